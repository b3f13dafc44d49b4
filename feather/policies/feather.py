"""Feather: batch formation as a sequence of ADD/STOP decisions over the Chunked Hash Tree.

Each step the policy offers candidates one at a time. Which candidate:

1. Empty batch: the oldest waiting request starts it (the FCFS head). An empty batch has no
   prefix to protect, and starting with the oldest means no request waits behind younger
   ones for a fresh batch. (The CHT's `best()` would pick the shortest prompt here.)
2. Starvation guard: once `max_bypass` admissions have passed over the oldest waiting
   request, it is offered next and added unconditionally (None disables the guard).
3. Otherwise the waiting request missing the fewest chunks from the working set among those
   that share at least one chunk with it (`ChunkedHashTree.best_sharing`); if none shares
   anything, the oldest waiting request. Restricting `best()` to sharers matters: among
   requests that share nothing, fewest-missing means shortest-first, not arrival order.

Whether to take it: the candidate's state is (b, delta, w) (see `CandidateState`). The
decision is delegated to the policy's rule only when there is sharing to lose - b >= 2 and
delta > 0. A one-request batch shares nothing between requests (its "shared depth" is just
its own length), and delta = 0 loses nothing, so both are forced ADDs.

Safety (claim C6): if no two requests share a chunk, no waiting request ever shares one with
the working set, so the candidate is always the oldest waiting request, and with b >= 2 the
shared depth is 0, so delta = 0 and every decision is a forced ADD. Every Feather policy -
learning or not - then admits exactly what FCFS admits, in the same order, and stops where
FCFS stops (limits and refusals are handled by `AdmissionPolicy` for all policies alike).

The rules: `feather-static` (thresholds), `feather-ucb` (contextual bandit) and
`feather-qlearn` (tabular Q-learning), the last two learning online from each step's
decode throughput and saving to / loading from a small JSON file (see `learning.py`).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, ClassVar

from feather.atomic import write_json_atomic
from feather.cht import CandidateState, ChunkedHashTree
from feather.policies.base import (
    Action,
    AdmissionPolicy,
    Decision,
    Request,
    RequestId,
    StepOutcome,
)
from feather.policies.learning import QTable, StateBuckets, UCBTable

POLICY_FILE_FORMAT = "feather-policy/1"


class FeatherPolicy(AdmissionPolicy):
    """CHT candidates + forced ADDs where nothing is at stake; subclasses give the rule.

    Parameters:
        chunk_size: tokens per chunk; must equal the engine's KV block size when the engine
            passes its own block hashes (`Request.chunk_hashes`).
        max_bypass: admissions that may pass over the oldest waiting request before it is
            added unconditionally (default 1000); None disables the guard.
    """

    def __init__(self, *, seed: int = 0, chunk_size: int = 16, max_bypass: int | None = 1000):
        super().__init__(seed=seed)
        if max_bypass is not None and max_bypass < 1:
            raise ValueError(f"max_bypass must be >= 1 or None, got {max_bypass}")
        self.chunk_size = chunk_size
        self.max_bypass = max_bypass
        self.cht = ChunkedHashTree(chunk_size)
        self._watched_oldest: RequestId | None = None
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
        candidate = oldest if sharing is None else sharing[0]
        state = cht.candidate_state(candidate)
        if batch_size < 2 or state.delta == 0:
            return self._forced(candidate, batch_size, state)
        delta_tokens = state.delta * self.chunk_size
        action = self._decide(batch_size, delta_tokens, state.w)
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
    def _decide(self, batch_size: int, delta_tokens: int, w: int) -> Action:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {**super().params(), "chunk_size": self.chunk_size, "max_bypass": self.max_bypass}


class FeatherStaticPolicy(FeatherPolicy):
    """The static heuristic: keep a batch homogeneous once it is large enough.

    STOP when the batch already holds `min_batch` requests and the candidate would cut at
    least `min_delta_tokens` of the prefix the batch shares; ADD otherwise. Below min_batch
    an underfilled device costs more than a mixed batch; small losses of sharing are not
    worth a smaller batch. The defaults mirror cascade attention's own thresholds in vLLM
    (<= 0.31: at least 8 requests sharing at least 256 tokens). w is not used: the loss of
    locality does not depend on how many could follow, and the learned policies use it.
    """

    name = "feather-static"

    def __init__(
        self,
        *,
        seed: int = 0,
        chunk_size: int = 16,
        max_bypass: int | None = 1000,
        min_batch: int = 8,
        min_delta_tokens: int = 256,
    ) -> None:
        super().__init__(seed=seed, chunk_size=chunk_size, max_bypass=max_bypass)
        if min_batch < 2:
            raise ValueError(f"min_batch must be >= 2, got {min_batch}")
        self.min_batch = min_batch
        self.min_delta_tokens = min_delta_tokens

    def _decide(self, batch_size: int, delta_tokens: int, w: int) -> Action:
        if batch_size >= self.min_batch and delta_tokens >= self.min_delta_tokens:
            return Action.STOP
        return Action.ADD

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "min_batch": self.min_batch,
            "min_delta_tokens": self.min_delta_tokens,
        }


class _Window:
    """The decisions of one step and the steps that followed, until the next decisions."""

    __slots__ = ("decisions", "steps", "time_s", "tokens")

    def __init__(self, decisions: list[tuple[str, Action]]) -> None:
        self.decisions = decisions
        self.tokens = 0
        self.time_s = 0.0
        self.steps = 0


class FeatherLearningPolicy(FeatherPolicy):
    """A Feather policy whose rule is a table learned online from decode throughput.

    The decisions of a step are credited with the throughput (tokens / seconds) of the steps
    that follow, up to the next step that takes decisions or `reward_horizon` steps, whichever
    comes first - the batch those decisions formed. For Q-learning, a decision's next state
    is the next decision's state (the same step's, or the next window's first).

    Parameters (besides FeatherPolicy's):
        frozen: act greedily and never update (a policy trained elsewhere, deployed).
        policy_file: load the table from this JSON file (see `save`).
        reward_horizon: at most this many steps are credited to one step's decisions.
        reward_scale_tok_s: divide throughput by this; None = by the highest seen so far.
        buckets: state bucket edges, `{"batch": [...], "delta_tokens": [...], "w": [...]}`.
    """

    table_kind: ClassVar[str] = ""

    def __init__(
        self,
        *,
        seed: int = 0,
        chunk_size: int = 16,
        max_bypass: int | None = 1000,
        frozen: bool = False,
        policy_file: str | Path | None = None,
        reward_horizon: int = 16,
        reward_scale_tok_s: float | None = None,
        buckets: dict[str, list[int]] | None = None,
    ) -> None:
        super().__init__(seed=seed, chunk_size=chunk_size, max_bypass=max_bypass)
        if reward_horizon < 1:
            raise ValueError(f"reward_horizon must be >= 1, got {reward_horizon}")
        if reward_scale_tok_s is not None and reward_scale_tok_s <= 0:
            raise ValueError(f"reward_scale_tok_s must be > 0, got {reward_scale_tok_s}")
        self.frozen = frozen
        self.reward_horizon = reward_horizon
        self.reward_scale_tok_s = reward_scale_tok_s
        self.buckets = StateBuckets.from_json(buckets) if buckets else StateBuckets()
        self.rng = random.Random(seed)
        self.table = self._new_table()
        self.policy_file: str | None = None
        self.policy_file_sha256: str | None = None
        self.updates = 0
        self._max_throughput = 0.0
        self._window: _Window | None = None
        self._step_decisions: list[tuple[str, Action]] = []
        self._decided_step = -1
        if policy_file is not None:
            self.load(policy_file)

    def _new_table(self) -> UCBTable | QTable:
        raise NotImplementedError

    # ---- deciding and learning -----------------------------------------------------------
    def _decide(self, batch_size: int, delta_tokens: int, w: int) -> Action:
        key = self.buckets.key(batch_size, delta_tokens, w)
        action = self.table.choose(key, greedy=self.frozen, rng=self.rng)
        if self._decided_step != self._step:
            self._decided_step, self._step_decisions = self._step, []
        self._step_decisions.append((key, action))
        return action

    def report_step(self, outcome: StepOutcome) -> None:
        decided_now = self._decided_step == self._step and self._step_decisions
        if decided_now:
            if self._window is not None:
                self._credit(self._window, next_key=self._step_decisions[0][0])
            self._window = _Window(self._step_decisions)
            self._step_decisions = []
        self._max_throughput = max(self._max_throughput, outcome.throughput_tok_s)
        window = self._window
        if window is None:
            return
        window.tokens += outcome.tokens
        window.time_s += outcome.step_time_s
        window.steps += 1
        if window.steps >= self.reward_horizon:
            self._credit(window, next_key=None)
            self._window = None

    def _credit(self, window: _Window, next_key: str | None) -> None:
        if self.frozen or window.time_s <= 0:
            return
        scale = self.reward_scale_tok_s or self._max_throughput
        if scale <= 0:
            return
        reward = min(1.0, (window.tokens / window.time_s) / scale)
        decisions = window.decisions
        for i, (key, action) in enumerate(decisions):
            following = decisions[i + 1][0] if i + 1 < len(decisions) else next_key
            self.table.update(key, action, reward, following)
            self.updates += 1

    # ---- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": POLICY_FILE_FORMAT,
            "policy": self.name,
            "table_kind": self.table_kind,
            "buckets": self.buckets.to_json(),
            "learner": self._learner_params(),
            "updates": self.updates,
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
        self._set_learner_params(data.get("learner", {}))
        self.table.load_json(data["table"])
        self.updates = int(data.get("updates", 0))
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
            "buckets": self.buckets.to_json(),
            "learner": self._learner_params(),
            "policy_file": self.policy_file,
            "policy_file_sha256": self.policy_file_sha256,
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
