"""Paged decode attention: a PyTorch reference and a plain Triton kernel.

Why this exists: claim C1 rests on shared KV blocks hitting in the GPU's L2 cache when the
requests of a decode batch share a prefix. `gpu/l2_probe.py` measures that with this kernel, so
the kernel reads KV the way vLLM's FlashAttention-2 paged decode path does (see
`feather/sim/l2.py` for the grid it models):

- one program per (sequence, KV head), the sequence index being `program_id(0)`, so CUDA issues
  all sequences for KV head 0 first, then head 1, ... (FA2's grid when it does not split KV);
- the query heads that share a KV head are packed into that program (GQA packing), so each KV
  block is read once per (sequence, KV head);
- each program walks its sequence's blocks in order through the block table (a few blocks,
  ~64 tokens, per loop iteration, so several loads are in flight), with an online softmax and
  fp32 accumulation; no split-KV, no shared-prefix tricks: a shared block is read once per
  sequence that holds it, and only the L2 cache can save DRAM traffic.

Products: bf16/fp16 inputs use the tensor cores (fp32 accumulation, P rounded to the input
dtype for P @ V, as FlashAttention does); fp32 inputs use exact fp32 products ("ieee", not
Triton's default tf32). Under TRITON_INTERPRET the products are always done in fp32, because
Triton's interpreter (3.9 at least) multiplies bf16 operands of tl.dot as raw uint16 bits.
Built offline for sm_90 (Triton 3.6 and 3.9, bf16, Llama shapes, 4 warps, 3 stages): 104
registers, ~39 KB shared memory, no spills, 16-byte cp.async loads, mma.sync products.

Layouts are vLLM's per layer: q [num_seqs, num_q_heads, head_dim]; k_cache and v_cache
[num_blocks, block_size, num_kv_heads, head_dim]; block_tables [num_seqs, max_blocks] int32;
seq_lens [num_seqs] int32. Query head h reads KV head h // (num_q_heads // num_kv_heads), as
Hugging Face's `repeat_kv` does. A sequence of length 0 gets a zero output.

Triton is imported lazily (`_triton_kernel`), so this module imports with torch alone and the
caller may set TRITON_INTERPRET=1 any time before the first Triton call.
"""

from __future__ import annotations

import functools
import math
import os

import torch

TRITON_KERNEL_NAME = "_paged_decode_kernel"  # what Nsight Compute's --kernel-name sees
_REFERENCE_CHUNK_TOKENS = 4096  # tokens of K or V gathered at once by the reference
_MIN_DOT_DIM = 16  # tl.dot needs M, N, K >= 16 on NVIDIA GPUs
_TILE_TOKENS_TARGET = 64  # tokens per loop iteration: several blocks in flight per program
_LOG2_E = 1.4426950408889634

