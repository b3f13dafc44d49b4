"""The compressed prefix tree of a batch's block sequences: one builder for the project.

The simulator's L2 model, PAT cost and cascade rule, the PAT-style kernels' plans and the
L2 benchmark all see a batch's sharing through this tree, so it lives beside the other core
data structures (the CHT, the radix tree) rather than in any one of them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchTree:
    """The compressed prefix tree of a batch's block-id sequences.

    A node is a maximal run of block positions shared by the same set of sequences. Node ids
    depend only on which ids are equal (not on their values), so `signature` identifies the
    sharing structure: two batches with equal signatures have equal costs.
    parent[v] is -1 for a top node; ends[i] is the last node of sequence i's path (-1: empty).
    """

    parent: tuple[int, ...]
    offset: tuple[int, ...]  # first block position of the node
    length: tuple[int, ...]  # blocks in the node
    ends: tuple[int, ...]

    @property
    def signature(self) -> tuple[tuple[int, ...], ...]:
        return (self.parent, self.offset, self.length, self.ends)

    def path(self, seq: int) -> list[int]:
        """Node ids of sequence `seq`, root first; each node is covered entirely."""
        out = []
        v = self.ends[seq]
        while v >= 0:
            out.append(v)
            v = self.parent[v]
        out.reverse()
        return out

    def seq_blocks(self, seq: int) -> int:
        v = self.ends[seq]
        return 0 if v < 0 else self.offset[v] + self.length[v]

    @classmethod
    def build(cls, seqs: Sequence[Sequence[Hashable]]) -> BatchTree:
        """Insert sequences one by one, comparing one id per node or split.

        Relies on sharing being prefix-closed: equal ids at position p imply equal ids before
        p. That is physical (a KV block's content depends on every earlier token, so a block
        can only be shared by sequences that share the whole prefix before it) and is how vLLM's
        cumulative block hashes work. Ids shared without their prefix are treated as distinct.
        """
        parent: list[int] = []
        offset: list[int] = []
        length: list[int] = []
        ref: list[tuple[Hashable, ...]] = []  # a sequence that covers the node
        kids: list[dict[Hashable, int]] = []
        top: dict[Hashable, int] = {}
        ends: list[int] = []

        for raw in seqs:
            x = raw if isinstance(raw, tuple) else tuple(raw)
            n = len(x)
            node, children, pos = -1, top, 0
            while pos < n:
                c = children.get(x[pos])
                if c is None:
                    children[x[pos]] = leaf = len(parent)
                    parent.append(node)
                    offset.append(pos)
                    length.append(n - pos)
                    ref.append(x)
                    kids.append({})
                    node = leaf
                    break
                r = ref[c]
                end = pos + length[c]
                if n >= end and x[end - 1] == r[end - 1]:
                    node, children, pos = c, kids[c], end
                    continue
                # Diverges (or ends) inside node c: split c after its last equal position m.
                lo, hi = pos + 1, min(end, n)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if x[mid - 1] == r[mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                m = lo
                upper = len(parent)
                parent.append(node)
                offset.append(pos)
                length.append(m - pos)
                ref.append(r)
                kids.append({r[m]: c})
                children[x[pos]] = upper
                parent[c], offset[c], length[c] = upper, m, end - m
                node, children, pos = upper, kids[upper], m
            ends.append(node)
        return cls(tuple(parent), tuple(offset), tuple(length), tuple(ends))
