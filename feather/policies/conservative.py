"""Conservative exploration for the learners: an exploratory STOP only within a budget.

A learner from scratch tries STOP in every new state, and under the paper's reading a STOP
keeps the batch as it is until a prefix group starts or stops running: on tiny groups under
cascade that cost UCB 0.57x FCFS (docs/stop.md, "Exploring from scratch"). Conservative
bandits (Wu et al. 2016) explore only while the learner's realised reward stays within
(1 - alpha) of what the default action is estimated to earn. Here the default is ADD (the
status quo: the batch FCFS would also grow), and reward is counted in decode tokens, so the
budget says what the never-worse promise measures: the tokens exploration lost stay within
`alpha` of the tokens the run produced.

An exploratory STOP is one the table's credited values do not already favour (its greedy
action is ADD). Its cost, once credited, is (ADD's decode rate in that state - the rate the
STOP's window ran at) x the window's seconds, never below 0; before it is credited the
estimate is pessimistic in Wu et al.'s sense: STOP's rate in that state if it was ever
credited there, else 0 (the lower bound of a reward in [0, 1]), over the seconds an
exploratory window has lasted so far. The budget is per policy object: over a training, the
runs before a STOP pay for it.

Tokens do not see latency: below saturation throughput is the arrival rate whatever the
policy does, so a STOP gains nothing there and its wait is all it costs (within budget, UCB's
exploratory STOPs made TTFT p99 5x FCFS's on grouped Poisson arrivals at half capacity). The
learners therefore also explore only under a backlog (`explore_backlog_only`, learned.py:
the waiting requests do not all fit beside the running batch, or the oldest has waited as
long as an exploratory STOP holds). `WaitBudget` is the other way measured (a budget of the
queueing exploration adds, 5% of what requests queued anyway): it kept the latency, but a
STOP that pays holds a whole group back, so it never let one through and nothing was learned.

Nor do they explore where the KV pool bounds the batch (`explore_pool_bound`, learned.py: the
engine refused a candidate or preempted a request within an exploratory STOP's hold): there
a STOP on a full pool costs nothing and is credited as if STOP were free, which the budget
(estimating from those credits) cannot see, and the greedy STOP learned from it shrinks the
batch below what FCFS fills.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from feather.policies.base import Action

# what an exploratory STOP is assumed to earn in a state where STOP was never credited: the
# decode rate of the batch running when it is taken (a STOP keeps that batch), or nothing
# (Wu et al.'s lower bound of a reward in [0, 1])
EXPLORE_PRIORS = ("kept-batch", "zero")


@dataclass(slots=True)
class _Mean:
    count: int = 0
    mean: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.mean += (value - self.mean) / self.count


@dataclass
class ExplorationBudget:
    """The tokens exploratory STOPs lost (credited) or may lose (awaiting credit), against
    `alpha` x everything produced."""

    alpha: float
    prior: str = "kept-batch"  # an untried STOP's rate: the running batch's, or 0 ("zero")
    lost_tokens: float = 0.0  # credited exploratory windows: ADD's rate x seconds - tokens
    pending_tokens: float = 0.0  # estimates for exploratory STOPs not credited yet
    allowed: int = 0
    refused: int = 0
    _rates: dict[tuple[str, Action], _Mean] = field(default_factory=dict)
    _add_rate: _Mean = field(default_factory=_Mean)  # every credited ADD, any state
    _explore_seconds: _Mean = field(default_factory=_Mean)  # credited exploratory windows

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"explore_budget must be in [0, 1), got {self.alpha}")
        if self.prior not in EXPLORE_PRIORS:
            raise ValueError(
                f"explore_prior must be one of {', '.join(EXPLORE_PRIORS)}, got {self.prior!r}"
            )

    def add_rate(self, key: str) -> float:
        """ADD's decode tokens/s in `key`, else over every state (0: nothing credited)."""
        mine = self._rates.get((key, Action.ADD))
        return mine.mean if mine else self._add_rate.mean

    def estimate(
        self, key: str, step_time_s: float, horizon: int, kept_rate: float = 0.0
    ) -> float | None:
        """Pessimistic tokens an exploratory STOP in `key` may lose; None: no evidence yet
        (no ADD credited, no step timed), so no estimate and no STOP. `kept_rate`: the decode
        rate of the batch running now, which a STOP keeps (the "kept-batch" prior)."""
        add = self.add_rate(key)
        seconds = self._explore_seconds.mean or step_time_s * horizon
        if add <= 0 or seconds <= 0:
            return None
        stop = self._rates.get((key, Action.STOP))
        prior = kept_rate if self.prior == "kept-batch" else 0.0
        rate = stop.mean if stop is not None else prior
        return max(0.0, add - rate) * seconds

    def ask(
        self,
        key: str,
        produced_tokens: float,
        step_time_s: float,
        horizon: int,
        kept_rate: float = 0.0,
    ) -> float:
        """The estimate charged for an exploratory STOP now, or -1 where it is refused:
        lost + pending + this estimate must stay within alpha of what the run produced
        plus that (what ADD alone is estimated to have produced)."""
        cost = self.estimate(key, step_time_s, horizon, kept_rate)
        spent = self.lost_tokens + self.pending_tokens
        if cost is None or spent + cost > self.alpha * (produced_tokens + spent + cost):
            self.refused += 1
            return -1.0
        self.allowed += 1
        self.pending_tokens += cost
        return cost

    def refund(self, cost: float) -> None:
        """An allowed STOP was not taken after all (another budget refused it)."""
        self.pending_tokens = max(0.0, self.pending_tokens - cost)
        self.allowed -= 1
        self.refused += 1

    def credit(
        self,
        decisions: list[tuple[str, Action]],
        tokens: float,
        seconds: float,
        estimate: float,
    ) -> None:
        """A window was credited (`seconds` 0: no decode step, no evidence); `estimate` is
        what its exploratory STOPs were charged in advance (0: none)."""
        rate = tokens / seconds if seconds > 0 else 0.0
        if seconds > 0:
            for key, action in decisions:
                self._rates.setdefault((key, action), _Mean()).add(rate)
                if action is Action.ADD:
                    self._add_rate.add(rate)
        if estimate <= 0:
            return
        self.pending_tokens = max(0.0, self.pending_tokens - estimate)
        if seconds <= 0:  # never judged: the advance stays spent
            self.lost_tokens += estimate
            return
        self._explore_seconds.add(seconds)
        key = next((k for k, a in decisions if a is Action.STOP), decisions[0][0])
        self.lost_tokens += max(0.0, self.add_rate(key) * seconds - tokens)

    def to_json(self) -> dict[str, float | int]:
        return {
            "alpha": self.alpha,
            "lost_tokens": round(self.lost_tokens, 1),
            "pending_tokens": round(self.pending_tokens, 1),
            "allowed": self.allowed,
            "refused": self.refused,
        }


