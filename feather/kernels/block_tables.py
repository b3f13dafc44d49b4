"""Block tables of synthetic decode batches: who shares which KV blocks (pure Python).

As vLLM's prefix caching lays them out: requests that share a prefix hold the SAME physical
block ids for its full blocks; the prefix's last partial block and each request's own tokens
sit in private blocks. Levels nest: a root prefix shared by every grouped request, then a
prefix per group, then the request's own suffix. A divergent request shares nothing (own
blocks for all its tokens) but has the same length, so only sharing changes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """One decode batch: block tables (padded to equal width with block 0) and lengths."""

    name: str
    block_size: int
    tables: list[list[int]]
    seq_lens: list[int]
    num_blocks: int
    groups: int
    divergent: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    def padded_tables(self) -> list[list[int]]:
        width = max((len(row) for row in self.tables), default=1)
        return [row + [0] * (width - len(row)) for row in self.tables]


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` items in `parts` groups whose sizes differ by at most one, larger first."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def grouped_batch(
    name: str,
    group_sizes: list[int],
    *,
    prefix_tokens: int,
    suffix_tokens: int,
    block_size: int,
    root_tokens: int = 0,
    divergent: int = 0,
    shuffle_seed: int | None = None,
) -> BatchLayout:
    """Requests in groups; every request is root + group prefix + own suffix tokens long.

    `divergent` requests (placed at seeded positions, or last without a seed) replace
    grouped ones and share nothing. `shuffle_seed` shuffles the batch order (mixed batches
    in arrival order); None keeps groups contiguous.
    """
    total = root_tokens + prefix_tokens + suffix_tokens
    if total <= 0:
        raise ValueError("requests need at least one token")
    if divergent > sum(group_sizes):
        raise ValueError(f"{divergent} divergent requests in a batch of {sum(group_sizes)}")
    next_block = iter(range(1 << 62))

    def fresh(count: int) -> list[int]:
        return [next(next_block) for _ in range(count)]

    root_full = root_tokens // block_size
    root = fresh(root_full)
    own_start = root_tokens + prefix_tokens  # tokens before this are shared when full
    members = [g for g, size in enumerate(group_sizes) for _ in range(size)]
    rng = random.Random(shuffle_seed)
    if shuffle_seed is not None:
        rng.shuffle(members)
    if divergent:
        picks = rng.sample(range(len(members)), divergent) if shuffle_seed is not None else []
        picks = picks or list(range(len(members) - divergent, len(members)))
        for i in picks:
            members[i] = -1
    group_blocks = {}
    for g in sorted(set(members) - {-1}):
        # the group's full blocks past the root; a root remainder starts the group's part
        group_blocks[g] = fresh(own_start // block_size - root_full)
    tables, lens = [], []
    total_blocks = -(-total // block_size)
    for g in members:
        shared = [] if g < 0 else root + group_blocks[g]
        tables.append(shared + fresh(total_blocks - len(shared)))
        lens.append(total)
    return BatchLayout(
        name=name,
        block_size=block_size,
        tables=tables,
        seq_lens=lens,
        num_blocks=next(next_block),
        groups=len(group_sizes),
        divergent=divergent,
    )
