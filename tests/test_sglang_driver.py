"""The SGLang plugin's plain-Python parts, in our own environment: the driver that puts our
policy's candidates where SGLang's walk visits them, its event bookkeeping, the per-step
records, the settings, the unsupported options, and installing feather into another env
(tests/test_sglang_plugin.py runs it all inside SGLang itself)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import venv
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest

from feather.engines.sglang.driver import AdmissionDriver, ProtocolBroken
from feather.engines.sglang.hooks import new_driver, unsupported_options
from feather.engines.sglang.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, ENTRY_POINT_VALUE
from feather.engines.sglang.records import (
    StepRecorder,
    parse_request_id,
    read_records,
    request_id_for,
    shared_prefix_tokens,
)
from feather.engines.sglang.settings import PARAMS_VAR, SCHEDULER_VAR, PluginSettings
from feather.overhead.envs import install_feather_into

REPO = Path(__file__).resolve().parents[1]


class FakeReq:
    """What the driver and the recorder read of SGLang's Req."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.rid = rid
        self.origin_input_ids = array("q", tokens)
        self.finished_reason = None
        self.output_ids: list[int] = []
        self.prefix_len = 0
        self.extend_input_len = len(tokens)

    def finished(self) -> bool:
        return self.finished_reason is not None


def grouped_requests(groups: int = 3, per_group: int = 4, prefix: int = 64) -> list[FakeReq]:
    reqs = []
    for k in range(per_group):
        for g in range(groups):
            tail = [90_000 + 100 * len(reqs) + t for t in range(8)]
            reqs.append(FakeReq(f"g{g}-{k}", [1000 * (g + 1) + t for t in range(prefix)] + tail))
    return reqs


def driver_for(scheduler: str = "feather-static", max_running: int = 64, **params):
    settings = PluginSettings(scheduler=scheduler, params=params)
    return new_driver(settings, object(), max_running=max_running)


def walk(driver: AdmissionDriver, queue: list[FakeReq], fits: int = 10**9) -> list[str]:
    """SGLang's walk: visit the list by index; the adder takes `fits` requests, then refuses."""
    driver.open_pass(queue)
    taken: list[str] = []
    for req in queue:
        if not driver.candidate(req):
            break  # STOP: add_one_req answered OTHER without committing
        committed = len(taken) < fits
        if committed:
            taken.append(req.rid)
        driver.outcome(req, committed, go_on=committed)
        if not committed:
            break
    driver.close_pass()
    return taken


def test_the_walk_visits_one_group_then_stops_and_others_keep_arrival_order() -> None:
    driver = driver_for(min_batch=2, min_delta_tokens=16, consult="always", min_share_tokens=0)
    queue = grouped_requests()
    arrival = [r.rid for r in queue]
    taken = walk(driver, queue)
    assert taken == ["g0-0", "g0-1", "g0-2", "g0-3"]
    order = [r.rid for r in queue]
    assert order[:4] == taken  # moved in place, where the walk visited them
    assert order[4:] == [rid for rid in arrival if rid not in taken]
    assert driver.last_record.stop_reason == "policy"
    assert [d.action for d in driver.last_record.decisions][-1] == "STOP"


def test_a_candidate_the_engine_never_reached_is_refused_and_stays_first() -> None:
    driver = driver_for(min_batch=2, min_delta_tokens=16, consult="always", min_share_tokens=0)
    queue = grouped_requests()
    assert walk(driver, queue, fits=2) == ["g0-0", "g0-1"]
    record = driver.last_record
    assert record.refused == "g0-2" and record.stop_reason == "refused"
    remaining = [r for r in queue if r.rid not in ("g0-0", "g0-1")]
    # next pass: the two running share the prefix; their group comes next
    assert walk(driver, remaining) == ["g0-2", "g0-3"]


def test_a_walk_that_skips_the_candidate_is_an_error_not_a_wrong_order() -> None:
    driver = driver_for()
    queue = grouped_requests()
    driver.open_pass(queue)
    with pytest.raises(ProtocolBroken, match="does not support"):
        driver.candidate(queue[1])


def test_events_come_from_the_requests_finished_retracted_aborted() -> None:
    driver = driver_for(min_batch=2, min_delta_tokens=16, consult="always", min_share_tokens=0)
    queue = grouped_requests(groups=2, per_group=3)
    taken = walk(driver, queue)
    by_rid = {r.rid: r for r in queue}
    waiting = [r for r in queue if r.rid not in taken]
    policy = driver.policy
    assert (policy.num_running, policy.num_waiting) == (3, 3)
    by_rid[taken[0]].finished_reason = "length"  # finished
    waiting.append(by_rid[taken[1]])  # retracted: it waits again
    waiting.remove(by_rid["g1-2"])  # aborted while waiting
    walk(driver, waiting, fits=0)
    assert (policy.num_running, policy.num_waiting) == (1, 3)
    assert policy.is_waiting(taken[1]) and not policy.is_waiting("g1-2")


