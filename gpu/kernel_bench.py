#!/usr/bin/env python3
"""Decode kernels on a GPU: paged vs cascade vs pat timed (C1, C2, C7), L2 and DRAM measured.

Run through `bash gpu/kernels.sh OUTDIR` (at most ~5 minutes; nothing installed, no network:
PyTorch, Triton and nvidia-ml-py are assumed). Everything goes to OUTDIR:

- kernels.json: `feather bench kernels --full` on the GPU (schema feather.bench.kernels/1):
  the PyTorch and Triton implementations of every kernel on the paper's shapes (8 groups x
  100 requests, 4,000-token prefixes, C2 divergent requests, prefix 1K-16K, a nested batch);
  batches not started by the timing deadline are listed in its `notes`;
- nvml.parquet / the `nvml` record: NVML counters sampled while the benchmarks run
  (`feather.telemetry.nvml.NvmlSampler`, the project's one sampler; where it cannot be
  imported, the probe's pynvml sampler in gpu/l2_probe_device.py gives the summary instead);
- ncu.json: where Nsight Compute works, L2 hit rate and DRAM bytes read
  (`lts__t_sector_hit_rate.pct`, `dram__bytes_read.sum`, ...) of each Triton kernel's launches
  for one decode step of the homogeneous batch and the mixed batches: this script re-runs
  itself under `ncu` in `--ncu-child` mode (one warm-up step, then the profiled step) with
  cold caches (`--cache-control all`); every failure (no ncu, ERR_NVGPUCTRPERM, timeouts) is
  recorded, never fatal;
- kernel-calibration-<gpu>.json: what the simulator's L2/kernel model reads, per hardware:
  copy bandwidth, and per (batch, kernel) the Triton median, bytes by construction, effective
  bandwidth, and the ncu L2 hit rate, DRAM bytes and the share of the paged kernel's repeated
  reads the L2 absorbed (`reuse_captured`); with the provenance record;
- log.txt (the shell wrapper tees stdout/stderr there).

`python gpu/kernel_bench.py --device cpu --quick --out DIR` runs the same flow on the CPU with
tiny shapes and Triton's interpreter (a logic check for the tests, not a measurement).
Reuses, through gpu/l2_probe.py (`_load_probe`), the probe's Nsight Compute plumbing
(gpu/l2_probe_ncu.py: flags, CSV parsing, metric query), its bounded subprocesses, watchdog and
results file (gpu/l2_probe_bookkeeping.py) and its NVML sampler (gpu/l2_probe_device.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

START = time.monotonic()
REPO_ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = Path(__file__).resolve().parent
TIMING_DEADLINE_S = 170.0  # no new benchmark batch starts after this
NCU_DEADLINE_S = 255.0  # no new ncu run starts after this
NCU_CALL_TIMEOUT_S = 45.0
WATCHDOG_S = 288.0  # everything written and the process gone before 5 minutes
NCU_KERNELS = "_paged_decode_kernel|_segment_decode_kernel"
COPY_BYTES = 1 << 30


def _load_probe() -> Any:
    """gpu/l2_probe.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("l2_probe", GPU_DIR / "l2_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("l2_probe", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def elapsed() -> float:
    return time.monotonic() - START


def say(message: str) -> None:
    print(f"[{elapsed():6.1f}s] {message}", flush=True)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


# ---------------------------------------------------------------------------------------------
# Nsight Compute


def ncu_targets(sweep: Any, block_size: int) -> dict[str, Any]:
    """The batches profiled, by role: C1's homogeneous batch and both mixed ones."""
    n = sweep.per_group
    names = {f"homog_{n}": "homog", f"mixed_{n}": "mixed", f"mixed_{8 * n}": "mixed_big"}
    return {
        names[batch.name]: batch
        for bench, batch in sweep.batches(block_size)
        if bench == "c1" and batch.name in names
    }


# Most telling first (ncu runs take ~10-30 s each; the budget may stop the list): the plain
# kernel's L2 reuse on homogeneous vs mixed tables (C1's mechanism), then pat and cascade.
NCU_ORDER = (
    ("homog", "paged"),
    ("mixed_big", "paged"),
    ("mixed", "paged"),
    ("homog", "pat"),
    ("mixed_big", "pat"),
    ("homog", "cascade"),
    ("mixed_big", "cascade"),
    ("mixed", "pat"),
    ("mixed", "cascade"),
)


def launches_per_step(kernel: str, plan: Sequence[Any]) -> int:
    """Kernel launches one Triton decode step makes (paged: one; others: one per tile class)."""
    if kernel == "paged":
        return 1
    return len({len(seg.queries) == 1 for seg in plan})


def ncu_command(
    probe: Any,
    ncu: str,
    metrics: Sequence[str],
    config: str,
    kernel: str,
    launches: int,
    args: Any,
) -> list[str]:
    """ncu over this script in child mode: skip one step's warm-up launches, profile a step's."""
    child = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--ncu-child",
        "--config",
        config,
        "--kernel",
        kernel,
        "--device",
        args.device,
    ]
    if args.quick:
        child.append("--quick")
    return [*probe.ncu_args(ncu, metrics, NCU_KERNELS, launches, launches), *child]


