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
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCRIPT_START_S = time.monotonic()
REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "feather.l2_probe/1"
RESULT_FILE = "l2_probe.json"
DEFAULT_OUT_DIR = "gpu_out"
SEED = 20260511

# Time budget (seconds since the script started); the whole run must end within 300 s.
TOTAL_BUDGET_S = 285.0
TIMING_DEADLINE_S = 150.0  # no new timing config starts after this
NCU_DEADLINE_S = 240.0  # no new ncu run starts after this
NCU_CALL_TIMEOUT_S = 75.0
NCU_QUERY_TIMEOUT_S = 30.0
SAFETY_MARGIN_S = 5.0
WATCHDOG_S = 292.0  # a hung step: write what there is, end our ncu child, exit 124

WARMUP_LAUNCHES = 3
TIMED_REPEATS = 30
NVML_PERIOD_S = 0.02
NVML_SUSTAIN_S = 1.0
SUSTAIN_BATCH_LAUNCHES = 32  # launches queued between two synchronisations while sampling
COPY_BYTES = 2 * 1024**3
COPY_REPEATS = 20
FLUSH_L2_MULTIPLE = 4  # the L2 flush buffer is this many times the L2 size
FLUSH_MIN_BYTES = 256 * 1024**2
CHECK_SEQS = 16  # sequences checked against the reference in configs other than homog_100
CHECK_REL_TOL = 2e-2  # ||out - ref|| / ||ref|| for bf16 inputs and output

CONFIG_NAMES = (
    "homog_100",
    "homog_100_1div",
    "mixed_100",
    "mixed_800",
    "mixed_800_grouped",
    "unshared_100",
    "unshared_800",
)
NCU_CONFIGS = ("homog_100", "mixed_800", "mixed_800_grouped", "unshared_100")
SWEEP_NAME = re.compile(r"sweep_g(\d+)_p(\d+)_b(\d+)")


def config_name(text: str) -> str:
    """argparse type: a named configuration or a sweep_g<G>_p<P>_b<B> pattern."""
    if text in CONFIG_NAMES or SWEEP_NAME.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown config {text!r}")


NCU_METRICS_REQUIRED = (
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
)
# Added only when `ncu --query-metrics` lists them (an unknown metric fails the whole ncu run).
NCU_METRICS_OPTIONAL = (
    "lts__t_sector_op_read_hit_rate.pct",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
)
_NCU_UNIT_SCALE = {  # ncu's decimal units, in case --print-units base is ignored
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "sector": 1.0,
    "ksector": 1e3,
    "msector": 1e6,
    "gsector": 1e9,
    "ns": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "nsecond": 1.0,
    "second": 1e9,
}