def test_without_sharing_the_walk_is_arrival_order() -> None:
    driver = driver_for("feather-ucb", seed=3)
    queue = [FakeReq(f"u{i}", [10_000 * i + t for t in range(20 + i)]) for i in range(12)]
    assert walk(driver, queue, fits=5) == [f"u{i}" for i in range(5)]


def test_unsupported_options_are_named() -> None:
    ok = SimpleNamespace(schedule_policy="fcfs", enable_lora=False, dllm_config=None,
                         disaggregation_mode=SimpleNamespace(value="null"))
    assert unsupported_options(ok) == []
    bad = SimpleNamespace(schedule_policy="lpm", enable_lora=True, dllm_config=None,
                          disaggregation_mode=SimpleNamespace(value="prefill"))
    found = " | ".join(unsupported_options(bad))
    assert "--schedule-policy lpm" in found and "--enable-lora" in found
    assert "disaggregation" in found


# ---- records ----------------------------------------------------------------------------------


def test_request_ids_carry_index_and_group() -> None:
    rid = request_id_for("r0", 7, "doc|3")
    assert parse_request_id(rid) == (7, "doc|3")
    assert parse_request_id("plain-id") is None


def test_shared_prefix_tokens() -> None:
    import numpy as np

    a, b, c = np.arange(10), np.r_[np.arange(6), [99, 98]], np.arange(3)
    assert shared_prefix_tokens([a, b]) == 6
    assert shared_prefix_tokens([a, b, c]) == 3
    assert shared_prefix_tokens([a]) == 10 and shared_prefix_tokens([]) == 0


class _Mode:
    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend(self) -> bool:
        return self.name == "EXTEND"


def test_recorder_writes_steps_and_requests_per_run(tmp_path: Path) -> None:
    reqs = [FakeReq(request_id_for("t", i, f"grp{i % 2}"), [1, 2, 3, 4, 10 + i]) for i in range(3)]
    recorder = StepRecorder(tmp_path, {"name": "sglang", "version": "x"})
    prefill = SimpleNamespace(reqs=reqs, forward_mode=_Mode("EXTEND"), decoding_reqs=None)
    recorder.on_schedule(prefill, start_s=0.0, cpu_s=0.001, wall_s=0.002, policy_cpu_s=0.0005,
                         waiting=5, record=None)
    for r in reqs:
        r.output_ids.append(1)
    recorder.on_result()
    decode = SimpleNamespace(reqs=reqs[0::2], forward_mode=_Mode("DECODE"))
    recorder.on_schedule(decode, start_s=recorder.now(), cpu_s=0.0, wall_s=0.0,
                         policy_cpu_s=0.0, waiting=5, record=None)
    for r in reqs[0::2]:
        r.output_ids.append(2)
        r.finished_reason = "length"
    recorder.on_result()
    empty = SimpleNamespace(reqs=[], forward_mode=_Mode("IDLE"))
    recorder.on_schedule(empty, start_s=recorder.now(), cpu_s=0.0, wall_s=0.0,
                         policy_cpu_s=0.0, waiting=0, record=None)
    assert recorder.on_result() is None  # an empty batch's result: no row, queue in step
    recorder.new_run()
    recorder.close()
    runs = read_records(recorder.path)
    assert runs[-1]["engine"] == [{"name": "sglang", "version": "x"}]
    steps, requests = runs[0]["steps"], runs[0]["requests"]
    assert [s["batch_size"] for s in steps] == [3, 2]
    assert [s["admitted"] for s in steps] == [3, 0]
    assert [s["sampled_tokens"] for s in steps] == [3, 2]
    assert [s["shared_prefix_tokens"] for s in steps] == [4, 4]
    assert [s["distinct_groups"] for s in steps] == [2, 1]
    assert [s["finished"] for s in steps] == [0, 2]
    assert steps[0]["prefill_tokens"] == 15 and steps[1]["decode_seqs"] == 2
    assert all(s["step_time_s"] >= 0 for s in steps)
    assert sorted(r["rid"] for r in requests) == sorted(r.rid for r in reqs[0::2])
    assert all(r["output_tokens"] == 2 and r["first_token_s"] <= r["finish_s"] for r in requests)
    assert runs[1] == {"steps": [], "requests": []}


# ---- settings, entry point, installing into another environment --------------------------------


def test_settings_from_the_environment() -> None:
    assert not PluginSettings.from_env({}).enabled
    s = PluginSettings.from_env({SCHEDULER_VAR: "feather-static", PARAMS_VAR: '{"min_batch": 4}'})
    assert s.enabled and s.params == {"min_batch": 4}
    assert PluginSettings.from_env(s.to_env()) == s
    with pytest.raises(ValueError, match="JSON object"):
        PluginSettings.from_env({PARAMS_VAR: "[1]"})


