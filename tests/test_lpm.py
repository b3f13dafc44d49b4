"""LPM (SGLang `lpm`) driven through the admission protocol only."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_engine import add, admission_step, lcp, warm

from feather.policies import Request, StopReason, create_scheduler
from feather.policies.lpm import LPMPolicy

S = list(range(100, 200))  # a 100-token prompt that gets cached


def first_offered(policy: LPMPolicy) -> Hashable:
    """The head of this step's order; refusing it changes nothing but the step."""
    offered = admission_step(policy, fits=lambda _: False)
    return offered[0]


def test_orders_by_longest_cached_prefix_ties_in_queue_order() -> None:
    policy = LPMPolicy()
    warm(policy, S)
    add(
        policy,
        a=S[:40] + [1] * 10,  # 40 cached
        c=[7] * 50,  # nothing cached
        b=S[:80] + [2] * 5,  # 80 cached
        d=S[:60] + [3] * 5,  # 60 cached
        e=S[:40] + [4] * 5,  # 40 cached, ties with a and arrived after it
    )
    assert admission_step(policy) == ["b", "d", "a", "e", "c"]  # FCFS would be a, c, b, d, e


def test_sort_key_is_capped_at_prompt_length_minus_one() -> None:
    # SGLang sorts by num_matched_prefix_tokens <= len(prompt) - 1: a fully cached
    # 100-token prompt counts 99 and loses to a 101-token prompt that matches 100.
    policy = LPMPolicy()
    warm(policy, S)
    add(policy, full=list(S), longer=[*S, 5])
    assert admission_step(policy) == ["longer", "full"]


def test_in_batch_deprioritization_at_the_32_token_boundary() -> None:
    shared32 = list(range(500, 532))
    policy = LPMPolicy()
    add(policy, x1=shared32 + [1] * 5, x2=shared32 + [2] * 5, y=[9] * 10)
    # nothing is cached (0 <= 32): x1 goes into the waiting-queue tree, x2 finds 32 tokens
    # of it there (>= 32) and is sorted last; y shares nothing
    assert admission_step(policy) == ["x1", "y", "x2"]

    shared31 = list(range(600, 631))
    policy = LPMPolicy()
    add(policy, x1=shared31 + [1] * 5, x2=shared31 + [2] * 5, y=[9] * 10)
    assert admission_step(policy) == [
        "x1",
        "x2",
        "y",
    ]  # 31 < 32: no deprioritization, no reordering


def test_in_batch_check_only_below_33_cached_tokens_and_deprioritized_keep_list_order() -> None:
    h = list(range(300, 333))  # 33 tokens
    policy = LPMPolicy()
    warm(policy, h)
    add(
        policy,
        z=h[:32] + [1] * 5,  # cache 32 <= 32: checked, inserted into the waiting-queue tree
        w=h + [2] * 5,  # cache 33 > 32: never checked, though it shares 32 tokens with z
        u=[8] * 40,  # cache 0: checked, inserted
        s=[8] * 40 + [1],  # cache 0: shares 40 with u -> deprioritized
        v=h[:32] + [3] * 5,  # cache 32: shares 32 with z -> deprioritized
    )
    # w (33) > z (32) > u (0); then the deprioritized in list order, s before v although
    # v has the longer cache match
    assert admission_step(policy) == ["w", "z", "u", "s", "v"]


def test_thresholds_are_parameters() -> None:
    shared = list(range(500, 510))
    policy = LPMPolicy(in_batch_deprioritize_threshold=10)
    add(policy, x1=[*shared, 1], x2=[*shared, 2], y=[9])
    assert admission_step(policy) == ["x1", "y", "x2"]
    policy = LPMPolicy(in_batch_check_threshold=-1)  # -1 disables the check, as in SGLang
    add(policy, x1=shared * 4 + [1], x2=shared * 4 + [2], y=[9])
    assert admission_step(policy) == ["x1", "x2", "y"]


