"""The workflow's simulation jobs (feather/pipeline/sim_batches.py, `feather simulate --runs`):
every run in exactly one job, a job holding one scheduler's runs of one experiment on one
profile, and several runs in one process giving exactly the numbers one process per run
gives (no state carried from run to run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feather.cli import main
from feather.pipeline.sim_batches import RUN_FILES, sim_batches

# what differs between two runs of the same spec: when and how fast they ran
VOLATILE = {"provenance", "wall_s", "sched_cpu_s_measured", "sched_cpu_fraction_of_gpu_time"}

_names = st.sampled_from(["a", "b-c", "b_c", "c5", "x.y"])
_runs = st.lists(st.tuples(_names, _names, _names, st.booleans()), max_size=60)


@given(runs=_runs, most=st.integers(1, 7))
def test_every_run_is_in_exactly_one_job_of_its_own_kind(runs, most) -> None:
    rows = [(f"results/{hw}/sim/{exp}/r{k}", hw, exp, sched, derived)
            for k, (hw, exp, sched, derived) in enumerate(runs)]
    batches = sim_batches(rows, most_runs=most)
    placed = [d for b in batches for d in b.run_dirs]
    assert sorted(placed) == sorted(r[0] for r in rows)  # each once, none lost
    assert len({b.name for b in batches}) == len(batches)  # rule names unique
    assert len({b.log for b in batches}) == len(batches)  # and logs
    kind = {r[0]: r[1:] for r in rows}
    for b in batches:
        assert 1 <= len(b.run_dirs) <= most
        assert {kind[d] for d in b.run_dirs} == {kind[b.run_dirs[0]]}  # one kind per job
        assert kind[b.run_dirs[0]][:3] == (b.hardware, b.experiment, b.scheduler)
        assert b.name.isidentifier()
        assert b.outputs() == [f"{d}/{f}" for d in b.run_dirs for f in RUN_FILES]
    # brute force: a job is split only where the group holds more than `most` runs
    groups: dict[tuple, int] = {}
    for r in rows:
        groups[r[1:]] = groups.get(r[1:], 0) + 1
    assert len(batches) == sum(-(-n // most) for n in groups.values())


def test_a_derived_run_never_shares_a_job_with_what_it_derives_from() -> None:
    rows = [("cap", "a100", "load", "fcfs", False), ("l1", "a100", "load", "fcfs", True)]
    first, second = sim_batches(rows)
    assert first.run_dirs == ("cap",) and second.run_dirs == ("l1",)
    assert second.name == "simulate_load_a100_fcfs_derived"


def _spec(workload: str, scheduler: str, seed: int) -> dict:
    return {"format": "feather-run-spec/1", "label": scheduler, "hardware_profile": None,
            "model_profile": None,
            "simulation": {"workload": workload, "scheduler": scheduler, "hardware": "a100-80gb",
                           "model": "llama-3.1-8b", "kernel": "paged", "engine_mode": "vllm",
                           "seed": seed, "scheduler_params": {}, "num_blocks": 400}}


def _summary(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in VOLATILE}


def test_runs_in_one_process_give_what_one_process_per_run_gives(tmp_path: Path) -> None:
    workload = "synthetic:groups=3,per_group=6,prefix=600,suffix=20,output=8,seed=2"
    other = "synthetic:groups=2,per_group=9,prefix=900,suffix=30,output=6,order=shuffled,seed=4"
    specs = [_spec(workload, "feather-static", 0), _spec(other, "lpm", 1),
             _spec(workload, "fcfs", 0), _spec(workload, "feather-static", 0)]
    runs = [{"out": str(tmp_path / "batch" / str(k)), "spec": s} for k, s in enumerate(specs)]
    assert main(["simulate", "--runs", json.dumps(runs), "--quiet"]) == 0
    for k, spec in enumerate(specs):
        alone = tmp_path / "alone" / str(k)
        assert main(["simulate", "--spec", json.dumps(spec), "--out", str(alone), "--quiet"]) == 0
        assert _summary(tmp_path / "batch" / str(k)) == _summary(alone)
        for name in RUN_FILES:
            assert (tmp_path / "batch" / str(k) / name).is_file()
    # the first and last run are the same spec: the first left nothing behind for the last
    assert _summary(tmp_path / "batch" / "0") == _summary(tmp_path / "batch" / "3")
    # a file of runs does the same
    listing = tmp_path / "runs.json"
    listing.write_text(json.dumps(runs[:1]))
    assert main(["simulate", "--runs", str(listing), "--quiet"]) == 0


@pytest.mark.parametrize(("runs", "extra", "message"), [
    ("[]", [], "--runs takes a non-empty JSON list"),
    ('[{"out": "x"}]', [], "--runs takes a non-empty JSON list"),
    ("[1, 2", [], "--runs: not valid JSON"),
    ('[{"out": "x", "spec": %s}, {"out": "x", "spec": %s}]', [], "two runs write the same"),
    ('[{"out": "x", "spec": %s}]', ["--out", "y"], "drop --spec and --out"),
    ('[{"out": "x", "spec": %s}]', ["--seed", "3"], "drop --seed"),
])
def test_bad_runs_fail_clearly_before_anything_runs(tmp_path, capsys, runs, extra,
                                                    message) -> None:
    spec = json.dumps(_spec("synthetic:groups=1,per_group=2,prefix=50,suffix=5,output=2",
                            "fcfs", 0))
    text = runs.replace("%s", spec)
    text = text.replace('"x"', json.dumps(str(tmp_path / "x")))
    assert main(["simulate", "--runs", text, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
