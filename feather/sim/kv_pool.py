"""A KV block pool with automatic prefix caching, as vLLM V1's `BlockPool` behaves.

- A sequence holds a list of blocks of `block_size` tokens; shared blocks are reference
  counted, so a prefix cached once is held by every sequence that hit it.
- A full block is registered under its cumulative hash as soon as it is allocated for
  computation (vLLM caches at `allocate_slots`), so a request admitted later in the same
  step already hits it (each layer writes the step's KV before attention reads it).
- Freed blocks go to the free queue in reverse order: hashed ones at the tail (kept for
  reuse, evicted least recently used first), unhashed ones at the head (reused first).
  Allocation pops the head and drops the evicted block's hash. A block with references
  is never in the free queue, so it can never be evicted; the pool is never over capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from feather.memory import check_fits

# The pool's bookkeeping per block: ~140 bytes measured at creation (free-queue entry,
# reference count, hash slot), twice that once blocks hold cached hashes.
BYTES_PER_BLOCK = 300


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        check_fits(f"a KV pool of {num_blocks} blocks", num_blocks * BYTES_PER_BLOCK)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._ref = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        self._cached: dict[Hashable, int] = {}
        self._held: dict[Hashable, list[int]] = {}
        # Per sequence, how many of its leading blocks are registered: a held block is never
        # evicted, so they stay registered until the sequence frees them.
        self._registered: dict[Hashable, int] = {}
        self.evictions = 0

    # ---- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (unreferenced, cached ones included)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_of(self, seq_id: Hashable) -> list[int]:
        return self._held.get(seq_id, [])

    def longest_hit(self, hashes: Sequence[Hashable], max_tokens: int) -> list[int]:
        """Cached blocks for the leading full-block hashes, at most max_tokens worth."""
        if not self.enable_caching:
            return []
        out = []
        for h in hashes[: max(0, max_tokens) // self.block_size]:
            block = self._cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def covers(self, seq_id: Hashable, num_tokens: int) -> bool:
        """Whether `allocate` and `cache_full_blocks` for num_tokens would change nothing: the
        sequence holds the blocks and every full one among them is registered (most decode
        steps, which the engine then skips at the cost of one lookup)."""
        held = self._held.get(seq_id)
        return (
            held is not None
            and len(held) * self.block_size >= num_tokens
            and num_tokens // self.block_size <= self._registered.get(seq_id, 0)
        )

    def blocks_needed(self, seq_id: Hashable, num_tokens: int, hit: Sequence[int] = ()) -> int:
        """Free blocks an `allocate` of this size would take (cached hits that sit in the
        free queue count: taking a reference removes them from it)."""
        held = len(self._held.get(seq_id, ()))
        new = max(0, -(-num_tokens // self.block_size) - held - len(hit))
        return new + sum(1 for b in hit if self._ref[b] == 0)

    # ---- changes -------------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int, hit: Sequence[int] = ()) -> bool:
        """Hold blocks for num_tokens tokens, starting with the cache hits; all or nothing."""
        if not hit:  # most calls: a decode step whose last block still has room
            held = self._held.get(seq_id)
            if held is not None and len(held) * self.block_size >= num_tokens:
                return True
        if self.blocks_needed(seq_id, num_tokens, hit) > len(self._free):
            return False
        held = self._held.setdefault(seq_id, [])
        if hit and held:
            raise ValueError(f"sequence {seq_id!r} already holds blocks; hits apply to new ones")
        for block in hit:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
            held.append(block)
        while len(held) * self.block_size < num_tokens:
            block, _ = self._free.popitem(last=False)
            old = self._hash[block]
            if old is not None:
                if self._cached.get(old) == block:
                    del self._cached[old]
                self._hash[block] = None
                self.evictions += 1
            self._ref[block] = 1
            held.append(block)
        return True

    def cache_full_blocks(
        self, seq_id: Hashable, hashes: Sequence[Hashable], num_tokens: int
    ) -> None:
        """Register the sequence's full blocks up to num_tokens under their hashes."""
        if not self.enable_caching:
            return
        held = self._held.get(seq_id, ())
        start = self._registered.get(seq_id, 0)
        stop = min(num_tokens // self.block_size, len(held), len(hashes))
        for i in range(start, stop):
            block = held[i]
            if self._hash[block] is None:
                h = hashes[i]
                self._hash[block] = h
                self._cached.setdefault(h, block)
        if stop > start:
            self._registered[seq_id] = stop

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence's references; see the module docstring for the queue order."""
        self._registered.pop(seq_id, None)
        for block in reversed(self._held.pop(seq_id, [])):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:
                    self._free.move_to_end(block, last=False)

    def check_invariants(self) -> None:
        """For tests: references match holders; free blocks are exactly the unreferenced."""
        refs = [0] * self.num_blocks
        for blocks in self._held.values():
            for b in blocks:
                refs[b] += 1
        assert refs == self._ref, "reference counts disagree with holders"
        assert set(self._free) == {b for b in range(self.num_blocks) if refs[b] == 0}
        for h, b in self._cached.items():
            assert self._hash[b] == h
