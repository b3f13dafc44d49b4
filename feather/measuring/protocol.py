"""Run the arms of a comparison repeat by repeat, interleaved and rotated, each repeat watched;
a disturbed repeat is taken again (bounded), and what could not be taken quietly is flagged.

Every real timing goes through `MeasuringProtocol.run`: `measure(arm, repeat)` runs one arm once and
returns its result; `keep(outcome)` receives each repeat once it is accepted (quiet, or its
retakes spent), so a job that fails later still leaves its finished repeats. Each kept result
carries a `record` (what `summary.json`'s `measurement` holds): the repeat, its order, what
else ran (feather.measuring.quiet), the probes, whether it was disturbed, and the raw values
of the attempts it replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from feather.measuring.order import rotated
from feather.measuring.quiet import Activity, QuietBounds, Watch, probe

A = TypeVar("A")
M = TypeVar("M")
PROTOCOL = "feather-measure/1"
PROBE_REASON = "the reference probe"  # how a repeat the probe flagged says so (probe_only)


@dataclass
class Attempt(Generic[A, M]):
    """One pass over a repeat's arms."""

    number: int
    values: list[M]
    activities: list[Activity]
    probe_before_s: float
    probe_after_s: float
    disturbed: str | None
    score: float  # how far past its bounds (<= 1: within them)


@dataclass
class RepeatOutcome(Generic[A, M]):
    """A repeat as kept: its arms in run order, their values and records."""

    repeat: int
    order: list[A]
    values: list[M]
    records: list[dict[str, Any]]
    disturbed: str | None
    attempts: int


@dataclass
class MeasuringProtocol(Generic[A, M]):
    """The measurement protocol for one job. `label(arm)` names an arm in the records;
    `describe(value)` gives the raw numbers a discarded attempt keeps."""

    job: str
    label: Callable[[A], str] = str
    describe: Callable[[M], dict[str, Any]] = lambda value: {}
    bounds: QuietBounds = field(default_factory=QuietBounds)
    watch: Watch = field(default_factory=Watch)
    say: Callable[[str], None] = lambda message: None
    probe_fn: Callable[[], float] = probe
    reference_probe_s: float | None = None
    retakes: int = 0

    def run(self, arms: Sequence[A], repeats: int, measure: Callable[[A, int], M],
            keep: Callable[[RepeatOutcome[A, M]], None] | None = None,
            first_repeat: int = 0) -> list[RepeatOutcome[A, M]]:
        """Repeats first_repeat..first_repeat+repeats-1 of every arm; returns them as kept."""
        if self.reference_probe_s is None:
            self.reference_probe_s = min(self.probe_fn() for _ in range(3))
        budget = int(self.bounds.retake_budget * repeats)
        outcomes = []
        for repeat in range(first_repeat, first_repeat + repeats):
            order = rotated(list(arms), repeat)
            attempts: list[Attempt[A, M]] = []
            while True:
                attempt = self._attempt(order, repeat, measure, len(attempts))
                attempts.append(attempt)
                if attempt.disturbed is None:
                    break
                if len(attempts) > self.bounds.max_retakes or self.retakes >= budget:
                    self.say(f"{self.job}: repeat {repeat} stays disturbed after "
                             f"{len(attempts)} attempt(s): {attempt.disturbed}")
                    break
                self.retakes += 1
                self.say(f"{self.job}: repeat {repeat} disturbed ({attempt.disturbed}): "
                         f"taking it again ({self.retakes} of at most {budget} retakes)")
                self._wait_for_quiet()
            outcome = self._outcome(repeat, order, attempts)
            if keep is not None:
                keep(outcome)
            outcomes.append(outcome)
        return outcomes

    def _attempt(self, order: list[A], repeat: int, measure: Callable[[A, int], M],
                 number: int) -> Attempt[A, M]:
        before = self._probe()
        values, activities, first = [], [], None
        for arm in order:
            started = self.watch.start()
            first = first or started
            values.append(measure(arm, repeat))
            activities.append(self.watch.stop(started))
        whole = self.watch.since(first)  # the repeat: its arms may be too short to judge
        after = self._probe()
        reference = min(self.reference_probe_s or before, before, after)
        self.reference_probe_s = reference
        reasons, score = [], 0.0
        bounds = self.bounds
        for arm, activity in zip(order, activities, strict=True):
            why = activity.disturbed(bounds)
            if why:
                reasons.append(f"{self.label(arm)}: {why}")
        why = whole.disturbed(bounds)
        if why and not reasons:
            reasons.append(f"over the repeat: {why}")
        for activity in (*activities, whole):
            if activity.disturbed(bounds):
                score = max(score, activity.wait_share / bounds.wait_share,
                            activity.excess_cores / bounds.excess_cores)
        drift = abs(after / before - 1.0) if before > 0 else 0.0
        slow = max(before, after) / reference - 1.0 if reference > 0 else 0.0
        if drift > bounds.probe_drift:
            reasons.append(f"{PROBE_REASON} moved {drift:.0%} during the repeat")
        if slow > bounds.probe_slow:
            reasons.append(f"{PROBE_REASON} ran {slow:.0%} slower than the job's quietest")
        score = max(score, drift / bounds.probe_drift, slow / bounds.probe_slow)
        return Attempt(number, values, activities, before, after, "; ".join(reasons) or None,
                       score)

    def _probe(self) -> float:
        """The reference probe, once our own processes are idle (it measures the machine)."""
        self.watch.settle_own()
        return self.probe_fn()

    def _wait_for_quiet(self) -> None:
        """Wait (up to bounds.quiet_wait_s, in one-second looks) for the others to calm down."""
        waited = 0.0
        while waited < self.bounds.quiet_wait_s:
            if self.watch.idle_excess(1.0) <= self.bounds.excess_cores:
                return
            waited += 1.0

    def _outcome(self, repeat: int, order: list[A], attempts: list[Attempt[A, M]]) -> (
            RepeatOutcome[A, M]):
        kept = attempts[-1] if attempts[-1].disturbed is None else min(
            attempts, key=lambda a: a.score)
        labels = [self.label(arm) for arm in order]
        records = []
        for position, activity in enumerate(kept.activities):
            records.append({
                "protocol": PROTOCOL,
                "job": self.job,
                "repeat": repeat,
                "position": position,
                "order": labels,
                "attempt": kept.number,
                "attempts": len(attempts),
                "activity": activity.to_json(),
                "probe_before_s": kept.probe_before_s,
                "probe_after_s": kept.probe_after_s,
                "probe_reference_s": self.reference_probe_s,
                "disturbed": kept.disturbed,
                "discarded": [
                    {"attempt": a.number, "value": self.describe(a.values[position]),
                     "activity": a.activities[position].to_json(), "disturbed": a.disturbed}
                    for a in attempts if a is not kept],
                "bounds": self.bounds.to_json(),
            })
        return RepeatOutcome(repeat, order, list(kept.values), records, kept.disturbed,
                             len(attempts))