def _fill(policy: LPMPolicy, n_unrelated: int) -> None:
    for i in range(n_unrelated):
        add(policy, **{f"r{i:03d}": [10_000 + i] * 5})
    add(policy, long=[*S[:50], 1])  # the only cached match, arrives last


def test_sorts_at_128_waiting() -> None:
    policy = LPMPolicy()
    warm(policy, S)
    _fill(policy, 127)
    assert policy.num_waiting == 128
    assert first_offered(policy) == "long"
    assert not policy.last_fcfs_fallback


def test_falls_back_to_fcfs_above_128_waiting() -> None:
    policy = LPMPolicy()
    warm(policy, S)
    _fill(policy, 128)
    assert policy.num_waiting == 129
    assert first_offered(policy) == "r000"
    assert policy.last_fcfs_fallback
    assert admission_step(policy)[-1] == "long"  # no reordering at all


def test_fallback_keeps_the_previously_sorted_order() -> None:
    # SGLang's waiting_queue is one list sorted in place: in fallback it keeps the order of
    # the last sort, with later arrivals appended - not arrival order.
    policy = LPMPolicy()
    warm(policy, S)
    _fill(policy, 127)
    assert first_offered(policy) == "long"  # sorted (128 waiting), nothing admitted
    add(policy, late=[20_000] * 5)  # 129 waiting now
    offered = admission_step(policy)
    assert policy.last_fcfs_fallback
    assert offered == ["long"] + [f"r{i:03d}" for i in range(127)] + ["late"]


def test_fallback_can_be_disabled() -> None:
    policy = LPMPolicy(fcfs_fallback_above=None)
    warm(policy, S)
    _fill(policy, 200)
    assert first_offered(policy) == "long"


def test_refused_candidate_is_not_lost() -> None:
    policy = LPMPolicy()
    warm(policy, S)
    add(policy, a=[*S[:80], 1], b=[*S[:40], 2])
    assert admission_step(policy, fits=lambda _: False) == ["a"]
    record = policy.last_step
    assert record.refused == "a" and record.stop_reason is StopReason.REFUSED
    assert policy.num_waiting == 2 and policy.is_waiting("a")
    add(policy, c=[*S[:90], 3])  # arrives between steps: the next sort places it first
    assert admission_step(policy) == ["c", "a", "b"]
    assert policy.num_waiting == 0 and policy.num_running == 3


def test_max_running_stops_admission() -> None:
    policy = LPMPolicy()
    warm(policy, S)
    add(policy, a=[1] * 5, b=[*S[:60], 2], c=[*S[:30], 3])
    assert admission_step(policy, max_running=2) == ["b", "c"]
    assert policy.last_step.stop_reason is StopReason.MAX_RUNNING
    assert admission_step(policy, max_running=3) == ["a"]


def test_admitted_prompt_is_cached_for_later_requests() -> None:
    policy = LPMPolicy()
    add(policy, p=list(range(1000, 1050)))
    assert admission_step(policy) == ["p"]  # running: its prompt is in the tree now
    add(policy, q=[5] * 60, r=[*range(1000, 1040), 1])
    assert admission_step(policy) == ["r", "q"]  # r matches 40 tokens of p's prompt


def test_preempted_request_keeps_its_cached_prefix_and_goes_to_the_queue_end() -> None:
    policy = LPMPolicy()
    add(policy, p=list(range(1000, 1050)))
    assert admission_step(policy) == ["p"]
    assert policy.tree_cache.locked_tokens == 50
    add(policy, q=[5] * 60, r=[6] * 60)
    policy.preempted("p")
    assert policy.tree_cache.locked_tokens == 0  # unlocked, still cached
    assert policy.waiting_queue() == ["q", "r", "p"]  # appended, as SGLang's retraction
    assert admission_step(policy) == ["p", "q", "r"]  # its prompt is cached: 49 tokens (capped)
    policy.finished("p")
    assert policy.tree_cache.locked_tokens == 120  # q and r still running


