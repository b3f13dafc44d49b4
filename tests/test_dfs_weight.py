"""DFS-weight (SGLang `dfs-weight`) driven through the admission protocol only."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from toy_engine import ToyRequest, add, admission_step, lcp, run, warm

from feather.policies import Request, create_scheduler
from feather.policies.dfs_weight import DFSWeightPolicy


def test_hand_built_tree() -> None:
    policy = DFSWeightPolicy()
    # Cached, in this order:
    #   [2,2,2,2]  -> root: {2: "2222"}
    #   [1,1,1,1]  -> root: {2: "2222", 1: "1111"}          (the 1-branch is inserted second)
    #   [1,1,0,0]  -> its match splits "1111" into "11" -> "11"; then "00" is added:
    #                 root: {2: "2222", 1: "11"};  "11": {1: "11", 0: "00"}
    #                 (under "11" the 1-child is older than the 0-child)
    warm(policy, [2, 2, 2, 2], [1, 1, 1, 1], [1, 1, 0, 0])
    add(
        policy,
        a=[2, 2, 2, 2, 9],  # last node "2222" (full match)
        h=[1, 1, 1, 1, 7],  # last node "11"/"11"
        b=[1, 1, 0, 0, 9],  # last node "11"/"00"
        c=[1, 1, 1, 1, 9],  # last node "11"/"11"
        e=[7],  # nothing cached: last node = root
        d=[1, 1, 0, 0, 8],  # last node "11"/"00"
        f=[1, 1, 9],  # last node "11" (the match ends exactly at its end)
        g=[2, 2, 5],  # ends inside "2222": split into "22" -> "22"; last node = upper "22"
    )
    # a was matched before g's split and keeps the lower "22" node (the original object).
    # Weights (own requests + children):
    #   "11"/"11" = 2 (h, c)        "11"/"00" = 2 (b, d)       "11" = 1 (f) + 2 + 2 = 5
    #   lower "22" = 1 (a)          upper "22" = 1 (g) + 1 = 2
    #   root = 1 (e) + 5 + 2 = 8
    # DFS, children by weight descending, a node's requests after its children:
    #   root: "11" (5) before "22" (2), though the 2-branch was inserted first
    #     "11": children tie at 2 -> insertion order: the 1-child ("11") before "00"
    #       "11"/"11": h, c (waiting-queue order)
    #       "11"/"00": b, d
    #       "11" itself: f
    #     upper "22": lower "22": a; then upper "22" itself: g
    #   root itself: e
    assert admission_step(policy) == ["h", "c", "b", "d", "f", "a", "g", "e"]


def test_requests_of_one_node_follow_the_persistent_queue_order() -> None:
    policy = DFSWeightPolicy()
    warm(policy, [1, 1])
    add(policy, x=[1, 1, 5], y=[3], z=[1, 1, 6])
    assert admission_step(policy, fits=lambda _: False) == ["x"]  # order now x, z, y
    assert policy.waiting_queue() == ["x", "z", "y"]
    add(policy, w=[1, 1, 7])  # appended after y
    assert admission_step(policy) == ["x", "z", "w", "y"]


def test_no_fcfs_fallback_for_long_queues() -> None:
    policy = DFSWeightPolicy()
    warm(policy, [5, 5, 5])
    for i in range(200):
        add(policy, **{f"r{i:03d}": [10_000 + i]})
    add(policy, g1=[5, 5, 5, 1], g2=[5, 5, 5, 2])  # the only subtree of weight 2
    offered = admission_step(policy)
    assert offered[:2] == ["g1", "g2"]
    assert offered[2:] == [f"r{i:03d}" for i in range(200)]  # root's own, in queue order


def test_preempted_request_rejoins_its_subtree() -> None:
    policy = DFSWeightPolicy()
    add(policy, p=[4, 4, 4, 1])
    assert admission_step(policy) == ["p"]
    add(policy, q=[8], r=[4, 4, 4, 2])
    policy.preempted("p")  # appended after r; its prompt stays cached (unlocked)
    assert policy.tree_cache.locked_tokens == 0
    # p's whole prompt is cached: its last node is "1" below "444" (r's match splits
    # "4441" there); r's last node is "444" itself, q's the root. Post-order: p, r, q -
    # although p is last in the queue.
    assert admission_step(policy) == ["p", "r", "q"]


def test_registry() -> None:
    policy = create_scheduler("dfs-weight", cache_capacity_tokens=1000)
    assert isinstance(policy, DFSWeightPolicy)
    assert policy.params()["cache_capacity_tokens"] == 1000


# ---- against a brute-force statement of the rule --------------------------------------


def dfs_weight_reference(cached: list[list[int]], waiting: list[list[int]], page: int) -> list[int]:
    """The same rule stated on token sequences, without a tree.

    A request's "node" is its matched prefix (longest common prefix with any cached prompt,
    in whole pages). At a prefix q, the requests extending q are grouped by their next page;
    a group's weight is its size; groups are visited heaviest first, ties in the order in
    which the cache first held q + that page (sibling insertion order), and the requests
    whose match is exactly q come after all groups, in queue order.
    """
    first_seen: dict[tuple[int, ...], int] = {}
    for seq in cached:  # cached in this order
        usable = tuple(seq[: len(seq) - len(seq) % page])
        for k in range(page, len(usable) + 1, page):
            first_seen.setdefault(usable[:k], len(first_seen))

    def matched(tokens: list[int]) -> tuple[int, ...]:
        best = max((lcp(seq, tokens) for seq in cached), default=0)
        return tuple(tokens[: best - best % page])

    match = [matched(tokens) for tokens in waiting]

    def visit(prefix: tuple[int, ...], members: list[int]) -> list[int]:
        own = [i for i in members if len(match[i]) == len(prefix)]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in members:
            if len(match[i]) > len(prefix):
                groups.setdefault(match[i][: len(prefix) + page], []).append(i)
        out: list[int] = []
        for child in sorted(groups, key=lambda p: (-len(groups[p]), first_seen[p])):
            out += visit(child, groups[child])
        return out + own

    return visit((), list(range(len(waiting))))


@settings(max_examples=200, deadline=None)
@given(
    page=st.integers(1, 3),
    cached=st.lists(st.lists(st.integers(0, 2), max_size=8), max_size=7),
    waiting=st.lists(st.lists(st.integers(0, 2), max_size=9), min_size=1, max_size=12),
)
def test_order_equals_brute_force(
    page: int, cached: list[list[int]], waiting: list[list[int]]
) -> None:
    policy = DFSWeightPolicy(page_size=page)
    warm(policy, *cached)
    for i, tokens in enumerate(waiting):
        policy.add_request(Request(i, prompt_token_ids=tokens))
    assert admission_step(policy) == dfs_weight_reference(cached, waiting, page)


# ---- the resumed matches (the port's speed-up) change no decision -------------------------------


class _FromTheRoot(DFSWeightPolicy):
    """The port as it was: every waiting request matched from the root at every pass."""

    def _match(self, req_id):
        return self.tree_cache.match_prefix(self._tokens[req_id])


@settings(max_examples=60, deadline=None)
@given(
    page=st.integers(1, 3),
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 12), st.lists(st.integers(0, 2), max_size=6)),
        min_size=1,
        max_size=30,
    ),
    capacity=st.one_of(st.none(), st.integers(0, 60)),
    refuse_every=st.integers(2, 7),
    preempt_every=st.integers(2, 9),
    max_running=st.integers(1, 6),
)
def test_resumed_matches_take_the_same_decisions(
    page, prompts, capacity, refuse_every, preempt_every, max_running
) -> None:
    """Arrivals over steps, refusals, preemptions, finishes and LRU eviction of a small
    mirrored cache: the same candidates offered and the same requests running every step."""
    stems = [[s] * 4 + [s, 1, 2] * 4 for s in range(4)]
    requests = [
        ToyRequest(i, stems[stem][:cut] + tail, output_len=1 + i % 3, arrival_step=i // 4)
        for i, (stem, cut, tail) in enumerate(prompts)
    ]

    def drive(policy: DFSWeightPolicy) -> list:
        logs = run(
            policy,
            requests,
            max_running=max_running,
            fits=lambda step, req_id: (step + req_id) % refuse_every != 0,
            preempt_at=lambda step: step % preempt_every == preempt_every - 1,
        )
        return [(log.admitted, log.running) for log in logs]

    def make(cls: type) -> DFSWeightPolicy:
        return cls(page_size=page, cache_capacity_tokens=capacity)

    assert drive(make(DFSWeightPolicy)) == drive(make(_FromTheRoot))
