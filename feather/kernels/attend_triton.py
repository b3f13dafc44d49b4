"""Decode attention over a plan, in Triton: the cascade and pat kernels on a GPU.

One kernel serves both (they differ only in their plans, `feather.kernels.plan`). The host
cuts every segment into work items - a run of at most `split_tokens` of its tokens (whole
blocks) for a tile of at most BLOCK_Q of its queries - and launches one program per (item,
KV head), items fastest. A program packs its queries' heads of that KV head into one matrix
(BLOCK_Q x group rows, the PAT packing), walks the item's blocks through its slice of the
flattened block list with an online softmax (fp32, base 2) and writes one partial result
(normalised output, natural log-sum-exp) per (query, head) row. `merge_partials` then
combines each request's partials. Items serving one query are launched separately with
BLOCK_Q = 1, so private suffixes do not pay for a full query tile.

So a shared node's blocks are read once per query tile and KV split (tiles of one node run
side by side, so repeats come from L2); the byte counter (`feather.kernels.traffic`) counts
the node once. Products follow `paged_decode`: tensor cores for bf16/fp16 with P rounded to
the input dtype, exact fp32 for fp32, always fp32 under TRITON_INTERPRET (its bf16 tl.dot
multiplies raw bits).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from feather.kernels.merge import merge_partials
from feather.kernels.paged_decode import (
    _LOG2_E,
    _MIN_DOT_DIM,
    _check_inputs,
    _interpreting,
    _next_pow2,
    attend_blocks_jit,
    tile_tokens_for,
)
from feather.kernels.plan import Segment

TRITON_KERNEL_NAME = "_segment_decode_kernel"  # what Nsight Compute's --kernel-name sees
DEFAULT_SPLIT_TOKENS = 1024  # KV tokens per work item (a multiple of the tile)
DEFAULT_QUERY_TILE = 16  # queries packed per program for shared segments
_MAX_ROWS = 128  # packed (query, head) rows per program: bounds the fp32 accumulator

tl = None  # triton.language, bound by `_triton_kernel`
_attend_blocks = None  # paged_decode's shared loop as a Triton function, bound there too


def _segment_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    blocks_ptr,
    item_block_ptr,
    item_tokens_ptr,
    item_slot_ptr,
    item_nq_ptr,
    item_row_ptr,
    slot_query_ptr,
    po_ptr,
    plse_ptr,
    scale_log2,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_token,
    stride_k_head,
    stride_v_block,
    stride_v_token,
    stride_v_head,
    stride_po_row,
    stride_po_head,
    stride_plse_row,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One (work item, KV head): its queries' heads packed as rows, online softmax."""
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    first_block = tl.load(item_block_ptr + item)
    n_tokens = tl.load(item_tokens_ptr + item)
    first_slot = tl.load(item_slot_ptr + item)
    nq = tl.load(item_nq_ptr + item)
    first_row = tl.load(item_row_ptr + item)

    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, TILE_TOKENS)
    local = offs_r // GROUP_PAD  # which of the item's queries a row belongs to
    g = offs_r % GROUP_PAD
    q_valid = local < nq
    r_mask = q_valid & (g < GROUP)
    query = tl.load(slot_query_ptr + first_slot + local, mask=q_valid, other=0).to(tl.int64)
    heads = kv_head * GROUP + g
    q_offs = query[:, None] * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=r_mask[:, None], other=0.0)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    m_i, l_i, acc = _attend_blocks(
        q, k_ptr, v_ptr, blocks_ptr + first_block, n_tokens, kv_head, scale_log2,
        stride_k_block, stride_k_token, stride_k_head,
        stride_v_block, stride_v_token, stride_v_head,
        m_i, l_i, acc, offs_t, offs_d, BLOCK_SIZE, TILE_TOKENS, DOT_FP32,
    )

    rows = (first_row + local).to(tl.int64)
    o_offs = rows[:, None] * stride_po_row + heads[:, None] * stride_po_head + offs_d[None, :]
    tl.store(po_ptr + o_offs, acc / l_i[:, None], mask=r_mask[:, None])
    lse = (m_i + tl.log2(l_i)) / 1.4426950408889634  # natural log-sum-exp of scaled scores
    tl.store(plse_ptr + rows * stride_plse_row + heads, lse, mask=r_mask)


@functools.cache
def _triton_kernel():
    """Import Triton and JIT the kernel (once; honours TRITON_INTERPRET set before this)."""
    global tl, _attend_blocks
    import triton
    import triton.language

    tl = triton.language
    _attend_blocks = attend_blocks_jit()
    return triton.jit(_segment_decode_kernel)


@dataclass(frozen=True)
class _Launch:
    """One launch's work items (device int32 arrays) and its query tile."""

    block_q: int
    item_block: torch.Tensor
    item_tokens: torch.Tensor
    item_slot: torch.Tensor
    item_nq: torch.Tensor
    item_row: torch.Tensor


