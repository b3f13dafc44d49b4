"""Our scheduler inside the real vLLM V1 Scheduler, driven without a model (fake outputs).

vLLM's KV cache manager, prefix cache and preemption are real; only the model is absent.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from vllm_harness import answer, make_request, make_scheduler, run_to_completion

from feather.engines.vllm.scheduler import shared_prefix_blocks
from feather.policies.base import Action

BLOCK = 16


def interleaved_groups(groups: int, per_group: int, prefix: int, seed: int = 0):
    """(group, tokens) in round-robin order over groups sharing a `prefix`-token document."""
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 30_000) for _ in range(prefix)] for _ in range(groups)]
    return [
        (g, docs[g] + [rng.randrange(3, 30_000) for _ in range(12)])
        for i in range(per_group)
        for g in range(groups)
    ]


def unshared(n: int, length: int, seed: int = 1):
    rng = random.Random(seed)
    return [(i, [rng.randrange(3, 30_000) for _ in range(length)]) for i in range(n)]


def admissions(tmp: Path, policy: str, prompts, max_tokens: int = 4, **engine) -> list[list[str]]:
    scheduler = make_scheduler(tmp, policy, **engine)
    for i, (group, tokens) in enumerate(prompts):
        scheduler.add_request(make_request(f"g{group}-{i}", tokens, max_tokens))
    steps = run_to_completion(scheduler)
    return [a for a in steps if a], scheduler


def groups_of(batch: list[str]) -> set[str]:
    return {req_id.split("-")[0] for req_id in batch}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_feather_admits_homogeneous_batches_where_fcfs_mixes(tmp) -> None:
    prompts = interleaved_groups(groups=4, per_group=8, prefix=256)
    fcfs, _ = admissions(tmp, "fcfs", prompts, max_num_seqs=8)
    feather, scheduler = admissions(tmp, "feather-static", prompts, max_num_seqs=8)
    assert all(len(groups_of(batch)) == 4 for batch in fcfs)
    assert [len(groups_of(batch)) for batch in feather] == [1, 1, 1, 1]
    assert sorted(r for b in feather for r in b) == sorted(r for b in fcfs for r in b)
    assert scheduler.step_rows[0].distinct_groups is None  # no group map from this driver
    assert max(row.shared_prefix_tokens for row in scheduler.step_rows) >= 256


def test_without_sharing_feather_admits_exactly_what_fcfs_admits(tmp) -> None:
    prompts = unshared(40, 100)
    fcfs, _ = admissions(tmp, "fcfs", prompts, max_num_seqs=6, num_blocks=60)
    for policy in ("feather-static", "feather-ucb"):
        feather, _ = admissions(tmp, policy, prompts, max_num_seqs=6, num_blocks=60)
        assert feather == fcfs, policy


def test_our_fcfs_through_the_queue_equals_vllms_own_queue_under_preemption(tmp) -> None:
    """The queue translation (offer, admit, refuse, preempt) changes nothing by itself."""
    prompts = interleaved_groups(groups=3, per_group=6, prefix=120, seed=3)
    engine = {"max_num_seqs": 8, "num_blocks": 24, "max_num_batched_tokens": 512}
    native, native_scheduler = admissions(tmp, "fcfs", prompts, max_tokens=100, **engine)
    ours, ours_scheduler = admissions(
        tmp, "feather.policies.fcfs:FCFSPolicy", prompts, max_tokens=100, **engine
    )
    assert sum(row.preempted for row in native_scheduler.step_rows) > 0  # pressure is real
    assert ours == native
    assert ours_scheduler.admission_policy is not None and native_scheduler.admission_policy is None


def _brute_depth(hash_lists) -> int:
    return shared_prefix_blocks(hash_lists) if hash_lists else 0


def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_policy_state_b_delta_w_matches_brute_force_over_vllms_requests(tmp) -> None:
    # nested sharing: two documents with a common 64-token header, plus loners
    rng = random.Random(5)
    header = [rng.randrange(3, 30_000) for _ in range(64)]
    docs = [header + [rng.randrange(3, 30_000) for _ in range(160)] for _ in range(2)]
    prompts = [
        (i % 2, docs[i % 2] + [rng.randrange(3, 30_000) for _ in range(20)]) for i in range(12)
    ]
    prompts += [(9, [rng.randrange(3, 30_000) for _ in range(150)]) for _ in range(3)]
    scheduler = make_scheduler(
        tmp,
        "feather-static",
        # vLLM 0.32 has no cascade attention: ask the rule anyway, to see its state
        params={
            "min_batch": 2,
            "min_delta_tokens": 32,
            "consult": "always",
            "min_share_tokens": 0,
        },
        max_num_seqs=5,
        num_blocks=200,
    )
    for i, (group, tokens) in enumerate(prompts):
        scheduler.add_request(make_request(f"g{group}-{i}", tokens, 6))

    def prompt_hashes(req_id):
        request = scheduler.requests[req_id]
        return list(request.block_hashes[: request.num_prompt_tokens // BLOCK])

    checked = stops = 0
    while scheduler.has_requests():
        running = [r.request_id for r in scheduler.running]
        waiting = [r for r in scheduler.requests if r not in running]
        output = scheduler.schedule()
        record = scheduler.admission_policy.last_step
        batch = list(running)
        waiting_now = list(waiting)
        for decision in record.decisions:
            assert decision.batch_size == len(batch)
            cand = prompt_hashes(decision.req_id)
            hashes = [prompt_hashes(r) for r in batch]
            if batch:
                new_depth = _brute_depth([*hashes, cand])
                delta = _brute_depth(hashes) - new_depth
            else:
                new_depth, delta = len(cand), 0
            w = sum(
                1
                for q in waiting_now
                if q != decision.req_id and _lcp(prompt_hashes(q), cand) >= new_depth
            )
            assert (decision.delta_tokens, decision.w) == (delta * BLOCK, w), decision
            checked += 1
            if decision.action is Action.ADD and decision.req_id in record.admitted:
                batch.append(decision.req_id)
                waiting_now.remove(decision.req_id)
            stops += decision.action is Action.STOP
        answer(scheduler, output)
    assert checked >= 15 and stops >= 1


def test_every_step_records_its_shape_and_the_engine_cpu_time(tmp) -> None:
    """Per scheduled request: KV before the step and tokens computed in it, which the cpu
    profile's step-time fit regresses on; they must add up to what vLLM scheduled."""
    prompts = interleaved_groups(groups=3, per_group=3, prefix=200)
    _, scheduler = admissions(tmp, "lpm", prompts, max_tokens=5, max_num_batched_tokens=256)
    rows = scheduler.step_rows
    assert any(len(r.seq_new_tokens) > 1 and max(r.seq_context_tokens) > 0 for r in rows)
    for row in rows:
        assert sum(row.seq_new_tokens) == row.scheduled_tokens
        assert len(row.seq_context_tokens) == len(row.seq_new_tokens) == row.batch_size
        assert row.step_cpu_s is not None and row.step_cpu_s >= 0
        prompt = 212  # every prompt: 200 shared + 12 own tokens; a decode has all of it
        assert row.decode_seqs == sum(
            1 for c, n in zip(row.seq_context_tokens, row.seq_new_tokens, strict=True)
            if n == 1 and c >= prompt
        )  # fmt: skip
    total_prompt = sum(len(t) for _, t in prompts)
    prefill = sum(row.prefill_tokens for row in rows)
    hits = sum(row.cache_hit_tokens for row in rows)
    assert prefill + hits == total_prompt  # every prompt token computed once or found cached