def combine_launches(launches: list[dict[str, Any]]) -> dict[str, float | None]:
    """One step's metrics from its launches: byte and sector counts add; the hit rate is
    weighted by each launch's L2 read sectors (unweighted where those are missing)."""
    if not launches:
        return {}
    out: dict[str, float | None] = {}
    names = {name for launch in launches for name in launch["metrics"]}
    for name in names:
        values = [launch["metrics"].get(name) for launch in launches]
        if any(v is None for v in values):
            out[name] = None
        elif name.endswith(".sum"):
            out[name] = float(sum(values))
    weights = [
        launch["metrics"].get("lts__t_sectors_srcunit_tex_op_read.sum") for launch in launches
    ]
    for name in (n for n in names if n.endswith(".pct")):
        values = [launch["metrics"].get(name) for launch in launches]
        if any(v is None for v in values):
            out[name] = None
        elif all(w for w in weights):
            out[name] = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
        else:
            out[name] = statistics.fmean(values)
    return out


def run_ncu_phase(probe: Any, args: Any, sweep: Any, shapes: Any, doc: dict[str, Any]) -> None:
    """Profile the target batches x Triton kernels under ncu while the budget allows."""
    ncu = args.ncu or shutil.which("ncu")
    doc.update(path=ncu, runs=[])
    if args.no_ncu:
        doc["error"] = "disabled by --no-ncu"
        return
    if not ncu:
        doc["error"] = "ncu not on PATH"
        return
    version = probe.run_bounded([ncu, "--version"], 20.0)
    doc["version"] = (version["stdout"] or version["stderr"]).strip()[-300:]
    doc.update(probe.ncu_available_metrics(ncu, 20.0))
    targets = ncu_targets(sweep, shapes.block_size)
    for role, kernel in NCU_ORDER:
        batch = targets[role]
        left = WATCHDOG_S - 10.0 - elapsed()
        if elapsed() > NCU_DEADLINE_S or left < 10:
            record = {"config": batch.name, "kernel": kernel, "skipped": "time budget spent"}
        else:
            record = profile_one(probe, ncu, doc["metrics"], batch, kernel, shapes, args, left)
        doc["runs"].append(record)
        summary = record.get("summary") or {}
        say(
            f"ncu {batch.name} {kernel}: L2 hit {summary.get('l2_hit_rate_pct')} %, "
            f"DRAM {summary.get('dram_read_bytes')} B {record.get('error', '')}"
            f"{record.get('skipped', '')}"
        )