tl = None  # triton.language, bound by `_triton_kernel` (the kernel body resolves it here)
_attend_blocks = None  # the JIT of `_attend_blocks_fn`, bound by `attend_blocks_jit`


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> tuple[int, int, int, int, int]:
    """Validate shapes; return (num_seqs, num_q_heads, head_dim, block_size, num_kv_heads)."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "expected q [seqs, q_heads, head_dim] and k/v [blocks, block_size, kv_heads, "
            f"head_dim]; got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, "
            f"v {tuple(v_cache.shape)}"
        )
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head_dim differs: q {head_dim}, kv {kv_head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads is not a multiple of {num_kv_heads}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks]")
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [{num_seqs}]")
    return num_seqs, num_q_heads, head_dim, block_size, num_kv_heads


def paged_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    chunk_tokens: int = _REFERENCE_CHUNK_TOKENS,
) -> torch.Tensor:
    """Exact attention of each query over its sequence's paged KV.

    Computes in float64 on the CPU and float32 on a GPU, and returns that dtype. One sequence
    at a time, gathering at most `chunk_tokens` tokens of K or V at once (scores first, then a
    softmax over the whole sequence, then P @ V chunk by chunk), so memory stays bounded for
    any batch.
    """
    num_seqs, num_q_heads, head_dim, block_size, num_kv_heads = _check_inputs(
        q, k_cache, v_cache, block_tables, seq_lens
    )
    dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    group = num_q_heads // num_kv_heads
    chunk_blocks = max(1, chunk_tokens // block_size)
    out = torch.zeros(num_seqs, num_q_heads, head_dim, dtype=dtype, device=q.device)
    lens = [int(n) for n in seq_lens.tolist()]
    for seq, seq_len in enumerate(lens):
        if seq_len <= 0:
            continue
        n_blocks = -(-seq_len // block_size)
        ids = block_tables[seq, :n_blocks].to(device=k_cache.device, dtype=torch.long)
        q_seq = q[seq].to(dtype).view(num_kv_heads, group, head_dim)
        scores = []
        for start in range(0, n_blocks, chunk_blocks):
            k = k_cache[ids[start : start + chunk_blocks]].to(dtype)
            k = k.reshape(-1, num_kv_heads, head_dim)  # [tokens, kv_heads, head_dim]
            scores.append(torch.einsum("hgd,thd->hgt", q_seq, k))
        probs = torch.softmax(torch.cat(scores, dim=-1)[..., :seq_len] * scale, dim=-1)
        acc = torch.zeros(num_kv_heads, group, head_dim, dtype=dtype, device=q.device)
        for start in range(0, n_blocks, chunk_blocks):
            v = v_cache[ids[start : start + chunk_blocks]].to(dtype)
            v = v.reshape(-1, num_kv_heads, head_dim)
            first = start * block_size
            last = min(first + v.shape[0], seq_len)
            acc += torch.einsum("hgt,thd->hgd", probs[..., first:last], v[: last - first])
        out[seq] = acc.reshape(num_q_heads, head_dim)
    return out


def _attend_blocks_fn(
    q,
    k_ptr,
    v_ptr,
    table_ptr,
    n_tokens,
    kv_head,
    scale_log2,
    stride_k_block,
    stride_k_token,
    stride_k_head,
    stride_v_block,
    stride_v_token,
    stride_v_head,
    m_i,
    l_i,
    acc,
    offs_t,
    offs_d,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """The online softmax of `q`'s rows over `n_tokens` tokens of KV reached through the block
    table at `table_ptr`, continuing (m_i, l_i, acc) - the loop every decode kernel here
    shares (this one per sequence, `attend_triton`'s per segment of blocks)."""
    for tile in range(0, tl.cdiv(n_tokens, TILE_TOKENS)):
        tokens = tile * TILE_TOKENS + offs_t
        t_mask = tokens < n_tokens
        block_ids = tl.load(table_ptr + tokens // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slots = tokens % BLOCK_SIZE
        k_offs = (
            block_ids[:, None] * stride_k_block
            + slots[:, None] * stride_k_token
            + kv_head * stride_k_head
            + offs_d[None, :]
        )
        k = tl.load(k_ptr + k_offs, mask=t_mask[:, None], other=0.0)
        if DOT_FP32:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale_log2
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_offs = (
            block_ids[:, None] * stride_v_block
            + slots[:, None] * stride_v_token
            + kv_head * stride_v_head
            + offs_d[None, :]
        )
        v = tl.load(v_ptr + v_offs, mask=t_mask[:, None], other=0.0)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    scale_log2,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_token,
    stride_k_head,
    stride_v_block,
    stride_v_token,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One (sequence, KV head): online softmax over the sequence's blocks, in block order."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, TILE_TOKENS)
    g_mask = offs_g < GROUP
    q_heads = kv_head * GROUP + offs_g
    q_offs = seq.to(tl.int64) * stride_q_seq + q_heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    m_i, l_i, acc = _attend_blocks(
        q, k_ptr, v_ptr, table_row, seq_len, kv_head, scale_log2,
        stride_k_block, stride_k_token, stride_k_head,
        stride_v_block, stride_v_token, stride_v_head,
        m_i, l_i, acc, offs_t, offs_d, BLOCK_SIZE, TILE_TOKENS, DOT_FP32,
    )

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    result = acc / l_safe[:, None]
    o_offs = seq.to(tl.int64) * stride_o_seq + q_heads[:, None] * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + o_offs, result.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@functools.cache
def _triton_kernel():
    """Import Triton and JIT the kernel (once; honours TRITON_INTERPRET set before this)."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    attend_blocks_jit()
    return triton.jit(_paged_decode_kernel)


@functools.cache
def attend_blocks_jit():
    """The shared loop as a Triton function (once), bound here for the kernels to call."""
    global tl, _attend_blocks
    import triton
    import triton.language

    tl = triton.language
    _attend_blocks = triton.jit(_attend_blocks_fn)
    return _attend_blocks


def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET set)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tile_tokens_for(block_size: int) -> int:
    """Tokens per loop iteration: whole blocks, >= tl.dot's minimum, ~64 for memory parallelism."""
    return max(block_size, _MIN_DOT_DIM, _TILE_TOKENS_TARGET // block_size * block_size)


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Launch the Triton kernel; returns `out` ([num_seqs, num_q_heads, head_dim], q's dtype).

    Grid (num_seqs, num_kv_heads): sequence fastest. Pass `out` to reuse a buffer (the tests
    poison it with NaN first, so any element the kernel misses fails).
    """
    return paged_decode_triton_launch(
        q, k_cache, v_cache, block_tables, seq_lens, scale, out=out, num_warps=num_warps
    )[0]


def paged_decode_triton_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, object]:
    """As `paged_decode_triton`, also returning what Triton's launch returned (the compiled
    kernel in Triton 3.x, whose n_regs / n_spills / metadata the probe records)."""
    num_seqs, num_q_heads, head_dim, block_size, num_kv_heads = _check_inputs(
        q, k_cache, v_cache, block_tables, seq_lens
    )
    if head_dim < _MIN_DOT_DIM or head_dim != _next_pow2(head_dim):
        raise ValueError(f"head_dim must be a power of two >= {_MIN_DOT_DIM}; got {head_dim}")
    if block_size != _next_pow2(block_size):
        raise ValueError(f"block_size must be a power of two; got {block_size}")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_tables and seq_lens must be int32")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous along its rows")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError("q, k_cache and v_cache must share one dtype")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError("out must have q's shape and be contiguous in head_dim")
    group = num_q_heads // num_kv_heads
    kernel = _triton_kernel()
    handle = kernel[(num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        float(scale) * _LOG2_E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_SIZE=block_size,
        TILE_TOKENS=tile_tokens_for(block_size),
        HEAD_DIM=head_dim,
        GROUP=group,
        GROUP_PAD=max(_MIN_DOT_DIM, _next_pow2(group)),
        DOT_FP32=q.dtype == torch.float32 or _interpreting(),
        num_warps=num_warps,
    )
    return out, handle


def default_scale(head_dim: int) -> float:
    """The usual softmax scale, 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)