def test_preempted_request_position_in_fcfs_fallback() -> None:
    # With the fallback active the list order shows where a retracted request goes: the
    # end of the queue (FCFS in feather would resume it at its arrival position).
    policy = LPMPolicy(fcfs_fallback_above=2)
    add(policy, p=[1] * 10)
    assert admission_step(policy) == ["p"]
    add(policy, q=[2] * 10, r=[3] * 10)
    policy.preempted("p")
    assert admission_step(policy) == ["q", "r", "p"]
    assert policy.last_fcfs_fallback


def test_capacity_evicts_least_recently_used_unlocked_prefix() -> None:
    a = list(range(1000, 1040))
    b = list(range(2000, 2040))
    for capacity, expected in ((None, ["a2", "b2"]), (50, ["b2", "a2"])):
        policy = LPMPolicy(cache_capacity_tokens=capacity)
        warm(policy, a, b)  # with capacity 50, caching b evicts a (older)
        add(policy, a2=[*a, 1], b2=[*b[:30], 2])  # a2 matches 40 if a stays, b2 30
        assert admission_step(policy) == expected


def test_running_requests_are_never_evicted() -> None:
    policy = LPMPolicy(cache_capacity_tokens=10)
    add(policy, p=list(range(1000, 1050)))
    assert admission_step(policy) == ["p"]
    assert policy.tree_cache.total_tokens == 50  # locked: over capacity, kept
    policy.finished("p")
    assert policy.tree_cache.total_tokens == 0


def test_request_without_token_ids_is_refused_clearly() -> None:
    policy = LPMPolicy()
    with pytest.raises(ValueError, match=r"'x'.*prompt_token_ids"):
        policy.add_request(Request("x", chunk_hashes=[1, 2, 3]))
    assert policy.num_waiting == 0
    policy.add_request(Request("x", prompt_token_ids=[1, 2]))  # the id is still free
    assert policy.num_waiting == 1


def test_registry_and_params() -> None:
    policy = create_scheduler("lpm", page_size=16, fcfs_fallback_above=None)
    assert isinstance(policy, LPMPolicy)
    assert policy.params() == {
        "seed": 0,
        "page_size": 16,
        "cache_capacity_tokens": None,
        "in_batch_check_threshold": 32,
        "in_batch_deprioritize_threshold": 32,
        "fcfs_fallback_above": None,
    }


# ---- against a brute-force statement of the rule --------------------------------------


def _match(seqs: list[list[int]], query: list[int], page_size: int) -> int:
    best = max((lcp(s, query) for s in seqs), default=0)
    return best - best % page_size


def lpm_reference(
    cached: list[list[int]],
    waiting: list[list[int]],
    page_size: int,
    check: int,
    deprioritize: int,
) -> list[int]:
    in_batch: list[list[int]] = []
    keys = []
    for tokens in waiting:
        cache_len = _match(cached, tokens, page_size)
        key = -min(cache_len, max(len(tokens) - 1, 0))
        if cache_len <= check:
            if _match(in_batch, tokens, 1) >= deprioritize:
                key = 10**9
            else:
                in_batch.append(tokens)
        keys.append(key)
    return sorted(range(len(waiting)), key=lambda i: keys[i])


@settings(max_examples=150, deadline=None)
@given(
    page_size=st.integers(1, 3),
    check=st.integers(-1, 4),
    deprioritize=st.integers(0, 4),
    cached=st.lists(st.lists(st.integers(0, 2), max_size=8), max_size=6),
    waiting=st.lists(st.lists(st.integers(0, 2), max_size=8), min_size=1, max_size=10),
)
def test_first_step_order_equals_brute_force(
    page_size: int,
    check: int,
    deprioritize: int,
    cached: list[list[int]],
    waiting: list[list[int]],
) -> None:
    policy = LPMPolicy(
        page_size=page_size,
        in_batch_check_threshold=check,
        in_batch_deprioritize_threshold=deprioritize,
    )
    warm(policy, *cached)
    for i, tokens in enumerate(waiting):
        policy.add_request(Request(i, prompt_token_ids=tokens))
    expected = lpm_reference(cached, waiting, page_size, check, deprioritize)
    assert admission_step(policy) == expected
