"""The static Feather rules over `FeatherPolicy` (the CHT's candidate order, asked ADD or STOP
at each candidate): `feather-static`'s thresholds, `feather-nostop` (the order alone) and
`feather-reference` (the rule of a public vLLM branch that implements the paper)."""


from __future__ import annotations

import math
from typing import Any

from feather.policies.base import (
    Action,
    RequestId,
)
from feather.policies.cht_policy import DecisionState, FeatherPolicy


class FeatherStaticPolicy(FeatherPolicy):
    """The static heuristic: keep a batch homogeneous once it is large enough.

    Consulted only where the kernel reads the batch's common prefix once (see the module
    docstring). STOP when the batch already holds `min_batch` requests (default: three
    quarters of the engine's slots, `min_batch_fraction` x max_running) and the candidate would
    cut at least `min_delta_tokens` of the prefix the batch shares; ADD otherwise.

    Why these thresholds. A homogeneous cascade step of b requests costs about the weights'
    read, t0; adding the rest mixes the batch (up to B = max_running requests) and every
    request then reads its own prefix: t0 + B x P x c per step (c: seconds per KV token read).
    Per token, STOP wins when t0 / b < t0 / B + P x c. On the A100 (t0 ~ 9 ms, c ~ 44 ns per
    token of llama-3.1-8b KV, measured in the simulator on C1's shape) that holds from b = B/2
    for P above ~800 tokens, hence 1024. But c is the device's: the RTX 6000 Ada's 96 MB L2
    serves a mixed batch's prefixes (hit rate 0.86-0.95) and its DRAM makes t0 twice the
    A100's, so there the boundary lies between 160 and 200 of 256 slots (cascade, llama-3.1-8b,
    groups of 150-240, 1.2K-6K-token prefixes, 128 and 512 outputs: STOP at b >= 128 ran at
    0.77-0.93x FCFS with groups of 150-160 and 2.5K-token or shorter prefixes, at b >= 192 at
    1.00-1.27x; on the A100 both won, 1.18-2.33x). With 64 slots, groups of 36-40 lost on both
    devices at b >= 32 (0.67-0.97x), and at b >= 48 were 1.00-1.19x. Of the two fractions
    measured, a half and three quarters, only three quarters lost nowhere on either device;
    the learned tables find each device's own boundary below it (the A100's lies at 64-127
    of 256). vLLM's cascade
    thresholds (8 requests, 256 tokens), the old defaults, say when cascade may run, not when
    it beats a batch 30x larger: with them feather-static ran at 0.37x FCFS on 80 groups of
    10 (4K-token prefixes, cascade). w is not used: the loss of sharing does not depend on
    how many could follow.
    """

    name = "feather-static"

    def __init__(
        self,
        *,
        min_batch: int | None = None,
        min_batch_fraction: float = 0.75,
        min_delta_tokens: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)  # FeatherPolicy's own (the registry follows **kwargs there)
        if min_batch is not None and min_batch < 2:
            raise ValueError(f"min_batch must be >= 2, got {min_batch}")
        if not 0.0 < min_batch_fraction <= 1.0:
            raise ValueError(f"min_batch_fraction must be in (0, 1], got {min_batch_fraction}")
        self.min_batch = min_batch
        self.min_batch_fraction = min_batch_fraction
        self.min_delta_tokens = min_delta_tokens

    def _decide(self, state: DecisionState) -> Action:
        min_batch = self.min_batch or max(
            2, math.ceil(self.min_batch_fraction * state.max_running)
        )
        if state.batch_size >= min_batch and state.delta_tokens >= self.min_delta_tokens:
            return Action.STOP
        return Action.ADD

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "min_batch": self.min_batch,
            "min_batch_fraction": self.min_batch_fraction,
            "min_delta_tokens": self.min_delta_tokens,
        }


