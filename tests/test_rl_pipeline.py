"""The pipeline's RL and never-worse pieces: experiments' engine jobs with their own scheduler
entries (a frozen table the pipeline trained), and the never-worse report over a summary
table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from feather.bench.never_worse import from_summary, minimum_by_policy, variants, violations
from feather.pipeline.experiments import (
    ExperimentError,
    engine_training_jobs,
    expand_engine_runs,
    load_experiment,
)

REPO = Path(__file__).resolve().parent.parent


def test_the_rl_experiment_deploys_the_transfer_table_frozen_on_vllm_cpu() -> None:
    experiment = load_experiment(REPO / "experiments" / "rl.yaml")
    config = {"schedulers": {"fcfs": {}, "feather-static": {}}, "engines": ["vllm"]}
    assert not expand_engine_runs(experiment, config, {"leval"}, {"vllm": "cpu"})  # full only
    config["engine_runs"] = {"sweep": "full"}
    batches = expand_engine_runs(experiment, config, {"leval"}, {"vllm": "cpu"})
    pressure = next(b for b in batches if b.workload == "cpu_pressure")
    labels = [label for label, _, _ in pressure.schedulers]
    assert labels == ["fcfs", "feather-static", "feather-stop", "feather-learned"]
    learned = dict(pressure.schedulers[-1][2])
    assert pressure.schedulers[-1][1] == "feather-ucb" and learned["frozen"] is True
    transfer = experiment.training["transfer"]
    expected = f"results/{transfer['hardware']}/sim/rl-transfer/{transfer['learner']}/policy.json"
    assert pressure.inputs() == [expected] == [learned["policy_file"]]
    assert pressure.repeats >= 5
    job = pressure.job_spec({})
    assert [s["label"] for s in job["schedulers"]] == labels
    assert job["schedulers"][-1]["class"] == "feather-ucb"
    experiment.engine_templates[0]["scheduler"] = [{"label": "x", "nope": 1}]
    with pytest.raises(ExperimentError, match="needs 'label'"):
        expand_engine_runs(experiment, config, {"leval"}, {"vllm": "cpu"})


def _row(**fields) -> dict:
    base = {
        "experiment": "c5",
        "hardware": "a100-80gb",
        "engine": "sim",
        "model": "llama-3.1-8b",
        "workload": "w",
        "kernel": "paged",
        "engine_mode": "vllm",
        "kv_pool_tokens": 1000,
        "load_factor": None,
        "ttft_p99_s": 1.0,
        "longest_wait_s": 2.0,
    }
    return {**base, **fields}


def test_never_worse_over_a_summary_table_pairs_each_setting_with_its_fcfs() -> None:
    table = pd.DataFrame(
        [
            _row(scheduler="fcfs", output_tok_s=100.0),
            _row(scheduler="feather-static", output_tok_s=99.5),
            _row(scheduler="feather-ucb", output_tok_s=98.0),
            _row(scheduler="lpm", output_tok_s=50.0),
            # another pool: its own FCFS
            _row(scheduler="fcfs", output_tok_s=10.0, kv_pool_tokens=10),
            _row(scheduler="feather-static", output_tok_s=40.0, kv_pool_tokens=10),
            # below saturation: latency compared too
            _row(scheduler="fcfs", output_tok_s=5.0, workload="load", load_factor=0.5),
            _row(scheduler="feather-static", output_tok_s=5.0, workload="load", load_factor=0.5,
                 longest_wait_s=2.4),
            # a real engine's repeats: median against FCFS's slowest repeat
            *[_row(engine="vllm", scheduler="fcfs", output_tok_s=v) for v in (9.0, 10.0, 11.0)],
            *[_row(engine="vllm", scheduler="feather-static", output_tok_s=v)
              for v in (8.0, 9.5, 12.0)],
            _row(scheduler="feather-qlearn", output_tok_s=1.0, workload="no fcfs here"),
        ]
    )
    results = from_summary(table)
    assert len(results) == 4  # the setting without FCFS is left out
    by = {(r["engine"], r["workload"], r["kv_pool_tokens"]): r["feather"] for r in results}
    assert by[("sim", "w", "1000")]["feather-static"]["throughput_ratio"] == pytest.approx(0.995)
    assert by[("sim", "w", "1000")]["feather-ucb (online)"]["throughput_ratio"] == 0.98
    assert by[("sim", "w", "10")]["feather-static"]["throughput_ratio"] == 4.0
    assert by[("sim", "load", "1000")]["feather-static"]["longest_wait_ratio"] == 1.2
    assert "longest_wait_ratio" not in by[("sim", "w", "1000")]["feather-static"]
    real = by[("vllm", "w", "1000")]["feather-static"]
    assert real["median_tok_s"] == 9.5 and real["fcfs_min_tok_s"] == 9.0
    assert real["median_at_or_above_fcfs_min"] is True
    broken = {v for r in results for v in violations(r)}
    assert broken == {
        "feather-ucb (online): 0.980x FCFS throughput",
        "feather-static: longest_wait_ratio 1.200",
    }
    worst = minimum_by_policy(results)
    assert worst["feather-static"]["min_throughput_ratio"] == pytest.approx(0.995)
    assert worst["feather-static"]["max_longest_wait_ratio"] == 1.2
    (real,) = worst["feather-static"]["real_engine"]
    assert real["median_over_fcfs_min"] == pytest.approx(9.5 / 9.0)


def test_frozen_tables_deploy_on_their_own_device() -> None:
    files = {"feather-ucb@a100-80gb": "a.json", "feather-qlearn": "any.json"}
    on_a100 = {v.label: v.params for v in variants(files, "a100-80gb")}
    on_ada = {v.label: v.params for v in variants(files, "rtx-6000-ada")}
    assert on_a100["feather-ucb (frozen)"]["policy_file"] == "a.json"
    assert "feather-ucb (frozen)" not in on_ada  # trained for another device only
    assert on_ada["feather-qlearn (frozen)"] == {"policy_file": "any.json", "frozen": True}
    assert {"feather-static", "feather-ucb (online)", "feather-qlearn (online)"} <= set(on_ada)


def test_a_frozen_table_run_on_another_device_says_so(tmp_path) -> None:
    from feather.policies import create_scheduler
    from feather.sim.run import SimulationSpec, simulate

    table = create_scheduler("feather-ucb")
    table.trained_on = {"hardware": "a100-80gb", "model": "llama-3.1-8b", "kernel": "cascade"}
    path = table.save(tmp_path / "ucb.json")
    spec = SimulationSpec(
        workload="synthetic:groups=2,per_group=4,prefix=64,suffix=8,output=4,seed=0",
        scheduler="feather-ucb",
        hardware="rtx-6000-ada",
        model="llama-3.1-8b",
        kernel="cascade",
        scheduler_params={"policy_file": str(path), "frozen": True},
    )
    summary = simulate(spec).summary
    assert summary["policy_scope_warning"] == (
        "table trained elsewhere: hardware a100-80gb -> rtx-6000-ada"
    )
    assert summary["provenance"]["policy"]["params"]["trained_on"]["hardware"] == "a100-80gb"
    same = simulate(spec.__class__(**{**spec.to_json(), "hardware": "a100-80gb"})).summary
    assert same["policy_scope_warning"] is None


def test_never_worse_joins_cases_run_earlier_with_the_summary(tmp_path: Path, capsys) -> None:
    """The pipeline runs the large cases beside the simulations and joins them with the
    summary table at the end: a violation found by the earlier job must survive the join, and
    a file that is not a never-worse report is refused."""
    import json

    from feather.cli import main

    fcfs = {"output_tok_s": 100.0, "ttft_p99_s": 1.0, "longest_wait_s": 1.0,
            "mean_batch_size": 8.0, "stop_decisions": 0, "delegated_decisions": 0}
    slow = {**fcfs, "output_tok_s": 90.0, "throughput_ratio": 0.9}
    case = {"name": "made-up", "below_saturation": False, "workload": "synthetic:groups=2",
            "hardware": "a100-80gb", "kernel": "paged", "engine_mode": "vllm",
            "model": "llama-3.1-8b", "kv_pool_fraction": None, "num_blocks": None}
    earlier = tmp_path / "cases.json"
    earlier.write_text(json.dumps({"benchmark": "never-worse", "provenance": {"seed": 1},
                                   "cases": [{"case": case, "fcfs": fcfs,
                                              "feather": {"feather-static": slow}}]}))
    out = tmp_path / "report.json"
    assert main(["bench", "never-worse", "--cases", "none", "--cases-from", str(earlier),
                 "--out", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["cases"][0]["case"]["name"] == "made-up"
    assert report["holds"] is False
    assert report["violations"] == ["feather-static: 0.900x FCFS throughput"]
    assert report["cases_provenance"] == {"seed": 1}
    assert report["minimum_by_policy"]["feather-static"]["min_throughput_ratio"] == 0.9
    earlier.write_text(json.dumps({"benchmark": "overhead"}))
    with pytest.raises(SystemExit, match="not a never-worse report"):
        main(["bench", "never-worse", "--cases", "none", "--cases-from", str(earlier)])
    with pytest.raises(SystemExit, match="--cases none"):
        main(["bench", "never-worse", "--cases-from", str(earlier)])


def test_engine_runs_tagged_full_run_only_in_the_full_sweep(tmp_path: Path) -> None:
    """experiments/stop.yaml's STOP regimes on vllm-cpu: `engine_runs: {sweep: full}` only
    (the default run measures the cached-documents regime in the engine-trained learners'
    job, experiments/rl.yaml stop_pays); a template naming another sweep is refused."""
    config = {"schedulers": {"fcfs": {}, "feather-static": {}}, "engines": ["vllm"]}

    def workloads(name: str, sweep: str | None) -> list[str]:
        experiment = load_experiment(REPO / "experiments" / f"{name}.yaml")
        chosen = {**config, "engine_runs": {"sweep": sweep}} if sweep else config
        return [b.workload for b in expand_engine_runs(experiment, chosen,
                                                       {"leval", "synthetic"}, {"vllm": "cpu"})]

    assert workloads("stop", None) == workloads("stop", "default") == []
    assert set(workloads("stop", "full")) == {"kernel_4k", "cascade_16k", "longchat_4k",
                                              "longchat_cached"}
    assert workloads("vllm", None) == workloads("vllm", "full") == ["leval_slice"]
    data = yaml.safe_load((REPO / "experiments" / "vllm.yaml").read_text())
    data["engine_runs"][0]["sweep"] = "most"
    (tmp_path / "vllm.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError, match="engine_runs entry 0: sweep must be one of default"):
        load_experiment(tmp_path / "vllm.yaml")


def test_the_full_sweep_adds_a_regime_trained_over_a_spread_and_graded_on_unseen_shapes(
        ) -> None:
    """experiments/rl.yaml's stop_pays_spread: two training shapes, three held-out ones (the
    trained shape's other seeds, groups of 9, real L-Eval documents as built files per seed),
    full sweep only; every held-out run a run directory of the summary table."""
    from feather.engines.vllm.learning import EngineTraining

    experiment = load_experiment(REPO / "experiments" / "rl.yaml")
    config = {"schedulers": {"fcfs": {}}, "engines": ["vllm"]}
    default = engine_training_jobs(experiment, config, {"vllm": "cpu"})
    assert set(default["results/cpu/vllm/rl"]) == {"stop_pays", "stop_loses"}
    full = engine_training_jobs(experiment, {**config, "engine_runs": {"sweep": "full"}},
                                {"vllm": "cpu"})["results/cpu/vllm/rl"]
    job = EngineTraining.from_json(full["stop_pays_spread"])
    assert len(job.train_workloads) == 2 and "{l2_prefix" not in " ".join(job.train_workloads)
    assert job.eval_names == ("trained_shape", "groups_of_9", "leval_documents")
    leval = job.eval_workloads[2]
    assert leval.startswith("data/workloads/leval__") and "seed={seed}" in leval
    assert job.workload_files() == [leval.replace("{seed}", str(s)) for s in job.eval_seeds]
    dirs = job.heldout_dirs("results/cpu/vllm/rl")
    assert len(dirs) == 3 * 5 * len(job.eval_seeds) * job.eval_repeats
    assert dirs[0] == Path("results/cpu/vllm/rl/stop_pays_spread-trained_shape__fcfs__r0")


def test_an_attention_list_expands_into_one_engine_start_per_backend(tmp_path: Path) -> None:
    """experiments/c2.yaml's real-engine runs: each workload under vLLM's kernel, cascade and
    PAT-style - one job each, distinct run directories and job names, vLLM's own keeping the
    plain `<workload>__` prefix every reader of run directories knows."""
    experiment = load_experiment(REPO / "experiments" / "c2.yaml")
    config = {"schedulers": {"fcfs": {}}, "engines": ["vllm"], "engine_runs": {"sweep": "full"}}
    batches = expand_engine_runs(experiment, config, {"synthetic"}, {"vllm": "cpu"})
    assert len(batches) == 12 and len({b.name for b in batches}) == 12
    dirs = [d for b in batches for d in b.run_dirs()]
    assert len(dirs) == len(set(dirs)) == 12 * 5
    by = {(b.workload, b.attention): b for b in batches}
    assert set(by) == {(f"div{k}_cpu", a) for k in (0, 1, 2, 4) for a in ("vllm", "cascade", "pat")}
    plain, pat = by[("div1_cpu", "vllm")], by[("div1_cpu", "pat")]
    assert plain.run_dirs()[0] == "results/cpu/vllm/c2/div1_cpu__batch-16__r0"
    assert pat.run_dirs()[0] == "results/cpu/vllm/c2/div1_cpu@pat__batch-16__r0"
    job = pat.job_spec({})
    assert job["options"]["attention"] == "pat" and job["run_prefix"] == "div1_cpu@pat__"
    data = yaml.safe_load((REPO / "experiments" / "c2.yaml").read_text())
    data["engine_runs"][0]["options"]["attention"] = ["vllm", "flash"]
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError, match="option attention must be one of vllm, cascade, pat"):
        load_experiment(tmp_path / "c2.yaml")