def profile_one(
    probe: Any,
    ncu: str,
    metrics: Sequence[str],
    batch: Any,
    kernel: str,
    shapes: Any,
    args: Any,
    timeout_s: float,
) -> dict[str, Any]:
    """One decode step of `kernel` on `batch` under ncu: metrics summed over its launches,
    set against the bytes a paged kernel would read (logical), the unique bytes and the
    bytes this kernel reads by construction."""
    from feather.kernels.plan import make_plan
    from feather.kernels.traffic import plan_bytes

    sizes = {
        "q_heads": shapes.q_heads,
        "kv_heads": shapes.kv_heads,
        "head_dim": shapes.head_dim,
        "dtype_bytes": shapes.dtype_bytes,
    }

    def kv_bytes(name: str) -> Any:
        plan = make_plan(name, batch.tables, batch.seq_lens, shapes.block_size)
        return plan, plan_bytes(plan, batch.num_seqs, **sizes)

    plan, by_construction = kv_bytes(kernel)
    logical, unique = kv_bytes("paged")[1].kv, kv_bytes("pat")[1].kv
    launches = launches_per_step(kernel, plan)
    cmd = ncu_command(probe, ncu, metrics, batch.name, kernel, launches, args)
    run = probe.run_bounded(cmd, min(NCU_CALL_TIMEOUT_S, timeout_s))
    parsed = probe.parse_ncu_csv(run["stdout"]) or probe.parse_ncu_csv(run["stderr"])
    record: dict[str, Any] = {
        "config": batch.name,
        "kernel": kernel,
        "command": " ".join(cmd),
        "rc": run["rc"],
        "wall_s": run["wall_s"],
        "timed_out": run.get("timed_out", False),
        "launches": len(parsed),
        "expected_launches": launches,
    }
    if not parsed:
        text = run["stdout"] + "\n" + run["stderr"]
        record["error"] = "timed out" if run.get("timed_out") else "no metrics in output"
        record["error_lines"] = [
            ln for ln in text.splitlines() if "ERR_" in ln or "==ERROR==" in ln
        ][:10]
        record["stderr_tail"] = run["stderr"][-1500:]
        return record
    combined = combine_launches(parsed)
    record["metrics"] = combined
    record["per_launch"] = [p["metrics"] for p in parsed]
    record["summary"] = probe.ncu_summary(combined, logical, unique)
    dram = combined.get("dram__bytes_read.sum")
    record["summary"]["dram_over_by_construction"] = (
        dram / by_construction.total if dram is not None else None
    )
    return record