class TritonDecode:
    """A plan cut into work items, its arrays on the device; call it per step."""

    def __init__(
        self,
        plan: Sequence[Segment],
        k_cache: torch.Tensor,
        num_seqs: int,
        num_q_heads: int,
        *,
        split_tokens: int = DEFAULT_SPLIT_TOKENS,
        query_tile: int = DEFAULT_QUERY_TILE,
    ) -> None:
        _, block_size, kv_heads, head_dim = k_cache.shape
        if head_dim < _MIN_DOT_DIM or head_dim != _next_pow2(head_dim):
            raise ValueError(f"head_dim must be a power of two >= {_MIN_DOT_DIM}; got {head_dim}")
        if block_size != _next_pow2(block_size):
            raise ValueError(f"block_size must be a power of two; got {block_size}")
        self.num_seqs, self.block_size = num_seqs, block_size
        self.group = num_q_heads // kv_heads
        self.tile_tokens = tile_tokens_for(block_size)
        query_tile = max(1, min(query_tile, _MAX_ROWS // _next_pow2(self.group)))
        split_blocks = max(1, split_tokens // self.tile_tokens) * self.tile_tokens // block_size
        blocks: list[int] = []
        slot_query: list[int] = []
        owner: list[int] = []
        items: dict[int, list[tuple[int, int, int, int, int]]] = {1: [], query_tile: []}
        for seg in plan:
            block0, slot0 = len(blocks), len(slot_query)
            blocks.extend(seg.blocks)
            slot_query.extend(seg.queries)
            tile = 1 if len(seg.queries) == 1 else query_tile
            for first in range(0, len(seg.blocks), split_blocks):
                tokens = min(seg.tokens - first * block_size, split_blocks * block_size)
                for q0 in range(0, len(seg.queries), tile):
                    nq = min(tile, len(seg.queries) - q0)
                    items[tile].append((block0 + first, tokens, slot0 + q0, nq, len(owner)))
                    owner.extend(seg.queries[q0 : q0 + nq])
        device = k_cache.device

        def ints(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        self.blocks = ints(blocks or [0])
        self.slot_query = ints(slot_query or [0])
        self.owner = torch.tensor(owner, dtype=torch.long, device=device)
        self.launches = [
            _Launch(tile, *(ints(column) for column in zip(*work, strict=True)))
            for tile, work in items.items()
            if work
        ]
        self.partial_o = torch.empty(len(owner), num_q_heads, head_dim, device=device)
        self.partial_lse = torch.empty(len(owner), num_q_heads, device=device)

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
        *,
        num_warps: int = 4,
        poison_partials: bool = False,
    ) -> torch.Tensor:
        if poison_partials:  # tests: a partial row the kernel misses turns the output NaN
            self.partial_o.fill_(float("nan"))
            self.partial_lse.fill_(float("nan"))
        kernel = _triton_kernel()
        group_pad = _next_pow2(self.group)
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        for launch in self.launches:
            kernel[(launch.item_block.numel(), kv_heads)](
                q,
                k_cache,
                v_cache,
                self.blocks,
                launch.item_block,
                launch.item_tokens,
                launch.item_slot,
                launch.item_nq,
                launch.item_row,
                self.slot_query,
                self.partial_o,
                self.partial_lse,
                float(scale) * _LOG2_E,
                q.stride(0),
                q.stride(1),
                k_cache.stride(0),
                k_cache.stride(1),
                k_cache.stride(2),
                v_cache.stride(0),
                v_cache.stride(1),
                v_cache.stride(2),
                self.partial_o.stride(0),
                self.partial_o.stride(1),
                self.partial_lse.stride(0),
                BLOCK_SIZE=self.block_size,
                TILE_TOKENS=self.tile_tokens,
                HEAD_DIM=head_dim,
                GROUP=self.group,
                GROUP_PAD=group_pad,
                ROWS=max(_MIN_DOT_DIM, _next_pow2(launch.block_q * group_pad)),
                DOT_FP32=q.dtype == torch.float32 or _interpreting(),
                num_warps=num_warps,
            )
        merged, _ = merge_partials(self.partial_o, self.partial_lse, self.owner, self.num_seqs)
        if out is None:
            return merged.to(q.dtype)
        out.copy_(merged)
        return out


def check_triton_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """What the kernel needs beyond paged_decode's shape checks: dtypes and strides."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError("q, k_cache and v_cache must share one dtype")


def decode_triton(
    plan: Sequence[Segment],
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    split_tokens: int = DEFAULT_SPLIT_TOKENS,
    query_tile: int = DEFAULT_QUERY_TILE,
    poison_partials: bool = False,
) -> torch.Tensor:
    """One decode step of the batch following `plan`, with the Triton kernel."""
    num_seqs, num_q_heads, *_ = _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check_triton_inputs(q, k_cache, v_cache)
    step = TritonDecode(
        plan, k_cache, num_seqs, num_q_heads, split_tokens=split_tokens, query_tile=query_tile
    )
    return step(q, k_cache, v_cache, scale, out=out, poison_partials=poison_partials)
