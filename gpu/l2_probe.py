#!/usr/bin/env python3
"""L2 probe: how much of a paged decode-attention kernel's KV reads reach DRAM, vs prefix sharing.

Run (repository root, on a CUDA machine with PyTorch and Triton; about 1.5-2.5 minutes, never
more than ~285 s):

    python gpu/l2_probe.py

(`python3 gpu/l2_probe.py` where the machine has no `python`; it re-runs itself under ncu with
the same interpreter, sys.executable.)
Results go to $OUT/l2_probe.json (./gpu_out/l2_probe.json when OUT is unset) and a compact table
to stdout. `python gpu/l2_probe.py --cpu-smoke` runs the same flow on the CPU with tiny shapes
and Triton's interpreter (a logic check, not a measurement).

WHY. Claim C1 of "Requests of a Feather Must Flock Together" (see ../shared/PAPER.md) says a
homogeneous decode batch (all requests share one prefix) decodes ~2x faster than a larger mixed
batch. A plain paged kernel reads a shared KV block once per sequence that holds it; only the L2
cache can turn those repeated reads into fewer DRAM bytes. The project's simulator models that
(`feather/sim/l2.py`: grid order, resident-program window, LRU L2) and predicts ~95% L2 hit
rates for homogeneous AND mixed batches on A100-class GPUs, i.e. that sharing pays whether or not
the batch is homogeneous. This probe measures it directly on one layer of Llama-3.1-8B
attention (32 query heads, 8 KV heads, head_dim 128, bf16, block size 16).

WHAT. `feather.kernels.paged_decode.paged_decode_triton`: one program per (sequence, KV head),
sequence index fastest (FA2's decode grid order), GQA-packed, blocks read in order through the
block table, no split-KV. Shared prefix blocks are the SAME physical block ids in the block
tables (block-granular sharing, as vLLM's prefix caching: the 3,900-token prefix gives 243 full
shared blocks; its last 12 tokens sit in each sequence's own first private block). Configs:
  homog_100          100 sequences, one 3,900-token prefix + 100 own tokens each
  homog_100_1div     homog_100 with one sequence (seeded position) replaced by an unshared one (C2)
  mixed_100          100 sequences from 8 prefix groups (13,13,13,13,12,12,12,12), shuffled
  mixed_800          800 sequences, 8 groups of 100 with different prefixes, shuffled (seeded)
  mixed_800_grouped  the same 800 with each group contiguous in the batch
  unshared_100/800   every sequence with its own 4,000 tokens (no reuse possible)
Per config:
  - correctness: Triton output vs the PyTorch reference (fp32 on the GPU), all of homog_100's
    sequences (the reference is timed there) and 16 seeded sequences of every other config;
  - timing: warm-ups, then TIMED_REPEATS launches timed with CUDA events, the L2 flushed before
    each by reading a buffer 4x the L2 size (reads leave clean lines: no write-backs steal DRAM
    bandwidth from the timed launch), so every launch starts cold as a real decode step does
    (each layer's weights stream through L2 between two reads of its KV);
    medians; logical KV bytes (sum of seq_len x 2 x kv_heads x head_dim x 2 bytes: every read a
    plain kernel issues), unique KV bytes (each physical block's used tokens once: the floor
    with perfect reuse), effective bandwidth = logical bytes / time and its ratio to a
    device-to-device copy measured here (a ratio above ~1 means L2 served repeated reads);
  - NVML (nvidia-ml-py): memory-controller and SM utilisation, memory/SM clocks and power
    sampled every ~20 ms on a thread while the kernel runs back to back (no flush) for ~1 s;
    mean/max per config (the back-to-back time per launch is recorded too);
  - Nsight Compute, for homog_100, mixed_800, mixed_800_grouped and unshared_100 if `ncu` works:
    this script re-runs itself (`--config NAME --ncu-mode`: one warm-up, one launch) under
    `ncu --csv --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,...` with
    `--cache-control all` (cold caches) and `--clock-control none`; L2 hit rate, DRAM bytes read,
    and DRAM bytes relative to the logical and unique bytes. Errors (no ncu, ERR_NVGPUCTRPERM,
    timeouts) are recorded, never fatal.
Also recorded: torch/triton/CUDA/driver/ncu versions, GPU name, L2 size, SM count, and the
compiled kernel's registers, spills and shared memory with an estimate of resident programs per
SM (the simulator's `window`). Every config runs in its own try/except; the JSON is rewritten
after each step; a global budget skips what would not finish inside ~285 s.

The probe's parts live beside it in gpu/: l2_probe_configs.py (the configurations and their
bytes), l2_probe_ncu.py (Nsight Compute's flags, metric query and CSV), l2_probe_device.py
(NVML sampling, the device's tensors and timers, kernel and device facts) and
l2_probe_bookkeeping.py (the time budget, bounded subprocesses, the watchdog, the results file
and the table). This file is the measurement's flow.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

GPU_DIR = Path(__file__).resolve().parent
if str(GPU_DIR) not in sys.path:
    # Loaded by path (the tests, gpu/kernel_bench.py): import the helper modules beside this
    # file by name, as `python gpu/l2_probe.py` does (Python puts a script's folder on sys.path).
    sys.path.insert(0, str(GPU_DIR))

# gpu/kernel_bench.py takes the Nsight Compute, NVML and watchdog pieces it shares through this
# module (`probe.ncu_args`, ...); tests/test_kernels_bench.py checks that it finds them all.
from l2_probe_bookkeeping import (  # noqa: E402
    NCU_CALL_TIMEOUT_S,
    NCU_DEADLINE_S,
    NCU_QUERY_TIMEOUT_S,
    SAFETY_MARGIN_S,
    TIMING_DEADLINE_S,
    TOTAL_BUDGET_S,
    Budget,
    Results,
    bandwidth_summary,
    error_record,
    format_table,
    run_bounded,
    start_watchdog,
    summarise_times,
)
from l2_probe_configs import (  # noqa: E402
    CONFIG_NAMES,
    FULL_SHAPES,
    SEED,
    SMOKE_SHAPES,
    SWEEP_NAME,
    ProbeConfig,
    build_config,
    describe_config,
)
from l2_probe_device import (  # noqa: E402
    Device,
    NvmlSampler,
    environment,
    init_nvml,
    kernel_facts,
    summarise_samples,
)
from l2_probe_ncu import (  # noqa: E402
    NCU_METRICS_REQUIRED,
    ncu_args,
    ncu_available_metrics,
    ncu_summary,
    parse_ncu_csv,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "feather.l2_probe/1"
RESULT_FILE = "l2_probe.json"
DEFAULT_OUT_DIR = "gpu_out"

WARMUP_LAUNCHES = 3
TIMED_REPEATS = 30
NVML_SUSTAIN_S = 1.0
SUSTAIN_BATCH_LAUNCHES = 32  # launches queued between two synchronisations while sampling
CHECK_SEQS = 16  # sequences checked against the reference in configs other than homog_100
CHECK_REL_TOL = 2e-2  # ||out - ref|| / ||ref|| for bf16 inputs and output

NCU_CONFIGS = ("homog_100", "mixed_800", "mixed_800_grouped", "unshared_100")


def config_name(text: str) -> str:
    """argparse type: a named configuration or a sweep_g<G>_p<P>_b<B> pattern."""
    if text in CONFIG_NAMES or SWEEP_NAME.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown config {text!r}")


# ---------------------------------------------------------------------------------------------
# Nsight Compute over this script (--config NAME --ncu-mode)
# ---------------------------------------------------------------------------------------------


def ncu_command(
    ncu: str, metrics: Sequence[str], config: str, kernel_regex: str, smoke: bool
) -> list[str]:
    """ncu over this script in single-config mode: skip the warm-up, profile the next launch."""
    cmd = [
        *ncu_args(ncu, metrics, kernel_regex, skip=1, count=1),
        sys.executable,
        str(Path(__file__).resolve()),
        "--config",
        config,
        "--ncu-mode",
    ]
    return [*cmd, "--cpu-smoke"] if smoke else cmd


def run_ncu_for_config(
    ncu: str,
    metrics: Sequence[str],
    config: str,
    kernel_regex: str,
    timeout_s: float,
    smoke: bool,
    logical: int,
    unique: int,
) -> dict[str, Any]:
    """Profile one config; return the parsed metrics and summary, or the error text."""
    cmd = ncu_command(ncu, metrics, config, kernel_regex, smoke)
    run = run_bounded(cmd, timeout_s)
    launches = parse_ncu_csv(run["stdout"]) or parse_ncu_csv(run["stderr"])
    record: dict[str, Any] = {
        "command": " ".join(cmd),
        "rc": run["rc"],
        "timed_out": run.get("timed_out", False),
        "wall_s": run["wall_s"],
    }
    if launches:
        record["kernel"] = launches[0]["kernel"]
        record["metrics"] = launches[0]["metrics"]
        record["units"] = launches[0]["units"]
        record["summary"] = ncu_summary(launches[0]["metrics"], logical, unique)
        if len(launches) > 1:
            record["extra_launches"] = len(launches) - 1
    else:
        text = run["stdout"] + "\n" + run["stderr"]
        hints = [ln for ln in text.splitlines() if "ERR_" in ln or "==ERROR==" in ln]
        record["error"] = run.get("error") or (
            "timed out" if run.get("timed_out") else "no metrics in ncu output"
        )
        record["error_lines"] = hints[:10]
        record["stdout_tail"] = run["stdout"][-1500:]
        record["stderr_tail"] = run["stderr"][-1500:]
    return record


# ---------------------------------------------------------------------------------------------
# NVML sampling
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# One configuration's measurement (torch imported lazily, by Device)
# ---------------------------------------------------------------------------------------------


def check_correctness(
    dev: Device, t: dict[str, Any], out: Any, config: ProbeConfig, scale: float, full: bool
) -> dict[str, Any]:
    """Triton output vs the PyTorch reference on all (full) or CHECK_SEQS seeded sequences."""
    from feather.kernels.paged_decode import paged_decode_reference

    torch = dev.torch
    if full:
        idx = list(range(config.num_seqs))
    else:
        idx = sorted(
            random.Random(f"check:{config.name}").sample(
                range(config.num_seqs), min(CHECK_SEQS, config.num_seqs)
            )
        )
    index = torch.tensor(idx, dtype=torch.long, device=dev.dev)
    dev.sync()
    t0 = time.perf_counter()
    ref = paged_decode_reference(
        t["q"][index], t["k"], t["v"], t["block_tables"][index], t["seq_lens"][index], scale
    )
    dev.sync()
    ref_s = time.perf_counter() - t0
    got = out[index].to(ref.dtype)
    diff = (got - ref).abs()
    rel = (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()
    finite = bool(torch.isfinite(got).all().item())
    return {
        "sequences_checked": len(idx),
        "max_abs_err": diff.max().item(),
        "rel_l2_err": rel,
        "all_finite": finite,
        "ok": finite and rel < CHECK_REL_TOL,
        "tolerance_rel": CHECK_REL_TOL,
        "reference_wall_s": ref_s,
        "reference_dtype": str(ref.dtype),
    }


def measure_config(
    dev: Device,
    config: ProbeConfig,
    copy_bps: float | None,
    nvml: tuple[Any, Any] | None,
    record: dict[str, Any],
    kernel_info: dict[str, Any],
    repeats: int,
    warmups: int,
    sustain_s: float,
) -> None:
    """Correctness, timed launches and NVML samples for one config, into `record`."""
    from feather.kernels.paged_decode import default_scale, paged_decode_triton_launch

    torch, shapes = dev.torch, dev.shapes
    scale = default_scale(shapes.head_dim)
    t = dev.tensors(config, seed=SEED)
    out = torch.empty_like(t["q"])

    def launch() -> object:
        return paged_decode_triton_launch(
            t["q"], t["k"], t["v"], t["block_tables"], t["seq_lens"], scale, out=out
        )[1]

    t0 = time.perf_counter()
    handle = launch()
    dev.sync()
    record["first_launch_wall_s"] = time.perf_counter() - t0  # includes any JIT compile
    if not kernel_info:
        kernel_info.update(kernel_facts(handle, torch, dev.smoke, shapes))
    for _ in range(max(0, warmups - 1)):
        launch()
    out.fill_(float("nan"))
    launch()
    dev.sync()
    record["correctness"] = check_correctness(
        dev, t, out, config, scale, full=config.name == "homog_100"
    )

    times = dev.time_launches(launch, repeats, flush=True)
    record["timing"] = summarise_times(times)
    record["timing"]["times_ms"] = [round(x, 6) for x in times]
    record["timing"]["flushed_l2_before_each"] = dev.flush_buf is not None
    struct = record["structure"]
    record["bandwidth"] = bandwidth_summary(
        struct["logical_kv_bytes"],
        struct["unique_kv_bytes"],
        record["timing"]["median_ms"],
        copy_bps,
    )
    if kernel_info.get("resident_programs_per_sm_estimate") and not dev.smoke:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        window = kernel_info["resident_programs_per_sm_estimate"] * sms
        record["waves_estimate"] = struct["programs"] / window

    if nvml is None or sustain_s <= 0:
        return
    launches = 0
    with NvmlSampler(*nvml) as sampler:
        dev.sync()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < sustain_s:
            for _ in range(SUSTAIN_BATCH_LAUNCHES):
                launch()
            launches += SUSTAIN_BATCH_LAUNCHES
            dev.sync()
        wall = time.perf_counter() - t0
    record["nvml"] = summarise_samples(sampler.samples)
    record["nvml"]["errors"] = sorted(sampler.errors)[:5]
    record["sustained_back_to_back"] = {
        "launches": launches,
        "wall_s": wall,
        "ms_per_launch": wall * 1e3 / max(1, launches),
        "note": "no L2 flush between launches: each starts with the previous one's lines",
    }


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def ncu_child(config_name: str, smoke: bool) -> int:
    """--ncu-mode: build one config, one warm-up launch, one profiled launch, nothing else."""
    from feather.kernels.paged_decode import default_scale, paged_decode_triton_launch

    shapes = SMOKE_SHAPES if smoke else FULL_SHAPES
    dev = Device(smoke, shapes)
    dev.flush_buf = None  # ncu flushes caches itself (--cache-control all)
    config = build_config(config_name, shapes)
    t = dev.tensors(config, seed=SEED)
    scale = default_scale(shapes.head_dim)
    for _ in range(2):  # warm-up (skipped by --launch-skip 1), then the profiled launch
        paged_decode_triton_launch(t["q"], t["k"], t["v"], t["block_tables"], t["seq_lens"], scale)
        dev.sync()
    print(f"ncu-mode {config_name}: done", flush=True)
    return 0


def run_probe(args: argparse.Namespace) -> int:
    """The whole measurement; returns 0 unless the results file could not be written."""
    smoke = args.cpu_smoke
    shapes = SMOKE_SHAPES if smoke else FULL_SHAPES
    budget = Budget()
    out_dir = Path(args.out or os.environ.get("OUT") or DEFAULT_OUT_DIR)
    results = Results(
        out_dir / RESULT_FILE,
        {
            "schema": SCHEMA,
            "mode": "cpu-smoke" if smoke else "gpu",
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
            "seed": SEED,
            "shapes": asdict(shapes),
            "budget_s": {
                "total": TOTAL_BUDGET_S,
                "timing_deadline": TIMING_DEADLINE_S,
                "ncu_deadline": NCU_DEADLINE_S,
            },
            "configs": {},
            "errors": [],
        },
    )
    data = results.data
    start_watchdog(results)
    names = args.configs or list(CONFIG_NAMES)
    repeats = 3 if smoke else TIMED_REPEATS
    warmups = 1 if smoke else WARMUP_LAUNCHES
    sustain_s = 0.0 if smoke else NVML_SUSTAIN_S

    nvml_mod, nvml_handle, nvml_info = init_nvml()
    data["nvml"] = nvml_info
    nvml = (nvml_mod, nvml_handle) if nvml_mod is not None else None
    try:
        data["environment"] = environment(smoke, nvml_info)
    except Exception as exc:
        data["errors"].append({"stage": "environment", **error_record(exc)})
    results.write()

    dev = None
    try:
        dev = Device(smoke, shapes)
        data["copy_bandwidth"] = dev.copy_bandwidth()
    except Exception as exc:
        data["errors"].append({"stage": "device/copy_bandwidth", **error_record(exc)})
    results.write()
    copy_bps = (data.get("copy_bandwidth") or {}).get("read_plus_write_bytes_per_s")

    kernel_info: dict[str, Any] = {}
    data["kernel"] = kernel_info
    structures: dict[str, dict[str, Any]] = {}
    for name in names:
        record: dict[str, Any] = {}
        data["configs"][name] = record
        try:
            config = build_config(name, shapes)
            record["structure"] = structures[name] = describe_config(config, shapes)
            if dev is None:
                raise RuntimeError("device setup failed (see errors)")
            if not budget.before(TIMING_DEADLINE_S):
                record["skipped"] = f"timing deadline {TIMING_DEADLINE_S:.0f} s passed"
                continue
            began = time.perf_counter()
            measure_config(
                dev, config, copy_bps, nvml, record, kernel_info, repeats, warmups, sustain_s
            )
            record["wall_s"] = time.perf_counter() - began
        except Exception as exc:
            record.update(error_record(exc))
        finally:
            if dev is not None and not smoke:
                with contextlib.suppress(Exception):
                    dev.torch.cuda.empty_cache()
            results.write()
            print(f"[{budget.elapsed():6.1f}s] {name}: {_one_line(record)}", flush=True)

    if dev is not None:
        dev.flush_buf = None
        with contextlib.suppress(Exception):
            if not smoke:
                dev.torch.cuda.empty_cache()
    run_ncu_phase(args, data, results, budget, structures, smoke)
    data["finished_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    results.write()
    print(format_table(data), flush=True)
    print(f"results: {results.path} ({budget.elapsed():.1f} s)", flush=True)
    return 0


def run_ncu_phase(
    args: argparse.Namespace,
    data: dict[str, Any],
    results: Results,
    budget: Budget,
    structures: dict[str, dict[str, Any]],
    smoke: bool,
) -> None:
    """Profile NCU_CONFIGS under Nsight Compute while the budget allows; record every error."""
    from feather.kernels.paged_decode import TRITON_KERNEL_NAME

    shapes = SMOKE_SHAPES if smoke else FULL_SHAPES
    ncu = args.ncu or shutil.which("ncu")
    info: dict[str, Any] = {"path": ncu, "runs": {}}
    data["ncu"] = info
    if args.no_ncu:
        info["error"] = "disabled by --no-ncu"
        return
    if not ncu:
        info["error"] = "ncu not on PATH"
        return
    try:
        version = run_bounded([ncu, "--version"], 20.0)
        info["version"] = (version["stdout"] or version["stderr"]).strip()[-300:]
        info.update(ncu_available_metrics(ncu, min(NCU_QUERY_TIMEOUT_S, budget.remaining() / 4)))
    except Exception as exc:
        info["error"] = error_record(exc)["error"]
        info["metrics"] = list(NCU_METRICS_REQUIRED)
    results.write()
    for name in args.ncu_configs:
        if not budget.before(NCU_DEADLINE_S):
            info["runs"][name] = {"skipped": f"ncu deadline {NCU_DEADLINE_S:.0f} s passed"}
            continue
        timeout = min(NCU_CALL_TIMEOUT_S, budget.remaining() - SAFETY_MARGIN_S)
        if timeout < 10:
            info["runs"][name] = {"skipped": "too little of the time budget left"}
            continue
        try:
            struct = structures.get(name) or describe_config(build_config(name, shapes), shapes)
            info["runs"][name] = run_ncu_for_config(
                ncu,
                info["metrics"],
                name,
                TRITON_KERNEL_NAME,
                timeout,
                smoke,
                struct["logical_kv_bytes"],
                struct["unique_kv_bytes"],
            )
        except Exception as exc:
            info["runs"][name] = error_record(exc)
        results.write()
        print(f"[{budget.elapsed():6.1f}s] ncu {name}: {_one_line(info['runs'][name])}", flush=True)


def _one_line(record: dict[str, Any]) -> str:
    if record.get("error"):
        return f"ERROR {record['error']}"
    if record.get("skipped"):
        return f"skipped ({record['skipped']})"
    if "summary" in record:
        s = record["summary"]
        return f"L2 hit {s.get('l2_hit_rate_pct')} %, DRAM read {s.get('dram_read_bytes')} B"
    timing = record.get("timing") or {}
    check = record.get("correctness") or {}
    return f"median {timing.get('median_ms')} ms, check rel err {check.get('rel_l2_err')}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, CPU, Triton interpreter")
    p.add_argument("--out", help="output folder (default: $OUT, else ./gpu_out)")
    p.add_argument("--config", help="with --ncu-mode: the one config to launch")
    p.add_argument("--ncu-mode", action="store_true", help="child run under ncu (internal)")
    p.add_argument("--configs", nargs="*", type=config_name, help="configs to time")
    p.add_argument("--ncu", help="path of the ncu binary (default: ncu on PATH)")
    p.add_argument(
        "--ncu-configs",
        nargs="*",
        type=config_name,
        default=list(NCU_CONFIGS),
        help="configs to profile under ncu (default: %(default)s)",
    )
    p.add_argument("--no-ncu", action="store_true", help="skip the Nsight Compute phase")
    return p.parse_args(argv)


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(None if argv is None else list(argv))
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # `feather` from this checkout, installed or not
    if args.ncu_mode:
        if not args.config:
            raise SystemExit("--ncu-mode needs --config NAME")
        return ncu_child(args.config, args.cpu_smoke)
    return run_probe(args)


if __name__ == "__main__":
    sys.exit(main())
