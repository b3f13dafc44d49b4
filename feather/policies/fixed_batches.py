"""`batches`: dispatch a workload as fixed batches, each drained before the next (C1, C2).

A policy like any other (so it runs in the simulator and the real engines alike): it offers
the current batch's requests, then answers STOP until every one of them has finished. The
plan comes from the workload's groups:

  homogeneous  each group's requests in batches of `size` (the paper's 8 x 100 for C1)
  mixed        all requests round-robin over groups, in batches of `size` (the mixed side)
  sorted       all requests group after group, in batches of `size`: batches as large and as
               mixed as `mixed`'s once `size` exceeds a group, but each group's requests
               adjacent in the batch (a kernel that walks requests in order reuses a prefix
               from cache while it is still there: vLLM's CPU kernel does)

C2 (k divergent requests in a homogeneous batch) is a workload of one group of 100 with
k requests made unshared (`synthetic:groups=1,per_group=100,unshared=0.0k`) under `mixed`:
round-robin puts the k singletons and 100 - k group members in one batch.

A batch limited by memory or `max_num_seqs` is admitted over several steps, as the engine
allows; the plan itself never changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feather.arrival import ArrivalQueue
from feather.policies.base import AdmissionPolicy, Request, RequestId, SchedCostKind
from feather.workloads.schema import WorkloadRequest

PLANS = ("homogeneous", "mixed", "sorted")


def plan_batches(requests: Sequence[WorkloadRequest], plan: str, size: int) -> list[list[str]]:
    """Request ids per batch, in dispatch order."""
    if plan not in PLANS:
        raise ValueError(f"unknown batch plan {plan!r}; plans: {', '.join(PLANS)}")
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    groups: dict[str, list[str]] = {}
    for r in requests:
        groups.setdefault(r.group_id, []).append(r.request_id)
    if plan == "homogeneous":
        return [g[i : i + size] for g in groups.values() for i in range(0, len(g), size)]
    if plan == "sorted":
        order = [rid for g in groups.values() for rid in g]
        return [order[i : i + size] for i in range(0, len(order), size)]
    longest = max(len(g) for g in groups.values())
    order = [g[i] for i in range(longest) for g in groups.values() if i < len(g)]
    return [order[i : i + size] for i in range(0, len(order), size)]


class FixedBatchesPolicy(AdmissionPolicy):
    """Admit a fixed plan of batches, one batch at a time, draining each before the next."""

    name = "batches"
    sched_cost_kind = SchedCostKind.PLAN
    plans_over_workload = True

    def __init__(
        self,
        *,
        seed: int = 0,
        plan: str = "homogeneous",
        size: int = 100,
        batches: list[list[RequestId]] | None = None,
    ) -> None:
        super().__init__(seed=seed)
        if plan not in PLANS:
            raise ValueError(f"unknown batch plan {plan!r}; plans: {', '.join(PLANS)}")
        self.plan, self.size = plan, size
        self._batches: list[list[RequestId]] | None = batches
        self._batch_of: dict[RequestId, int] = {}
        self._current = 0
        self._left: list[int] = []  # requests of each batch not finished yet
        self._queue = ArrivalQueue()  # waiting members of the current batch, in plan order
        self._order: dict[RequestId, int] = {}
        if batches is not None:
            self._index(batches)

    def bind_workload(self, requests: Sequence[WorkloadRequest]) -> None:
        """Build the plan from the workload's groups (engines call this before running)."""
        if self._batches is None:
            self._batches = plan_batches(requests, self.plan, self.size)
            self._index(self._batches)

    def _index(self, batches: list[list[RequestId]]) -> None:
        for b, batch in enumerate(batches):
            for position, rid in enumerate(batch):
                if rid in self._batch_of:
                    raise ValueError(f"request {rid!r} appears in two batches of the plan")
                self._batch_of[rid] = b
                self._order[rid] = position
        self._left = [len(batch) for batch in batches]

    def alias(self, plan_id: RequestId, engine_id: RequestId) -> None:
        """The request planned as `plan_id` reaches the policy as `engine_id` (an engine that
        names requests itself: vLLM). Call before it arrives."""
        if self._batches is None:
            raise ValueError("the batches policy needs its plan: call bind_workload() first")
        if plan_id not in self._batch_of:
            raise ValueError(f"request {plan_id!r} is in no batch of the plan")
        if engine_id == plan_id:
            return
        if engine_id in self._batch_of:
            raise ValueError(f"engine id {engine_id!r} already names a request of the plan")
        b = self._batch_of.pop(plan_id)
        self._batch_of[engine_id] = b
        self._order[engine_id] = self._order.pop(plan_id)
        batch = self._batches[b]
        batch[batch.index(plan_id)] = engine_id

    def _on_arrival(self, request: Request) -> None:
        if self._batches is None:
            raise ValueError("the batches policy needs its plan: call bind_workload() first")
        if request.req_id not in self._batch_of:
            raise ValueError(f"request {request.req_id!r} is in no batch of the plan")
        if self._batch_of[request.req_id] == self._current:
            self._queue.push(request.req_id, self._order[request.req_id])

    def _on_admit(self, req_id: RequestId) -> None:
        self._queue.discard(req_id)

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        if not finished:
            self._queue.push(req_id, self._order[req_id])
            return
        self._left[self._batch_of[req_id]] -= 1
        while self._current < len(self._left) and self._left[self._current] == 0:
            self._current += 1  # drained: the next batch's waiting members become candidates
            for rid in self._batches[self._current] if self._current < len(self._left) else []:
                if self.is_waiting(rid):
                    self._queue.push(rid, self._order[rid])

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        self._queue.discard(req_id)
        self._on_leave_running(req_id, finished=True)

    def _choose(self) -> RequestId | None:
        return self._queue.peek()

    def params(self) -> dict[str, Any]:
        return {**super().params(), "plan": self.plan, "size": self.size}
