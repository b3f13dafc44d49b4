"""First come, first served: the engines' default admission order (vLLM V1, SGLang `fcfs`)."""

from __future__ import annotations

from feather.arrival import ArrivalQueue
from feather.policies.base import AdmissionPolicy, Request, RequestId, SchedCostKind


class FCFSPolicy(AdmissionPolicy):
    """Offer waiting requests in arrival order until a limit is hit; never STOP early.

    A preempted request waits again at its original arrival position, so it is resumed
    before anything that arrived after it (vLLM puts preempted requests at the queue front).
    """

    name = "fcfs"
    sched_cost_kind = SchedCostKind.FIFO

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._queue = ArrivalQueue()

    def _on_arrival(self, request: Request) -> None:
        self._queue.push(request.req_id, self._next_seq)

    def _on_admit(self, req_id: RequestId) -> None:
        self._queue.discard(req_id)

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        if not finished:
            self._queue.push(req_id, self.arrival_seq(req_id))

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        self._queue.discard(req_id)

    def _choose(self) -> RequestId | None:
        return self._queue.peek()
