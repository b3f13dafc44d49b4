"""Test drivers: any policy through the admission protocol, and brute-force references.

`run` is a minimal continuous-batching loop, not a simulator: every running request emits
one token per step and finishes after its output length; the test decides what fits, when
to preempt and what a step's time is. `admission_step`, `add` and `warm` drive single steps.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from feather.policies import AdmissionPolicy, Request, StepContext, StepOutcome


@dataclass(frozen=True)
class ToyRequest:
    req_id: int
    tokens: list[int]
    output_len: int = 4
    group: int = -1
    arrival_step: int = 0


@dataclass
class StepLog:
    admitted: list[int]
    running: list[int]  # after admission, in admission order
    groups: set[int] = field(default_factory=set)


def run(
    policy: AdmissionPolicy,
    requests: Sequence[ToyRequest],
    *,
    max_running: int,
    fits: Callable[[int, int], bool] = lambda step, req_id: True,
    preempt_at: Callable[[int], bool] = lambda step: False,
    step_time_s: Callable[[list[ToyRequest]], float] = lambda batch: 1.0,
    max_steps: int = 10_000,
    prefix_read_once: bool = False,
    on_step: Callable[[AdmissionPolicy], None] = lambda policy: None,
) -> list[StepLog]:
    """Run until every request finished; returns one log per step. `prefix_read_once`: the
    engine's kernel reads a common prefix once (where Feather's rules are consulted)."""
    by_id = {r.req_id: r for r in requests}
    pending = sorted(requests, key=lambda r: (r.arrival_step, r.req_id))
    produced: dict[int, int] = {}
    running: list[int] = []
    logs: list[StepLog] = []
    done = 0
    for step in range(max_steps):
        while pending and pending[0].arrival_step <= step:
            r = pending.pop(0)
            policy.add_request(Request(r.req_id, r.tokens))
        if preempt_at(step) and len(running) >= 2:
            victim = running.pop()  # the most recently admitted, as vLLM preempts
            policy.preempted(victim)
            produced[victim] = 0  # recompute preemption: its output starts again
        policy.begin_step(
            StepContext(
                num_running=len(running),
                max_running=max_running,
                prefix_read_once=prefix_read_once,
            )
        )
        admitted = []
        while (req_id := policy.next_candidate()) is not None:
            if fits(step, req_id):
                policy.admitted(req_id)
                running.append(req_id)
                admitted.append(req_id)
            else:
                policy.refused(req_id)
        on_step(policy)
        batch = [by_id[i] for i in running]
        logs.append(StepLog(admitted, list(running), {r.group for r in batch}))
        if batch:
            policy.report_step(StepOutcome(len(batch), len(batch), step_time_s(batch)))
        for req_id in list(running):
            produced[req_id] = produced.get(req_id, 0) + 1
            if produced[req_id] >= by_id[req_id].output_len:
                running.remove(req_id)
                policy.finished(req_id)
                done += 1
        if done == len(requests):
            return logs
    raise AssertionError(f"not all requests finished within {max_steps} steps")


def grouped_requests(
    groups: int, per_group: int, *, prefix: int, suffix: int, output_len: Callable[[int], int]
) -> list[ToyRequest]:
    """Requests over `groups` distinct prefixes, interleaved round-robin in arrival order."""
    out = []
    for i in range(groups * per_group):
        g = i % groups
        tokens = [10_000 * (g + 1) + k for k in range(prefix)] + [50_000 + i] * suffix
        out.append(ToyRequest(i, tokens, output_len(i), g))
    return out


def admission_step(
    policy: AdmissionPolicy,
    *,
    max_running: int = 10_000,
    fits: Callable[[Hashable], bool] = lambda _: True,
    prefix_read_once: bool = False,
) -> list[Hashable]:
    """One admission phase; returns the candidates in the order they were offered."""
    policy.begin_step(
        StepContext(
            num_running=policy.num_running,
            max_running=max_running,
            prefix_read_once=prefix_read_once,
        )
    )
    offered = []
    while (req_id := policy.next_candidate()) is not None:
        offered.append(req_id)
        if fits(req_id):
            policy.admitted(req_id)
        else:
            policy.refused(req_id)
    return offered


def add(policy: AdmissionPolicy, **prompts: list[int]) -> None:
    """Requests named by keyword, in keyword order."""
    for req_id, prompt in prompts.items():
        policy.add_request(Request(req_id, prompt_token_ids=prompt))


def warm(policy: AdmissionPolicy, *prompts: list[int]) -> None:
    """Run each prompt to completion, one per step, so a cache-aware policy has cached it."""
    for i, prompt in enumerate(prompts):
        req_id = ("warm", i, len(prompt))
        policy.add_request(Request(req_id, prompt_token_ids=prompt))
        assert admission_step(policy, max_running=policy.num_running + 1) == [req_id]
        policy.finished(req_id)


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (the brute-force reference of every tree)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
