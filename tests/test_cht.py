"""The Chunked Hash Tree against a brute-force reference, after every operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from feather.cht import CandidateState, ChunkedHashTree, UnknownRequestError
from feather.chunk_hash import chunk_hashes

CHUNK = 2
GROUP = 2  # chunks that name a prefix group


class Reference:
    """The definitions, computed by scanning every request (what the CHT must equal)."""

    def __init__(self, chunk_size: int, order: str = "fewest-missing", group_chunks: int = 1):
        self.chunk_size = chunk_size
        self.order = order
        self.group_chunks = group_chunks
        self.chunks: dict[int, list] = {}
        self.seq: dict[int, int] = {}
        self.active: set[int] = set()
        self.next_seq = 0

    def add(self, rid: int, tokens: list[int]) -> None:
        n = len(tokens) // self.chunk_size
        self.chunks[rid] = [tuple(tokens[: (k + 1) * self.chunk_size]) for k in range(n)]
        self.seq[rid] = self.next_seq
        self.next_seq += 1

    def waiting(self) -> list[int]:
        return sorted((r for r in self.chunks if r not in self.active), key=self.seq.__getitem__)

    def working_set(self) -> set:
        return {h for r in self.active for h in self.chunks[r]}

    def missing(self, rid: int) -> int:
        ws = self.working_set()
        return sum(h not in ws for h in self.chunks[rid])

    def best(self, sharing_only: bool = False):
        ws = self.working_set()
        options = [
            # deepest: most chunks in the working set first (it is prefix-closed, so that is
            # the depth of the shared prefix), then arrival
            ((-sum(h in ws for h in self.chunks[r]),) if self.order == "deepest" else ())
            + (self.missing(r), self.seq[r], r)
            for r in self.waiting()
            if not sharing_only or any(h in ws for h in self.chunks[r])
        ]
        if self.order == "deepest":
            options = [(o[0], o[2], o[1], o[3]) for o in options]  # depth, arrival
        if not options:
            return None
        *_, rid = min(options)
        return rid, self.missing(rid)

    @staticmethod
    def common(lists: list[list]) -> int:
        depth = 0
        while all(len(c) > depth for c in lists) and len({c[depth] for c in lists}) == 1:
            depth += 1
        return depth

    def shared_depth(self) -> int:
        return self.common([self.chunks[r] for r in self.active]) if self.active else 0

    def candidate_state(self, rid: int) -> CandidateState:
        mine = self.chunks[rid]
        if not self.active:
            new_depth, delta = len(mine), 0
        else:
            new_depth = self.common([self.chunks[r] for r in self.active] + [mine])
            delta = self.shared_depth() - new_depth
        w = sum(
            1
            for r in self.waiting()
            if r != rid
            and self.chunks[r][:new_depth] == mine[:new_depth]
            and len(self.chunks[r]) >= new_depth
        )
        return CandidateState(new_depth=new_depth, delta=delta, w=w)

    def group(self, rid: int) -> object:
        """A request's prefix group: its first `group_chunks` chunks (all, if fewer); a
        prompt without a full chunk is alone."""
        chunks = self.chunks[rid]
        return chunks[: self.group_chunks] if chunks else ("alone", rid)

    def active_groups(self) -> int:
        return len({repr(self.group(r)) for r in self.active})


# Prompts over a 3-token alphabet with chunk size 2: prefixes are shared and nested all the
# time, prompts end inside runs, partial last chunks occur, and empty prompts too.
prompts = st.lists(st.integers(0, 2), max_size=10)


class CHTMachine(RuleBasedStateMachine):
    """Random operations on the tree and the reference, checked after every step.

    best(), best_sharing() and oldest() are asked by a rule (and at the end), not after every
    step: they pop dead entries off the top of lazy heaps, so asking them after every step
    would clear away the dead entry a bug leaves behind before it could do harm, a cleanup a
    scheduler that finishes and admits several requests between two best() calls does not
    get. The invariants check every cache and every lazy heap without touching them.
    """

    order = "fewest-missing"

    def __init__(self) -> None:
        super().__init__()
        self.tree = ChunkedHashTree(chunk_size=CHUNK, order=self.order, group_chunks=GROUP)
        self.ref = Reference(CHUNK, self.order, GROUP)
        self.next_id = 0
        self.history: list[list[int]] = []
        # group_changes' reference: the running groups after the previous step, and how many
        # groups entered or left that set so far (one operation moves at most one)
        self.running_groups: set[str] = set()
        self.group_changes = 0

    def _add(self, tokens: list[int]) -> None:
        rid = self.next_id
        self.next_id += 1
        self.tree.add_waiting(rid, tokens)
        self.ref.add(rid, tokens)
        self.history.append(tokens)

    @rule(tokens=prompts)
    def add(self, tokens: list[int]) -> None:
        self._add(tokens)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), suffix=prompts)
    def add_to_family(self, data: st.DataObject, suffix: list[int]) -> None:
        """A prompt that extends a cut of an earlier one: deep, nested prefix families."""
        base = data.draw(st.sampled_from(self.history))
        cut = data.draw(st.integers(0, len(base)))
        self._add(base[:cut] + suffix)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def add_copy(self, data: st.DataObject) -> None:
        """The same prompt again (n > 1 samples, a retry): several requests end at one node."""
        self._add(data.draw(st.sampled_from(self.history)))

    @precondition(lambda self: self.ref.waiting())
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.ref.waiting()))
        self.tree.admit(rid)
        self.ref.active.add(rid)

    @precondition(lambda self: self.ref.waiting())
    @rule()
    def admit_best(self) -> None:
        """The way batches are formed: best() then admit()."""
        pick = self.tree.best()
        assert pick == self.ref.best()
        rid, _ = pick
        self.tree.admit(rid)
        self.ref.active.add(rid)

    @precondition(lambda self: self.ref.chunks)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ref.chunks)))
        self.tree.finish(rid)
        self.ref.active.discard(rid)
        del self.ref.chunks[rid]

    @precondition(lambda self: self.ref.active)
    @rule(data=st.data())
    def finish_active(self, data: st.DataObject) -> None:
        """A running request completes (`finish` mostly picks waiting ones)."""
        rid = data.draw(st.sampled_from(sorted(self.ref.active)))
        self.tree.finish(rid)
        self.ref.active.discard(rid)
        del self.ref.chunks[rid]

    @precondition(lambda self: self.ref.active)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ref.active)))
        self.tree.preempt(rid)
        self.ref.active.discard(rid)

    @invariant()
    def any_shared_matches_a_scan(self) -> None:
        """Whether some two requests (waiting or active) share a chunk, by brute force."""
        chunks = list(self.ref.chunks.values())
        expected = any(
            set(a) & set(b) for i, a in enumerate(chunks) for b in chunks[i + 1 :]
        )
        assert self.tree.any_shared() == expected

    @invariant()
    def tree_stays_compressed_and_counted(self) -> None:
        """No dead node, no run that stopped branching, subtree counters exact."""

        def visit(node, is_root: bool) -> tuple[int, int, list]:
            """Counts and the waiting (n, seq) in the subtree, checked against the caches."""
            by_depth = self.order == "deepest"  # keys compare arrival only
            here = [(0 if by_depth else r.n, r.seq) for r in node.ends.values() if r.state == 0]
            waiting, active = len(here), len(node.ends) - len(here)
            below, hanging = list(here), []
            for child in node.children.values():
                assert child.parent is node
                w, a, reqs = visit(child, False)
                waiting, active = waiting + w, active + a
                below += reqs
                if child.n_active == 0:
                    hanging += reqs
            if not is_root:
                assert node.ends or len(node.children) >= 2
                assert node.start < node.end
            assert (node.n_waiting, node.n_active) == (waiting, active)
            assert (node.sub and node.sub[:2]) == (min(below) if below else None)
            if node.n_active or is_root:  # its best attached request, exactly
                attached = [(0, seq) for _, seq in here] + [
                    (0 if by_depth else n - node.end, s) for n, s in hanging
                ]
                assert (node.att and node.att[:2]) == (min(attached) if attached else None)
            return waiting, active, below

        visit(self.tree._root, True)

    @invariant()
    def lazy_heap_entries_that_look_live_are_current(self) -> None:
        """An entry the tree would take as live carries its owner's current key, and every
        owner that has a key has such an entry: a stale entry can neither come back to life
        nor hide the live ones, even while it is not at the top of its heap."""
        tree = self.tree
        nodes, stack = [], [tree._root]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        for node in nodes:
            own = {e[2].seq for e in node.own if e[2].state == 0 and e[2].epoch == e[1]}
            assert own == {r.seq for r in node.ends.values() if r.state == 0}
            for heap, outside_only in ((node.kids_all, False), (node.kids_out, True)):
                live = set()
                for n, seq, stamp, child in heap:
                    if child.alive and child.parent is node and child.sub_stamp == stamp:
                        if outside_only and child.n_active:
                            continue
                        assert child.sub is not None and child.sub[:2] == (n, seq)
                        live.add(id(child))
                expected = {
                    id(c)
                    for c in node.children.values()
                    if c.sub is not None and not (outside_only and c.n_active)
                }
                assert live == expected
        live = set()
        for key, seq, stamp, node in tree._attached:
            if node.alive and node.n_active and node.att_stamp == stamp:
                expected_key = -node.end if self.order == "deepest" else node.att[0]
                assert node.att is not None and (key, seq) == (expected_key, node.att[1])
                live.add(id(node))
        expected = {id(n) for n in nodes if n.parent is not None and n.n_active and n.att}
        assert live == expected

    @rule()
    def ask_best(self) -> None:
        """The queries that pop dead heap entries (see the class docstring)."""
        assert self.tree.best() == self.ref.best()
        assert self.tree.best_sharing() == self.ref.best(sharing_only=True)
        waiting = self.ref.waiting()
        assert self.tree.oldest() == (waiting[0] if waiting else None)

    def teardown(self) -> None:
        self.ask_best()

    @invariant()
    def queries_match_reference(self) -> None:
        """The queries that leave the tree as it is."""
        assert self.tree.shared_depth() == self.ref.shared_depth()
        waiting = self.ref.waiting()
        assert self.tree.num_waiting == len(waiting)
        assert self.tree.num_active == len(self.ref.active)
        assert self.tree.num_active_groups == self.ref.active_groups()
        running = {repr(self.ref.group(r)) for r in self.ref.active}
        self.group_changes += len(running ^ self.running_groups)
        self.running_groups = running
        assert self.tree.group_changes == self.group_changes
        for rid in waiting:
            assert self.tree.joins_active_group(rid) == (repr(self.ref.group(rid)) in running)
            assert self.tree.missing(rid) == self.ref.missing(rid)
            assert self.tree.candidate_state(rid) == self.ref.candidate_state(rid)


TestCHTAgainstReference = CHTMachine.TestCase
TestCHTAgainstReference.settings = settings(max_examples=600, stateful_step_count=40, deadline=None)


class DeepestFirstCHTMachine(CHTMachine):
    """The same operations with the order the Feather policies use: deepest shared prefix
    with the working set first, ties by arrival."""

    order = "deepest"


TestDeepestFirstCHTAgainstReference = DeepestFirstCHTMachine.TestCase
TestDeepestFirstCHTAgainstReference.settings = settings(
    max_examples=400, stateful_step_count=40, deadline=None
)


@given(st.lists(prompts, min_size=1, max_size=12))
@settings(max_examples=200, deadline=None)
def test_precomputed_hashes_behave_like_token_ids(batch: list[list[int]]) -> None:
    """Engines pass their own cumulative block hashes; any cumulative scheme gives the same tree."""
    from_tokens = ChunkedHashTree(chunk_size=CHUNK)
    from_hashes = ChunkedHashTree(chunk_size=CHUNK)
    for rid, tokens in enumerate(batch):
        from_tokens.add_waiting(rid, tokens)
        engine_hashes = [
            ("blk", tuple(tokens[: (k + 1) * CHUNK])) for k in range(len(tokens) // CHUNK)
        ]
        from_hashes.add_waiting(rid, chunk_hashes=engine_hashes)
    while (pick := from_tokens.best()) is not None:
        assert from_hashes.best() == pick
        assert from_hashes.candidate_state(pick[0]) == from_tokens.candidate_state(pick[0])
        from_tokens.admit(pick[0])
        from_hashes.admit(pick[0])
        assert from_hashes.shared_depth() == from_tokens.shared_depth()


def test_group_scenario_counts() -> None:
    """A hand-checked case: two groups sharing a 3-chunk system prompt, then documents."""
    tree = ChunkedHashTree(chunk_size=4)
    system = list(range(12))  # 3 chunks
    doc_a = [100 + i for i in range(8)]  # 2 chunks
    doc_b = [200 + i for i in range(8)]
    tree.add_waiting("a1", system + doc_a + [1, 1, 1, 1])
    tree.add_waiting("b1", system + doc_b + [2, 2, 2, 2])
    tree.add_waiting("a2", system + doc_a + [3, 3, 3, 3])
    tree.add_waiting("a3", system + doc_a + [4, 4])  # partial last chunk: 5 full chunks
    assert tree.best() == ("a3", 5)  # nothing active: fewest chunks, i.e. the shortest
    assert tree.candidate_state("a1") == CandidateState(new_depth=6, delta=0, w=0)
    tree.admit("a1")
    assert tree.shared_depth() == 6
    assert tree.best() == ("a3", 0)  # all its chunks are held by a1
    assert tree.missing("a2") == 1 and tree.missing("b1") == 3
    # a2 keeps the system prompt and the document: depth 5 of a1's 6, w counts a3.
    assert tree.candidate_state("a2") == CandidateState(new_depth=5, delta=1, w=1)
    assert tree.candidate_state("b1") == CandidateState(new_depth=3, delta=3, w=2)
    tree.admit("a2")
    tree.admit("b1")
    assert tree.shared_depth() == 3
    tree.finish("b1")
    assert tree.shared_depth() == 5
    tree.finish("a1")
    assert tree.shared_depth() == 6  # a2 alone: its own chunk count
    tree.preempt("a2")
    assert tree.shared_depth() == 0
    assert tree.oldest() == "a2"  # preempted, it keeps its arrival place before a3


def test_missing_counts_rise_when_a_deeper_holder_finishes() -> None:
    """b loses depth (3 -> 1 chunk) but still shares one: its heap key must be re-keyed."""
    tree = ChunkedHashTree(chunk_size=2)
    tree.add_waiting("a", [1, 1, 2, 2, 3, 3])
    tree.add_waiting("d", [1, 1, 9, 9])
    tree.add_waiting("b", [1, 1, 2, 2, 3, 3, 4, 4])
    tree.add_waiting("c", [1, 1, 5, 5])
    tree.admit("a")
    tree.admit("d")
    assert tree.best() == ("b", 1)
    tree.finish("a")
    assert tree.missing("b") == 3
    assert tree.best() == ("c", 1)
    assert tree.best_sharing() == ("c", 1)


def test_best_survives_a_node_rejoining_the_working_set_with_nothing_attached() -> None:
    """A node that left the working set and came back with no request attached revived its
    old entry in the heap of attached requests, and that dead entry hid the live ones."""
    tree = ChunkedHashTree(chunk_size=2)
    ref = Reference(2)

    def add(rid: int, tokens: list[int]) -> None:
        tree.add_waiting(rid, tokens)
        ref.add(rid, tokens)

    add(0, [1, 1, 2, 2])
    add(1, [1, 1, 2, 2])
    tree.admit(0)  # node [1 1 2 2] joins the working set, request 1 attached at it
    ref.active.add(0)
    assert tree.best() == ref.best() == (1, 0)
    tree.finish(0)  # the node leaves the working set
    ref.active.discard(0)
    del ref.chunks[0]
    tree.admit(1)  # ... and comes back with nothing attached
    ref.active.add(1)
    assert tree.best() == ref.best() is None
    add(2, [1, 1, 3, 3])  # shares the first chunk: attached at the new head node
    assert ref.best() == ref.best(sharing_only=True) == (2, 1)
    assert tree.best() == ref.best()
    assert tree.best_sharing() == ref.best(sharing_only=True)


def test_a_revived_entry_hides_no_request_when_best_is_asked_after_every_step() -> None:
    """The same bug with best() asked after every operation, as a scheduler does: asking pops
    dead entries off the top, so the dead one must sit under a live one (c's) meanwhile."""
    tree = ChunkedHashTree(chunk_size=2)
    ref = Reference(2)
    steps = [
        ("add", "c", [1, 1]),  # waiting at node [1 1], held by e: attached there, missing 0
        ("add", "e", [1, 1, 5, 5]),
        ("add", "d", [1, 1, 3, 3]),
        ("add", "a", [1, 1, 2, 2]),
        ("add", "b", [1, 1, 2, 2]),
        ("admit", "e", None),
        ("admit", "a", None),  # node [1 1 2 2] joins, b attached at it
        ("finish", "a", None),  # ... leaves
        ("admit", "b", None),  # ... and rejoins with nothing attached
        ("admit", "c", None),  # c's entry no longer covers b's dead one
    ]
    for op, rid, tokens in steps:
        if op == "add":
            tree.add_waiting(rid, tokens)
            ref.add(rid, tokens)
        elif op == "admit":
            tree.admit(rid)
            ref.active.add(rid)
        else:
            tree.finish(rid)
            ref.active.discard(rid)
            del ref.chunks[rid]
        assert tree.best() == ref.best(), (op, rid)
        assert tree.best_sharing() == ref.best(sharing_only=True), (op, rid)
    assert ref.best() == ("d", 1)


def test_lazy_heaps_do_not_grow_with_finished_requests() -> None:
    """A long run that never asks best(): dead heap entries are compacted away."""
    tree = ChunkedHashTree(chunk_size=2)
    for i in range(5_000):
        tree.add_waiting(i, [i % 7, i % 7, i, i])
        if i >= 3:
            tree.admit(i - 3)  # admitted without ever surfacing in a heap
            tree.finish(i - 3)
    live = len(tree)
    assert live == 3
    assert len(tree._attached) <= 2 * live + 65
    assert len(tree._arrival._heap) <= 2 * live + 65
    stack = [tree._root]
    while stack:
        node = stack.pop()
        assert len(node.own) <= 2 * len(node.ends) + 9
        assert len(node.kids_all) <= 2 * len(node.children) + 9
        assert len(node.kids_out) <= 2 * len(node.children) + 9
        stack.extend(node.children.values())
    for i in range(4_997, 5_000):
        tree.finish(i)
    assert tree._root.children == {}  # pruning leaves no node behind


def test_bad_input_gives_clear_errors() -> None:
    tree = ChunkedHashTree(chunk_size=4)
    tree.add_waiting("r", [1, 2, 3, 4])
    with pytest.raises(ValueError, match="duplicate request id 'r'"):
        tree.add_waiting("r", [1, 2, 3, 4])
    with pytest.raises(TypeError, match="integer token ids"):
        tree.add_waiting("f", [1.5, 2, 3, 4])
    with pytest.raises(TypeError, match="integer token ids"):
        tree.add_waiting("s", "abcd")
    with pytest.raises(ValueError, match=r"token ids in \[0, 2\*\*32\)"):
        tree.add_waiting("n", [1, -2, 3, 4])
    with pytest.raises(UnknownRequestError, match="admit of unknown request id 'x'"):
        tree.admit("x")
    with pytest.raises(UnknownRequestError, match="finish of unknown request id 'x'"):
        tree.finish("x")
    with pytest.raises(ValueError, match="exactly one of token_ids or chunk_hashes"):
        tree.add_waiting("both", [1, 2, 3, 4], chunk_hashes=[b"h"])
    with pytest.raises(ValueError, match="mixing hash schemes"):
        tree.add_waiting("h", chunk_hashes=[b"h"])
    tree.admit("r")
    with pytest.raises(ValueError, match="it is active, expected waiting"):
        tree.admit("r")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        ChunkedHashTree(chunk_size=0)
    assert "f" not in tree and "n" not in tree  # a rejected request leaves nothing behind


def test_chunk_hashes_are_cumulative() -> None:
    a = chunk_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = chunk_hashes([1, 2, 3, 9, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3
    assert a[0] == b[0]
    assert a[1] != b[1] and a[2] != b[2]  # chunk 2 is equal, but its prefix is not
