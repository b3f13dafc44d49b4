"""What each decode kernel reads: its plan, a list of segments.

A segment is a run of KV tokens (physical block ids, the last one possibly partial) attended
once for a set of queries; every query's segments cover its tokens exactly once, and the
per-segment results are merged by log-sum-exp (`feather.kernels.merge`). The three kernels
differ only in how they cut the batch into segments:

- paged: one segment per request (each request reads its own blocks; vLLM/SGLang decode);
- cascade: the batch-wide shared prefix (the longest run of identical full blocks at the
  start of every request's table) once for all queries, then each request's suffix;
- pat: one segment per node of the batch's prefix tree (`feather.kernels.tree`), attended
  once for all the queries beneath it (PAT, arXiv 2511.22333).

Plans are pure Python, so the byte counter (`feather.kernels.traffic`) and the tests see
exactly what the PyTorch and Triton implementations execute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from feather.kernels.tree import blocks_used, prefix_tree

KERNELS = ("paged", "cascade", "pat")


@dataclass(frozen=True, slots=True)
class Segment:
    """KV tokens read once for several queries."""

    queries: tuple[int, ...]  # request indices in the batch
    blocks: tuple[int, ...]  # physical block ids, in token order
    tokens: int  # tokens read: all of every block but possibly the last


def plan_paged(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[Segment]:
    """One segment per non-empty request."""
    return [
        Segment((seq,), tuple(int(b) for b in row[: blocks_used(n, block_size)]), int(n))
        for seq, (row, n) in enumerate(zip(block_tables, seq_lens, strict=True))
        if n > 0
    ]


def shared_prefix_blocks(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> int:
    """Leading block positions that are full and hold the same id in every request."""
    lens = [int(n) for n in seq_lens]
    if not lens:
        return 0
    full = min(n // block_size for n in lens)
    first = block_tables[0]
    depth = 0
    while depth < full and all(int(row[depth]) == int(first[depth]) for row in block_tables):
        depth += 1
    return depth


def plan_cascade(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[Segment]:
    """The shared prefix once for all queries (if any), then every request's own suffix."""
    lens = [int(n) for n in seq_lens]
    depth = shared_prefix_blocks(block_tables, lens, block_size)
    plan = []
    if depth:
        first = tuple(int(b) for b in block_tables[0][:depth])
        plan.append(Segment(tuple(range(len(lens))), first, depth * block_size))
    start = depth * block_size
    for seq, (row, n) in enumerate(zip(block_tables, lens, strict=True)):
        if n > start:
            blocks = tuple(int(b) for b in row[depth : blocks_used(n, block_size)])
            plan.append(Segment((seq,), blocks, n - start))
    return plan


def plan_pat(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[Segment]:
    """One segment per prefix-tree node, for all the queries beneath it."""
    return [
        Segment(node.queries, node.blocks, node.tokens)
        for node in prefix_tree(block_tables, seq_lens, block_size)
    ]


_PLANNERS = {"paged": plan_paged, "cascade": plan_cascade, "pat": plan_pat}


def make_plan(
    kernel: str, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[Segment]:
    """The plan of `kernel` (one of KERNELS) for one decode step of the batch."""
    try:
        planner = _PLANNERS[kernel]
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}") from None
    return planner(block_tables, seq_lens, block_size)
