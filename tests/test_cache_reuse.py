"""The cold-KV capacity rule (feather/kernels/cache_reuse.py) against brute-force references:
reuse distances counted item by item, an LRU replayed read by read, and the GPU L2 model's
exact LRU (`feather.sim.l2.exact_l2`) with one thread block at a time."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.kernels.cache_reuse import (
    ADJACENT,
    CAPACITY,
    LRU,
    RETAIN,
    ColdRule,
    cold_kv_tokens,
    lru_cold_kv_tokens,
    replay_cold_kv_tokens,
    reuse_distances,
    trace_cold_kv_tokens,
)
from feather.kernels.traffic import cold_decode_kv_tokens
from feather.sim.l2 import SEQUENCE_FASTEST, KernelGrid, exact_l2

BLOCK = 4


def brute_distances(stream: list[int]) -> list[int]:
    out = []
    for t, item in enumerate(stream):
        before = [i for i in range(t) if stream[i] == item]
        out.append(len(set(stream[before[-1] + 1 : t]) - {item}) if before else -1)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=60))
def test_reuse_distances_count_the_distinct_items_in_between(stream) -> None:
    assert reuse_distances(stream) == brute_distances(stream)


def batches(draw_groups: int, rng: random.Random) -> list[tuple[tuple[int, ...], int, int]]:
    """Rows of a step: groups share leading blocks (prefix trees two deep), decode or prefill."""
    rows, fresh = [], 1000
    prefixes = [tuple(range(g * 100, g * 100 + rng.randrange(0, 9))) for g in range(draw_groups)]
    for _ in range(rng.randrange(1, 10)):
        shared = rng.choice(prefixes)
        own = rng.randrange(1, 4)
        blocks = shared + tuple(range(fresh, fresh + own))
        fresh += own
        tokens = len(blocks) * BLOCK - rng.randrange(0, BLOCK)
        new = 1 if rng.random() < 0.8 else rng.randrange(1, 3 * BLOCK)
        rows.append((blocks, max(0, tokens - new), min(new, tokens)))
    return rows


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), groups=st.integers(1, 4), capacity=st.integers(1, 40))
def test_the_replay_is_an_lru_cache_read_by_read(seed, groups, capacity) -> None:
    rows = batches(groups, random.Random(seed))
    reads = [(b, 0, c + n, n == 1 and c > 0) for b, c, n in rows]
    rule = ColdRule(CAPACITY, capacity)
    assert replay_cold_kv_tokens(reads, BLOCK, rule) == lru_cold_kv_tokens(reads, BLOCK, capacity)
    assert cold_kv_tokens(rows, BLOCK, rule) == lru_cold_kv_tokens(reads, BLOCK, capacity)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), groups=st.integers(1, 4), capacity=st.integers(1, 40))
def test_one_head_read_sequence_after_sequence_is_the_gpu_l2_model_with_one_thread(
    seed, groups, capacity
) -> None:
    """Decode rows whose blocks are all full: the cold tokens are the L2 model's misses (one
    KV head, a window of one thread block, sequence-fastest order) times the block size."""
    rng = random.Random(seed)
    rows = [(b, len(b) * BLOCK - 1, 1) for b, _, _ in batches(groups, rng)]
    grid = KernelGrid(heads=1, window=1, capacity_items=capacity, order=SEQUENCE_FASTEST)
    misses = exact_l2([b for b, _, _ in rows], grid).misses
    assert cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, capacity)) == misses * BLOCK


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), groups=st.integers(1, 4), capacity=st.integers(1, 40))
def test_retained_hits_lie_between_lru_and_an_unbounded_cache(seed, groups, capacity) -> None:
    rows = batches(groups, random.Random(seed))
    lru = cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, capacity, replacement=LRU))
    retain = cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, capacity, replacement=RETAIN))
    unbounded = cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, 10**6))
    assert unbounded - 1e-9 <= retain <= lru + 1e-9


def test_the_adjacent_rule_is_the_capacity_rule_of_group_sorted_batches_that_fit() -> None:
    rng = random.Random(3)
    for _ in range(200):
        rows = sorted(batches(rng.randrange(1, 4), rng), key=lambda r: r[0][:1])
        rows = [(b, len(b) * BLOCK - 2, 1) for b, _, _ in rows]
        wide = ColdRule(CAPACITY, 10**6)
        assert cold_kv_tokens(rows, BLOCK, wide) <= cold_decode_kv_tokens(rows, BLOCK)
        if all(len({b[:k] for b, _, _ in rows}) == 1 for k in (1,)):  # one group: equal
            assert cold_kv_tokens(rows, BLOCK, wide) == cold_decode_kv_tokens(rows, BLOCK)
        assert cold_kv_tokens(rows, BLOCK, ColdRule(ADJACENT)) == cold_decode_kv_tokens(
            rows, BLOCK
        )


def test_a_prefix_per_head_over_the_capacity_is_cold_for_every_sharer_but_read_once() -> None:
    prefix = tuple(range(10))  # 10 blocks per head, a capacity of 8: every re-read misses
    rows = [((*prefix, 100 + i), 10 * BLOCK + 1, 1) for i in range(4)]
    decode_kv = sum(c + 1 for _, c, _ in rows)
    assert cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, 8)) == decode_kv
    assert cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, 12)) == decode_kv - 3 * 10 * BLOCK
    once = ColdRule(CAPACITY, 8, read_once=True)  # cascade: the prefix once, then the rests
    assert cold_kv_tokens(rows, BLOCK, once) == decode_kv - 3 * 10 * BLOCK
    # a retaining cache keeps 8 of the 10 blocks of the cycle: 8/11 of each re-read hits
    retain = cold_kv_tokens(rows, BLOCK, ColdRule(CAPACITY, 8, replacement=RETAIN))
    assert retain == pytest.approx(decode_kv - 3 * 10 * BLOCK * 8 / 11)
    # mixed in a prefill row, or alone, cascade hands the step to vLLM's order
    mixed = [*rows, ((500, 501), 2, 5)]
    assert cold_kv_tokens(mixed, BLOCK, once) == decode_kv


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.integers(1, 12), cascade=st.booleans())
def test_the_trace_count_agrees_with_the_block_tables_wherever_it_decides(
    seed, capacity, cascade
) -> None:
    """Rows as the engine's steps hold them (one group's prefix or several, private rests);
    the trace keeps only each row's shape and the batch's common full-block prefix."""
    rng = random.Random(seed)
    groups = rng.randrange(1, 4)
    prefixes = [tuple(range(g * 100, g * 100 + rng.randrange(1, 16))) for g in range(groups)]
    rows, fresh = [], 1000
    for _ in range(rng.randrange(1, 8)):
        prefix = rng.choice(prefixes)
        tail = rng.randrange(1, 2 * BLOCK)
        blocks = prefix + tuple(range(fresh, fresh + -(-tail // BLOCK)))
        fresh += len(blocks)
        context = len(prefix) * BLOCK + tail - 1
        rows.append((blocks, context, 1))
    rule = ColdRule(CAPACITY, capacity, read_once=cascade)
    depth = min(len(b) for b, _, _ in rows)
    common = next((k for k in range(depth) if len({b[k] for b, _, _ in rows}) > 1), depth)
    common = min(common, min((c + 1) // BLOCK for _, c, _ in rows))
    shapes = ([c for _, c, _ in rows], [n for _, _, n in rows], common * BLOCK, BLOCK, rule)
    try:
        counted = trace_cold_kv_tokens(*shapes)
    except ValueError as exc:
        assert "block tables" in str(exc)
        return
    assert counted == cold_kv_tokens(rows, BLOCK, rule)


def test_rules_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown cold rule"):
        ColdRule("nearby")
    with pytest.raises(ValueError, match="capacity_blocks >= 1"):
        ColdRule(CAPACITY, 0)
    with pytest.raises(ValueError, match="unknown replacement"):
        ColdRule(CAPACITY, 4, replacement="fifo")
    with pytest.raises(ValueError, match="LRU replacement"):
        trace_cold_kv_tokens([5], [1], 0, BLOCK, ColdRule(CAPACITY, 4, replacement=RETAIN))
