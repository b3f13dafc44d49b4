"""Arrivals, aborts, finishes and preemptions in random interleavings, on the real vLLM
scheduler with each of our policies: nothing leaks, nothing is lost, nothing runs twice.

What a server sees (clients that disconnect abort their request, at any point: waiting,
running, just preempted) is driven here through vLLM's own `Scheduler` (`vllm_harness`: no
model, a fake output per step) with a KV pool small enough that vLLM preempts. After every
operation the policy agrees with vLLM on what waits and runs; at the end, once everything
finished or was aborted, the scheduler, the policy and the CHT hold nothing, every request
finished exactly once (by completing or by its abort), and the state file a served engine
writes says the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.request import RequestStatus
from vllm_harness import answer, make_request, make_scheduler

BLOCK = 16
POLICIES = ["fcfs", "feather-static", "feather-ucb", "lpm", "dfs-weight"]
# an add (prefix group, suffix blocks, output tokens), a step, or an abort (which known request)
operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 10_000)),
)


def prompt(group: int, suffix_blocks: int, serial: int) -> list[int]:
    """A 3-block prefix of its group, then blocks of its own and 12 tokens: a few output
    tokens fill that block, and decoding needs a new one (where vLLM preempts)."""
    prefix = [1000 * (group + 1) + i for i in range(3 * BLOCK)]
    own = [50_000 + 997 * serial + i for i in range(suffix_blocks * BLOCK + 12)]
    return prefix + own


def finished_ids(outputs) -> list[str]:
    return [
        out.request_id
        for client in (outputs or {}).values()
        for out in client.outputs
        if out.finish_reason is not None
    ]


def agree(scheduler) -> None:
    """The policy and vLLM agree on what waits and what runs."""
    policy = scheduler.admission_policy
    if policy is None:  # vLLM's own FCFS queue: nothing of ours to disagree
        return
    held = policy.footprint()
    assert held["requests"] == len(scheduler.requests)
    assert policy.num_waiting == len(scheduler.waiting)
    assert policy.num_running == len(scheduler.running)
    if "cht_requests" in held:
        assert held["cht_requests"] == len(scheduler.requests)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    policy=st.sampled_from(POLICIES),
    ops=st.lists(operation, min_size=5, max_size=80),
    num_blocks=st.integers(11, 40),
)
def test_any_interleaving_leaves_nothing_behind(policy, ops, num_blocks, tmp_path: Path) -> None:
    state_file = tmp_path / f"state-{policy}-{num_blocks}.json"
    scheduler = make_scheduler(
        tmp_path,
        policy,
        num_blocks=num_blocks,
        max_num_seqs=6,
        max_num_batched_tokens=256,
        max_model_len=256,
        records=False,
        state_file=state_file,
    )
    added: list[str] = []
    completed: list[str] = []
    aborted: list[str] = []
    preemptions = 0

    def live() -> list[str]:
        return [r for r in added if r in scheduler.requests]

    def one_step() -> None:
        nonlocal preemptions
        output = scheduler.schedule()
        preemptions += len(output.preempted_req_ids or ())
        before = set(scheduler.requests)  # every schedule() gets its update, as in vLLM
        answer(scheduler, output)
        # what update_from_output reported finished (answer() drops the outputs: recount)
        completed.extend(r for r in before if r not in scheduler.requests)

    for op in ops:
        if op[0] == "add":
            _, group, suffix_blocks, max_tokens = op
            req_id = f"r{len(added)}"
            scheduler.add_request(
                make_request(req_id, prompt(group, suffix_blocks, len(added)), max_tokens)
            )
            added.append(req_id)
        elif op[0] == "step":
            one_step()
        else:
            candidates = live()
            if candidates:
                req_id = candidates[op[1] % len(candidates)]
                scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
                aborted.append(req_id)
        agree(scheduler)
    for _ in range(2_000):  # drain what is left
        if not scheduler.has_requests():
            break
        one_step()
        agree(scheduler)
    assert not scheduler.has_requests(), "the scheduler did not drain"

    assert sorted(completed + aborted) == sorted(added)  # each exactly once, none lost
    assert not set(completed) & set(aborted)
    held = scheduler.held()
    assert held["requests"] == held["waiting"] == held["running"] == 0
    assert held["added"] == held["freed"] == len(added)
    assert held["freed_twice"] == 0
    assert held["records"] == {"steps": 0, "requests": 0}  # a served engine keeps no rows
    if scheduler.admission_policy is not None:
        footprint = scheduler.admission_policy.footprint()
        assert footprint["requests"] == footprint["running"] == 0
        if "cht_requests" in footprint:
            assert footprint["cht_requests"] == footprint["cht_nodes"] == 0
            assert footprint["cht_heap_entries"] <= 64  # dead entries, bounded by compaction
    assert json.loads(state_file.read_text()) == json.loads(json.dumps(held))


def test_the_interleavings_reach_preemption_and_aborts_of_running_requests(tmp_path) -> None:
    """The property above is only as good as what it reaches: under the same limits a plain
    burst preempts, and an abort can land on a running request (not only on waiting ones)."""
    scheduler = make_scheduler(
        tmp_path, "feather-static", num_blocks=12, max_num_seqs=6,
        max_num_batched_tokens=256, max_model_len=256, records=False,
    )  # fmt: skip
    for k in range(8):
        scheduler.add_request(make_request(f"r{k}", prompt(k % 2, 0, k), 30))
    preempted = 0
    aborted_running = False
    for _ in range(200):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        preempted += len(output.preempted_req_ids or ())
        answer(scheduler, output)
        running = [r.request_id for r in scheduler.running]
        if running and not aborted_running:
            scheduler.finish_requests(running[0], RequestStatus.FINISHED_ABORTED)
            aborted_running = True
        agree(scheduler)
    assert preempted > 0 and aborted_running
    assert scheduler.admission_policy.footprint()["cht_nodes"] == 0