def probe_only(reasons: Sequence[Any]) -> bool:
    """Whether every disturbed repeat was flagged by the reference probe alone (no process on
    this machine was busy): the machine itself ran slower, as when other tenants of its host
    use its memory, which /proc here cannot see."""
    texts = [r for r in reasons if isinstance(r, str) and r]
    return bool(texts) and all(
        part.split(": ", 1)[-1].startswith(PROBE_REASON)
        for text in texts for part in text.split("; "))


def unstable_text(cores: float, disturbed: int, repeats: int, reasons: Sequence[Any],
                  tail: str) -> str:
    """The page's flag: "unstable: another process used N% of a core during k of n repeats",
    or, where only the reference probe flagged them, that the machine itself ran slower."""
    if probe_only(reasons):
        return (f"unstable: the reference probe ran slower during {disturbed} of {repeats} "
                f"repeats while no other process here was busy (the host's other tenants, "
                f"out of this machine's view) {tail}")
    return (f"unstable: another process used {cores:.0%} of a core during {disturbed} of "
            f"{repeats} repeats {tail}")


def unstable_flag(records: Sequence[dict[str, Any]]) -> str | None:
    """The page's flag for a set of kept measurements (one per arm and repeat): None where
    every repeat was quiet, else "unstable: another process used N% of a core during k of n
    repeats" (N: the most any disturbed one saw; k and n count repeats, not arms)."""
    by_repeat: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for record in records:
        if record:
            by_repeat.setdefault((record.get("job", ""), record["repeat"]), []).append(record)
    if not by_repeat:
        return None
    disturbed = {key: rs for key, rs in by_repeat.items() if any(r.get("disturbed") for r in rs)}
    if not disturbed:
        return None
    cores = max(r["activity"]["others_cores"] for rs in disturbed.values() for r in rs)
    waited = max(r["activity"]["wait_share"] for rs in disturbed.values() for r in rs)
    reasons = [r.get("disturbed") for rs in disturbed.values() for r in rs]
    return unstable_text(cores, len(disturbed), len(by_repeat), reasons,
                         f"(our threads waited for a core up to {waited:.0%} of the time)")
