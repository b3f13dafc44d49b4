"""`feather bench kernels`: decode-attention kernels timed for real (claims C1, C2, C7).

One decode step of one attention layer of Llama-3.1-8B (32 query heads, 8 KV heads, head_dim
128, from `feather.models`), block size 16, over synthetic batches (`feather.kernels.block_tables`):

- c1: one homogeneous batch of n requests vs a mixed batch of n from 8 prefix groups (equal
  batch size), and the paper's shape: 8 homogeneous batches of n vs one mixed batch of 8n;
- c2: a homogeneous batch with 0, 1, 2, 4, ... divergent requests (no sharing, same length);
- prefix: a homogeneous batch, shared prefix 1K to 16K tokens;
- c7: paged vs cascade vs pat on every batch, plus a nested batch (a root prefix for all, a
  document per group, a suffix each) where only pat can share both levels.
Run order: c1, c2, c7, prefix (a time budget cuts the end first).
Every kernel runs on every batch: PyTorch on the CPU (and the GPU); Triton on a GPU.

Protocol: per batch a fresh seeded KV pool (normal values, no zeros); per launch a fresh
query; warm-up launches, then timed repeats, medians reported. CPU: wall time of the call;
GPU: CUDA events around each launch, L2 flushed before it (a real step finds the layer's KV
cold: the weights streamed through L2 in between). The plan (host work: tree, work items)
is timed apart as `plan_s`. Every kernel's output is checked against the PyTorch paged one.
Bytes are counted by construction (`feather.kernels.traffic`).

The CPU default is scaled down to keep the sweep within ~3 minutes on 2 cores (the scale is
printed and written); `--full` runs the paper's shapes (8 x 100 requests, 4,000-token
prefixes, 16K prefix lengths), sized for a GPU.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from feather.kernels.block_tables import BatchLayout, grouped_batch, split_evenly
from feather.kernels.plan import KERNELS
from feather.kernels.traffic import plan_bytes
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome
from feather.measuring.stats import unpaired_ratio_interval
from feather.models import get_model

SCHEMA = "feather.bench.kernels/1"
GROUPS = 8
BENCHMARKS = ("c1", "c2", "prefix", "c7")
CHECK_REL_TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 4e-3}


@dataclass(frozen=True, slots=True)
class Shapes:
    """One attention layer's shapes and the KV block size."""

    model: str
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2


def model_shapes(model: str = "llama-3.1-8b", block_size: int = 16, dtype: str = "float32"):
    """A published model's per-layer attention heads (one layer)."""
    profile = get_model(model)
    return Shapes(model, profile.q_heads, profile.kv_heads, profile.head_dim, block_size, dtype)


@dataclass(frozen=True, slots=True)
class Sweep:
    """Batch sizes and token counts of every benchmark; `scale` says how they relate to the
    paper's (8 groups x 100 requests, ~4,000-token prefixes, 100-token suffixes)."""

    scale: str
    per_group: int  # c1: the homogeneous batch n; the mixed batch of 8 groups has 8n
    prefix_tokens: int
    suffix_tokens: int
    c2_batch: int
    c2_divergent: tuple[int, ...]
    prefix_batch: int
    prefix_lengths: tuple[int, ...]
    nested_root_tokens: int  # c7's nested batch: the root every request shares
    warmup: int = 1
    repeats: int = 5
    benchmarks: tuple[str, ...] = BENCHMARKS

    def batches(self, bs: int) -> Iterator[tuple[str, BatchLayout]]:
        """(benchmark, batch) in run order."""
        n, p, s = self.per_group, self.prefix_tokens, self.suffix_tokens
        if "c1" in self.benchmarks:
            yield (
                "c1",
                grouped_batch(f"homog_{n}", [n], prefix_tokens=p, suffix_tokens=s, block_size=bs),
            )
            yield (
                "c1",
                grouped_batch(
                    f"mixed_{n}",
                    split_evenly(n, GROUPS),
                    prefix_tokens=p,
                    suffix_tokens=s,
                    block_size=bs,
                    shuffle_seed=1,
                ),
            )
            yield (
                "c1",
                grouped_batch(
                    f"mixed_{GROUPS * n}",
                    [n] * GROUPS,
                    prefix_tokens=p,
                    suffix_tokens=s,
                    block_size=bs,
                    shuffle_seed=2,
                ),
            )
        if "c2" in self.benchmarks:
            for k in self.c2_divergent:
                yield (
                    "c2",
                    grouped_batch(
                        f"homog_{self.c2_batch}_div{k}",
                        [self.c2_batch],
                        prefix_tokens=p,
                        suffix_tokens=s,
                        block_size=bs,
                        divergent=k,
                        shuffle_seed=3,
                    ),
                )
        if "c7" in self.benchmarks:
            root = self.nested_root_tokens
            yield (
                "c7",
                grouped_batch(
                    f"nested_{GROUPS * n}",
                    [n] * GROUPS,
                    root_tokens=root,
                    prefix_tokens=p - root,
                    suffix_tokens=s,
                    block_size=bs,
                    shuffle_seed=4,
                ),
            )
        if "prefix" in self.benchmarks:
            for length in self.prefix_lengths:
                yield (
                    "prefix",
                    grouped_batch(
                        f"homog_{self.prefix_batch}_p{length}",
                        [self.prefix_batch],
                        prefix_tokens=length,
                        suffix_tokens=s,
                        block_size=bs,
                    ),
                )


