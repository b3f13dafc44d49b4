"""The learning Feather rules: `feather-ucb` (a contextual bandit) and `feather-qlearn` (tabular
Q-learning) over `FeatherPolicy`, learning online from the throughput a decision earned and
saved to / loaded from a small JSON file (tables and state buckets: `learning.py`).

As registered they follow the paper's reading of its RL policy (`LEARNER_DEFAULTS`): the rule
is asked at every group change once the tree holds any sharing (`consult="group"`: a
candidate that cuts the batch's shared prefix or opens a prefix group), a STOP dispatches the
batch as it is and holds until a prefix group starts or stops running
(`stop_holds="group-change"`), and a decision is credited with the decode throughput of the
batch it formed (`reward_window="lifetime"`). That needs nothing of the kernel, so a learner
trained with the defaults on any kernel visits states and learns.

`feather-ucb-kernel-gated` and `feather-qlearn-kernel-gated` are the earlier rule, kept as
labelled variants (`KERNEL_GATED`): asked only where b >= 2, delta > 0 and the engine's kernel
reads the batch's common prefix once (cascade attention), a STOP holding for one step, the
decisions of a step credited until the next step that decides. Under a kernel that reads
every request's own KV (paged, vllm-cpu, SGLang's) they are never asked, so they learn
nothing there (0 states). docs/stop.md measures both.
"""


from __future__ import annotations

import hashlib
import json
import random
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

from feather.atomic import write_json_atomic
from feather.policies.base import (
    Action,
    Request,
    RequestId,
    StepOutcome,
)
from feather.policies.cht_policy import CONSULT, STOP_HOLDS, DecisionState, FeatherPolicy
from feather.policies.conservative import ExplorationBudget, WaitBudget
from feather.policies.learning import (
    QTable,
    StateBuckets,
    UCBTable,
    greedy_action,
    known_actions,
)

POLICY_FILE_FORMAT = "feather-policy/1"


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

    __slots__ = (
        "decisions",
        "explore_estimate",
        "first_batch",
        "first_time_s",
        "group_changes",
        "next_key",
        "start",
    )

    def __init__(
        self,
        decisions: list[tuple[str, Action]],
        start: tuple[int, float, int, float, int],
        group_changes: int,
        explore_estimate: float = 0.0,
    ) -> None:
        self.decisions = decisions
        self.explore_estimate = explore_estimate  # what its exploratory STOPs were charged
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

# How the registered learners are asked, hold a STOP and are credited: the paper's reading
# (module docstring); experiments/rl.yaml trains with these
LEARNER_DEFAULTS = {"consult": "group", "stop_holds": "group-change", "reward_window": "lifetime"}
# the kernel-gated variants' (`feather-ucb-kernel-gated`, `feather-qlearn-kernel-gated`)
KERNEL_GATED = {"consult": "kernel", "stop_holds": "step", "reward_window": "until-next"}
# the conservative variants' (`feather-ucb-conservative`, `feather-qlearn-conservative`):
# the paper's reading, exploring only within a budget (docs/stop.md, "Exploring from scratch")
CONSERVATIVE = {
    "explore_budget": 0.01,
    "explore_prior": "kept-batch",
    "explore_hold_steps": 16,
    "explore_backlog_only": True,
    "explore_pool_bound": False,
}


