"""Feather inside SGLang, through SGLang's real objects: its plugin loader finds our entry
point and wraps its methods; its real `Req`, `SchedulePolicy`, `RadixCache` and
`PrefillAdder` then admit in our policy's order (see feather/engines/sglang/probe.py).

SGLang 0.5.23 runs in its own environment (built on first use, like the overhead tests'),
with feather installed into it; one probe process answers every test here. These tests never
skip: without the environment they fail, with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from feather.overhead.envs import build_env

REPO = Path(__file__).resolve().parents[1]
SGLANG = "sglang-0.5.23"
TARGETS = {
    "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority",
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req",
    "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy",
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
    "sglang.srt.managers.scheduler.Scheduler.flush_cache",
}


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    envs = Path(os.environ.get("FEATHER_ENVS_DIR", REPO / ".envs"))
    status = build_env(SGLANG, envs / SGLANG, progress=print, install_feather=True)
    if not status.ok:
        pytest.fail(f"SGLang's environment could not be built: {status.reason}")
    return status.python


def _probe(python: Path, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEATHER_SGLANG_")}
    done = subprocess.run(
        [str(python), "-P", "-m", "feather.engines.sglang.probe"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**clean, **env},
    )
    assert done.returncode == 0, f"probe failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probe(sglang_python: Path) -> dict:
    return _probe(sglang_python)


def _groups(rids: list[str]) -> set[str]:
    return {rid.split("-")[0] for rid in rids}


def test_the_plugin_registers_through_sglangs_entry_point_loader(probe: dict) -> None:
    entry = probe["entry_point"]
    assert set(entry["registered"]) == TARGETS
    assert all(sources == ["feather:feather"] for sources in entry["registered"].values())
    # the admission methods are wrapped (the Scheduler's module needs GPU-side packages
    # that this environment lacks: its hooks apply in the real scheduler process)
    assert entry["wrapped"] == {"calc_priority": True, "add_one_req": True}
    assert {t for t in TARGETS if ".schedule_policy." in t} <= set(entry["applied"])


def test_without_a_setting_the_plugin_registers_nothing(sglang_python: Path) -> None:
    script = (
        "from feather.engines.sglang.api import SGLangAPI; SGLangAPI()\n"
        "from feather.engines.sglang.probe import entry_point_check\n"
        "import json; print(json.dumps(entry_point_check()))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEATHER_SGLANG_")}
    done = subprocess.run([str(sglang_python), "-P", "-c", script], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=clean)
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(done.stdout.strip().splitlines()[-1])
    assert entry["registered"] == {}
    assert entry["wrapped"] == {"calc_priority": False, "add_one_req": False}


def test_interleaved_groups_are_admitted_in_homogeneous_batches(probe: dict) -> None:
    fcfs, ours = probe["grouped"]["fcfs"], probe["grouped"]["feather-static"]
    # SGLang's fcfs takes arrival order: every batch mixes all four groups
    assert [len(_groups(p["admitted"])) for p in fcfs] == [4, 4, 4]
    # ours: one group per batch, all of it, group after group
    assert [sorted(p["admitted"]) for p in ours] == [
        [f"g{g}-{k}" for k in range(6)] for g in range(4)
    ]
    # SGLang's radix cache did the reuse: every admitted request hit its cached prefix,
    # and the pass locked only the one group's prefix node
    assert all(p["prefix_len"] == [64] * 6 and p["hit_tokens"] == 6 * 64 for p in ours)
    assert [p["protected_tokens"] for p in ours] == [64, 64, 64, 64]
    assert [p["protected_tokens"] for p in fcfs] == [256, 256, 256]


def test_lpm_is_sglangs_own_and_keeps_groups_mixed_here(probe: dict) -> None:
    # every prefix is cached and equally long: LPM's stable sort keeps arrival order
    lpm = probe["grouped"]["lpm"]
    assert [p["admitted"] for p in lpm] == [p["admitted"] for p in probe["grouped"]["fcfs"]]
    assert all(p["record"] is None for p in lpm)  # no Feather policy attached


def test_stop_ends_admission_without_committing_the_request(probe: dict) -> None:
    first = probe["grouped"]["feather-static"][0]
    assert first["record"] == {"stop_reason": "policy", "decisions_stop": 1}
    stopped = first["visited"][-1]
    assert stopped == "g1-0"  # the oldest request of the next group: the walk reached it
    assert stopped not in first["admitted"]
    assert first["waiting"][0] == stopped  # still waiting, first in line
    # not committed: its cached prefix was neither counted as a hit nor locked
    assert first["hit_tokens"] == 6 * 64 and first["protected_tokens"] == 64
    assert probe["grouped"]["feather-static"][1]["admitted"][0] == stopped


@pytest.mark.parametrize("learner", ["feather-static", "feather-ucb", "feather-qlearn"])
def test_with_no_sharing_it_admits_exactly_as_sglangs_fcfs(probe: dict, learner: str) -> None:
    fcfs, ours = probe["unshared"]["fcfs"], probe["unshared"][learner]
    assert [p["admitted"] for p in ours] == [p["admitted"] for p in fcfs]
    assert [p["visited"] for p in ours] == [p["visited"] for p in fcfs]
    # the engine's limits, not the policy, ended the passes: token budget and request slots
    reasons = {p["record"]["stop_reason"] for p in ours}
    assert {"refused", "max_running"} <= reasons and "policy" not in reasons
    assert len(fcfs) >= 8  # several passes, with requests finishing between them
