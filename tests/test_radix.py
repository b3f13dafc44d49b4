"""The token radix tree against a brute-force reference: a plain list of inserted sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)
from toy_engine import lcp

from feather.radix import RadixNode, RadixTree

# A tiny alphabet makes shared prefixes, splits and page mismatches frequent.
tokens_st = st.lists(st.integers(0, 2), max_size=12)
page_size_st = st.integers(1, 4)


def aligned(tokens: list[int] | tuple[int, ...], page_size: int) -> tuple[int, ...]:
    return tuple(tokens[: len(tokens) - len(tokens) % page_size])


def reference_match(inserted: list[tuple[int, ...]], query: list[int], page_size: int) -> int:
    """Longest common prefix with any inserted sequence, rounded down to whole pages."""
    best = max((lcp(seq, tuple(query)) for seq in inserted), default=0)
    return best - best % page_size


def distinct_pages(inserted: list[tuple[int, ...]], page_size: int) -> int:
    """Tokens a trie of the inserted sequences must hold: one page per distinct page prefix."""
    prefixes = {
        seq[:k]
        for seq in inserted
        for k in range(page_size, len(aligned(seq, page_size)) + 1, page_size)
    }
    return len(prefixes) * page_size


def check_structure(tree: RadixTree) -> None:
    """Invariants every operation must keep."""
    total = locked = nodes = 0
    for node in tree.iter_nodes():
        if node is tree.root:
            assert node.key == () and node.parent is None
        else:
            assert len(node.key) > 0 and len(node.key) % tree.page_size == 0
            total += len(node.key)
            nodes += 1
            if node.lock_ref > 0:
                locked += len(node.key)
                assert node.parent is tree.root or node.parent.lock_ref >= node.lock_ref
        for child_key, child in node.children.items():
            assert child.parent is node
            first = child.key[0] if tree.page_size == 1 else child.key[: tree.page_size]
            assert child_key == first
    assert tree.total_tokens == total
    assert tree.locked_tokens == locked
    assert tree.num_nodes == nodes  # kept by every insert, split, eviction and reset


# ---- matching and insertion ------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    page_size=page_size_st,
    ops=st.lists(st.tuples(st.booleans(), tokens_st), max_size=25),
)
def test_match_and_insert_equal_brute_force(page_size: int, ops: list) -> None:
    tree = RadixTree(page_size)
    inserted: list[tuple[int, ...]] = []
    for is_insert, tokens in ops:
        if is_insert:
            node = tree.insert(tokens)
            inserted.append(aligned(tokens, page_size))
            assert node.path_tokens() == aligned(tokens, page_size)
        else:
            before = tree.total_tokens
            matched, node = tree.match_prefix(tokens)
            assert matched == reference_match(inserted, tokens, page_size)
            # the last node is exact: it ends at the matched length (split if need be)
            assert node.prefix_len == matched
            assert node.path_tokens() == tuple(tokens[:matched])
            assert tree.total_tokens == before  # a split moves tokens, never adds any
        check_structure(tree)
        assert tree.total_tokens == distinct_pages(inserted, page_size)


def test_split_when_match_ends_inside_a_node() -> None:
    tree = RadixTree()
    leaf = tree.insert([1, 2, 3, 4])
    matched, node = tree.match_prefix([1, 2, 9])
    assert matched == 2
    assert node.key == (1, 2) and node.parent is tree.root
    # the original node object is kept as the deeper part, so references stay valid
    assert leaf.key == (3, 4) and leaf.parent is node
    assert list(node.children.values()) == [leaf]
    assert tree.total_tokens == 4


def test_split_keeps_sibling_order() -> None:
    tree = RadixTree()
    first = tree.insert([1, 1, 1])
    tree.insert([2])
    tree.insert([3])
    _, upper = tree.match_prefix([1, 1])
    assert [c.key for c in tree.root.children.values()] == [(1, 1), (2,), (3,)]
    assert upper.children[1] is first


def test_pages_match_whole_or_not_at_all() -> None:
    tree = RadixTree(page_size=2)
    tree.insert([1, 2, 3, 4, 5])  # the odd last token is not cached
    assert tree.total_tokens == 4
    assert tree.match_prefix([1, 2, 3, 9])[0] == 2  # second page differs in its last token
    assert tree.match_prefix([1, 2, 3, 4, 5])[0] == 4
    assert tree.match_prefix([1])[0] == 0  # shorter than a page
    matched, node = tree.match_prefix([1, 2, 3, 4])
    assert matched == 4 and node.key == (3, 4)  # the earlier match split at the page border


def test_empty_match_returns_root() -> None:
    tree = RadixTree()
    assert tree.match_prefix([]) == (0, tree.root)
    assert tree.match_prefix([5]) == (0, tree.root)
    assert tree.insert([]) is tree.root


def test_bad_page_size() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixTree(page_size=0)


def test_reset_forgets_everything() -> None:
    tree = RadixTree()
    node = tree.insert([1, 2, 3])
    tree.lock(node)
    tree.reset()
    assert tree.total_tokens == tree.locked_tokens == tree.num_nodes == 0
    assert tree.match_prefix([1, 2, 3]) == (0, tree.root)
    with pytest.raises(ValueError, match="not in this tree"):
        tree.unlock(node)


# ---- locking and eviction -------------------------------------------------------------
def test_lock_protects_the_path_and_unlock_balances() -> None:
    tree = RadixTree()
    a = tree.insert([1, 2, 3, 4])
    b = tree.insert([1, 2, 5, 6])  # splits: (1,2) -> (3,4), (5,6)
    tree.lock(a)
    assert tree.locked_tokens == 4  # (1,2) and (3,4)
    assert tree.evict(100) == 2  # only (5,6) may go
    assert tree.match_prefix([1, 2, 5, 6])[0] == 2
    with pytest.raises(ValueError, match="not in this tree"):
        tree.lock(b)  # evicted
    tree.unlock(a)
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(a)
    assert tree.evict(100) == 4
    assert tree.total_tokens == 0


def test_eviction_is_lru_and_cascades_to_parents() -> None:
    tree = RadixTree()
    tree.insert([1, 1])
    tree.insert([2, 2])
    tree.insert([3, 3])
    tree.match_prefix([1, 1])  # (1,1) is now the most recently used
    assert tree.evict(1) == 2  # whole nodes go
    assert tree.match_prefix([2, 2])[0] == 0  # the oldest, (2,2), went first
    assert tree.match_prefix([1, 1])[0] == 2 and tree.match_prefix([3, 3])[0] == 2
    # a parent left childless becomes a candidate: (4,) -> (5,) goes in two evictions
    tree.reset()
    tree.insert([4, 5])
    tree.insert([4, 6])
    tree.match_prefix([4, 6])
    assert tree.evict(2) == 2  # (5,), then (6,); (4,) stays: 2 tokens were asked
    assert tree.total_tokens == 1
    assert tree.evict_to(0) == 1
    assert tree.total_tokens == 0


class EvictionMachine(RuleBasedStateMachine):
    """Random inserts, locks, unlocks, matches and evictions; the tree stays a trie of what
    was inserted, locked sequences survive, capacity is respected when it can be."""

    held = Bundle("held")

    @initialize(page_size=page_size_st)
    def init(self, page_size: int) -> None:
        self.tree = RadixTree(page_size)
        self.page_size = page_size
        self.inserted: list[tuple[int, ...]] = []
        self.locked: dict[int, tuple[RadixNode, tuple[int, ...]]] = {}
        self.next_hold = 0

    @rule(tokens=tokens_st)
    def insert(self, tokens: list[int]) -> None:
        self.tree.insert(tokens)
        self.inserted.append(aligned(tokens, self.page_size))

    @rule(target=held, tokens=tokens_st)
    def insert_and_lock(self, tokens: list[int]) -> int:
        node = self.tree.insert(tokens)
        self.tree.lock(node)
        self.inserted.append(aligned(tokens, self.page_size))
        self.next_hold += 1
        self.locked[self.next_hold] = (node, aligned(tokens, self.page_size))
        return self.next_hold

    @rule(hold=consumes(held))
    def unlock(self, hold: int) -> None:
        node, _ = self.locked.pop(hold)
        self.tree.unlock(node)

    @rule(tokens=tokens_st)
    def match(self, tokens: list[int]) -> None:
        matched, node = self.tree.match_prefix(tokens)
        assert node.prefix_len == matched
        # never more than what was ever inserted, never less than what is locked
        assert matched <= reference_match(self.inserted, tokens, self.page_size)
        locked_seqs = [seq for _, seq in self.locked.values()]
        assert matched >= reference_match(locked_seqs, tokens, self.page_size)

    @rule(capacity=st.integers(0, 30))
    def evict_to(self, capacity: int) -> None:
        self.tree.evict_to(capacity)
        if self.tree.total_tokens > capacity:
            # over capacity only if nothing unlocked is left to evict
            assert all(n.lock_ref > 0 for n in self.tree.iter_nodes() if n is not self.tree.root)

    @rule()
    def evict_one_page(self) -> None:
        """`evict(1)` removes exactly the least recently used unlocked leaf."""
        candidates = [
            n
            for n in self.tree.iter_nodes()
            if n is not self.tree.root and not n.children and n.lock_ref == 0
        ]
        if not candidates:
            assert self.tree.evict(1) == 0
            return
        victim = min(candidates, key=lambda n: (n.last_access, n.node_id))
        before = self.tree.total_tokens
        assert self.tree.evict(1) == len(victim.key)
        assert victim.parent is None
        assert self.tree.total_tokens == before - len(victim.key)

    @invariant()
    def structure(self) -> None:
        if not hasattr(self, "tree"):
            return
        check_structure(self.tree)
        for node, seq in self.locked.values():
            assert node.lock_ref > 0
            assert node.path_tokens() == seq  # a locked node is never evicted or moved
        for leaf in self.tree.iter_nodes():
            if leaf.children or leaf is self.tree.root:
                continue
            path = leaf.path_tokens()
            assert any(seq[: len(path)] == path for seq in self.inserted)


EvictionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
TestEviction = EvictionMachine.TestCase


# ---- resuming a match from its previous answer ------------------------------------------------
def snapshot(tree: RadixTree) -> list[tuple]:
    """Everything about the tree an answer or an eviction can depend on, in child order."""
    return [
        (n.node_id, n.key, n.last_access, n.lock_ref, tuple(c.node_id for c in n.children.values()))
        for n in tree.iter_nodes()
    ]


op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st),
    st.tuples(st.just("insert_lock"), tokens_st),
    st.tuples(st.just("match"), st.integers(0, 5)),
    st.tuples(st.just("evict_to"), st.integers(0, 30)),
    st.tuples(st.just("unlock"), st.integers(0, 5)),
    st.tuples(st.just("reset"), st.just(0)),
)


@settings(max_examples=400, deadline=None)
@given(
    page_size=page_size_st,
    queries=st.lists(st.lists(st.integers(0, 2), max_size=14), min_size=6, max_size=6),
    ops=st.lists(op_st, max_size=40),
)
def test_a_hinted_match_is_a_match_from_the_root(page_size, queries, ops) -> None:
    """Two trees through the same operations: one matches every query from the root, the
    other resumes from the query's previous answer. Answers, splits, node ids and LRU
    touches stay identical, so every later eviction is too."""
    fresh, hinted = RadixTree(page_size), RadixTree(page_size)
    hints: dict[int, tuple[int, RadixNode]] = {}
    locked: list[tuple[RadixNode, RadixNode]] = []
    for op, arg in ops:
        if op in ("insert", "insert_lock"):
            a, b = fresh.insert(arg), hinted.insert(arg)
            if op == "insert_lock":
                fresh.lock(a)
                hinted.lock(b)
                locked.append((a, b))
        elif op == "match":
            expected = fresh.match_prefix(queries[arg])
            got = hinted.match_prefix(tuple(queries[arg]), hints.get(arg))
            hints[arg] = got
            assert got[0] == expected[0]
            assert got[1].node_id == expected[1].node_id
        elif op == "evict_to":
            assert fresh.evict_to(arg) == hinted.evict_to(arg)
        elif op == "unlock" and locked:
            a, b = locked.pop(arg % len(locked))
            fresh.unlock(a)
            hinted.unlock(b)
        elif op == "reset":
            fresh.reset()
            hinted.reset()
            locked.clear()
        assert snapshot(hinted) == snapshot(fresh)
        check_structure(hinted)


def test_a_stale_hint_is_ignored() -> None:
    tree, other = RadixTree(), RadixTree()
    tree.insert([1, 2, 3, 4])
    hint = tree.match_prefix((1, 2, 3, 9))
    assert hint[0] == 3
    tree.evict(10)  # the hint's node is gone
    assert tree.match_prefix((1, 2, 3, 9), hint) == (0, tree.root)
    other_hint = other.match_prefix((1, 2))
    tree.insert([1, 2])
    assert tree.match_prefix((1, 2), other_hint)[0] == 2  # another tree's node: from the root