class FeatherLearningPolicy(FeatherPolicy):
    """A Feather policy whose rule is a table learned online from decode throughput.

    The decisions of a step are credited with the decode throughput of the batch they formed:
    tokens / seconds over the steps that follow without prefill, for as long as the window
    lasts (`reward_window`; by default the batch's lifetime: until a prefix group starts or
    stops running). A window with no prefill-free step gives no reward (no evidence). Prefill
    is left out because both actions pay it: ADD now, STOP later, when the held-back requests
    are admitted; counting it would charge every ADD for work a STOP only postpones. For
    Q-learning, a decision's next state is the next decision's state (the same step's, or the
    next window's first).

    Defaults: the paper's reading (`LEARNER_DEFAULTS`, module docstring): `consult="group"`,
    `stop_holds="group-change"`, `reward_window="lifetime"` - not FeatherPolicy's kernel-gated
    `consult="kernel"` and one-step STOP, under which a learner on a kernel that reads every
    request's own KV is never asked and learns nothing. The kernel-gated learners are
    registered apart (`FeatherUCBKernelGatedPolicy`, `FeatherQLearningKernelGatedPolicy`).

    Parameters (besides FeatherPolicy's):
        frozen: act greedily and never update (a policy trained elsewhere, deployed); a state
            the table never saw takes STOP only where the seen states imply it
            (`StateBuckets.generalise`), else ADD; and every decision is ADD where the
            engine's kernel is not the kind the table was trained on (`trained_on`: cascade,
            which reads a batch's common prefix once, or one that reads each request's KV).
        policy_file: load the table from this JSON file (see `save`); its bucket edges,
            learner parameters and decision rule (`consult`, `stop_holds`) replace the ones
            given here, so a table runs as it was trained (a file saved before the rule was
            recorded keeps the `consult` given here, and its STOPs held for one step: holding
            came with the record).
        reward_horizon: with the "lifetime" window, at least this many steps are credited to
            one step's decisions; with the others, at most this many.
        reward_scale_tok_s: divide throughput by this; None = by the highest throughput (of
            the same signal) seen so far.
        reward_signal: "decode" (the paper's: the window's prefill-free steps) or "all-steps"
            (tokens over the whole window's time, prefill steps included: it charges ADD for
            the prefill it admits and STOP for none until the held-back requests come in) -
            the alternative measured against the paper's in docs/stop.md; or "one-step" (the
            public vLLM branch's reference reward: the next step's batch size over its time).
        reward_window: "lifetime" (the default: a window runs `reward_horizon` steps and
            then on while the running set holds the same prefix groups: a STOP is judged on
            the homogeneous batch it kept, an ADD that opened a group on the mixed batch it
            made, each until a group starts or drains; the minimum keeps an ADD from being
            judged only on its own prefill when the next group opens a step later;
            `LIFETIME_MAX_STEPS` bounds it), "until-next" (the kernel-gated variants': a
            window ends at the next step that takes decisions; where decisions come every
            step, as when the rule is asked at every candidate, each is judged on one step)
            or "horizon" (every window runs `reward_horizon` steps whatever later decisions
            do; the windows overlap).
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
        consult: str = LEARNER_DEFAULTS["consult"],
        min_share_tokens: int = 256,
        frozen: bool = False,
        policy_file: str | Path | None = None,
        reward_horizon: int = 16,
        reward_scale_tok_s: float | None = None,
        reward_signal: str = "decode",
        reward_window: str = LEARNER_DEFAULTS["reward_window"],
        buckets: dict[str, Any] | None = None,
        confidence: float = 0.0,
        stop_holds: str = LEARNER_DEFAULTS["stop_holds"],
        explore_budget: float | None = None,
        explore_hold_steps: int | None = None,
        explore_prior: str = "kept-batch",
        explore_backlog_only: bool = False,
        explore_pool_bound: bool = True,
        explore_wait_budget: float | None = None,
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
        if explore_hold_steps is not None and explore_hold_steps < 1:
            raise ValueError(f"explore_hold_steps must be >= 1, got {explore_hold_steps}")
        self.explore_hold_steps = explore_hold_steps
        self.explore_backlog_only = explore_backlog_only
        self.refused_no_backlog = 0  # exploratory STOPs refused without a backlog
        self.explore_pool_bound = explore_pool_bound
        self.refused_pool_bound = 0  # exploratory STOPs refused where the KV pool bounds
        self._pool_bound_step = -(10**9)  # the last step the engine refused or preempted
        self._arrived_step: dict[RequestId, int] = {}  # live requests (explore_backlog_only)
        self.wait_budget = (
            None if explore_wait_budget is None else WaitBudget(explore_wait_budget)
        )
        self.budget = (
            None if explore_budget is None else ExplorationBudget(explore_budget, explore_prior)
        )
        self._kept_rate = 0.0  # the last prefill-free step's decode tokens/s per request
        self._exploring = False  # the last decision was an exploratory STOP
        self._step_explore = 0.0  # this step's exploratory STOPs' advance charge
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
            self._step_explore = 0.0
        exploratory = (
            not self.frozen
            and action is Action.STOP
            and self.table.greedy(key) is not Action.STOP
        )
        self._exploring = False
        if exploratory:
            cost = self._explore_cost(key, state)
            if cost is None:  # over a budget: the status quo
                action = self.table.overrule(key, Action.STOP, Action.ADD)
            else:
                self._exploring = True
                self._step_explore += cost
        self._step_decisions.append((key, action))
        return action

    def _explore_cost(self, key: str, state: DecisionState) -> float | None:
        """The tokens an exploratory STOP is charged in advance, or None where a budget
        refuses it (no budget: 0, always allowed)."""
        if not self.explore_pool_bound and self._pool_bounds():
            self.refused_pool_bound += 1
            return None
        # no backlog: below saturation a STOP cannot raise throughput (it is the arrival
        # rate), only add wait
        if self.explore_backlog_only and not self._backlogged(state):
            self.refused_no_backlog += 1
            return None
        totals = self._totals
        step_time_s = totals.all_time_s / totals.steps if totals.steps else 0.0
        cost = 0.0
        if self.budget is not None:
            # the batch a STOP keeps: the requests running now at the last decode step's rate
            kept = self._kept_rate * state.batch_size
            cost = self.budget.ask(key, totals.all_tokens, step_time_s, self.reward_horizon, kept)
            if cost < 0:
                return None
        if self.wait_budget is not None:
            held = min(state.waiting, state.max_running - state.batch_size)
            if not self.wait_budget.ask(held, self._explore_hold * step_time_s):
                if self.budget is not None:
                    self.budget.refund(cost)
                return None
        return cost

    @property
    def _explore_hold(self) -> int:
        """The steps an exploratory STOP holds (at most): the window the exploration gates
        look back over."""
        return self.explore_hold_steps or self.reward_horizon

    def _backlogged(self, state: DecisionState) -> bool:
        """Requests queue anyway: the waiting ones do not all fit beside the running batch,
        or the oldest has waited at least as many steps as an exploratory STOP holds. Below
        saturation FCFS admits each on arrival."""
        if state.batch_size + state.waiting > state.max_running:
            return True
        oldest = self.cht.oldest()
        if oldest is None or oldest not in self._arrived_step:
            return False
        return self._step - self._arrived_step[oldest] >= self._explore_hold

    def _pool_bounds(self) -> bool:
        """The engine's KV pool, not the policy, bounds the batch (`explore_pool_bound`): it
        refused a candidate it could not fit, or preempted a running request, within the
        steps an exploratory STOP holds. There an exploratory STOP either keeps the batch below
        what the pool holds, which FCFS fills, or is no STOP at all (the engine would refuse
        the candidate anyway). Credited at the full batch's rate, such STOPs taught the table
        that STOP costs nothing there, so the budget charged them nothing, and the greedy STOP
        learned from them, taken where the batch was not yet full and held until the groups
        changed, cost a round: 0.944x FCFS on tight-KV tiny groups (docs/stop.md, "Exploring
        from scratch"). A preempted request waits again, so under preemption the backlog gate
        passes, and a STOP held on its return ran the pool's tail later (0.964x)."""
        return self._step - self._pool_bound_step <= self._explore_hold

    def _on_refused(self, req_id: RequestId) -> None:
        super()._on_refused(req_id)
        self._pool_bound_step = self._step

    def _on_arrival(self, request: Request) -> None:
        super()._on_arrival(request)
        if self.explore_backlog_only:
            self._arrived_step[request.req_id] = self._step

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        super()._on_leave_running(req_id, finished=finished)
        if finished:
            self._arrived_step.pop(req_id, None)
        else:  # preempted: the pool ran out
            self._pool_bound_step = self._step

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        super()._on_drop_waiting(req_id)
        self._arrived_step.pop(req_id, None)

    def _hold_steps(self) -> int | None:
        """An exploratory STOP holds at most `explore_hold_steps`; one the table favours
        holds as the paper's STOP does."""
        return self.explore_hold_steps if self._exploring else None

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
                _Window(
                    self._step_decisions,
                    self._totals.snapshot(),
                    self.cht.group_changes,
                    self._step_explore,
                )
            )
            self._step_decisions = []
            self._step_explore = 0.0
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
        if self.wait_budget is not None:
            self.wait_budget.step(self.cht.num_waiting, outcome.step_time_s)
        if outcome.prefill_tokens == 0 and outcome.step_time_s > 0 and outcome.batch_size:
            self._kept_rate = outcome.throughput_tok_s / outcome.batch_size
        if self.reward_signal == "one-step":
            horizon = 1
        elif self.reward_window == "lifetime":
            horizon = LIFETIME_MAX_STEPS
        else:
            horizon = self.reward_horizon
        # windows open oldest first, so the ones that ran their horizon are at the front
        while windows and windows[0].steps(self._totals) >= horizon:
            self._credit(windows.popleft())

    def end_episode(self) -> None:
        """The run is over: credit every open window with the steps it saw (a window without
        a prefill-free step stays uncredited, as in `_credit`) and close it, so that no
        decision of this run is judged on the next run's steps - another workload, with the
        engine's cache and clock in another state."""
        while self._windows:
            self._credit(self._windows.popleft())
        self._step_decisions = []
        self._step_explore = 0.0

    def _credit(self, window: _Window) -> None:
        next_key = window.next_key
        tokens, seconds = window.tokens_and_time(self.reward_signal, self._totals)
        if self.budget is not None and not self.frozen:
            self.budget.credit(window.decisions, tokens, seconds, window.explore_estimate)
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
        # files saved before the rule was recorded: the constructor's consult, and a STOP
        # that held for one step (held STOPs came with the record)
        decision = data.get("decision", {"stop_holds": "step"})
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
            "explore_budget": self.budget.alpha if self.budget is not None else None,
            "explore_hold_steps": self.explore_hold_steps,
            "explore_prior": self.budget.prior if self.budget is not None else None,
            "explore_backlog_only": self.explore_backlog_only,
            "explore_pool_bound": self.explore_pool_bound,
            "explore_wait_budget": self.wait_budget.alpha if self.wait_budget else None,
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


