"""Which decode KV a CPU attention kernel reads from memory: a cache of finite capacity, in
the kernel's read order.

The paper's homogeneity effect is cache reuse: a request that re-reads a prefix another just
read finds it in cache, if the cache still holds it. `feather.kernels.traffic.
cold_decode_kv_tokens` (the `adjacent` rule) asks only whether the request before it in the
kernel's order shares the blocks; it knows nothing about capacity, so it calls a 16K-token
prefix re-read after its neighbour warm, though one head's K and V of it (16 MiB in fp32)
outgrow a CPU core's caches, and vLLM's kernel measurably re-reads it from memory
(docs/stop.md, the cpu-attn tables). The `capacity` rule replays the kernel's reads through
a least-recently-used cache of `capacity_blocks` items and calls a read cold when it misses:
the GPU profiles' L2 model (`feather.sim.l2`) with one thread (a window of one) and the
host's cache in place of the GPU's L2.

The read order (one engine thread): vLLM's CPU kernel, as the measurements fit, reads one KV
head's blocks for every request of the batch before the next head's (`feather.sim.l2`'s
SEQUENCE_FASTEST); heads never share blocks, so every head replays the same stream and one
is modelled. An item is one block's K and V of one head (block_size x head_dim x 2 elements).
A step starts cold: the other layers' KV and the weights pass through between two reads of
one layer's KV. With `read_once` (our cascade backend) a pure decode step whose requests all
share leading blocks reads that common prefix once, then each request's rest
(`feather.kernels.plan`'s cascade plan; the step falls back to vLLM's order otherwise).

Where a read of block b by request j repeats request i's, the cache saw every other block of
request i in between (the blocks after b, then request j's blocks before b, which are i's),
so under LRU a whole run of adjacent sharers is warm when one request's per-head KV fits the
capacity and cold when it does not. `trace_cold_kv_tokens` uses that to count the rule from
a real trace that recorded no block tables.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from feather.kernels.plan import shared_prefix_blocks
from feather.kernels.traffic import cold_decode_kv_tokens

ADJACENT = "adjacent"
CAPACITY = "capacity"
COLD_RULES = (ADJACENT, CAPACITY)
LRU = "lru"  # a read hits when fewer than `capacity` other items came between
RETAIN = "retain"  # beyond the capacity, a cyclic stream keeps `capacity` of its items
REPLACEMENTS = (LRU, RETAIN)
_MEMO_ENTRIES = 4096  # step structures remembered (a simulation repeats them step after step)

Row = tuple[Sequence[Hashable], int, int]  # (block ids, context tokens, new tokens)


@dataclass(frozen=True, slots=True)
class ColdRule:
    """How a step's cold decode KV tokens are counted (see the module docstring).

    kind: `adjacent` (the request before shares the blocks) or `capacity` (a replay).
    capacity_blocks: items (one head's K and V of one block) the cache holds.
    read_once: the backend reads a pure decode step's common prefix once (cascade).
    replacement: `lru` - a re-read hits when fewer than capacity_blocks other items were
        read since (all or nothing: a run of sharers each reading more than the capacity
        misses entirely); `retain` - the same below the capacity, and beyond it a fraction
        capacity / (distance + 1) hits, as a cache whose replacement resists thrashing keeps
        part of a cyclic stream (the measured kernels degrade so: docs/stop.md's tables).
    """

    kind: str = ADJACENT
    capacity_blocks: int = 0
    read_once: bool = False
    replacement: str = LRU

    def __post_init__(self) -> None:
        if self.kind not in COLD_RULES:
            raise ValueError(f"unknown cold rule {self.kind!r}; known: {', '.join(COLD_RULES)}")
        if self.replacement not in REPLACEMENTS:
            raise ValueError(
                f"unknown replacement {self.replacement!r}; known: {', '.join(REPLACEMENTS)}"
            )
        if self.kind == CAPACITY and self.capacity_blocks < 1:
            raise ValueError("the capacity rule needs capacity_blocks >= 1")

    def hit(self, distance: int) -> float:
        """The fraction of a read that hits, `distance` other items after its last read
        (negative: never read before in the step)."""
        if distance < 0:
            return 0.0
        if distance < self.capacity_blocks:
            return 1.0
        return self.capacity_blocks / (distance + 1) if self.replacement == RETAIN else 0.0


def _is_decode(context: int, new: int) -> bool:
    return new == 1 and context > 0


def reuse_distances(stream: Sequence[Hashable]) -> list[int]:
    """For each access, the distinct other items accessed since the same item's previous
    access (-1 for a first access): LRU stack distances, by a Fenwick tree over access times
    in which each item marks only its latest access."""
    n = len(stream)
    tree = [0] * (n + 1)

    def add(i: int, value: int) -> None:
        i += 1
        while i <= n:
            tree[i] += value
            i += i & -i

    def before(i: int) -> int:  # marks at positions < i
        total = 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    last: dict[Hashable, int] = {}
    out = []
    for t, item in enumerate(stream):
        previous = last.get(item)
        if previous is None:
            out.append(-1)
        else:
            out.append(before(t) - before(previous + 1))
            add(previous, -1)
        add(t, 1)
        last[item] = t
    return out


def common_prefix_blocks(rows: Sequence[Row], block_size: int) -> int:
    """Leading full blocks every row holds at the same positions (the cascade plan's shared
    prefix, `feather.kernels.plan.shared_prefix_blocks`)."""
    if not rows:
        return 0
    return shared_prefix_blocks([b for b, _, _ in rows], [c + n for _, c, n in rows], block_size)


def reads_prefix_once(rows: Sequence[Row], block_size: int) -> int:
    """The common prefix blocks the cascade backend reads once in this step, 0 where it hands
    the step to vLLM's kernel (a prefill row, a single row, or nothing shared)."""
    if len(rows) < 2 or not all(_is_decode(c, n) for _, c, n in rows):
        return 0
    return common_prefix_blocks(rows, block_size)


@lru_cache(maxsize=_MEMO_ENTRIES)
def _hits(
    structure: tuple[tuple[tuple[Hashable, ...], int, bool], ...], rule: ColdRule
) -> tuple[tuple[int, int, float], ...]:
    """(read, block index, fraction hit) of every counted re-read that hits at all; a read
    is (block ids, first block index read, counted)."""
    stream, where = [], []
    for r, (blocks, first, counted) in enumerate(structure):
        for index in range(first, len(blocks)):
            stream.append(blocks[index])
            where.append((r, index, counted))
    out = []
    for (r, index, counted), distance in zip(where, reuse_distances(stream), strict=True):
        fraction = rule.hit(distance)
        if counted and fraction > 0:
            out.append((r, index, fraction))
    return tuple(out)


def replay_cold_kv_tokens(
    reads: Sequence[tuple[Sequence[Hashable], int, int, bool]], block_size: int, rule: ColdRule
) -> float:
    """Replay reads through the rule's cache; the tokens of the counted reads that missed.
    Each read is (block ids, first block index, tokens the blocks hold, counted): a sequence
    reads its blocks from that index on, in order."""
    structure = tuple((tuple(b), first, counted) for b, first, _, counted in reads)
    cold = 0.0
    for _, first, tokens, counted in reads:
        if counted:
            cold += max(0, tokens - first * block_size)
    for r, index, fraction in _hits(structure, rule):
        tokens = reads[r][2]
        cold -= fraction * max(0, min(block_size, tokens - index * block_size))
    return cold


def lru_cold_kv_tokens(
    reads: Iterable[tuple[Sequence[Hashable], int, int, bool]],
    block_size: int,
    capacity_blocks: int,
) -> int:
    """The LRU replay read by read (the specification `replay_cold_kv_tokens` is tested
    against): an ordered dict of at most `capacity_blocks` items."""
    cache: OrderedDict[Hashable, None] = OrderedDict()
    cold = 0
    for blocks, first, tokens, counted in reads:
        for index in range(first, len(blocks)):
            block = blocks[index]
            if block in cache:
                cache.move_to_end(block)
                continue
            cache[block] = None
            if len(cache) > capacity_blocks:
                cache.popitem(last=False)
            if counted:
                cold += max(0, min(block_size, tokens - index * block_size))
    return cold


def cold_kv_tokens(rows: Iterable[Row], block_size: int, rule: ColdRule) -> float:
    """A step's cold decode KV tokens under `rule`; rows in the kernel's order. A decode
    reads its context and new token; a prefill row's reads pass through the cache too but
    are not decode KV, so they are not counted."""
    rows = list(rows)
    if rule.kind == ADJACENT:
        return cold_decode_kv_tokens(rows, block_size)
    once = reads_prefix_once(rows, block_size) if rule.read_once else 0
    reads = [(b, once, c + n, _is_decode(c, n)) for b, c, n in rows]
    if once:  # the common prefix once, then each row's rest
        reads.insert(0, (rows[0][0][:once], 0, once * block_size, True))
    return replay_cold_kv_tokens(reads, block_size, rule)


def trace_cold_kv_tokens(
    context_tokens: Sequence[int],
    new_tokens: Sequence[int],
    shared_prefix_tokens: int,
    block_size: int,
    rule: ColdRule,
) -> int:
    """`cold_kv_tokens` of a real step from what its trace row holds (each sequence's context
    and new tokens and the tokens in full blocks all of them share, no block tables).

    Exact where the trace decides it: a step the cascade backend reads once (the common
    prefix once, every rest cold), and any step in vLLM's order where every sequence's
    per-head blocks, less one, fill the capacity (then every re-read misses: the module
    docstring). A cascade step's rests are taken as private (no request shares more than
    the batch's common prefix with another, as in the synthetic workloads). Otherwise the
    trace cannot tell which re-reads hit, and this raises."""
    if rule.kind != CAPACITY or rule.replacement != LRU:
        raise ValueError("trace_cold_kv_tokens counts the capacity rule with LRU replacement")
    rows = list(zip(context_tokens, new_tokens, strict=True))
    decode_kv = sum(c + 1 for c, n in rows if _is_decode(c, n))
    shared = shared_prefix_tokens // block_size
    if rule.read_once and len(rows) >= 2 and shared and all(_is_decode(c, n) for c, n in rows):
        return decode_kv - (len(rows) - 1) * shared * block_size
    if all(-(-(c + n) // block_size) - 1 >= rule.capacity_blocks for c, n in rows):
        return decode_kv
    raise ValueError(
        f"a step of {len(rows)} sequences with some per-head KV within the cache's "
        f"{rule.capacity_blocks} blocks: which re-reads hit needs the kernel's block tables, "
        "which this trace does not hold"
    )
