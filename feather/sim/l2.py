"""L2 reuse of the paged decode-attention kernel: the mechanism behind claim C1.

A paged kernel reads every sequence's KV blocks, shared or not; a shared block costs DRAM
bandwidth only when it is no longer in L2 when the next sequence reads it. Whether it still is
depends on the order in which the kernel issues its reads, so this module models that order:

Kernel grid (read in vllm-project/flash-attention, the FA2 build vLLM uses on A100 and Ada:
csrc/flash_attn/src/flash_fwd_launch_template.h `run_flash_splitkv_fwd` at commit 039af716, and
flash_api.cpp at 04325b67; Dao-AILab/flash-attention's file at 01afd16d has the same grid).
vLLM's paged decode path runs `flash_fwd_splitkv_kernel` with
`grid(num_m_block, num_splits > 1 ? num_splits : b, num_splits > 1 ? b * h : h)`. For decode
with GQA the queries of one KV head are packed into one thread block (`seqlenq_ngroups_swapped`,
h = KV heads, num_m_block = 1). CUDA issues blocks x-fastest, then y, then z, so:
  - num_splits == 1 (FA2's heuristic picks it once b * h * m_blocks >= 0.8 * 2 * SMs): all
    sequences for head 0, then all for head 1, ... -> `SEQUENCE_FASTEST`;
  - num_splits > 1 (small batches): z = b * h with the head fastest -> `HEAD_FASTEST`. The split
    of one sequence's blocks over several thread blocks is NOT modelled (each thread block reads
    the whole sequence); such grids are at most a wave or two, so almost every shared read is
    concurrent anyway.
Without GQA packing (a step with a prefill chunk), h is the query heads and `kv_group` query
heads read the same KV head; a prefill sequence's several query tiles are modelled as one
thread block (they are adjacent in the grid and run together).

Timing (ASSUMPTIONS): `window` thread blocks are resident at once (SMs x blocks per SM); every
resident block reads one (block, KV head) item per time step (lockstep: equal per-block cost,
no drift); a finished block's slot takes the next block in grid order at the next step; within
a step, blocks read in grid order. L2 is one true LRU of `capacity_items` items of
block_size x head_dim x 2 (K, V) x 2 bytes (the K and V rows of one head in one block are
disjoint cache lines in vLLM's [2, blocks, block_size, kv_heads, head_dim] layout). A step
starts with a cold L2: layers touch disjoint KV, and each layer streams hundreds of MB of
weights (Llama-3-8B: ~0.44 GB per layer) between two reads of the same layer's KV.
Every layer repeats the same pattern, so one layer is modelled.

Two implementations:
  - `exact_l2`: the full access trace through a true LRU (slow; tests and small cases);
  - `fast_l2`: what the simulator calls each step; same schedule, reuse decided analytically
    (see `fast_from_signature_numpy`), memoised on the batch's sharing structure. It sees sharing
    through the batch's prefix tree (`feather.batch_tree.BatchTree`) and assumes capacity >= window.
    The simulator runs the same algorithm compiled (`feather.sim.l2_jit`, identical integers);
    the numpy version here is its specification and the fallback without numba.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from feather.batch_tree import BatchTree
from feather.sim import l2_jit

SEQUENCE_FASTEST = "sequence_fastest"
HEAD_FASTEST = "head_fastest"
GRID_ORDERS = (SEQUENCE_FASTEST, HEAD_FASTEST)

_FAST_CACHE_ENTRIES = 256  # memoised batch compositions (~50 KB each at 800 sequences)
_SAMPLES_PER_RUN = l2_jit.SAMPLES_PER_RUN
_INF_GAP = l2_jit.INF_GAP
_MAX_CLASS = l2_jit.MAX_CLASS


@dataclass(frozen=True, slots=True)
class KernelGrid:
    """How the attention kernel issues its thread blocks, and the L2 they share.

    heads: thread blocks per sequence (KV heads when GQA-packed, query heads otherwise).
    window: thread blocks resident at once (SMs x resident blocks per SM).
    capacity_items: LRU capacity in (block, KV head) items.
    kv_group: consecutive grid heads that read the same KV head (1 when packed).
    order: SEQUENCE_FASTEST or HEAD_FASTEST (see the module docstring).
    """

    heads: int
    window: int
    capacity_items: int
    kv_group: int = 1
    order: str = SEQUENCE_FASTEST

    def __post_init__(self) -> None:
        if self.order not in GRID_ORDERS:
            raise ValueError(f"unknown grid order {self.order!r}; known: {', '.join(GRID_ORDERS)}")
        if min(self.heads, self.window, self.kv_group) < 1 or self.capacity_items < 0:
            raise ValueError(f"invalid kernel grid {self}")
        if self.heads % self.kv_group:
            raise ValueError("heads must be a multiple of kv_group")


@dataclass(frozen=True, slots=True)
class L2Result:
    """Reads of (block, KV head) items in one layer, and how many L2 served."""

    reads: int
    hits: int

    @property
    def misses(self) -> int:
        return self.reads - self.hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.reads if self.reads else 0.0


# ----------------------------------------------------------------------------------------------
# The schedule both models share.


def launch_order(n_seqs: int, grid: KernelGrid) -> tuple[np.ndarray, np.ndarray]:
    """(sequence, grid head) of every thread block, in the order the kernel issues them."""
    seqs, heads = np.arange(n_seqs, dtype=np.int64), np.arange(grid.heads, dtype=np.int64)
    if grid.order == SEQUENCE_FASTEST:
        return np.tile(seqs, grid.heads), np.repeat(heads, n_seqs)
    return np.repeat(seqs, grid.heads), np.tile(heads, n_seqs)


def schedule_starts(lengths: np.ndarray, window: int) -> np.ndarray:
    """Start step of each thread block (lengths in steps, grid order; all lengths > 0).

    The first `window` start at 0; each later one takes the earliest freed slot (a block that
    started at s with n reads frees its slot at s + n). Equivalent to a heap of finish times,
    done a window at a time: the next blocks take the smallest pending finish times, valid up
    to the first block that one of its own predecessors in the batch would have beaten.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    starts = np.zeros(n, dtype=np.int64)
    if n <= window:
        return starts
    if (lengths == lengths[0]).all():
        return (np.arange(n) // window) * lengths[0]
    pool = np.sort(lengths[:window])  # pending slot-free times, sorted
    j = window
    while j < n:
        m = min(window, n - j)
        cand = pool[:m]
        fin = cand + lengths[j : j + m]
        # Block j + i may take cand[i] only if no block j..j+i-1 frees a slot before cand[i].
        beaten = np.minimum.accumulate(fin)[:-1] < cand[1:]
        if beaten.any():
            m = int(np.argmax(beaten)) + 1
        starts[j : j + m] = cand[:m]
        pool = np.sort(np.concatenate((pool[m:], fin[:m])))
        j += m
    return starts


# ----------------------------------------------------------------------------------------------
# Exact: the access trace through a true LRU.


def exact_l2(seqs: Sequence[Sequence[Hashable]], grid: KernelGrid) -> L2Result:
    """Every (block, KV head) read, in lockstep grid order, through an LRU of the capacity."""
    blocks = [tuple(s) for s in seqs]
    cta_seq, cta_head = launch_order(len(blocks), grid)
    ctas = [(i, h) for i, h in zip(cta_seq.tolist(), cta_head.tolist(), strict=True) if blocks[i]]
    lru: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
    cap = grid.capacity_items
    reads = hits = 0
    pending = iter(ctas)
    active: list[list[int]] = []  # [seq, kv head, next position], in grid order
    exhausted = False
    while True:
        while len(active) < grid.window and not exhausted:
            nxt = next(pending, None)
            if nxt is None:
                exhausted = True
            else:
                active.append([nxt[0], nxt[1] // grid.kv_group, 0])
        if not active:
            break
        for cta in active:
            key = (blocks[cta[0]][cta[2]], cta[1])
            reads += 1
            if key in lru:
                hits += 1
                lru.move_to_end(key)
            else:
                lru[key] = None
                if len(lru) > cap:
                    lru.popitem(last=False)
            cta[2] += 1
        active = [c for c in active if c[2] < len(blocks[c[0]])]
    return L2Result(reads, hits)


# ----------------------------------------------------------------------------------------------
# Fast: the same schedule, reuse decided from reuse distances.


def fast_l2(seqs: Sequence[Sequence[Hashable]], grid: KernelGrid) -> L2Result:
    """`exact_l2` approximated in O(thread blocks x path nodes), memoised per structure."""
    return fast_l2_tree(BatchTree.build(seqs), grid)


def fast_l2_tree(tree: BatchTree, grid: KernelGrid) -> L2Result:
    return _fast_from_signature(tree.signature, grid)


@lru_cache(maxsize=_FAST_CACHE_ENTRIES)
def _fast_from_signature(signature: tuple[tuple[int, ...], ...], grid: KernelGrid) -> L2Result:
    if not l2_jit.AVAILABLE:
        return fast_from_signature_numpy(signature, grid)
    parent, offset, length, ends = (np.asarray(x, dtype=np.int64) for x in signature)
    reads, hits = l2_jit.fast_counts(
        parent, offset, length, ends, grid.heads, grid.kv_group, grid.window,
        grid.capacity_items, grid.order == SEQUENCE_FASTEST,
    )
    return L2Result(int(reads), int(hits))


def fast_from_signature_numpy(
    signature: tuple[tuple[int, ...], ...], grid: KernelGrid
) -> L2Result:
    """Reuse-distance evaluation of the lockstep trace.

    A "run" is one thread block reading one tree node for one KV head: it reads the node's item
    p at step a + p, where a = block start + node offset. All runs of one (node, KV head) read the
    same items shifted in time, so an item's previous read is by the run with the next earlier
    start: the gap g is constant along the run. The read hits iff fewer than C distinct items
    were read in between. Over the steps (t - g, t), a run q with gap g_q reads an item that is
    new to that window only during its first g_q steps after t - g (later its items were already
    read in the window), so
        distinct(t - g, t) = sum_q |steps of q  in  [t - g + 1, t - g + 1 + min(g - 1, g_q))|,
    computed from sorted run starts and ends with prefix sums, the runs grouped in gap classes
    of one octave (each represented by its mean gap), plus half of the step's reads for the two
    partial end steps
    (the reads after the earlier read in its step and before the later one in its step; half a
    step is the value that agrees best with `exact_l2`, see tests/test_sim_l2.py).
    Runs with g = 0 (read in the same step by an earlier block) hit; this assumes
    capacity >= window. First reads miss. Each run is evaluated at `_SAMPLES_PER_RUN`
    positions, each standing for its share of the run.
    """
    parent, offset, length, ends = signature
    if not parent:  # every sequence empty
        return L2Result(0, 0)
    n_seqs = len(ends)
    par = np.asarray(parent, dtype=np.int64)
    node_off = np.asarray(offset, dtype=np.int64)
    node_len = np.asarray(length, dtype=np.int64)
    end = np.asarray(ends, dtype=np.int64)
    lens = np.where(end >= 0, node_off[end] + node_len[end], 0)
    cta_seq, cta_head = launch_order(n_seqs, grid)
    keep = lens[cta_seq] > 0
    cta_seq, cta_kvh = cta_seq[keep], cta_head[keep] // grid.kv_group
    if cta_seq.size == 0:
        return L2Result(0, 0)
    starts = schedule_starts(lens[cta_seq], grid.window)
    reads = int(lens[cta_seq].sum())

    # Paths as flat arrays: path_nodes[path_ptr[i]:path_ptr[i + 1]] is sequence i's path,
    # root first. anc[d] is the d-th ancestor of each sequence's end node (-1 above the root).
    anc = [end]
    while (anc[-1] >= 0).any():
        up = anc[-1]
        anc.append(np.where(up >= 0, par[np.maximum(up, 0)], -1))
    anc_m = np.stack(anc[-2::-1])  # (depth, seqs), root side first, -1 padding on top
    path_cnt = (anc_m >= 0).sum(axis=0)
    path_ptr = np.zeros(n_seqs + 1, dtype=np.int64)
    np.cumsum(path_cnt, out=path_ptr[1:])
    path_nodes = anc_m.T[anc_m.T >= 0]

    # Runs: (thread block, node on its sequence's path), generated in grid order.
    cnt = path_cnt[cta_seq]
    run_cta = np.repeat(np.arange(cta_seq.size), cnt)
    first = np.repeat(np.cumsum(cnt) - cnt, cnt)
    run_node = path_nodes[path_ptr[cta_seq][run_cta] + (np.arange(run_cta.size) - first)]
    run_a = starts[run_cta] + node_off[run_node]
    run_len = node_len[run_node]
    n_kv = grid.heads // grid.kv_group
    stream = run_node * n_kv + cta_kvh[run_cta]

    # Sort runs by (stream, start); ties (same start) have gap 0 in either order.
    order = np.argsort(stream * (int(run_a.max()) + 1) + run_a)
    s_stream, s_a, s_len = stream[order], run_a[order], run_len[order]
    gap = np.full(order.size, _INF_GAP, dtype=np.int64)
    same = s_stream[1:] == s_stream[:-1]
    gap[1:][same] = (s_a[1:] - s_a[:-1])[same]

    hits = int(s_len[gap == 0].sum())
    cap, window = grid.capacity_items, grid.window
    finite = (gap > 0) & (gap < _INF_GAP)
    # Upper bound on distinct items between two reads g steps apart: (g - 1) + 1 steps x window.
    sure = finite & (gap * window < cap)
    hits += int(s_len[sure].sum())
    ask = finite & ~sure
    if ask.any():
        hits += _evaluate_runs(s_a, s_len, gap, ask, cap)
    return L2Result(reads, hits)


def _evaluate_runs(a: np.ndarray, n: np.ndarray, gap: np.ndarray, ask: np.ndarray, cap: int) -> int:
    """Hits of the runs marked `ask`, from distinct-item counts over their reuse windows."""
    counted = gap > 0  # same-step re-reads add no distinct items
    ca, cg, cb = a[counted], gap[counted], a[counted] + n[counted]
    # Gap classes: octaves of finite gaps, one class for first reads.
    finite = cg < _INF_GAP
    cls_raw = np.full(cg.size, _MAX_CLASS, dtype=np.int64)
    cls_raw[finite] = np.log2(cg[finite]).astype(np.int64)
    used = np.bincount(cls_raw, minlength=_MAX_CLASS + 1)
    remap = np.cumsum(used > 0) - 1
    cls = remap[cls_raw]
    k = int(remap[-1]) + 1
    gamma = np.bincount(cls, weights=cg.astype(np.float64), minlength=k) / used[used > 0]
    if used[_MAX_CLASS]:
        gamma[-1] = np.inf
    reads_before = _ReadsBefore(cls, ca, cb, k)

    qa, qn, qg = a[ask], n[ask], gap[ask]
    j = np.arange(_SAMPLES_PER_RUN)[:, None]
    lo = (j * qn) // _SAMPLES_PER_RUN
    hi = ((j + 1) * qn) // _SAMPLES_PER_RUN
    weight = (hi - lo).ravel()  # reads each sample stands for
    t = (qa + (lo + np.maximum(hi - 1, lo)) // 2).ravel()  # the sampled read's step
    g = np.broadcast_to(qg, lo.shape).ravel()
    by_t = np.argsort(t)  # sorted needles make the lookups below cheaper
    t, g, weight = t[by_t], g[by_t], weight[by_t]
    start = t - g + 1  # first whole step after the previous read
    # All classes over [start, t), less what classes with gaps < g - 1 read after their span.
    distinct = reads_before.total(t) - reads_before.total(start)
    cls_q, q = np.nonzero(gamma[:, None] < (g - 1)[None, :])  # class-major pairs
    if cls_q.size:
        cut = start[q] + np.rint(gamma[cls_q]).astype(np.int64)
        late = reads_before.of_class(cls_q, t[q]) - reads_before.of_class(cls_q, cut)
        distinct -= np.bincount(q, weights=late, minlength=t.size).astype(np.int64)
    distinct += reads_before.active(t) // 2
    return int((weight * (distinct < cap)).sum())


class _ReadsBefore:
    """Reads by runs at steps < t: each run (start a, end b) adds one read per step in
    [a, b), so reads(t) = sum_{a < t} (t - a) - sum_{b < t} (t - b), from sorted starts and
    ends with prefix sums (exact at integer t). Counts of starts/ends below t come from a
    table over the (small) range of steps, so a lookup is an index, not a binary search."""

    def __init__(self, cls: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> None:
        self._span = int(b.max()) + 2 if b.size else 2  # steps 0 .. max end, + "beyond"
        self._all = (self._events(a), self._events(b))
        order = np.argsort(cls, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(cls, minlength=k))))
        a, b = a[order], b[order]
        self._classes = [
            (self._events(a[lo:hi]), self._events(b[lo:hi]))
            for lo, hi in itertools.pairwise(bounds)
        ]

    def _events(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(below, sums): below[i] = how many x < i (i clipped to the table), sums[j] = sum
        of the j smallest x."""
        xs = np.sort(x)
        sums = np.zeros(xs.size + 1, dtype=np.int64)
        np.cumsum(xs, out=sums[1:])
        below = np.zeros(self._span + 1, dtype=np.int64)
        np.cumsum(np.bincount(xs, minlength=self._span)[: self._span], out=below[1:])
        return below, sums

    def _count_below(self, below: np.ndarray, t: np.ndarray) -> np.ndarray:
        return below[np.minimum(np.maximum(t, 0), self._span)]  # np.clip is slower here

    def _at(self, curve: tuple[tuple[np.ndarray, np.ndarray], ...], t: np.ndarray) -> np.ndarray:
        (a, sa), (b, sb) = curve
        na = self._count_below(a, t)
        nb = self._count_below(b, t)
        return t * (na - nb) - (sa[na] - sb[nb])

    def total(self, t: np.ndarray) -> np.ndarray:
        """Reads by all runs at steps < t."""
        return self._at(self._all, t)

    def of_class(self, c: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Reads by runs of class c[i] at steps < t[i]; c must be sorted (class-major)."""
        out = np.empty(t.size, dtype=np.int64)
        bounds = np.searchsorted(c, np.arange(len(self._classes) + 1))
        for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            if hi > lo:
                out[lo:hi] = self._at(self._classes[k], t[lo:hi])
        return out

    def active(self, t: np.ndarray) -> np.ndarray:
        """Runs reading at step t (all classes): starts <= t less ends <= t."""
        (a, _), (b, _) = self._all
        return self._count_below(a, t + 1) - self._count_below(b, t + 1)


def clear_fast_cache() -> None:
    """Forget memoised compositions (tests and benchmarks of the cold cost)."""
    _fast_from_signature.cache_clear()