# ---------------------------------------------------------------------------------------------
# Configurations (pure Python: block tables and sequence lengths)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeShapes:
    """Attention shapes and workload sizes of one probe run."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # "bfloat16", "float16" or "float32"
    prefix_tokens: int  # shared prefix per group
    own_tokens: int  # each group member's own tokens after the prefix
    unshared_tokens: int  # an unshared sequence's length
    batch_small: int  # the "100" of the config names
    num_groups: int  # the "8" prefix groups

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes


# Llama-3.1-8B, one layer, bf16, vLLM's GPU block size.
FULL_SHAPES = ProbeShapes(
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
    dtype="bfloat16",
    prefix_tokens=3900,
    own_tokens=100,
    unshared_tokens=4000,
    batch_small=100,
    num_groups=8,
)
# --cpu-smoke: the same flow in seconds under Triton's interpreter (partial last blocks, GQA 2).
SMOKE_SHAPES = ProbeShapes(
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    dtype="bfloat16",
    prefix_tokens=30,
    own_tokens=5,
    unshared_tokens=35,
    batch_small=8,
    num_groups=4,
)


@dataclass
class ProbeConfig:
    """One batch of decode queries over a paged KV pool (block ids index the pool)."""

    name: str
    block_tables: list[list[int]]
    seq_lens: list[int]
    groups: list[int]  # prefix group of each sequence; -1: no shared prefix
    num_blocks: int  # physical pool size (ids 0..num_blocks-1, all used)
    description: str

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_blocks(self) -> int:
        return max(len(t) for t in self.block_tables)

    def padded_tables(self, pad_id: int = 0) -> list[list[int]]:
        """Rows padded to max_blocks (the kernel never reads past a sequence's length)."""
        width = self.max_blocks
        return [row + [pad_id] * (width - len(row)) for row in self.block_tables]


class _BlockAllocator:
    """Hands out physical block ids in order, as a fresh vLLM block pool does."""

    def __init__(self) -> None:
        self.next_id = 0

    def take(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _group_sequences(alloc: _BlockAllocator, shapes: ProbeShapes, count: int) -> list[list[int]]:
    """`count` sequences sharing one new prefix: its full blocks shared, the rest private."""
    shared = alloc.take(shapes.prefix_tokens // shapes.block_size)
    total = _blocks_for(shapes.prefix_tokens + shapes.own_tokens, shapes.block_size)
    return [shared + alloc.take(total - len(shared)) for _ in range(count)]


def _unshared_sequences(alloc: _BlockAllocator, shapes: ProbeShapes, count: int) -> list[list[int]]:
    return [
        alloc.take(_blocks_for(shapes.unshared_tokens, shapes.block_size)) for _ in range(count)
    ]


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of `parts` groups summing to `total`, the larger ones first (100/8: 13 x4, 12 x4)."""
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def build_config(name: str, shapes: ProbeShapes = FULL_SHAPES, seed: int = SEED) -> ProbeConfig:
    """Block tables and lengths of a named configuration (deterministic in `seed`)."""
    rng = random.Random(f"{seed}:{name}")
    alloc = _BlockAllocator()
    member_len = shapes.prefix_tokens + shapes.own_tokens
    small, n_groups = shapes.batch_small, shapes.num_groups
    rows: list[tuple[list[int], int, int]] = []  # (block table, seq_len, group)

    def add_groups(sizes: Sequence[int]) -> None:
        for group, size in enumerate(sizes):
            rows.extend((t, member_len, group) for t in _group_sequences(alloc, shapes, size))

    def add_unshared(count: int) -> None:
        rows.extend(
            (t, shapes.unshared_tokens, -1) for t in _unshared_sequences(alloc, shapes, count)
        )

    if name == "homog_100":
        add_groups([small])
        text = f"{small} sequences sharing one {shapes.prefix_tokens}-token prefix"
    elif name == "homog_100_1div":
        add_groups([small - 1])
        add_unshared(1)
        divergent = rows.pop()
        position = rng.randrange(small)
        rows.insert(position, divergent)
        text = f"homog_100 with the sequence at index {position} unshared"
    elif name == "mixed_100":
        add_groups(split_evenly(small, n_groups))
        rng.shuffle(rows)
        text = f"{small} sequences from {n_groups} prefix groups, shuffled"
    elif name in ("mixed_800", "mixed_800_grouped"):
        add_groups([small] * n_groups)
        if name == "mixed_800":
            rng.shuffle(rows)
            text = f"{n_groups} groups of {small}, shuffled"
        else:
            text = f"{n_groups} groups of {small}, each group contiguous"
    elif name == "unshared_100":
        add_unshared(small)
        text = f"{small} sequences of {shapes.unshared_tokens} own tokens"
    elif name == "unshared_800":
        add_unshared(small * n_groups)
        text = f"{small * n_groups} sequences of {shapes.unshared_tokens} own tokens"
    elif (sweep := SWEEP_NAME.fullmatch(name)) is not None:
        # sweep_g{G}_p{P}_b{B}: B sequences in G groups sharing P-token prefixes, shuffled
        n_groups, prefix, batch = (int(x) for x in sweep.groups())
        shapes = replace(shapes, prefix_tokens=prefix)
        member_len = prefix + shapes.own_tokens
        add_groups(split_evenly(batch, n_groups))
        rng.shuffle(rows)
        text = f"{batch} sequences in {n_groups} groups sharing {prefix}-token prefixes, shuffled"
    else:
        raise ValueError(
            f"unknown config {name!r}; known: {', '.join(CONFIG_NAMES)}, "
            "or sweep_g<groups>_p<prefix tokens>_b<sequences>"
        )
    return ProbeConfig(
        name=name,
        block_tables=[r[0] for r in rows],
        seq_lens=[r[1] for r in rows],
        groups=[r[2] for r in rows],
        num_blocks=alloc.next_id,
        description=text,
    )


# ---------------------------------------------------------------------------------------------
# Bookkeeping (pure Python)
# ---------------------------------------------------------------------------------------------


def logical_kv_bytes(config: ProbeConfig, shapes: ProbeShapes) -> int:
    """Every K and V byte a plain paged kernel reads (shared blocks once per sequence)."""
    return sum(config.seq_lens) * shapes.kv_bytes_per_token


def unique_kv_bytes(config: ProbeConfig, shapes: ProbeShapes) -> int:
    """K and V bytes of the distinct tokens read: the DRAM floor with perfect reuse."""
    used: dict[int, int] = {}
    for table, seq_len in zip(config.block_tables, config.seq_lens, strict=True):
        for i, block in enumerate(table[: _blocks_for(seq_len, shapes.block_size)]):
            tokens = min(shapes.block_size, seq_len - i * shapes.block_size)
            used[block] = max(used.get(block, 0), tokens)
    return sum(used.values()) * shapes.kv_bytes_per_token


def describe_config(config: ProbeConfig, shapes: ProbeShapes) -> dict[str, Any]:
    """What the JSON records about a configuration's structure."""
    group_sizes: dict[int, int] = {}
    for g in config.groups:
        group_sizes[g] = group_sizes.get(g, 0) + 1
    return {
        "description": config.description,
        "num_seqs": config.num_seqs,
        "num_blocks": config.num_blocks,
        "max_blocks": config.max_blocks,
        "seq_lens_total_tokens": sum(config.seq_lens),
        "group_sizes": {str(k): v for k, v in sorted(group_sizes.items())},
        "group_order_head": config.groups[:32],
        "programs": config.num_seqs * shapes.num_kv_heads,
        "logical_kv_bytes": logical_kv_bytes(config, shapes),
        "unique_kv_bytes": unique_kv_bytes(config, shapes),
        "q_bytes": config.num_seqs * shapes.num_q_heads * shapes.head_dim * shapes.dtype_bytes,
    }


def summarise_times(times_ms: Sequence[float]) -> dict[str, float | int]:
    """Median and spread of repeated launch times."""
    ordered = sorted(times_ms)
    n = len(ordered)
    return {
        "n": n,
        "median_ms": statistics.median(ordered),
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[math.ceil(0.9 * (n - 1))],
    }


def bandwidth_summary(
    logical_bytes: int, unique_bytes: int, median_ms: float, copy_bytes_per_s: float | None
) -> dict[str, float | None]:
    """Effective bandwidths of one config and their ratio to the measured copy bandwidth."""
    seconds = median_ms / 1e3
    effective = logical_bytes / seconds
    return {
        "effective_bytes_per_s": effective,
        "unique_bytes_per_s": unique_bytes / seconds,
        "ratio_to_copy": effective / copy_bytes_per_s if copy_bytes_per_s else None,
        "unique_ratio_to_copy": (unique_bytes / seconds) / copy_bytes_per_s
        if copy_bytes_per_s
        else None,
    }


def summarise_samples(samples: Sequence[dict[str, float | None]]) -> dict[str, Any]:
    """Mean and max of each sampled NVML quantity (None readings left out)."""
    keys = sorted({k for s in samples for k in s if k != "t_s"})
    out: dict[str, Any] = {"samples": len(samples)}
    for key in keys:
        values = [s[key] for s in samples if s.get(key) is not None]
        out[key] = (
            {"mean": statistics.fmean(values), "max": max(values), "n": len(values)}
            if values
            else None
        )
    return out


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Kernel launches and their metrics (base units) from `ncu --csv` output.

    Lines before the CSV header (the program's own output, ==PROF== notes) are skipped; each
    launch ID becomes one dict {"id", "kernel", "metrics": {name: value}, "units": {...}}.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(ln for ln in lines[start:] if ln.startswith('"'))))
    launches: dict[str, dict[str, Any]] = {}
    for row in rows:
        name, raw = row.get("Metric Name"), row.get("Metric Value")
        if not name or raw is None:
            continue
        entry = launches.setdefault(
            row.get("ID", "?"),
            {"id": row.get("ID"), "kernel": row.get("Kernel Name"), "metrics": {}, "units": {}},
        )
        unit = (row.get("Metric Unit") or "").strip()
        value = _ncu_number(raw)
        scale = _NCU_UNIT_SCALE.get(unit.lower(), 1.0)
        entry["metrics"][name] = value * scale if value is not None else None
        entry["units"][name] = unit
    return list(launches.values())


def _ncu_number(raw: str) -> float | None:
    cleaned = raw.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def ncu_summary(metrics: dict[str, float | None], logical: int, unique: int) -> dict[str, Any]:
    """L2 hit rate and DRAM bytes, against what no reuse and perfect reuse would read."""
    dram = metrics.get("dram__bytes_read.sum")
    out: dict[str, Any] = {
        "l2_hit_rate_pct": metrics.get("lts__t_sector_hit_rate.pct"),
        "l2_read_hit_rate_pct": metrics.get("lts__t_sector_op_read_hit_rate.pct"),
        "dram_read_bytes": dram,
        "l2_tex_read_bytes": _sectors_to_bytes(
            metrics.get("lts__t_sectors_srcunit_tex_op_read.sum")
        ),
    }
    if dram is not None:
        out["dram_over_logical"] = dram / logical if logical else None
        out["dram_over_unique"] = dram / unique if unique else None
        # 1: DRAM read only the unique bytes; 0: every logical read went to DRAM.
        out["reuse_captured"] = (logical - dram) / (logical - unique) if logical > unique else None
    return out


def _sectors_to_bytes(sectors: float | None) -> float | None:
    return None if sectors is None else sectors * 32.0  # an L2 sector is 32 bytes


class Budget:
    """Seconds since the script started, against the deadlines above."""

    def __init__(self, start_s: float = SCRIPT_START_S, total_s: float = TOTAL_BUDGET_S) -> None:
        self.start_s = start_s
        self.total_s = total_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start_s

    def remaining(self) -> float:
        return self.total_s - self.elapsed()

    def before(self, deadline_s: float) -> bool:
        return self.elapsed() < deadline_s


class Results:
    """The JSON document, rewritten atomically after every step."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def write(self) -> None:
        self.data["elapsed_s"] = time.monotonic() - SCRIPT_START_S
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def start_watchdog(results: Results, deadline_s: float = WATCHDOG_S) -> threading.Thread:
    """If the run is still going at `deadline_s`, save the results, end the ncu child we are
    waiting on (its process group, by id) and exit 124: the 5-minute limit holds even if a
    launch hangs."""

    def fire() -> None:
        time.sleep(max(0.0, deadline_s - (time.monotonic() - SCRIPT_START_S)))
        for pid in list(_ACTIVE_CHILD_PIDS):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            results.data["errors"].append(
                {"stage": "watchdog", "error": f"still running at {deadline_s:.0f} s; stopped"}
            )
            results.data["watchdog_fired"] = True
            results.write()
        print(f"watchdog: stopped at {deadline_s:.0f} s; partial results written", flush=True)
        os._exit(124)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


def error_record(exc: BaseException) -> dict[str, str]:
    """An exception as JSON: type, message and the traceback's end."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}", "traceback_tail": tb[-2000:]}


def format_table(data: dict[str, Any]) -> str:
    """The compact stdout table: one line per config."""
    head = (
        f"{'config':<18} {'seqs':>5} {'logicalGB':>9} {'uniqMB':>8} {'med_ms':>8} "
        f"{'effTB/s':>8} {'xcopy':>6} {'L2hit%':>7} {'dramGB':>7} {'dram/log':>8} {'check':>6}"
    )
    lines = [head]
    ncu_runs = data.get("ncu", {}).get("runs", {})
    for name, rec in data.get("configs", {}).items():
        struct = rec.get("structure", {})
        timing = rec.get("timing") or {}
        bw = rec.get("bandwidth") or {}
        ncu = (ncu_runs.get(name) or {}).get("summary") or {}
        check = rec.get("correctness") or {}
        ok = check.get("ok")
        lines.append(
            f"{name:<18} {struct.get('num_seqs', 0):>5} "
            f"{_fmt(struct.get('logical_kv_bytes'), 1e9, 9, 3)} "
            f"{_fmt(struct.get('unique_kv_bytes'), 1e6, 8, 1)} "
            f"{_fmt(timing.get('median_ms'), 1, 8, 3)} "
            f"{_fmt(bw.get('effective_bytes_per_s'), 1e12, 8, 2)} "
            f"{_fmt(bw.get('ratio_to_copy'), 1, 6, 2)} "
            f"{_fmt(ncu.get('l2_hit_rate_pct'), 1, 7, 1)} "
            f"{_fmt(ncu.get('dram_read_bytes'), 1e9, 7, 3)} "
            f"{_fmt(ncu.get('dram_over_logical'), 1, 8, 3)} "
            f"{'-' if ok is None else ('ok' if ok else 'FAIL'):>6}"
            + (f"  ERROR {rec['error']}" if rec.get("error") else "")
        )
    return "\n".join(lines)


def _fmt(value: float | None, divisor: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value / divisor:>{width}.{digits}f}"


# ---------------------------------------------------------------------------------------------
# Nsight Compute (subprocess; no torch needed here)
# ---------------------------------------------------------------------------------------------


def ncu_args(
    ncu: str, metrics: Sequence[str], kernel_regex: str, skip: int, count: int
) -> list[str]:
    """Nsight Compute's flags, before the profiled command (gpu/kernel_bench.py uses them too):
    CSV in base units, `count` launches of matching kernels after `skip`, caches flushed
    between them, clocks left as the GPU sets them."""
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--metrics",
        ",".join(metrics),
        "--kernel-name",
        f"regex:{kernel_regex}",
        "--launch-skip",
        str(skip),
        "--launch-count",
        str(count),
        "--cache-control",
        "all",
        "--clock-control",
        "none",
    ]


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


_ACTIVE_CHILD_PIDS: set[int] = set()  # process groups run_bounded started and still waits on


def run_bounded(cmd: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run a command in its own process group; on timeout kill that group (ours alone)."""
    began = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return {
            "rc": None,
            "error": f"could not start: {exc}",
            "wall_s": 0.0,
            "stdout": "",
            "stderr": "",
        }
    _ACTIVE_CHILD_PIDS.add(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, timeout_s))
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    finally:
        _ACTIVE_CHILD_PIDS.discard(proc.pid)
    return {
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": time.monotonic() - began,
        "stdout": stdout or "",
        "stderr": stderr or "",
    }


def ncu_available_metrics(ncu: str, timeout_s: float = NCU_QUERY_TIMEOUT_S) -> dict[str, Any]:
    """Required metrics plus the optional ones `ncu --query-metrics` lists for this GPU."""
    run = run_bounded([ncu, "--query-metrics"], timeout_s)
    listing = run["stdout"] + run["stderr"]
    found = [m for m in NCU_METRICS_OPTIONAL if m.rsplit(".", 1)[0] in listing]
    if run["rc"] != 0:
        found = []
    return {
        "metrics": [*NCU_METRICS_REQUIRED, *found],
        "query_rc": run["rc"],
        "query_tail": "" if run["rc"] == 0 else listing[-800:],
    }


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


class NvmlSampler:
    """Samples memory/SM utilisation, clocks and power every `period_s` on a daemon thread."""

    def __init__(self, nvml: Any, handle: Any, period_s: float = NVML_PERIOD_S) -> None:
        self.nvml, self.handle, self.period_s = nvml, handle, period_s
        self.samples: list[dict[str, float | None]] = []
        self.errors: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _read(self, fn: Callable[[], float]) -> float | None:
        try:
            return float(fn())
        except Exception as exc:  # one unsupported query must not stop the others
            self.errors.add(f"{type(exc).__name__}: {exc}")
            return None

    def _loop(self) -> None:
        nvml, h = self.nvml, self.handle
        t0 = time.monotonic()
        while not self._stop.is_set():
            util = None
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(h)
            except Exception as exc:
                self.errors.add(f"utilization: {type(exc).__name__}: {exc}")
            self.samples.append(
                {
                    "t_s": time.monotonic() - t0,
                    "mem_util_pct": None if util is None else float(util.memory),
                    "sm_util_pct": None if util is None else float(util.gpu),
                    "mem_clock_mhz": self._read(
                        lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
                    ),
                    "sm_clock_mhz": self._read(
                        lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
                    ),
                    "power_w": self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                }
            )
            self._stop.wait(self.period_s)


def init_nvml() -> tuple[Any, Any, dict[str, Any]]:
    """(pynvml module, device handle, info) or (None, None, info with the error)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info: dict[str, Any] = {"available": True}
        with contextlib.suppress(Exception):
            info["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(Exception):
            info["device_name"] = _text(pynvml.nvmlDeviceGetName(handle))
        with contextlib.suppress(Exception):
            info["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
        return pynvml, handle, info
    except Exception as exc:
        return None, None, {"available": False, **error_record(exc)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------------------------------------
# Device work (torch imported here, lazily)
# ---------------------------------------------------------------------------------------------


class Device:
    """The device-specific pieces: tensors, timers, the L2 flush."""

    def __init__(self, smoke: bool, shapes: ProbeShapes) -> None:
        import torch

        self.torch = torch
        self.smoke = smoke
        self.shapes = shapes
        if not smoke and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to PyTorch (use --cpu-smoke on a CPU)")
        self.dev = torch.device("cpu" if smoke else "cuda")
        self.dtype = getattr(torch, shapes.dtype)
        self.flush_buf = None
        self.flush_sink = None
        if not smoke:
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            n = max(FLUSH_L2_MULTIPLE * l2, FLUSH_MIN_BYTES) // 4
            self.flush_buf = torch.ones(n, dtype=torch.int32, device=self.dev)

    def sync(self) -> None:
        if not self.smoke:
            self.torch.cuda.synchronize()

    def flush_l2(self) -> None:
        """Read a buffer several times the L2: evicts every KV line and leaves no dirty line."""
        if self.flush_buf is not None:
            self.flush_sink = self.flush_buf.sum()

    def time_launches(
        self, launch: Callable[[], object], repeats: int, flush: bool = True
    ) -> list[float]:
        """Per-launch milliseconds (CUDA events on the GPU, perf_counter on the CPU)."""
        torch = self.torch
        if self.smoke:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                launch()
                times.append((time.perf_counter() - t0) * 1e3)
            return times
        pairs = []
        for _ in range(3 if flush else 0):  # queue GPU work ahead: no host gap in the first pair
            self.flush_l2()
        for _ in range(repeats):
            if flush:
                self.flush_l2()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in pairs]

    def tensors(self, config: ProbeConfig, seed: int) -> dict[str, Any]:
        """Random q and KV pool (never zeros), block tables and lengths on the device."""
        torch, s = self.torch, self.shapes
        gen = torch.Generator(device=self.dev).manual_seed(seed)
        kv_shape = (config.num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
        kw = {"dtype": self.dtype, "device": self.dev, "generator": gen}
        return {
            "q": torch.randn(config.num_seqs, s.num_q_heads, s.head_dim, **kw),
            "k": torch.randn(kv_shape, **kw),
            "v": torch.randn(kv_shape, **kw),
            "block_tables": torch.tensor(
                config.padded_tables(), dtype=torch.int32, device=self.dev
            ),
            "seq_lens": torch.tensor(config.seq_lens, dtype=torch.int32, device=self.dev),
        }

    def copy_bandwidth(self) -> dict[str, Any]:
        """Device-to-device copy of COPY_BYTES (median), counting bytes read plus written."""
        torch = self.torch
        nbytes = COPY_BYTES if not self.smoke else 64 * 1024**2
        src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=self.dev)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        self.sync()
        times = self.time_launches(lambda: dst.copy_(src), COPY_REPEATS, flush=False)
        sum_times = self.time_launches(
            lambda: torch.sum(src, dtype=torch.float32), COPY_REPEATS, flush=False
        )
        med = statistics.median(times)
        med_sum = statistics.median(sum_times)
        return {
            "bytes": nbytes,
            "median_ms": med,
            "read_plus_write_bytes_per_s": 2 * nbytes / (med / 1e3),
            "read_bytes_per_s": nbytes / (med / 1e3),
            "sum_read_median_ms": med_sum,
            "sum_read_bytes_per_s": nbytes / (med_sum / 1e3),
            "note": "copy: bytes read + written over time (KINDS.md convention, ~4.3 TB/s on "
            "H200); sum_read: a reduction reading the buffer once (a read-only ceiling)",
        }


def kernel_facts(handle: object, torch: Any, smoke: bool, shapes: ProbeShapes) -> dict[str, Any]:
    """Registers, spills, shared memory of the compiled kernel and resident programs per SM."""
    from feather.kernels.paged_decode import TRITON_KERNEL_NAME, tile_tokens_for

    meta = getattr(handle, "metadata", None)
    facts: dict[str, Any] = {
        "name": TRITON_KERNEL_NAME,
        "tile_tokens": tile_tokens_for(shapes.block_size),
        "n_regs": getattr(handle, "n_regs", None),
        "n_spills": getattr(handle, "n_spills", None),
        "shared_bytes": getattr(meta, "shared", None),
        "num_warps": getattr(meta, "num_warps", None),
        "num_stages": getattr(meta, "num_stages", None),
    }
    if smoke or facts["n_regs"] is None or facts["num_warps"] is None:
        return facts
    props = torch.cuda.get_device_properties(0)
    limits = {
        "regs_per_sm": getattr(props, "regs_per_multiprocessor", 65536),
        "shared_per_sm": getattr(props, "shared_memory_per_multiprocessor", 233472),
        "threads_per_sm": getattr(props, "max_threads_per_multi_processor", 2048),
    }
    facts["occupancy_inputs"] = limits
    facts["resident_programs_per_sm_estimate"] = resident_programs_per_sm(
        int(facts["n_regs"]), int(facts["shared_bytes"] or 0), int(facts["num_warps"]), **limits
    )
    return facts


def resident_programs_per_sm(
    n_regs: int,
    shared_bytes: int,
    num_warps: int,
    regs_per_sm: int = 65536,
    shared_per_sm: int = 233472,
    threads_per_sm: int = 2048,
    max_blocks_per_sm: int = 32,
) -> int:
    """Programs (CTAs) one SM holds at once: the tightest of registers (allocated per thread in
    units of 8), shared memory (+1 KiB the driver reserves per CTA), threads and CTA slots."""
    threads = num_warps * 32
    regs = max(8, -(-n_regs // 8) * 8) * threads
    by_shared = shared_per_sm // (shared_bytes + 1024)
    return int(min(regs_per_sm // regs, by_shared, threads_per_sm // threads, max_blocks_per_sm))


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


def environment(smoke: bool, nvml_info: dict[str, Any]) -> dict[str, Any]:
    """Versions and device facts."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": None,
        "driver_version": nvml_info.get("driver_version"),
        "cuda_driver_version": nvml_info.get("cuda_driver_version"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    with contextlib.suppress(Exception):
        import triton

        env["triton"] = triton.__version__
    if not smoke and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=torch.cuda.get_device_name(0),
            l2_cache_bytes=props.L2_cache_size,
            sm_count=props.multi_processor_count,
            total_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
    if env["driver_version"] is None and shutil.which("nvidia-smi"):
        run = run_bounded(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 20.0
        )
        env["driver_version"] = run["stdout"].strip() or None
    return env


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