def test_the_policy_learns_its_kernel_from_the_attention_backend(tmp, monkeypatch) -> None:
    """feather-static is asked (and stops) only where the engine's decode attention reads a
    batch's common prefix once: our cascade backend, selected by FEATHER_VLLM_ATTENTION (what
    the plugin reads in the engine's process). Under vLLM's kernel or PAT-style, every
    candidate is a forced ADD and the batches mix as the CHT orders them."""
    from feather.engines.vllm import attention_plugin

    prompts = interleaved_groups(groups=2, per_group=6, prefix=1280)
    counts = {}
    for mode in ("vllm", "pat", "cascade"):
        monkeypatch.setenv(attention_plugin.ENV, mode)
        batches, scheduler = admissions(tmp, "feather-static", prompts, max_tokens=8,
                                        max_num_seqs=8)
        counts[mode] = (scheduler.decisions["stop"], [len(groups_of(b)) for b in batches])
    assert counts["vllm"] == counts["pat"] and counts["vllm"][0] == 0
    stops, groups_per_admission = counts["cascade"]
    assert stops > 0 and set(groups_per_admission) == {1}


@pytest.mark.parametrize("policy", ["fcfs", "feather.policies.fcfs:FCFSPolicy", "feather-static"])
def test_priority_preemption_takes_vllms_victim_in_every_mode(tmp, policy) -> None:
    """vLLM keeps its SchedulingPolicy in `Scheduler.policy` and, under the priority policy,
    preempts the running request of the lowest priority (the largest value); ours is
    `admission_policy`, so vLLM's choice holds in pass-through and in the policy modes."""
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    scheduler = make_scheduler(tmp, policy, num_blocks=12, max_num_seqs=4,
                               scheduling_policy="priority")
    assert scheduler.policy == SchedulingPolicy.PRIORITY
    rng = random.Random(5)
    # the low-priority request arrives first, so vLLM's FCFS victim (the last running)
    # would be the urgent one
    scheduler.add_request(make_request("low", [rng.randrange(3, 30_000) for _ in range(32)],
                                       max_tokens=80, priority=9))
    scheduler.add_request(make_request("urgent", [rng.randrange(3, 30_000) for _ in range(32)],
                                       max_tokens=80, priority=0))
    preempted: list[str] = []
    for _ in range(400):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        preempted += [r.request_id for r in scheduler.waiting
                      if r.num_preemptions and r.request_id not in preempted]
        answer(scheduler, output)
    assert not scheduler.has_requests()
    assert preempted and preempted[0] == "low", preempted


def test_a_free_of_an_unknown_or_freed_request_is_counted_not_raised(tmp) -> None:
    """vLLM's own tests put requests straight into the engine, and a free may come twice:
    neither may raise inside the engine's step."""
    from vllm.v1.request import RequestStatus

    for policy in ("fcfs", "feather-static"):
        scheduler = make_scheduler(tmp, policy)
        request = make_request("direct", list(range(3, 40)), max_tokens=4)
        scheduler.requests[request.request_id] = request  # not through add_request
        scheduler.running.append(request)
        request.status = RequestStatus.FINISHED_STOPPED
        scheduler.running.remove(request)
        scheduler._free_request(request)
        assert "direct" not in scheduler.requests
        scheduler._free_request(request)  # again
        assert scheduler.held()["freed_twice"] == 1, policy
