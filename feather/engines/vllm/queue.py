"""vLLM's waiting queue with the order decided by one of our admission policies.

vLLM's `Scheduler.schedule()` admits waiting requests in a loop: it asks the queue whether
anything waits (`bool(queue)`), looks at the head (`peek_request`), tries to allocate KV
blocks for it and, if they fit, takes it (`pop_request`); if they do not (or the token budget
is spent) it stops for this step and the head stays. Preempted requests come back with
`prepend_request`; so do requests the loop had to skip. That loop is our admission protocol
(`feather.policies.base`) in another form, so this queue translates one into the other:

    bool(queue)        -> policy.next_candidate() is not None (None: the policy says STOP,
                          or nothing waits, or the running limit is hit)
    peek_request()     -> the offered candidate
    pop_request()      -> policy.admitted(candidate)
    the loop ends with the candidate still at the head -> policy.refused(candidate)
    prepend_request(r) -> policy.preempted(r) if the policy saw r admitted
    add_request(r)     -> policy.add_request(r's prompt tokens and vLLM's own block hashes)

vLLM keeps its KV accounting, prefix caching and preemption; only the admission order
changes. The policy's per-step bookkeeping starts at the first question of a step
(`begin_admission`), after the running requests were scheduled and any preemption reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from feather.policies.base import AdmissionPolicy, StepContext
from feather.policies.base import Request as PolicyRequest


class PolicyWaitingQueue(RequestQueue):
    """The waiting requests of a vLLM scheduler, in the order an `AdmissionPolicy` offers them.

    `step_context` is called at the first question of each admission phase; it returns the
    engine's running count and limits at that moment.
    """

    def __init__(self, policy: AdmissionPolicy, step_context: Callable[[], StepContext]) -> None:
        self.policy = policy
        self._step_context = step_context
        self._waiting: dict[str, Request] = {}  # insertion order = arrival order
        self._known: set[str] = set()  # added and not yet freed: what the policy holds
        self._admitting = False  # inside schedule()'s admission phase
        self._phase_started = False
        self._offered: str | None = None
        self.admitted_this_step: list[str] = []
        self._policy_cpu_s = 0.0

    def take_policy_cpu_s(self) -> float:
        """CPU time spent in the policy since the last call (its share of scheduling)."""
        spent, self._policy_cpu_s = self._policy_cpu_s, 0.0
        return spent

    # ---- the step, as the scheduler subclass drives it --------------------------------------
    def open_step(self) -> None:
        """schedule() starts: the admission phase begins at the first question."""
        self._admitting = True
        self._phase_started = False
        self._offered = None
        self.admitted_this_step = []

    def close_step(self) -> bool:
        """schedule() ended. True when the policy took part this step (asked at least once)."""
        if self._offered is not None:  # vLLM stopped with the candidate still at the head
            self.policy.refused(self._offered)
            self._offered = None
        self._admitting = False
        return self._phase_started

    def _offer(self) -> str | None:
        if not self._admitting:
            raise RuntimeError(
                "vLLM asked the waiting queue for a request outside schedule(): the Feather "
                "scheduler only supports admission from schedule()"
            )
        if self._offered is None:
            cpu0 = time.thread_time()
            if not self._phase_started:
                self.policy.begin_step(self._step_context())
                self._phase_started = True
            self._offered = self.policy.next_candidate()
            self._policy_cpu_s += time.thread_time() - cpu0
        return self._offered

    # ---- vLLM's RequestQueue ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        cpu0 = time.thread_time()
        self.policy.add_request(
            PolicyRequest(
                req_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                chunk_hashes=list(request.block_hashes),
                arrival_time=request.arrival_time,
            )
        )
        self._policy_cpu_s += time.thread_time() - cpu0
        self._waiting[request.request_id] = request
        self._known.add(request.request_id)

    def pop_request(self) -> Request:
        req_id = self._offer()
        if req_id is None:
            raise IndexError("pop from a waiting queue whose policy offers nothing")
        cpu0 = time.thread_time()
        self.policy.admitted(req_id)
        self._policy_cpu_s += time.thread_time() - cpu0
        self._offered = None
        self.admitted_this_step.append(req_id)
        return self._waiting.pop(req_id)

    def peek_request(self) -> Request:
        req_id = self._offer()
        if req_id is None:
            raise IndexError("peek at a waiting queue whose policy offers nothing")
        return self._waiting[req_id]

    def prepend_request(self, request: Request) -> None:
        req_id = request.request_id
        if req_id in self._waiting:
            raise RuntimeError(f"request {req_id!r} is already waiting")
        self.policy.preempted(req_id)  # it ran (or was taken this step): it waits again
        self._waiting[req_id] = request

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.prepend_request(request)

    def forget(self, req_id: str) -> None:
        """vLLM freed the request (finished or aborted): the policy forgets it (one the
        policy never saw - put straight into the engine's running set - is none of its)."""
        if req_id not in self._known:
            return
        self._known.discard(req_id)
        cpu0 = time.thread_time()
        self.policy.finished(req_id)
        self._policy_cpu_s += time.thread_time() - cpu0
        self._waiting.pop(req_id, None)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Aborted or stopped while waiting: vLLM frees them next (the policy forgets them
        when the scheduler frees the request)."""
        for request in requests:
            self._waiting.pop(request.request_id, None)

    def __bool__(self) -> bool:
        if not self._admitting:
            return bool(self._waiting)
        return self._offer() is not None

    def __len__(self) -> int:
        return len(self._waiting)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._waiting.values()))
