"""The prefix tree and the plans built on it, against brute force and hand-built batches."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from feather.kernels.block_tables import grouped_batch, split_evenly
from feather.kernels.plan import make_plan, plan_cascade, shared_prefix_blocks
from feather.kernels.tree import prefix_tree


def brute_force_nodes(tables, lens, bs) -> set[tuple[frozenset[int], int, int]]:
    """(requests, first position, last position) of every maximal run of block positions
    whose set of requests with an identical prefix up to there stays the same."""

    def keys(seq: int) -> list[tuple[int, int]]:
        n = lens[seq]
        return [(tables[seq][p], min(bs, n - p * bs)) for p in range(-(-n // bs) if n > 0 else 0)]

    rows = [keys(s) for s in range(len(lens))]
    sets: dict[tuple[int, int], frozenset[int]] = {}
    for s, row in enumerate(rows):
        for p in range(len(row)):
            sets[s, p] = frozenset(o for o in range(len(rows)) if rows[o][: p + 1] == row[: p + 1])
    nodes = set()
    for (s, p), members in sets.items():
        if p > 0 and sets[s, p - 1] == members:
            continue  # not the start of a run
        last = p
        while (s, last + 1) in sets and sets[s, last + 1] == members:
            last += 1
        nodes.add((members, p, last))
    return nodes


tables_strategy = st.integers(1, 4).flatmap(
    lambda bs: st.tuples(
        st.just(bs),
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 3), min_size=0, max_size=5),  # few ids: many equal
                st.integers(0, 5 * bs),
            ),
            min_size=1,
            max_size=7,
        ),
    )
)


@settings(max_examples=300, deadline=None)
@given(tables_strategy)
def test_tree_matches_brute_force(case) -> None:
    bs, rows = case
    tables, lens = [], []
    for ids, n in rows:
        need = -(-n // bs)
        tables.append((ids + [0] * need)[: max(need, 1)])
        lens.append(n)
    nodes = prefix_tree(tables, lens, bs)
    got = {(frozenset(v.queries), v.first_block, v.first_block + len(v.blocks) - 1) for v in nodes}
    assert got == brute_force_nodes(tables, lens, bs)
    # every request's tokens are covered exactly once, in order, by its path
    for seq, n in enumerate(lens):
        mine = sorted((v for v in nodes if seq in v.queries), key=lambda v: v.first_block)
        assert sum(v.tokens for v in mine) == n
        flat = [b for v in mine for b in v.blocks]
        assert flat == [int(b) for b in tables[seq][: len(flat)]]
        for v in mine:
            assert v.parent == -1 or seq in nodes[v.parent].queries


def test_tree_of_a_three_level_batch_by_hand() -> None:
    tables = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 5, 6], [0, 7, 8, 9]]
    nodes = prefix_tree(tables, [16, 15, 13, 16], 4)
    by_start = {(v.first_block, v.queries): (v.blocks, v.tokens) for v in nodes}
    assert by_start == {
        (0, (0, 1, 2, 3)): ((0,), 4),
        (1, (0, 1, 2)): ((1,), 4),
        (2, (0, 1)): ((2,), 4),
        (3, (0,)): ((3,), 4),
        (3, (1,)): ((4,), 3),
        (2, (2,)): ((5, 6), 5),
        (1, (3,)): ((7, 8, 9), 12),
    }


def test_partial_last_block_is_shared_only_with_equal_use() -> None:
    nodes = prefix_tree([[0, 1], [0, 1], [0, 1]], [7, 7, 8], 4)
    assert {(v.queries, v.tokens) for v in nodes} == {((0, 1, 2), 4), ((0, 1), 3), ((2,), 4)}


def test_cascade_prefix_is_full_common_blocks_only() -> None:
    # requests 0-2 share blocks 0,1,2; request 2 ends inside block 2 -> prefix is 2 blocks
    tables = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 0]]
    assert shared_prefix_blocks(tables, [16, 16, 10], 4) == 2
    assert shared_prefix_blocks(tables, [16, 16, 12], 4) == 3
    assert shared_prefix_blocks([[5, 1], [6, 1]], [8, 8], 4) == 0
    plan = plan_cascade(tables, [16, 16, 10], 4)
    assert plan[0].queries == (0, 1, 2) and plan[0].blocks == (0, 1) and plan[0].tokens == 8
    assert [(s.queries, s.blocks, s.tokens) for s in plan[1:]] == [
        ((0,), (2, 3), 8),
        ((1,), (2, 4), 8),
        ((2,), (2,), 2),
    ]


def test_one_divergent_request_turns_cascade_into_paged() -> None:
    batch = grouped_batch("c2", [8], prefix_tokens=64, suffix_tokens=8, block_size=16, divergent=1)
    cascade = make_plan("cascade", batch.tables, batch.seq_lens, 16)
    pat = make_plan("pat", batch.tables, batch.seq_lens, 16)
    assert all(len(s.queries) == 1 for s in cascade) and len(cascade) == 8
    assert max(len(s.queries) for s in pat) == 7


def test_grouped_batch_layout() -> None:
    batch = grouped_batch(
        "m",
        split_evenly(10, 3),
        root_tokens=20,
        prefix_tokens=30,
        suffix_tokens=5,
        block_size=8,
        shuffle_seed=1,
    )
    assert split_evenly(10, 3) == [4, 3, 3]
    assert batch.seq_lens == [55] * 10 and all(len(r) == 7 for r in batch.tables)
    roots = {tuple(r[:2]) for r in batch.tables}
    assert len(roots) == 1  # 20 root tokens: 2 full blocks shared by everyone
    groups = {tuple(r[:6]) for r in batch.tables}  # 50 tokens: 6 full shared blocks
    assert len(groups) == 3
    own = [r[6] for r in batch.tables]
    assert len(set(own)) == 10  # the 51st token onwards: a private block each
    assert batch.num_blocks == 2 + 3 * 4 + 10