def test_pyproject_declares_the_plugin_entry_point() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == {ENTRY_POINT_NAME: ENTRY_POINT_VALUE}


def test_install_feather_into_another_env_exposes_the_entry_point(tmp_path: Path) -> None:
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    install_feather_into(env)
    dist_info = install_feather_into(env)  # idempotent
    assert dist_info.name.startswith("feather-")
    script = (
        "import json, importlib.metadata as m, feather\n"
        f"eps = m.entry_points(group={ENTRY_POINT_GROUP!r})\n"
        "print(json.dumps({'eps': [[e.name, e.value, e.dist.name] for e in eps],"
        " 'file': feather.__file__}))\n"
    )
    done = subprocess.run([str(env / "bin" / "python"), "-P", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(done.stdout)
    assert found["eps"] == [[ENTRY_POINT_NAME, ENTRY_POINT_VALUE, "feather"]]
    assert Path(found["file"]).resolve() == (REPO / "feather" / "__init__.py").resolve()
    assert sys.prefix != str(env)


# ---- the scheduler hooks, on a stand-in scheduler (the real one needs a GPU) --------------------


def _scheduler(**options) -> SimpleNamespace:
    base = dict(schedule_policy="fcfs", enable_lora=False, dllm_config=None,
                disaggregation_mode=SimpleNamespace(value="null"), tree_cache=object(),
                max_running_requests=8, page_size=1, policy=SimpleNamespace(), waiting_queue=[])
    return SimpleNamespace(**{**base, **options})


def test_scheduler_hooks_attach_record_and_reset_between_runs(tmp_path, monkeypatch) -> None:
    from feather.engines.sglang import hooks
    from feather.engines.sglang.driver import DRIVER_ATTR
    from feather.engines.sglang.settings import TRACE_VAR

    monkeypatch.setenv(SCHEDULER_VAR, "feather-static")
    params = {"min_batch": 2, "min_delta_tokens": 16, "consult": "always", "min_share_tokens": 0}
    monkeypatch.setenv(PARAMS_VAR, json.dumps(params))
    monkeypatch.setenv(TRACE_VAR, str(tmp_path))
    sched = _scheduler()
    hooks.after_init_schedule_policy(None, sched)
    driver = getattr(sched.policy, DRIVER_ATTR)
    assert driver.max_running == 8 and driver.tree_cache is sched.tree_cache
    queue = grouped_requests(groups=2, per_group=2)

    def schedule(scheduler, **kwargs):  # SGLang's pass: calc_priority, then the walk
        taken = walk_open(driver, queue)
        reqs = [r for r in queue if r.rid in taken]
        batch = SimpleNamespace(reqs=reqs, forward_mode=_Mode("EXTEND"), decoding_reqs=None)
        return SimpleNamespace(batch_to_run=batch, running_batch=None)

    plan = hooks.around_get_next_batch_to_run(schedule, sched)
    assert not driver.in_pass  # the hook closed the pass
    for req in plan.batch_to_run.reqs:
        req.output_ids.append(1)
    hooks.after_process_batch_result(None, sched, plan.batch_to_run, None)
    for req in plan.batch_to_run.reqs:
        req.finished_reason = "length"
    hooks.after_process_batch_result(None, sched, plan.batch_to_run, None)  # nothing in flight
    hooks.after_flush_cache(True, sched)
    assert getattr(sched.policy, DRIVER_ATTR) is not driver  # a fresh policy per run
    runs = read_records(getattr(sched, hooks.RECORDER_ATTR).path)
    facts = runs[-1]["engine"][0]
    assert facts["feather_scheduler"] == "feather-static" and facts["schedule_policy"] == "fcfs"
    (step,) = runs[0]["steps"]
    assert step["batch_size"] == 2 and step["decisions_stop"] == 1
    assert step["stop_reason"] == "policy" and step["distinct_groups"] is None
    assert runs[1] == {"steps": [], "requests": []}


def walk_open(driver: AdmissionDriver, queue: list[FakeReq]) -> list[str]:
    """The walk without closing the pass (the get_next_batch_to_run hook closes it)."""
    driver.open_pass(queue)
    taken = []
    for req in queue:  # the live list, as SGLang's walk: the driver reorders it in place
        if not driver.candidate(req):
            break
        taken.append(req.rid)
        driver.outcome(req, True, True)
    return taken


def test_the_scheduler_refuses_to_start_with_options_feather_cannot_serve(monkeypatch) -> None:
    from feather.engines.sglang import hooks

    monkeypatch.setenv(SCHEDULER_VAR, "feather-static")
    with pytest.raises(ValueError, match="--schedule-policy lpm"):
        hooks.after_init_schedule_policy(None, _scheduler(schedule_policy="lpm"))
    monkeypatch.setenv(PARAMS_VAR, "not json")
    with pytest.raises(ValueError, match="not JSON"):
        hooks.after_init_schedule_policy(None, _scheduler())
