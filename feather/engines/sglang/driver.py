"""One admission pass of SGLang's scheduler, driven by one of our policies.

SGLang forms a prefill batch in `Scheduler._get_new_batch_prefill_raw`: it sorts the waiting
queue (`SchedulePolicy.calc_priority`; `fcfs` leaves it in arrival order), then walks the
list, offering each request to the `PrefillAdder` (`add_one_req`), and stops at the first
that does not return CONTINUE. That walk is our admission protocol (`feather.policies.base`)
if the list holds, at each position, the candidate our policy offers next:

    calc_priority (after SGLang's own) -> sync events, begin_step, put candidate 1 first
    add_one_req(candidate k)           -> SGLang's own budget checks and commit; then
                                          admitted(k) + put candidate k+1 next, or refused(k)
    add_one_req(anything else)         -> the policy said STOP: answer OTHER (the walk
                                          ends, nothing committed, the request keeps waiting)
    the walk ends with a candidate unvisited (budget, batch full) -> refused(candidate)

The walk iterates the list by index, so moving candidate k+1 to the next index is what it
visits next; the rest keep their arrival order. SGLang's KV accounting, radix-cache matching
and reuse, chunked prefill and retraction run unchanged.

Events come from the requests themselves at the start of a pass (no other hook needed): a
waiting request not seen before arrived; one the policy saw admitted and now waits again
was retracted; an admitted one whose `finished()` is true finished; a waiting one no longer
in the queue was aborted. Plain Python: SGLang's `Req` is used only through `rid`,
`origin_input_ids` and `finished()`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from feather.policies.base import AdmissionPolicy, StepContext, StepRecord
from feather.policies.base import Request as PolicyRequest

DRIVER_ATTR = "_feather_driver"  # set on SGLang's SchedulePolicy the driver serves


class ProtocolBroken(RuntimeError):
    """SGLang's walk did not visit the candidate the policy offered (an unsupported option
    - LoRA, pooling modes, storage prefetch - skipped it)."""


class AdmissionDriver:
    """Our policy at the head of one SGLang `SchedulePolicy`'s waiting queue."""

    # the pass in progress per radix tree (one per scheduler): add_one_req finds it by its
    # adder's tree, since the adder does not know the SchedulePolicy
    _open: dict[int, AdmissionDriver] = {}  # noqa: RUF012 - registry shared by design

    def __init__(self, policy: AdmissionPolicy, tree_cache: Any, max_running: int) -> None:
        self.policy = policy
        self.tree_cache = tree_cache
        self.max_running = max_running
        self._waiting: dict[str, Any] = {}  # rid -> Req, arrival order
        self._running: dict[str, Any] = {}
        self._queue: list[Any] | None = None
        self._pos = -1  # index of the last candidate admitted in this pass
        self._offered: Any = None
        self.policy_cpu_s = 0.0
        self.passes = 0
        self.last_record: StepRecord | None = None  # the last closed pass's record

    @classmethod
    def for_tree(cls, tree_cache: Any) -> AdmissionDriver | None:
        return cls._open.get(id(tree_cache))

    def take_policy_cpu_s(self) -> float:
        spent, self.policy_cpu_s = self.policy_cpu_s, 0.0
        return spent

    # ---- the pass ------------------------------------------------------------------------
    def open_pass(self, waiting_queue: list[Any]) -> None:
        """SGLang sorted the queue for a pass: order its head by our policy."""
        cpu0 = time.thread_time()
        self.close_pass()
        self._sync(waiting_queue)
        self.policy.begin_step(StepContext(len(self._running), self.max_running))
        self._queue, self._pos, self._offered = waiting_queue, -1, None
        AdmissionDriver._open[id(self.tree_cache)] = self
        self.passes += 1
        self._offer_next()
        self.policy_cpu_s += time.thread_time() - cpu0

    def candidate(self, req: Any) -> bool:
        """Before SGLang's add_one_req(req): True = offer it to the adder; False = the
        policy said STOP (or offers nothing): end the walk without committing req."""
        if self._offered is None:
            return False
        if req is not self._offered:
            raise ProtocolBroken(
                f"SGLang offered request {req.rid!r} to the prefill adder, but the policy's "
                f"candidate was {self._offered.rid!r}: an option that skips waiting requests "
                "(LoRA, pooling modes, storage prefetch) is on; Feather does not support it"
            )
        return True

    def outcome(self, req: Any, committed: bool, go_on: bool) -> None:
        """After SGLang's add_one_req(req): it committed req or not; `go_on`: it returned
        CONTINUE, so the walk visits the next index."""
        cpu0 = time.thread_time()
        self._offered = None
        if committed:
            self.policy.admitted(req.rid)
            self._running[req.rid] = self._waiting.pop(req.rid)
            self._pos += 1
            if go_on:
                self._offer_next()
        else:
            self.policy.refused(req.rid)
        self.policy_cpu_s += time.thread_time() - cpu0

    def close_pass(self) -> None:
        """The walk is over: a candidate it never reached was refused. Idempotent."""
        if self._queue is None:
            return
        if self._offered is not None:
            self.policy.refused(self._offered.rid)
            self._offered = None
        self._queue = None
        AdmissionDriver._open.pop(id(self.tree_cache), None)
        self.last_record = self.policy.last_step

    @property
    def in_pass(self) -> bool:
        return self._queue is not None

    # ---- internals -----------------------------------------------------------------------
    def _offer_next(self) -> None:
        assert self._queue is not None
        req_id = self.policy.next_candidate()
        if req_id is None:
            return
        req = self._waiting[req_id]
        target = self._pos + 1
        queue = self._queue
        if target >= len(queue) or queue[target] is not req:
            queue.insert(target, queue.pop(queue.index(req, target)))
        self._offered = req

    def _sync(self, waiting_queue: Sequence[Any]) -> None:
        policy = self.policy
        for rid, req in list(self._running.items()):
            if req.finished():
                del self._running[rid]
                policy.finished(rid)
        for req in waiting_queue:
            rid = req.rid
            if rid in self._waiting:
                continue
            if rid in self._running:  # retracted: it waits again
                self._waiting[rid] = self._running.pop(rid)
                policy.preempted(rid)
                continue
            policy.add_request(PolicyRequest(rid, prompt_token_ids=list(req.origin_input_ids)))
            self._waiting[rid] = req
        if len(self._waiting) != len(waiting_queue):  # aborted while waiting
            present = {req.rid for req in waiting_queue}
            for rid in [rid for rid in self._waiting if rid not in present]:
                del self._waiting[rid]
                policy.finished(rid)
