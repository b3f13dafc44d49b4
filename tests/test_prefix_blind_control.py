"""The prefix-blind control (feather/policies/shortest_prompt.py) driven through the admission
protocol only, against a brute-force reference; and the synthetic workload option that makes
prompt length say nothing of the prefix group (`suffix_spread`)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from toy_engine import ToyRequest, admission_step, run

from feather.policies import (
    Request,
    SchedCostKind,
    StepContext,
    StopReason,
    create_scheduler,
    resolve_scheduler,
)
from feather.policies.shortest_prompt import ShortestPromptPolicy
from feather.workloads import load_workload
from feather.workloads.schema import WorkloadError

_OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4)),  # few lengths: ties are common
    st.tuples(st.just("step"), st.integers(0, 4), st.integers(0, 5)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("preempt"), st.integers(0, 50)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_OPS, min_size=4, max_size=60))
# a preempted request ties with one that arrived after it: it goes first again
@example(ops=[("add", 1), ("step", 1, 5), ("add", 1), ("preempt", 0), ("step", 2, 5)])
def test_every_offer_is_the_shortest_waiting_prompt_ties_by_arrival(ops) -> None:
    """Against a brute-force reference: every candidate is the minimum of (prompt length,
    arrival) over what waits, through refusals, preemptions (original place kept) and aborts;
    the policy holds nothing once every request is gone."""
    policy = ShortestPromptPolicy()
    waiting: dict[int, tuple[int, int]] = {}  # id -> (length, arrival)
    length: dict[int, int] = {}
    running: list[int] = []
    next_id = 0
    for op in ops:
        kind = op[0]
        if kind == "add":
            policy.add_request(Request(next_id, prompt_token_ids=[next_id % 7] * op[1]))
            waiting[next_id] = (op[1], next_id)
            length[next_id] = op[1]
            next_id += 1
        elif kind == "step":
            limit, refuse_at = len(running) + op[1], op[2]
            policy.begin_step(StepContext(num_running=len(running), max_running=max(limit, 1)))
            offered = 0
            while (req_id := policy.next_candidate()) is not None:
                assert req_id == min(waiting, key=waiting.__getitem__)
                if offered == refuse_at:
                    policy.refused(req_id)
                else:
                    policy.admitted(req_id)
                    running.append(req_id)
                    del waiting[req_id]
                offered += 1
            reason = policy.last_step.stop_reason
            assert reason is not StopReason.POLICY  # it never stops early
            assert (reason is StopReason.NO_WAITING) == (not waiting)
        elif kind == "finish" and running:
            policy.finished(running.pop(op[1] % len(running)))
        elif kind == "preempt" and running:
            req_id = running.pop(op[1] % len(running))
            policy.preempted(req_id)
            waiting[req_id] = (length[req_id], req_id)  # back at its own place
        elif kind == "abort" and waiting:
            req_id = sorted(waiting)[op[1] % len(waiting)]
            policy.finished(req_id)
            del waiting[req_id]
    for req_id in [*running, *waiting]:
        policy.finished(req_id)
    assert set(policy.footprint().values()) <= {0}


@st.composite
def equal_length_workloads(draw) -> list[ToyRequest]:
    length = draw(st.integers(1, 6))
    count = draw(st.integers(1, 14))
    return [ToyRequest(i, [draw(st.integers(0, 3)) for _ in range(length)],
                       draw(st.integers(1, 5)), arrival_step=draw(st.integers(0, 6)))
            for i in range(count)]


@given(reqs=equal_length_workloads(), max_running=st.integers(1, 5),
       refuse_mod=st.integers(2, 7), preempt_mod=st.integers(2, 9))
@settings(max_examples=100, deadline=None)
def test_with_equal_lengths_it_admits_exactly_as_fcfs(reqs, max_running, refuse_mod,
                                                      preempt_mod) -> None:
    """Where lengths tie the control is FCFS: same admissions, same steps, whatever the
    prefixes, refusals and preemptions."""

    def admissions(name: str) -> list[list[int]]:
        logs = run(create_scheduler(name), reqs, max_running=max_running,
                   fits=lambda step, req_id: (step + req_id) % refuse_mod != 0,
                   preempt_at=lambda step: step % preempt_mod == preempt_mod - 1)
        return [log.admitted for log in logs]

    assert admissions("shortest-prompt") == admissions("fcfs")


@given(lengths=st.lists(st.integers(1, 8), min_size=1, max_size=12), seed=st.integers(0, 99))
@settings(max_examples=100, deadline=None)
def test_it_is_blind_to_prefixes_new_token_ids_of_the_same_lengths_change_nothing(
        lengths, seed) -> None:
    rng = random.Random(seed)
    shared = [ToyRequest(i, [1] * n, 2) for i, n in enumerate(lengths)]  # one common prefix
    distinct = [ToyRequest(i, [rng.randrange(1000) for _ in range(n)], 2)
                for i, n in enumerate(lengths)]
    order = [run(create_scheduler("shortest-prompt"), reqs, max_running=3)
             for reqs in (shared, distinct)]
    assert [s.admitted for s in order[0]] == [s.admitted for s in order[1]]


def test_groups_of_near_equal_lengths_are_admitted_together_by_accident() -> None:
    """L-Eval's shape: one document's questions have nearly equal lengths, documents differ,
    so a length sort admits each document's questions one after another although they arrive
    interleaved (FCFS mixes all three)."""
    policy = ShortestPromptPolicy()
    for i in range(9):
        doc = i % 3
        policy.add_request(Request(i, prompt_token_ids=[doc] * (1000 * (doc + 1) + i)))
    order = admission_step(policy, max_running=9)
    assert [i % 3 for i in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a_request_without_token_ids_is_refused_and_nothing_is_recorded() -> None:
    policy = ShortestPromptPolicy()
    with pytest.raises(ValueError, match="needs prompt_token_ids"):
        policy.add_request(Request("a", chunk_hashes=[1, 2]))
    assert policy.num_waiting == 0
    policy.add_request(Request("a", prompt_token_ids=[1, 2]))
    assert admission_step(policy) == ["a"]


def test_registered_as_a_fifo_priced_baseline_not_as_feather() -> None:
    cls = resolve_scheduler("shortest-prompt")
    assert cls is ShortestPromptPolicy
    assert cls.sched_cost_kind is SchedCostKind.FIFO
    assert not cls.name.startswith("feather")  # figures and verdicts would count it as Feather
    with pytest.raises(ValueError, match="has no parameter 'chunk_size'"):
        create_scheduler("shortest-prompt", chunk_size=16)


# ---- the workload where length reveals nothing: synthetic suffix_spread ----

OVERLAP = "synthetic:groups=6,per_group=8,prefix=64,suffix=20,suffix_spread=0.9,output=4,seed=3"


def _lengths_by_group(spec: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in load_workload(spec).requests:
        out.setdefault(r.group_path[-1], []).append(len(r.prompt_token_ids))
    return out


def test_suffix_spread_makes_lengths_overlap_across_groups() -> None:
    groups = _lengths_by_group(OVERLAP)
    assert len(groups) == 6
    for lengths in groups.values():
        assert all(64 + 2 <= n <= 64 + 38 for n in lengths)  # 20 tokens +-90%
        assert len(set(lengths)) > 1  # lengths vary within a group
    spans = sorted((min(v), max(v)) for v in groups.values())
    assert all(lo <= prev_hi for (_, prev_hi), (lo, _) in itertools.pairwise(spans))
    # and a length sort no longer groups them: most neighbours belong to different groups
    requests = load_workload(OVERLAP).requests
    by_length = sorted(requests, key=lambda r: len(r.prompt_token_ids))
    changes = sum(a.group_path[-1] != b.group_path[-1]
                  for a, b in itertools.pairwise(by_length))
    assert changes > len(requests) / 2


def test_suffix_spread_zero_changes_nothing_and_bad_values_are_refused() -> None:
    base = "synthetic:groups=3,per_group=4,prefix=16,suffix=5,seed=1"
    plain = load_workload(base).requests
    zero = load_workload(base + ",suffix_spread=0.0").requests
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
               for a, b in zip(plain, zero, strict=True))
    assert {len(r.prompt_token_ids) for r in plain} == {21}
    with pytest.raises(WorkloadError, match=r"suffix_spread=1\.0: expected 0 <= suffix_spread"):
        load_workload(base + ",suffix_spread=1.0")