def ncu_child(args: Any) -> int:
    """Under ncu: one batch, one kernel; a warm-up step, then the profiled step."""
    import torch

    from feather.bench import kernels as bench
    from feather.kernels.decode import prepare
    from feather.kernels.paged_decode import default_scale

    sweep, shapes = bench_setup(args)
    batch = next(b for b in ncu_targets(sweep, shapes.block_size).values() if b.name == args.config)
    dev = bench.Device(torch, args.device)
    t = bench.make_tensors(dev, batch, shapes, seed=0)
    step = prepare(
        args.kernel,
        "triton",
        t["k"],
        t["v"],
        t["block_tables"],
        t["seq_lens"],
        shapes.q_heads,
        default_scale(shapes.head_dim),
    )
    q = torch.randn(t["q_shape"], generator=t["gen"], device=args.device, dtype=t["dtype"])
    for _ in range(2):
        step.step(q, None)
        dev.sync()
    print(f"ncu-child {args.config} {args.kernel}: done", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The run


def bench_setup(args: Any) -> tuple[Any, Any]:
    """The sweep and shapes `feather bench kernels` uses for this mode."""
    from dataclasses import replace

    from feather.bench import kernels as bench

    sweep = bench.select_sweep("quick" if args.quick else "full", None, None)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    shapes = (
        replace(bench.QUICK_SHAPES, dtype=dtype) if args.quick else bench.model_shapes(dtype=dtype)
    )
    return sweep, shapes


def copy_bandwidth(torch: Any, device: str) -> dict[str, Any]:
    """Device-to-device copy (bytes read + written per second), median of 10."""
    nbytes = COPY_BYTES if device == "cuda" else 1 << 24
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {"bytes": nbytes, "median_s": median, "read_plus_write_bytes_per_s": 2 * nbytes / median}


@contextlib.contextmanager
def nvml_sampling(out_dir: Path, probe: Any, record: dict[str, Any]):
    """NVML counters while the block runs, into `record` (and out_dir/nvml.parquet).

    TELEMETRY: `feather.telemetry.nvml.NvmlSampler` is the project's sampler; it needs
    pyarrow for its series. Without it, the probe's pynvml sampler (gpu/l2_probe_device.py)
    summarises instead.
    """
    try:
        from feather.telemetry.nvml import NvmlSampler
    except ImportError as exc:
        record["sampler"] = f"gpu/l2_probe.py NvmlSampler (feather.telemetry: {exc})"
        nvml, handle, info = probe.init_nvml()
        record.update(info)
        if nvml is None:
            yield
            return
        with probe.NvmlSampler(nvml, handle, period_s=0.05) as sampler:
            yield
        record["summary"] = probe.summarise_samples(sampler.samples)
        return
    record["sampler"] = "feather.telemetry.nvml.NvmlSampler"
    with NvmlSampler(out=out_dir / "nvml.parquet", interval_ms=50) as sampler:
        yield
    record.update(sampler.record)


def calibration(doc: dict[str, Any], ncu: dict[str, Any], copy: dict[str, Any]) -> dict:
    """Per hardware: Triton medians, bytes and bandwidths, and the ncu L2/DRAM figures."""
    runs = {(r["config"], r["kernel"]): r for r in ncu.get("runs", [])}
    entries = []
    for row in doc["rows"]:
        if row["implementation"] != "triton":
            continue
        entry = {
            key: row[key]
            for key in (
                "benchmark",
                "config",
                "kernel",
                "num_seqs",
                "seq_tokens",
                "median_s",
                "bytes",
                "logical_kv_bytes",
                "unique_kv_bytes",
            )
        }
        entry["effective_bytes_per_s"] = row["bytes"]["total"] / row["median_s"]
        entry["logical_bytes_per_s"] = row["logical_kv_bytes"] / row["median_s"]
        copy_bps = copy.get("read_plus_write_bytes_per_s")
        entry["effective_over_copy"] = (
            entry["effective_bytes_per_s"] / copy_bps if copy_bps else None
        )
        entry["ncu"] = (runs.get((row["config"], row["kernel"])) or {}).get("summary")
        entries.append(entry)
    return {
        "schema": "feather.kernel_calibration/1",
        "hardware": doc["device_name"],
        "device": doc["device"],
        "scale": doc["scale"],
        "copy_bandwidth": copy,
        "entries": entries,
        "ncu_available": bool(runs) and any("summary" in r for r in runs.values()),
        "provenance": doc["provenance"],
    }


def run_all(args: Any) -> int:
    import torch

    from feather.atomic import write_json_atomic
    from feather.bench import kernels as bench

    probe = _load_probe()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"errors": []}
    results = probe.Results(out_dir / "run_state.json", state)
    probe.start_watchdog(results, WATCHDOG_S)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to PyTorch (use --device cpu --quick)")
    copy = copy_bandwidth(torch, args.device)
    say(f"copy bandwidth {copy['read_plus_write_bytes_per_s'] / 1e9:.1f} GB/s")
    nvml: dict[str, Any] = {}
    with nvml_sampling(out_dir, probe, nvml):
        doc = bench.run(
            sweep_name="quick" if args.quick else "full",
            benchmarks=tuple(args.benchmarks.split(",")) if args.benchmarks else None,
            device=args.device,
            implementations=("torch", "triton"),
            dtype="float32" if args.device == "cpu" else "bfloat16",
            deadline=START + TIMING_DEADLINE_S,
            keep_going=True,
            progress=say,
            command=[sys.executable, *sys.argv],
        )
    doc["nvml"] = nvml
    write_json_atomic(out_dir / "kernels.json", doc)
    print(bench.format_table(doc["rows"]), flush=True)
    print(bench.format_summary(doc["summary"]), flush=True)
    if args.device == "cuda":
        torch.cuda.empty_cache()
    sweep, shapes = bench_setup(args)
    ncu: dict[str, Any] = {}
    try:
        run_ncu_phase(probe, args, sweep, shapes, ncu)
    except Exception as exc:
        ncu.setdefault("error", f"{type(exc).__name__}: {exc}")
    write_json_atomic(out_dir / "ncu.json", ncu)
    cal = calibration(doc, ncu, copy)
    name = f"kernel-calibration-{slug(doc['device_name'] if args.device == 'cuda' else 'cpu')}.json"
    write_json_atomic(out_dir / name, cal)
    state["finished"] = True
    results.write()
    say(f"wrote {out_dir}: kernels.json, ncu.json, {name}")
    return 0 if all(r["check_ok"] for r in doc["rows"]) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="output folder")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a logic check)")
    p.add_argument("--ncu", help="the ncu binary (default: ncu on PATH)")
    p.add_argument("--no-ncu", action="store_true", help="skip Nsight Compute")
    p.add_argument("--benchmarks", help="comma-separated subset of c1,c2,prefix,c7")
    p.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--kernel", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # `feather` from this checkout, installed or not
    if args.ncu_child:
        return ncu_child(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
