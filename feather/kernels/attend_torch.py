"""Decode attention over a plan, in PyTorch (CPU or GPU): the kernels' portable implementation.

Each segment is attended in chunks of whole blocks gathered into one reused buffer (never a
whole batch's KV at once, nor a whole long segment's): per chunk the segment's queries are
packed into one matrix per KV head ([queries x group, tokens] scores), so a shared segment is
a matrix product where a paged one is a matrix-vector product. Every chunk gives a partial
result (output, log-sum-exp); one `merge_partials` call combines them per request.
Computes in float32 whatever the input dtype; returns q's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from feather.kernels.merge import merge_partials
from feather.kernels.paged_decode import _check_inputs
from feather.kernels.plan import Segment

DEFAULT_CHUNK_TOKENS = 2048
MAX_SCORE_ELEMENTS = 1 << 23  # per chunk: KV heads x packed query rows x tokens (32 MiB fp32)


class TorchDecode:
    """A plan bound to its batch's shapes, with its gather buffers; call it per step."""

    def __init__(
        self,
        plan: Sequence[Segment],
        k_cache: torch.Tensor,
        num_seqs: int,
        num_q_heads: int,
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        _, block_size, kv_heads, head_dim = k_cache.shape
        self.plan = list(plan)
        self.num_seqs = num_seqs
        self.block_size = block_size
        self.group = num_q_heads // kv_heads
        device = k_cache.device
        self._queries = [torch.tensor(s.queries, dtype=torch.long, device=device) for s in plan]
        self._blocks = [torch.tensor(s.blocks, dtype=torch.long, device=device) for s in plan]
        self._chunk_blocks = [self._blocks_per_chunk(s, chunk_tokens, kv_heads) for s in plan]
        most = max(self._chunk_blocks, default=1)
        shape = (most, block_size, kv_heads, head_dim)
        self._k_buf = torch.empty(shape, dtype=k_cache.dtype, device=device)
        self._v_buf = torch.empty(shape, dtype=k_cache.dtype, device=device)

    def _blocks_per_chunk(self, seg: Segment, chunk_tokens: int, kv_heads: int) -> int:
        rows = len(seg.queries) * self.group * kv_heads
        tokens = min(chunk_tokens, MAX_SCORE_ELEMENTS // rows)
        return max(1, min(tokens // self.block_size, len(seg.blocks)))

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num_seqs, num_q_heads, head_dim = q.shape
        kv_heads = k_cache.shape[2]
        outs, lses, owners = [], [], []
        for seg, queries, blocks, per_chunk in zip(
            self.plan, self._queries, self._blocks, self._chunk_blocks, strict=True
        ):
            n = len(seg.queries)
            # [kv_heads, n * group, head_dim]: the packed queries of each KV head
            qs = q.index_select(0, queries).float().view(n, kv_heads, self.group, head_dim)
            qs = qs.permute(1, 0, 2, 3).reshape(kv_heads, n * self.group, head_dim) * scale
            for first in range(0, len(seg.blocks), per_chunk):
                ids = blocks[first : first + per_chunk]
                tokens = min(seg.tokens - first * self.block_size, len(ids) * self.block_size)
                k = torch.index_select(k_cache, 0, ids, out=self._k_buf[: len(ids)])
                v = torch.index_select(v_cache, 0, ids, out=self._v_buf[: len(ids)])
                k = k.view(-1, kv_heads, head_dim)[:tokens].transpose(0, 1).float()
                v = v.view(-1, kv_heads, head_dim)[:tokens].transpose(0, 1).float()
                scores = torch.matmul(qs, k.transpose(1, 2))  # [kv_heads, n * group, tokens]
                lse = torch.logsumexp(scores, dim=-1)
                o = torch.matmul(torch.exp(scores - lse[..., None]), v)
                outs.append(o.view(kv_heads, n, self.group, head_dim).transpose(0, 1))
                lses.append(lse.view(kv_heads, n, self.group).transpose(0, 1))
                owners.append(queries)
        if outs:
            o_all = torch.cat([o.reshape(o.shape[0], num_q_heads, head_dim) for o in outs])
            lse_all = torch.cat([x.reshape(x.shape[0], num_q_heads) for x in lses])
            merged, _ = merge_partials(o_all, lse_all, torch.cat(owners), num_seqs)
        else:
            merged = torch.zeros(num_seqs, num_q_heads, head_dim, device=q.device)
        if out is None:
            return merged.to(q.dtype)
        out.copy_(merged)
        return out


def decode_torch(
    plan: Sequence[Segment],
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """One decode step of the batch following `plan` (shapes checked as paged_decode does)."""
    num_seqs, num_q_heads, *_ = _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    step = TorchDecode(plan, k_cache, num_seqs, num_q_heads, chunk_tokens=chunk_tokens)
    return step(q, k_cache, v_cache, scale, out=out)