class FeatherNoStopPolicy(FeatherPolicy):
    """Feather without STOP: the CHT's candidate order alone, every decision ADD.

    The baseline that separates STOP's contribution from the candidate order's: where a
    Feather rule beats FCFS, this says how much of that the order already gives (on vLLM's
    CPU kernel, all of it: docs/stop.md). The same as any Feather rule with `consult="never"`.
    """

    name = "feather-nostop"

    def __init__(self, *, consult: str = "never", **kwargs: Any) -> None:
        if consult != "never":
            raise ValueError(f"feather-nostop: consult must be 'never', not {consult!r}")
        super().__init__(consult=consult, **kwargs)

    def _decide(self, state: DecisionState) -> Action:
        return Action.ADD  # never reached: consult="never" makes every decision a forced ADD


class FeatherReferencePolicy(FeatherPolicy):
    """The static rule of a public vLLM branch that implements the paper (its
    `SchedulingPolicy.FEATHER` request queue), written here from its stated behaviour.

    Consulted at every candidate (`consult="every"`, the paper's reading). In the branch's
    own 50-token chunks (`chunk_tokens`): ADD when the candidate cuts at most `max_loss_chunks`
    chunks (5) of the prefix the running batch shares, or `busy_loss_chunks` (7) when at least
    `busy_waiting` (10) requests wait; otherwise ADD only while the running batch is smaller
    than a floor that starts at `floor_start` (1), grows by one with every admission that
    passed the loss test (counted when the engine admits it: a candidate refused for the
    token budget is asked again), and stops growing at `floor_cap` (10); nothing we know of
    the branch resets it, so nothing here does. The first request of a batch
    is always admitted (an empty batch is never consulted). Compared with feather-static it
    stops early and often: a homogeneous batch of 10 or more stops at the first candidate of
    another prefix, whatever the slot count.
    """

    name = "feather-reference"

    def __init__(
        self,
        *,
        chunk_tokens: int = 50,
        max_loss_chunks: int = 5,
        busy_loss_chunks: int = 7,
        busy_waiting: int = 10,
        floor_start: int = 1,
        floor_cap: int = 10,
        consult: str = "every",
        **kwargs: Any,
    ) -> None:
        super().__init__(consult=consult, **kwargs)
        for name, value, low in (
            ("chunk_tokens", chunk_tokens, 1),
            ("max_loss_chunks", max_loss_chunks, 0),
            ("busy_loss_chunks", busy_loss_chunks, 0),
            ("busy_waiting", busy_waiting, 1),
            ("floor_start", floor_start, 1),
            ("floor_cap", floor_cap, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if floor_cap < floor_start:
            raise ValueError(f"floor_cap ({floor_cap}) must be >= floor_start ({floor_start})")
        self.chunk_tokens = chunk_tokens
        self.max_loss_chunks = max_loss_chunks
        self.busy_loss_chunks = busy_loss_chunks
        self.busy_waiting = busy_waiting
        self.floor_start = floor_start
        self.floor_cap = floor_cap
        self.floor = floor_start
        self._passed: set[RequestId] = set()  # ADDed by the loss test, not yet admitted

    def _decide(self, state: DecisionState) -> Action:
        allowed = (
            self.busy_loss_chunks if state.waiting >= self.busy_waiting else self.max_loss_chunks
        )
        if state.delta_tokens <= allowed * self.chunk_tokens:
            self._passed.add(self._candidate)
            return Action.ADD
        return Action.ADD if state.batch_size < self.floor else Action.STOP

    def _on_admit(self, req_id: RequestId) -> None:
        super()._on_admit(req_id)
        if req_id in self._passed:  # the floor grows per admission, not per decision: an
            self._passed.discard(req_id)  # engine that refuses (token budget) asks again
            self.floor = min(self.floor_cap, self.floor + 1)

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        super()._on_leave_running(req_id, finished=finished)
        self._passed.discard(req_id)

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        super()._on_drop_waiting(req_id)
        self._passed.discard(req_id)

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "chunk_tokens": self.chunk_tokens,
            "max_loss_chunks": self.max_loss_chunks,
            "busy_loss_chunks": self.busy_loss_chunks,
            "busy_waiting": self.busy_waiting,
            "floor_start": self.floor_start,
            "floor_cap": self.floor_cap,
        }