class _KernelGated:
    """A learner under the kernel-gated rule (`KERNEL_GATED`): asked only where b >= 2,
    delta > 0 and the engine's kernel reads the batch's common prefix once; a STOP holds for
    one step; a step's decisions credited until the next step that decides. Any of the three
    may still be given."""

    def __init__(
        self,
        *,
        consult: str = KERNEL_GATED["consult"],
        stop_holds: str = KERNEL_GATED["stop_holds"],
        reward_window: str = KERNEL_GATED["reward_window"],
        **kwargs: Any,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            consult=consult, stop_holds=stop_holds, reward_window=reward_window, **kwargs
        )


class FeatherUCBKernelGatedPolicy(_KernelGated, FeatherUCBPolicy):
    """`feather-ucb` under the kernel-gated rule (`_KernelGated`)."""

    name = "feather-ucb-kernel-gated"


class FeatherQLearningKernelGatedPolicy(_KernelGated, FeatherQLearningPolicy):
    """`feather-qlearn` under the kernel-gated rule (`_KernelGated`)."""

    name = "feather-qlearn-kernel-gated"


class _Conservative:
    """A learner under the paper's reading that explores conservatively (`CONSERVATIVE`): an
    exploratory STOP (one its credited values do not favour) only while the tokens
    exploration lost, credited or estimated, stay within 1% of what the learner produced
    (`conservative.ExplorationBudget`), only under a backlog (the waiting requests do not all
    fit beside the running batch, or the oldest has waited 16 steps), not where the KV pool
    bounds the batch (the engine refused a candidate or preempted a request within the last
    16 steps), held for at most 16 steps; a STOP the table favours holds as the paper's does.
    Any of them may be given."""

    def __init__(
        self,
        *,
        explore_budget: float | None = CONSERVATIVE["explore_budget"],
        explore_prior: str = CONSERVATIVE["explore_prior"],
        explore_hold_steps: int | None = CONSERVATIVE["explore_hold_steps"],
        explore_backlog_only: bool = CONSERVATIVE["explore_backlog_only"],
        explore_pool_bound: bool = CONSERVATIVE["explore_pool_bound"],
        **kwargs: Any,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            explore_budget=explore_budget,
            explore_prior=explore_prior,
            explore_hold_steps=explore_hold_steps,
            explore_backlog_only=explore_backlog_only,
            explore_pool_bound=explore_pool_bound,
            **kwargs,
        )


class FeatherUCBConservativePolicy(_Conservative, FeatherUCBPolicy):
    """`feather-ucb` exploring within a budget (`_Conservative`)."""

    name = "feather-ucb-conservative"


class FeatherQLearningConservativePolicy(_Conservative, FeatherQLearningPolicy):
    """`feather-qlearn` exploring within a budget (`_Conservative`)."""

    name = "feather-qlearn-conservative"