@dataclass
class WaitBudget:
    """The queueing exploratory STOPs may add, against `alpha` x the queueing every request
    had anyway: tokens do not see latency (module docstring). A STOP is charged, in
    request-seconds, the requests it may hold back (those that would be admitted now: the
    waiting ones that fit in the free slots, at least one) x its hold x the mean step time.
    Where requests wait long anyway (all arriving at once) there is room to explore; under
    light load, where FCFS admits each request on arrival, there is none."""

    alpha: float
    waited_s: float = 0.0  # request-seconds spent waiting so far, every request
    spent_s: float = 0.0  # charged to exploratory STOPs
    refused: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"explore_wait_budget must be in [0, 1), got {self.alpha}")

    def step(self, waiting: int, step_time_s: float) -> None:
        """A step ran with `waiting` requests left waiting through it."""
        self.waited_s += waiting * step_time_s

    def ask(self, held: int, hold_s: float) -> bool:
        cost = max(1, held) * hold_s
        if self.spent_s + cost > self.alpha * (self.waited_s + self.spent_s + cost):
            self.refused += 1
            return False
        self.spent_s += cost
        return True

    def to_json(self) -> dict[str, float | int]:
        return {
            "alpha": self.alpha,
            "waited_s": round(self.waited_s, 3),
            "spent_s": round(self.spent_s, 3),
            "refused": self.refused,
        }
