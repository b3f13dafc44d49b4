"""The prefix tree of a decode batch's block tables, as the PAT-style kernel walks it.

One tree builder in the project: `feather.batch_tree.BatchTree.build` (the simulator's L2
and PAT cost models use it too). This module only turns block tables into the keys it needs
and its nodes into what a kernel reads: physical block ids, token counts and the requests
beneath.

Keys. BatchTree relies on sharing being prefix-closed (equal ids at position p imply equal
prefixes before p). Engines guarantee that (cumulative block hashes), arbitrary block tables
do not, so each position's key is interned from (key of the previous position, block id):
keys are equal exactly when the whole prefixes are equal, whatever the tables hold. A
partial last block is keyed with its used-token count too, so two requests share it only
when they read the same tokens of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from feather.batch_tree import BatchTree


@dataclass(frozen=True, slots=True)
class TreeNode:
    """A maximal run of block positions read by the same set of requests."""

    parent: int  # index of the parent node, -1 for a top node
    first_block: int  # block position (in the requests' tables) where the run starts
    blocks: tuple[int, ...]  # physical block ids of the run
    tokens: int  # tokens of the run (its last block may be partial)
    queries: tuple[int, ...]  # the requests whose paths pass through this node, ascending


def blocks_used(seq_len: int, block_size: int) -> int:
    """Blocks a sequence of `seq_len` tokens occupies."""
    return -(-seq_len // block_size) if seq_len > 0 else 0


def prefix_keys(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[tuple[int, ...]]:
    """Per request, one interned key per block position (see the module docstring)."""
    intern: dict[tuple[int, int, int], int] = {}
    out = []
    for row, seq_len in zip(block_tables, seq_lens, strict=True):
        n = blocks_used(seq_len, block_size)
        keys = []
        prev = -1
        for pos in range(n):
            used = min(block_size, seq_len - pos * block_size)
            prev = intern.setdefault((prev, int(row[pos]), used), len(intern))
            keys.append(prev)
        out.append(tuple(keys))
    return out


def prefix_tree(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> list[TreeNode]:
    """The batch's prefix tree; every request's tokens are covered by exactly its path."""
    lens = [int(n) for n in seq_lens]
    tree = BatchTree.build(prefix_keys(block_tables, lens, block_size))
    beneath: list[list[int]] = [[] for _ in tree.parent]
    for seq in range(len(lens)):
        for node in tree.path(seq):
            beneath[node].append(seq)
    nodes = []
    for v, queries in enumerate(beneath):
        first, count = tree.offset[v], tree.length[v]
        seq = queries[0]  # every request beneath reads the same blocks and tokens here
        row = block_tables[seq]
        tokens = min(lens[seq] - first * block_size, count * block_size)
        nodes.append(
            TreeNode(
                parent=tree.parent[v],
                first_block=first,
                blocks=tuple(int(b) for b in row[first : first + count]),
                tokens=tokens,
                queries=tuple(queries),
            )
        )
    return nodes
