"""One table of every run: a row per run directory, metrics and provenance side by side.

A run directory, ours or one a user's own rule wrote, is valid when its `summary.json` is a
`RunSummary` (feather/run_summary.py): every field all producers write, and a provenance
record naming the config, seed and hardware; anything else is rejected with the file and the
missing or wrong-typed fields named, before any table is written. Fields that some producers
legitimately lack (the simulator's KV traffic, vLLM's attention time, NVML before it was
sampled) are declared optional there and are empty cells here, as are provenance facts older
runs lack (GPU facts). Hardware comes from provenance (the simulated profile for simulator
runs, the real device otherwise), never from the directory name; figures comparing hardware
read the `hardware` column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from feather.atomic import atomic_target
from feather.engines.runs import run_attention
from feather.run_summary import InvalidSummaryError, RunSummary
from feather.sim.attribution import PARTS as TIME_PARTS  # where a simulated run's time went
from feather.sim.run_spec import RUN_SPEC_FILE, RunSpec, RunSpecError
from feather.telemetry.devices import device_name
from feather.workloads.cache_regime import per_core_l2_bytes


class InvalidRunError(ValueError):
    """A run directory whose summary cannot be trusted or used."""


# the regime a run ran in (feather/workloads/regime.py): what its numbers can show
REGIME_COLUMNS = (
    "arrival_order",
    "order_seed",
    "output_regime",
    "arrival",
    "load_factor",
    "kv_pool_tokens",
    "distinct_shared_prefix_tokens",
    "pool_to_prefix_ratio",
    "device_kv_pool_tokens",
    "pool_hypothetical",
)

# the NVML means the table carries (per run: the mean over its GPUs of each GPU's mean)
NVML_COLUMNS = ("sm_util_pct", "mem_util_pct", "gpm_dram_bw_util_pct", "power_w")


def _hardware_of(provenance: dict[str, Any]) -> tuple[str, str, str]:
    """(hardware name, what produced the number, kind) from a run's provenance; kind is
    "simulated", "gpu" or "cpu"."""
    if "simulated_hardware" in provenance:
        name = provenance["simulated_hardware"]["name"]
        return name, f"simulator ({name} profile)", "simulated"
    engine = (provenance.get("engine") or {}).get("name") or "engine"
    on_cpu = provenance.get("device") == "cpu"
    gpu = None if on_cpu else device_name(provenance.get("gpus") or {})
    gpu = gpu or (provenance.get("gpu") or {}).get("name")
    name = str(gpu) if gpu else "cpu"
    producer = provenance.get("produced_by") or f"{engine} on {gpu or 'CPU'}"
    return name, producer, "gpu" if gpu else "cpu"


def _nvml_columns(nvml: dict[str, Any] | None) -> dict[str, Any]:
    """nvml_available and the mean of each key counter over the run (None where absent)."""
    columns: dict[str, Any] = {"nvml_available": None if nvml is None else nvml.get("available")}
    gpus = (nvml or {}).get("gpus") or []
    for metric in NVML_COLUMNS:
        means = [
            g["metrics"][metric]["mean"]
            for g in gpus
            if (g.get("metrics") or {}).get(metric, {}).get("mean") is not None
        ]
        columns[f"nvml_{metric}_mean"] = sum(means) / len(means) if means else None
    return columns


def _environment_columns(provenance: dict[str, Any]) -> dict[str, Any]:
    """Engine, GPU stack and frozen policy of a run, flat (None where not recorded)."""
    engine = provenance.get("engine") or {}
    nvml = (provenance.get("gpus") or {}).get("nvml") or {}
    torch_cuda = (provenance.get("gpus") or {}).get("torch_cuda") or {}
    packages = provenance.get("packages") or {}
    return {
        "engine_name": engine.get("name"),
        "engine_version": engine.get("version"),
        "attention_backend": engine.get("attention_backend"),
        "block_size": engine.get("block_size"),
        "gpu_driver": nvml.get("driver_version"),
        "cuda_driver_version": nvml.get("cuda_driver_version"),
        "torch_cuda_build": torch_cuda.get("torch_cuda_build"),
        "torch_version": packages.get("torch"),
        "policy_file_sha256": (provenance.get("policy_file") or {}).get("sha256"),
    }


def _measurement_columns(record: dict[str, Any] | None) -> dict[str, Any]:
    """How a real run was measured (feather/measuring): its job, attempt and what else ran;
    empty for the simulator and for runs recorded before the protocol."""
    record = record or {}
    activity = record.get("activity") or {}
    return {
        "measure_job": record.get("job"),
        "measure_position": record.get("position"),
        "measure_attempts": record.get("attempts"),
        "measure_disturbed": record.get("disturbed"),
        "measure_others_cores": activity.get("others_cores"),
        "measure_wait_share": activity.get("wait_share"),
        "measure_probe_s": record.get("probe_after_s"),
    }


def _shape_columns(provenance: dict[str, Any], summary: RunSummary) -> dict[str, Any]:
    """What a policy could act on in a real run: the engine's slots, the largest prefix
    group of the workload, and the STOPs it decided (a static rule whose threshold no group
    reaches never stops: the page says so)."""
    engine = provenance.get("engine") or {}
    groups = ((provenance.get("workload") or {}).get("statistics") or {}).get(
        "requests_per_group") or {}
    return {"max_num_seqs": engine.get("max_num_seqs"),
            "largest_group": groups.get("max"),
            "decisions_stop": summary.decisions_stop}


def run_label(run_dir: Path) -> str | None:
    """The scheduler's label a simulated run's spec.json gives (None: no spec, as for real
    engine runs, whose summaries carry their label)."""
    spec = run_dir / RUN_SPEC_FILE
    if not spec.is_file():
        return None
    try:
        return RunSpec.load(str(spec)).label
    except RunSpecError as exc:
        raise InvalidRunError(f"{spec}: {exc}") from None


def summary_row(path: Path) -> dict[str, Any] | None:
    """The table's row for one run; None for a failed job's record (no run: the verdicts
    page names it, feather/pipeline/job_status.py)."""
    from feather.pipeline.job_status import FAILED

    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRunError(f"{path}: unreadable summary ({exc})") from exc
    if isinstance(document, dict) and document.get("status") == FAILED:
        return None
    try:
        summary = RunSummary.from_json(document, where=str(path))
    except InvalidSummaryError as exc:
        raise InvalidRunError(str(exc)) from None
    provenance = summary.provenance
    parts = path.parent.parts
    if len(parts) < 5 or parts[-5] != "results":
        raise InvalidRunError(f"{path}: not in results/<hardware>/<engine>/<experiment>/<run>/")
    config = provenance["config"] or {}
    hardware, producer, hardware_kind = _hardware_of(provenance)
    policy = provenance.get("policy") or {}
    return {
        "hardware": hardware,
        "hardware_kind": hardware_kind,
        "engine": parts[-3],
        "experiment": parts[-2],
        "run": parts[-1],
        "produced_by": producer,
        **_environment_columns(provenance),
        "scheduler": config.get("scheduler_label") or policy.get("name") or config.get("scheduler"),
        "scheduler_class": config.get("scheduler"),
        "params": json.dumps(config.get("scheduler_params", {}), sort_keys=True),
        "workload": config.get("workload"),
        "model": config.get("model"),
        "kernel": config.get("kernel"),
        "attention": run_attention({"attention": summary.attention}),
        "engine_mode": config.get("engine_mode"),
        "seed": provenance["seed"],
        "repeat": config.get("repeat", 0),
        **{key: getattr(summary, key) for key in REGIME_COLUMNS},
        "requests": summary.requests,
        "output_tok_s": summary.output_tok_s,
        "total_tok_s": summary.total_tok_s,
        "makespan_s": summary.makespan_s,
        "ttft_p50_s": summary.ttft_s["p50"],
        "ttft_p99_s": summary.ttft_s["p99"],
        "tpot_p50_s": summary.tpot_s["p50"],
        "tpot_p99_s": summary.tpot_s["p99"],
        "longest_wait_s": summary.longest_wait_s,
        "mean_batch_size": summary.mean_batch_size,
        # a real engine's steps that prefill nothing (C1's measure: decode throughput)
        "decode_only_tok_s": summary.decode_only_tok_s,
        "decode_only_step_s": summary.decode_only_step_s,
        "decode_only_attention_share": summary.decode_only_attention_share,
        "mean_shared_prefix_tokens": summary.mean_shared_prefix_tokens,
        "mean_distinct_groups": summary.mean_distinct_groups,
        "l2_hit_rate": summary.l2_hit_rate,
        "kv_read_bytes": summary.kv_read_bytes,
        "prefix_cache_hit_rate": summary.prefix_cache_hit_rate,
        # vLLM: whether the run started with its documents cached (EngineSetup.prefix_cache)
        "prefix_cache_at_start": summary.prefix_cache_at_start,
        "preemptions": summary.preemptions,
        "pool_evictions": summary.pool_evictions,
        "prefill_tokens_computed": summary.prefill_tokens_computed,
        "prefill_tokens_recomputed": summary.prefill_tokens_recomputed,
        **{f"time_{part}_s": (summary.time_split_s or {}).get(part) for part in TIME_PARTS},
        "cascade_steps": summary.cascade_steps,
        # which model priced scheduling (feather/sim/sched_measured.py) and whether it
        # overlapped the GPU step; a real engine's runs have neither
        "sched_cost_model": (summary.sched_cost_model or {}).get("name"),
        "overlap_scheduling": (summary.sched_cost_model or {}).get("overlap_scheduling"),
        "sched_fraction_of_step_time": summary.sched_fraction_of_step_time,
        "sched_cpu_s_measured": summary.sched_cpu_s_measured,
        "fraction_of_oracle": summary.fraction_of_oracle,
        "wall_s": summary.wall_s,
        **_measurement_columns(summary.measurement),
        **_shape_columns(provenance, summary),
        **_nvml_columns(summary.nvml),
        "git_revision": provenance["git"].get("revision"),
        "git_dirty": provenance["git"].get("dirty"),
        "feather_version": provenance.get("feather_version"),
        "config_hash": provenance["config_hash"],
        "host_cpu": provenance["host"].get("cpu_model"),
        # the per-core L2 a CPU decode kernel reuses a prefix from (workloads/cache_regime.py)
        "host_l2_bytes": per_core_l2_bytes(provenance["host"].get("cpu_caches") or []),
        "python": (provenance.get("python") or {}).get("version"),
        "started_utc": provenance.get("started_utc"),
        "summary_path": str(path),
    }


def aggregate(
    paths: list[str | Path],
    out_parquet: str | Path,
    out_csv: str | Path,
) -> pd.DataFrame:
    """Validate every summary, then write both tables (atomically). A simulated run's
    scheduler is the label its spec.json gives (the experiment file's name for it). A failed
    job's record (feather/pipeline/job_status.py) is no run: the verdicts page names it."""
    rows = [row for p in paths if (row := summary_row(Path(p))) is not None]
    for row in rows:
        label = run_label(Path(row["summary_path"]).parent)
        if label:
            row["scheduler"] = label
    frame = pd.DataFrame(rows).sort_values(["experiment", "hardware", "run"]).reset_index(drop=True)
    with atomic_target(out_parquet) as tmp:
        frame.to_parquet(tmp, index=False)
    with atomic_target(out_csv) as tmp:
        frame.to_csv(tmp, index=False)
    return frame