SWEEPS = {
    # tests and dry runs: seconds, even under Triton's interpreter
    "quick": Sweep(
        "quick: tiny shapes, a logic check, not a measurement",
        per_group=2,
        prefix_tokens=48,
        suffix_tokens=8,
        c2_batch=4,
        c2_divergent=(0, 1),
        prefix_batch=2,
        prefix_lengths=(32, 64),
        nested_root_tokens=16,
        warmup=1,
        repeats=2,
    ),
    # the CPU default: 1/6 of the paper's batch, half its prefix
    "default": Sweep(
        "cpu, 1 thread: 8 groups x 16 requests (paper: x 100), 2,048-token prefixes (paper: "
        "~4,000), 64-token suffixes (paper: 100); C2 with 32 requests; prefix sweep 1K-16K "
        "with 8 requests; Llama-3.1-8B heads, one layer, float32",
        per_group=16,
        prefix_tokens=2048,
        suffix_tokens=64,
        c2_batch=32,
        c2_divergent=(0, 1, 2, 4, 8, 16),
        prefix_batch=8,
        prefix_lengths=(1024, 2048, 4096, 8192, 16384),
        nested_root_tokens=512,
        warmup=1,
        repeats=7,
    ),
    # the paper's shapes (a GPU)
    "full": Sweep(
        "paper: 8 groups x 100 requests, 4,000-token prefixes, 100-token suffixes; "
        "prefix sweep with 100 requests, 1K-16K; Llama-3.1-8B heads, one layer, bfloat16",
        per_group=100,
        prefix_tokens=4000,
        suffix_tokens=100,
        c2_batch=100,
        c2_divergent=(0, 1, 2, 4, 8, 16, 32),
        prefix_batch=100,
        prefix_lengths=(1024, 2048, 4096, 8192, 16384),
        nested_root_tokens=1000,
        warmup=2,
        repeats=10,
    ),
}

QUICK_SHAPES = Shapes("tiny", 8, 2, 16, 4, "float32")


# ---------------------------------------------------------------------------------------------
# Timing


