"""A simulated run as one specification (feather/sim/run_spec.py): the job the pipeline
specifies runs exactly what the flags run, keeps its spec beside the summary, reruns from it,
carries a user profile, names its label in the summary table, and bad specs fail clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from feather.cli import main
from feather.pipeline.aggregate import aggregate
from feather.sim.run_spec import RUN_SPEC_FORMAT, RunSpec, RunSpecError

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
    assert "--spec holds the whole run; drop --kernel" in capsys.readouterr().err
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