def cpu_model() -> str:
    """The CPU's model name (platform.processor() is empty on most Linux systems)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@dataclass
class Device:
    """Where kernels run and how they are timed."""

    torch: Any
    name: str  # "cpu" or "cuda"
    flush_bytes: int = 0
    _flush: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name == "cuda" and self.flush_bytes:
            self._flush = self.torch.ones(
                self.flush_bytes // 4, dtype=self.torch.int32, device="cuda"
            )

    @property
    def description(self) -> str:
        if self.name == "cuda":
            return self.torch.cuda.get_device_name(0)
        return f"cpu: {cpu_model()}, torch threads: {self.torch.get_num_threads()}"

    def sync(self) -> None:
        if self.name == "cuda":
            self.torch.cuda.synchronize()

    def time_call(self, fn: Callable[[], object]) -> float:
        """Seconds one call takes (after an L2 flush on a GPU)."""
        if self.name != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        if self._flush is not None:
            self._flush.sum()  # reads only: evicts the KV lines, leaves nothing dirty
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


# ---------------------------------------------------------------------------------------------
# One batch, every kernel


def make_tensors(dev: Device, batch: BatchLayout, shapes: Shapes, seed: int) -> dict[str, Any]:
    """A fresh KV pool (normal values: never all zeros), block tables and lengths."""
    torch = dev.torch
    gen = torch.Generator(device=dev.name).manual_seed(seed)
    dtype = getattr(torch, shapes.dtype)
    shape = (batch.num_blocks, shapes.block_size, shapes.kv_heads, shapes.head_dim)
    kw = {"generator": gen, "device": dev.name, "dtype": dtype}
    return {
        "k": torch.randn(shape, **kw),
        "v": torch.randn(shape, **kw),
        "block_tables": torch.tensor(batch.padded_tables(), dtype=torch.int32, device=dev.name),
        "seq_lens": torch.tensor(batch.seq_lens, dtype=torch.int32, device=dev.name),
        "gen": gen,
        "q_shape": (batch.num_seqs, shapes.q_heads, shapes.head_dim),
        "dtype": dtype,
    }


def describe(benchmark: str, batch: BatchLayout, shapes: Shapes, sweep: Sweep) -> dict[str, Any]:
    root = sweep.nested_root_tokens if batch.name.startswith("nested") else 0
    return {
        "benchmark": benchmark,
        "config": batch.name,
        "num_seqs": batch.num_seqs,
        "groups": batch.groups,
        "divergent": batch.divergent,
        "seq_tokens": batch.seq_lens[0],
        "root_tokens": root,
        "prefix_tokens": batch.seq_lens[0] - sweep.suffix_tokens - root,
        "suffix_tokens": sweep.suffix_tokens,
        "block_size": shapes.block_size,
        "q_heads": shapes.q_heads,
        "kv_heads": shapes.kv_heads,
        "head_dim": shapes.head_dim,
        "dtype": shapes.dtype,
        "model": shapes.model,
    }


def run_batch(
    dev: Device,
    benchmark: str,
    batch: BatchLayout,
    shapes: Shapes,
    sweep: Sweep,
    implementations: tuple[str, ...],
    seed: int,
) -> list[dict[str, Any]]:
    """Every (kernel, implementation) on one batch: rows with medians, bytes and a check.

    Repeats follow the measurement protocol (feather/measuring): each runs every kernel once,
    on the same fresh query, in an order rotated from repeat to repeat, and a repeat taken
    beside a busy process is taken again, so a load spike hits all kernels alike.
    """
    from feather.kernels.decode import prepare
    from feather.kernels.paged_decode import default_scale

    torch = dev.torch
    t = make_tensors(dev, batch, shapes, seed)
    scale = default_scale(shapes.head_dim)

    def fresh_q() -> Any:
        return torch.randn(t["q_shape"], generator=t["gen"], device=dev.name, dtype=t["dtype"])

    args = (t["k"], t["v"], t["block_tables"], t["seq_lens"], shapes.q_heads, scale)
    bound, plan_s = {}, {}
    for impl in implementations:
        for kernel in KERNELS:
            plan_times = []
            for _ in range(min(3, sweep.repeats)):
                t0 = time.perf_counter()
                bound[kernel, impl] = prepare(kernel, impl, *args)
                plan_times.append(time.perf_counter() - t0)
            plan_s[kernel, impl] = statistics.median(plan_times)
    out = torch.empty(t["q_shape"], device=dev.name, dtype=t["dtype"])
    check_q = fresh_q()
    checked = {}
    for key, b in bound.items():
        out.fill_(float("nan"))  # poisoned: an unwritten element fails the check
        checked[key] = b.step(check_q, out).float().clone()
    expected = checked["paged", implementations[0]]
    times: dict[tuple[str, str], list[float]] = {key: [] for key in bound}
    records: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in bound}
    for _ in range(sweep.warmup):
        q = fresh_q()
        for b in bound.values():
            dev.sync()
            dev.time_call(functools.partial(b.step, q, out))
    queries: dict[int, Any] = {}

    def measure(key: tuple[str, str], repeat: int) -> float:
        q = queries.setdefault(repeat, fresh_q())  # every kernel of a repeat: the same query
        dev.sync()
        return dev.time_call(functools.partial(bound[key].step, q, out))

    def keep(outcome: RepeatOutcome) -> None:
        queries.pop(outcome.repeat, None)
        for key, seconds, record in zip(outcome.order, outcome.values, outcome.records,
                                        strict=True):
            times[key].append(seconds)
            records[key].append(record)

    # the measurement protocol (feather/measuring): every kernel in each repeat, on the same
    # fresh query, the order rotated, a repeat taken beside a busy process taken again
    MeasuringProtocol(f"kernels {benchmark} {batch.name}", label=lambda key: "/".join(key),
                      describe=lambda seconds: {"seconds": seconds}).run(
        list(bound), sweep.repeats, measure, keep)

    def count(key: tuple[str, str]) -> Any:
        return plan_bytes(
            bound[key].plan,
            batch.num_seqs,
            q_heads=shapes.q_heads,
            kv_heads=shapes.kv_heads,
            head_dim=shapes.head_dim,
            dtype_bytes=shapes.dtype_bytes,
        )

    fixed = {
        **describe(benchmark, batch, shapes, sweep),
        "device": dev.name,
        "logical_kv_bytes": count(("paged", implementations[0])).kv,
        "unique_kv_bytes": count(("pat", implementations[0])).kv,
    }
    rows = []
    for (kernel, impl), got in checked.items():
        bytes_moved = count((kernel, impl))
        median = statistics.median(times[kernel, impl])
        rel = torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected)
        rel = float(rel.item())
        rows.append(
            {
                **fixed,
                "kernel": kernel,
                "implementation": impl,
                "median_s": median,
                "min_s": min(times[kernel, impl]),
                "times_s": times[kernel, impl],
                "measurement": records[kernel, impl],
                "warmup": sweep.warmup,
                "repeats": sweep.repeats,
                "plan_s": plan_s[kernel, impl],
                "segments": len(bound[kernel, impl].plan),
                "bytes": bytes_moved.to_json(),
                "tokens_per_s": batch.num_seqs / median,
                "bytes_per_s": bytes_moved.total / median,
                "rel_err_vs_paged": rel,
                "check_ok": bool(torch.isfinite(got).all()) and rel < CHECK_REL_TOL[shapes.dtype],
            }
        )
    return rows


def run_sweep(
    dev: Device,
    sweep: Sweep,
    shapes: Shapes,
    implementations: tuple[str, ...],
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    *,
    deadline: float | None = None,
    keep_going: bool = False,
    notes: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every batch of the sweep; one progress line per batch.

    deadline (time.monotonic()): batches not started by then are skipped. keep_going: a
    batch that fails (a GPU out of memory) is recorded in `notes` and the sweep goes on.
    """
    rows: list[dict[str, Any]] = []
    notes = [] if notes is None else notes
    for i, (benchmark, batch) in enumerate(sweep.batches(shapes.block_size)):
        where = {"benchmark": benchmark, "config": batch.name}
        if deadline is not None and time.monotonic() > deadline:
            notes.append({**where, "skipped": "time budget spent"})
            continue
        t0 = time.perf_counter()
        try:
            got = run_batch(dev, benchmark, batch, shapes, sweep, implementations, seed + i)
        except Exception as exc:
            if not keep_going:
                raise
            notes.append({**where, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows += got
        if progress is not None:
            meds = " ".join(
                f"{r['kernel']}/{r['implementation']}={r['median_s'] * 1e3:.2f}ms" for r in got
            )
            progress(f"{benchmark} {batch.name}: {meds} ({time.perf_counter() - t0:.1f} s)")
    return rows


# ---------------------------------------------------------------------------------------------
# Ratios the claims are about


def _median(rows: list[dict], config: str, kernel: str, impl: str) -> float | None:
    for r in rows:
        if (r["config"], r["kernel"], r["implementation"]) == (config, kernel, impl):
            return r["median_s"]
    return None


def _times(rows: list[dict], config: str, kernel: str, impl: str) -> list[float]:
    """A row's repeats that the protocol kept quiet (all, for rows recorded before it)."""
    for r in rows:
        if (r["config"], r["kernel"], r["implementation"]) == (config, kernel, impl):
            times = r.get("times_s") or [r["median_s"]]
            records = r.get("measurement") or [{}] * len(times)
            return [t for t, m in zip(times, records, strict=True)
                    if not m.get("disturbed")] or list(times)
    return []


def summarise(rows: list[dict], sweep: Sweep) -> dict[str, list[dict[str, Any]]]:
    """C1, C2 and C7 ratios per (kernel, implementation), from the rows' medians."""
    out: dict[str, list[dict[str, Any]]] = {"c1": [], "c2": [], "c7": []}
    impls = sorted({r["implementation"] for r in rows})
    n = sweep.per_group
    for impl in impls:
        for kernel in KERNELS:
            homog = _median(rows, f"homog_{n}", kernel, impl)
            mixed = _median(rows, f"mixed_{n}", kernel, impl)
            big = _median(rows, f"mixed_{GROUPS * n}", kernel, impl)
            if homog and mixed and big:
                # separate batches (each its own run): unpaired, the wider interval
                interval = unpaired_ratio_interval(
                    [n / t for t in _times(rows, f"homog_{n}", kernel, impl)],
                    [GROUPS * n / t for t in _times(rows, f"mixed_{GROUPS * n}", kernel, impl)])
                out["c1"].append(
                    {
                        "kernel": kernel,
                        "implementation": impl,
                        "mixed_over_homog_equal_size": mixed / homog,
                        "homog_tok_s": n / homog,
                        "mixed_big_tok_s": GROUPS * n / big,
                        "homog_throughput_over_mixed_big": (n / homog) / (GROUPS * n / big),
                        "interval": interval.to_json() if interval else None,
                    }
                )
            base = _median(rows, f"homog_{sweep.c2_batch}_div0", kernel, impl)
            for k in sweep.c2_divergent:
                got = _median(rows, f"homog_{sweep.c2_batch}_div{k}", kernel, impl)
                if base and got and k:
                    out["c2"].append(
                        {
                            "kernel": kernel,
                            "implementation": impl,
                            "divergent": k,
                            "slowdown": got / base,
                        }
                    )
        for config in sorted({r["config"] for r in rows if r["implementation"] == impl}):
            paged = _median(rows, config, "paged", impl)
            if not paged:
                continue
            entry = {"config": config, "implementation": impl}
            for kernel in ("cascade", "pat"):
                other = _median(rows, config, kernel, impl)
                entry[f"paged_over_{kernel}"] = paged / other if other else None
            out["c7"].append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# Output


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'bench':<6} {'config':<20} {'kernel':<8} {'impl':<6} {'seqs':>5} {'tokens':>6} "
        f"{'median_ms':>10} {'KV_MB':>9} {'total_MB':>9} {'GB/s':>7} {'check':>5}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['benchmark']:<6} {r['config']:<20} {r['kernel']:<8} {r['implementation']:<6} "
            f"{r['num_seqs']:>5} {r['seq_tokens']:>6} {r['median_s'] * 1e3:>10.3f} "
            f"{r['bytes']['kv'] / 1e6:>9.1f} {r['bytes']['total'] / 1e6:>9.1f} "
            f"{r['bytes_per_s'] / 1e9:>7.2f} {'ok' if r['check_ok'] else 'FAIL':>5}"
        )
    return "\n".join(lines)


def format_summary(summary: dict[str, list[dict]]) -> str:
    lines = ["C1 (per kernel): mixed/homog time at equal size; homog tok/s over the mixed 8n"]
    for e in summary["c1"]:
        lines.append(
            f"  {e['kernel']:<8} {e['implementation']:<6} "
            f"{e['mixed_over_homog_equal_size']:6.2f}x "
            f"{e['homog_throughput_over_mixed_big']:6.2f}x"
        )
    lines.append("C2 (per kernel): time with k divergent requests / time with none")
    for e in summary["c2"]:
        lines.append(
            f"  {e['kernel']:<8} {e['implementation']:<6} k={e['divergent']:<3} "
            f"{e['slowdown']:6.2f}x"
        )
    lines.append("C7 (per batch): paged time / cascade time, paged time / pat time")
    for e in summary["c7"]:
        c, p = e["paged_over_cascade"], e["paged_over_pat"]
        lines.append(
            f"  {e['config']:<20} {e['implementation']:<6} "
            f"{c or float('nan'):6.2f}x {p or float('nan'):6.2f}x"
        )
    return "\n".join(lines)


def document(
    rows: list[dict],
    sweep: Sweep,
    shapes: Shapes,
    dev: Device,
    wall_s: float,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """The JSON the pipeline reads (schema feather.bench.kernels/1)."""
    return {
        "schema": SCHEMA,
        "device": dev.name,
        "device_name": dev.description,
        "scale": sweep.scale,
        "sweep": asdict(sweep),
        "shapes": asdict(shapes),
        "rows": rows,
        "summary": summarise(rows, sweep),
        "wall_s": wall_s,
        "provenance": provenance,
    }


def select_sweep(name: str, benchmarks: tuple[str, ...] | None, repeats: int | None) -> Sweep:
    sweep = SWEEPS[name]
    if benchmarks:
        unknown = set(benchmarks) - set(BENCHMARKS)
        if unknown:
            raise ValueError(f"unknown benchmarks {sorted(unknown)}; known: {BENCHMARKS}")
        sweep = replace(sweep, benchmarks=tuple(benchmarks))
    if repeats is not None:
        sweep = replace(sweep, repeats=repeats)
    return sweep


def _provenance(**fields: Any) -> dict[str, Any]:
    """`collect_provenance`, or what can be said without it: a bare GPU box may lack what
    `feather.provenance` imports (pyarrow, through the telemetry series)."""
    try:
        from feather.provenance import collect_provenance
    except ImportError as exc:
        return {
            "error": f"feather.provenance unavailable: {exc}",
            "command": sys.argv,
            "config": fields.get("config"),
            "seed": fields.get("seed"),
            "host": platform.node(),
            "python": platform.python_version(),
        }
    return collect_provenance(**fields)


def run(
    *,
    sweep_name: str = "default",
    benchmarks: tuple[str, ...] | None = None,
    repeats: int | None = None,
    device: str = "auto",
    implementations: tuple[str, ...] | None = None,
    dtype: str | None = None,
    seed: int = 0,
    threads: int = 1,
    flush_l2: bool = True,
    deadline: float | None = None,
    keep_going: bool = False,
    progress: Callable[[str], None] | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """The whole benchmark: the JSON document (see `document`)."""
    import torch

    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device visible to PyTorch")
    if implementations is None:
        implementations = ("torch", "triton") if device == "cuda" else ("torch",)
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    if device == "cpu" and "triton" in implementations:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton on a CPU: its interpreter
    if device == "cpu":
        # one thread by default: on a shared machine OpenMP's barriers wait for descheduled
        # threads and a 2-thread matmul can take 10-100x longer than usual (measured here)
        torch.set_num_threads(threads)
    sweep = select_sweep(sweep_name, benchmarks, repeats)
    shapes = (
        replace(QUICK_SHAPES, dtype=dtype) if sweep_name == "quick" else model_shapes(dtype=dtype)
    )
    flush = 0
    if device == "cuda" and flush_l2:
        flush = max(4 * torch.cuda.get_device_properties(0).L2_cache_size, 256 * 1024**2)
    dev = Device(torch, device, flush)
    notes: list[dict[str, Any]] = []
    rows = run_sweep(
        dev,
        sweep,
        shapes,
        tuple(implementations),
        seed,
        progress,
        deadline=deadline,
        keep_going=keep_going,
        notes=notes,
    )
    config = {
        "sweep": asdict(sweep),
        "shapes": asdict(shapes),
        "device": device,
        "implementations": list(implementations),
        "flush_l2": bool(flush),
        "cpu_threads": torch.get_num_threads() if device == "cpu" else None,
    }
    provenance = _provenance(
        config=config,
        seed=seed,
        command=command,
        started_utc=started,
        extra={
            "engine": {
                "name": "feather-kernels",
                "version": None,
                "attention_backend": ",".join(f"{k}/{i}" for i in implementations for k in KERNELS),
                "block_size": shapes.block_size,
            }
        },
    )
    doc = document(rows, sweep, shapes, dev, time.perf_counter() - t0, provenance)
    # other work on a shared machine slows every kernel alike (repeats are interleaved) but
    # widens the spread: the load says how quiet the host was
    doc["host_load_avg_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    doc["notes"] = notes  # batches skipped (time budget) or failed (keep_going)
    return doc
