"""What a claim module declares, and the one rule every claim is graded by.

A claim module (feather/claims/c1.py, ...) names its experiment file, the figures it draws,
its headline numbers (figures/ours.md) and, for a claim of the paper, its verdict. A verdict
is graded separately on every source that ran - a real GPU, a real engine, real code, a real
kernel, the simulator's GPU profiles, its cpu profile - by `grade`, each in the regimes the
paper's setup plausibly had; the headline verdict is the most real source's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from feather.failure_record import failed
from feather.measuring.stats import Interval, median_interval, unpaired_ratio_interval

REPRODUCED, PARTLY, NOT_REPRODUCED, UNTESTABLE = (
    "reproduced", "partly reproduced", "not reproduced", "not testable here",
)
# a real source whose interval spans a bar: the repeats cannot tell which side it is on
INCONCLUSIVE = "inconclusive"
# a real source none of whose repeats was quiet: its numbers are shown, never graded
UNSTABLE_GRADE = f"{INCONCLUSIVE} (no repeat was quiet)"
# a "holds" row (not a paper claim: the STOP mechanism, online load) uses these two
HOLDS, DOES_NOT_HOLD = "holds", "does not hold"

# The sources a verdict can rest on, most real first: the headline verdict is the first
# one's that graded the claim.
REAL_GPU = "real GPU"
REAL_ENGINE = "real engine"
REAL_CODE = "real code"
REAL_KERNEL = "real kernel"
SIM_GPU = "simulator, GPU profiles"
SIM_CPU = "simulator, cpu profile"
SOURCES = (REAL_GPU, REAL_ENGINE, REAL_CODE, REAL_KERNEL, SIM_GPU, SIM_CPU)

# The paper's GPUs: a simulated regime it plausibly had runs on one of these profiles.
PAPER_GPUS = ("a100-80gb", "rtx-6000-ada")
# An effect within this fraction of no effect is no effect (run-to-run noise of a ratio of
# medians on these machines is about this size).
NOISE = 0.01


@dataclass(frozen=True)
class Scale:
    """One claim's measure: `none` is no effect, `half` half the paper's effect. A claim of
    "no worse" (C6, C7) has `full` as the bar to clear and `some` as "partly"."""

    none: float
    half: float

    @property
    def higher_is_better(self) -> bool:
        return self.half > self.none


def grade(value: float | None, scale: Scale) -> str:
    """The page's rule: at least half the paper's effect with its sign: reproduced; the same
    sign beyond noise but less than half: partly; else (no effect, the opposite sign): not."""
    if value is None or pd.isna(value):
        return UNTESTABLE
    sign = 1 if scale.higher_is_better else -1
    effect, half = sign * (value - scale.none), sign * (scale.half - scale.none)
    if effect >= half:
        return REPRODUCED
    if effect > NOISE * max(abs(scale.none), 1.0):
        return PARTLY
    return NOT_REPRODUCED


def grade_no_worse(value: float | None, full: float, some: float) -> str:
    """A claim of "no worse"/"matches": at least `full` reproduces it, `some` partly."""
    if value is None or pd.isna(value):
        return UNTESTABLE
    return REPRODUCED if value >= full else PARTLY if value >= some else NOT_REPRODUCED


def grade_interval(interval: Interval | None, scale: Scale) -> str:
    """`grade` for a real source's repeats: a grade only where the whole interval lies on one
    side of each of its bars (reproduced: the lower end clears half the paper's effect; not
    reproduced: the interval excludes any effect beyond noise; partly: wholly between),
    else "inconclusive (interval a-b spans the bar B)"."""
    if interval is None:
        return UNTESTABLE
    if interval.disturbed:
        return UNSTABLE_GRADE
    sign = 1 if scale.higher_is_better else -1
    noise = scale.none + sign * NOISE * max(abs(scale.none), 1.0)
    worst, best = (interval.low, interval.high) if sign > 0 else (interval.high, interval.low)
    if grade(worst, scale) == grade(best, scale):
        return grade(worst, scale)
    bar = scale.half if grade(best, scale) == REPRODUCED and grade(worst, scale) != REPRODUCED \
        else noise
    return inconclusive(interval, bar)


def grade_interval_no_worse(interval: Interval | None, full: float, some: float) -> str:
    """`grade_no_worse` for a real source's repeats: decided where the interval lies between
    two bars, else inconclusive."""
    if interval is None:
        return UNTESTABLE
    if interval.disturbed:
        return UNSTABLE_GRADE
    low, high = (grade_no_worse(interval.low, full, some),
                 grade_no_worse(interval.high, full, some))
    if low == high:
        return low
    return inconclusive(interval, full if high == REPRODUCED else some)


def holds_interval(interval: Interval | None, bar: float) -> str:
    """A mechanism's row (HOLDS where the ratio must reach `bar`): holds where the interval's
    lower end reaches it, does not where its upper end stays below, else inconclusive."""
    if interval is None:
        return UNTESTABLE
    if interval.disturbed:
        return UNSTABLE_GRADE
    if interval.low >= bar:
        return HOLDS
    if interval.high < bar:
        return DOES_NOT_HOLD
    return inconclusive(interval, bar)


def inconclusive(interval: Interval, bar: float) -> str:
    return (f"{INCONCLUSIVE} (interval {interval.low:.2f}-{interval.high:.2f} spans the bar "
            f"{bar:.2f})")


def is_inconclusive(grade_text: str) -> bool:
    return grade_text.startswith(INCONCLUSIVE)


@dataclass(frozen=True)
class Measure:
    """One number a source's grade rests on: a real source's median with its interval over
    repeats, or a simulator's point value (deterministic: no interval); what `feather verdicts
    diff` compares between two runs."""

    name: str
    interval: Interval | None = None
    value: float | None = None

    @property
    def median(self) -> float | None:
        return self.interval.median if self.interval is not None else self.value

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value,
                "interval": self.interval.to_json() if self.interval else None}


@dataclass(frozen=True)
class SourceGrade:
    """One source's measurement of a claim: what ran (`where`), in which regime, the measure
    in a short line, and its grade (UNTESTABLE: it ran, but in no plausible regime). A real
    source gives its `measures` as intervals over repeats and, where repeats could not be
    taken quietly, its `flag` ("unstable: ...")."""

    source: str
    where: str
    text: str
    grade: str
    measures: tuple[Measure, ...] = ()
    flag: str | None = None

    def line(self) -> str:
        flag = f" - {self.flag}" if self.flag else ""
        return f"{self.source} ({self.where}): {self.text}{flag} - **{self.grade}**"

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "where": self.where, "grade": self.grade,
                "flag": self.flag, "measures": [m.to_json() for m in self.measures]}


@dataclass(frozen=True)
class Verdict:
    """A row of figures/verdicts.md."""

    claim: str
    paper: str
    grades: tuple[SourceGrade, ...]
    mechanism: str
    verdict: str = ""  # set by `headline_verdict` unless a row decides it itself
    notes: tuple[str, ...] = ()

    @property
    def headline(self) -> str:
        return self.verdict or headline_verdict(self.grades)

    @property
    def graded_by(self) -> str:
        """The source the headline verdict rests on ("" where none graded it)."""
        first = next((g for g in self.grades if g.grade != UNTESTABLE), None)
        return first.source if first else ""

    def disagreement(self) -> str:
        """Where sources grade the claim differently, the sources and their grades."""
        graded = [g for g in self.grades if g.grade != UNTESTABLE]
        if len({g.grade for g in graded}) < 2:
            return ""
        return "sources disagree: " + ", ".join(f"{g.source} {g.grade}" for g in graded)


def headline_verdict(grades: tuple[SourceGrade, ...]) -> str:
    """The most real source's grade, sources ranked as SOURCES lists them."""
    ranked = sorted(grades, key=lambda g: SOURCES.index(g.source))
    return next((g.grade for g in ranked if g.grade != UNTESTABLE), UNTESTABLE)


def sorted_grades(grades: list[SourceGrade]) -> tuple[SourceGrade, ...]:
    return tuple(sorted(grades, key=lambda g: SOURCES.index(g.source)))


@dataclass
class Evidence:
    """What this run produced: the summary table and the other experiments' outputs."""

    table: pd.DataFrame
    overhead_dir: Path | None = None
    kernel_files: tuple[Path, ...] = ()
    fidelity: pd.DataFrame | None = None
    online_files: tuple[Path, ...] = ()
    rl_reports: tuple[dict[str, Any], ...] = ()

    def overhead(self, name: str) -> pd.DataFrame | None:
        path = self.overhead_dir / f"{name}.parquet" if self.overhead_dir else None
        return pd.read_parquet(path) if path is not None and path.is_file() else None

    def kernels(self) -> list[dict[str, Any]]:
        """The kernel benches that measured (a `quick` sweep is a logic check of tiny shapes,
        not a measurement: it grades nothing)."""
        docs = [json.loads(p.read_text()) for p in self.kernel_files
                if p.is_file() and not failed(p)]
        return [d for d in docs if not str(d.get("scale", "")).startswith("quick")]

    def runs(self, experiment: str) -> pd.DataFrame:
        return self.table[self.table.experiment == experiment]


@dataclass(frozen=True)
class RunOutputs:
    """Where a run's outputs are, for the report's labels: figures/ours.md, and the tables
    of the experiments with rules of their own (None or absent: not made in this run)."""

    ours_md: Path
    overhead_dir: Path | None = None
    kernel_files: tuple[Path, ...] = ()
    fidelity_json: Path | None = None


@dataclass(frozen=True)
class FigureSpec:
    """A figure: its name (figures/<name>.png), what it shows and the paper's number for it
    (figures/README.md's index, the report's labels), and how it is drawn: `draw` from the
    summary table (or the rl reports), else the rule `drawn_by` names."""

    name: str
    shows: str
    paper: str
    draw: Callable[..., None] | None = None
    drawn_by: str = ""
    # the report's "ours" for a figure whose numbers are not a row of figures/ours.md
    ours: Callable[[str, RunOutputs], str] | None = None
    from_reports: bool = False  # drawn from the learners' training reports, not the table


@dataclass(frozen=True)
class Claim:
    """One row of the house: an experiment file, its figures, headline numbers, verdict."""

    key: str
    experiment: str | None  # experiments/<name>.yaml, or None (a row of another's results)
    rank: float  # place on the verdict page and in the figure index (C1-C7 are 1-7)
    figures: tuple[FigureSpec, ...] = ()
    headline: Callable[[Evidence], list[str]] | None = None
    verdict: Callable[[Evidence], Verdict] | None = None


# ---- formatting shared by the claims' rows ----


def times(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.{digits}f}x"


def pct(value: float | None) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{100 * value:.1f}%"


def median_range(values: pd.Series) -> str:
    return f"{values.median():.0f} ({values.min():.0f}-{values.max():.0f})"


def plain(value: float | None) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.2f}"


# ---- a real source's repeats: paired within a repeat, quiet ones graded ----


def job_repeats(runs: pd.DataFrame, metric: str = "output_tok_s") -> pd.DataFrame:
    """One row per measured repeat of a real job, one column per arm (scheduler label):
    arms paired within their repeat. Index: (job, repeat), the job being the measurement
    protocol's (feather/measuring) or, for runs recorded before it, the run directory's
    prefix."""
    if runs.empty:
        return pd.DataFrame()
    keyed = runs.assign(_job=measure_jobs(runs))
    return keyed.pivot_table(index=["_job", "repeat"], columns="scheduler", values=metric,
                             aggfunc="median")


def measure_jobs(runs: pd.DataFrame) -> pd.Series:
    """Each run's measuring job: the protocol's record, else its directory's prefix."""
    if "measure_job" in runs:
        recorded = runs["measure_job"]
    else:
        recorded = pd.Series(None, index=runs.index, dtype=object)
    fallback = [f"{Path(str(p)).parent.parent}/{str(r)[: len(str(r)) - len(f'{s}__r{k}')]}"
                for p, r, s, k in zip(runs.get("summary_path", runs["run"]), runs["run"],
                                      runs["scheduler"], runs["repeat"], strict=True)]
    return recorded.where(recorded.notna(), pd.Series(fallback, index=runs.index))


def quiet_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of the repeats the protocol kept quiet (every run of a repeat goes if one arm
    of it was disturbed: its pairs are no longer like for like)."""
    if "measure_disturbed" not in runs:
        return runs
    jobs = measure_jobs(runs)
    bad = {(j, r) for j, r, d in zip(jobs, runs["repeat"], runs["measure_disturbed"],
                                     strict=True) if isinstance(d, str) and d}
    keep = [(j, r) not in bad for j, r in zip(jobs, runs["repeat"], strict=True)]
    return runs[keep]


def paired_interval(runs: pd.DataFrame, arm: str, baseline: str,
                    metric: str = "output_tok_s") -> Interval | None:
    """arm / baseline (scheduler labels) paired within each quiet repeat (every job of `runs`
    pooled): the median ratio and its interval."""
    return ratio_interval(runs[runs.scheduler == arm], runs[runs.scheduler == baseline],
                          metric)


def ratio_interval(arm: pd.DataFrame, baseline: pd.DataFrame,
                   metric: str = "output_tok_s") -> Interval | None:
    """The arm's runs over the baseline's, from their quiet repeats: paired within each repeat
    where both ran in the same measuring jobs (interleaved in one engine start), else - arms
    of separate engine starts - the unpaired ratio of medians with its wider interval."""
    arm, baseline = arm[arm[metric].notna()], baseline[baseline[metric].notna()]
    if arm.empty or baseline.empty:
        return None
    quiet_arm, quiet_baseline = quiet_runs(arm), quiet_runs(baseline)
    if quiet_arm.empty or quiet_baseline.empty:  # shown over the disturbed repeats, ungraded
        found = ratio_interval(arm.assign(measure_disturbed=None),
                               baseline.assign(measure_disturbed=None), metric)
        return replace(found, disturbed=True) if found else None
    arm, baseline = quiet_arm, quiet_baseline
    top = pd.Series(arm[metric].to_numpy(), index=pd.MultiIndex.from_arrays(
        [measure_jobs(arm), arm["repeat"]])).groupby(level=[0, 1]).median()
    bottom = pd.Series(baseline[metric].to_numpy(), index=pd.MultiIndex.from_arrays(
        [measure_jobs(baseline), baseline["repeat"]])).groupby(level=[0, 1]).median()
    if set(top.index.get_level_values(0)) == set(bottom.index.get_level_values(0)):
        both = top.index.intersection(bottom.index)
        return median_interval(top[both] / bottom[both])
    return unpaired_ratio_interval(top, bottom)


def best_of_intervals(runs: pd.DataFrame, arms: list[str], baseline: str,
                      metric: str = "output_tok_s") -> tuple[str | None, Interval | None]:
    """The arm whose paired ratio to `baseline` has the highest median, and that interval."""
    found = [(a, paired_interval(runs, a, baseline, metric)) for a in arms]
    found = [(a, iv) for a, iv in found if iv is not None]
    return max(found, key=lambda f: f[1].median) if found else (None, None)


def unstable_text(runs: pd.DataFrame) -> str | None:
    """The page's flag for a real source: None where every repeat was quiet, else
    "unstable: another process used N% of a core during k of n repeats"."""
    if runs.empty or "measure_disturbed" not in runs:
        return None
    keyed = runs.assign(_job=measure_jobs(runs))
    repeats = keyed.groupby(["_job", "repeat"])
    disturbed = repeats.measure_disturbed.apply(
        lambda d: any(isinstance(x, str) and x for x in d))
    if not disturbed.any():
        return None
    busy = keyed.set_index(["_job", "repeat"]).loc[disturbed[disturbed].index]
    cores = busy.get("measure_others_cores", pd.Series([float("nan")])).max()
    from feather.measuring.protocol import unstable_text as flag_text

    return flag_text(cores, int(disturbed.sum()), len(disturbed),
                     list(busy.measure_disturbed), "(those repeats not graded)")


def bench_flag(doc: dict[str, Any]) -> str | None:
    """A bench document's flag (feather/measuring): its rows' measurement records, one per
    repeat of each case or kernel, flagged where repeats stayed disturbed."""
    from feather.measuring.protocol import unstable_flag

    records = [r for row in doc.get("rows") or [] for r in row.get("measurement") or []
               if isinstance(r, dict)]
    return unstable_flag(records)


# ---- the plausible regime ----


def simulated(table: pd.DataFrame, experiment: str) -> pd.DataFrame:
    return table[(table.experiment == experiment) & (table.engine == "sim")]


def on_paper_gpus(data: pd.DataFrame) -> pd.DataFrame:
    return data[data.hardware.isin(PAPER_GPUS)]


def plausible(data: pd.DataFrame) -> pd.DataFrame:
    """The runs in a regime the paper's setup plausibly had, whatever produced them: one
    prefix's requests not already arriving together (not `grouped`), and the KV pool the
    device's memory leaves (not a swept, hypothetical pool). The GPU condition is the
    source's: the simulator's GPU profiles count on the paper's GPUs only."""
    keep = pd.Series(True, index=data.index)
    if "arrival_order" in data:
        keep &= data.arrival_order.fillna("") != "grouped"
    if "pool_hypothetical" in data:
        keep &= ~data.pool_hypothetical.fillna(False).astype(bool)
    return data[keep]


def real_source(data: pd.DataFrame) -> str:
    """A real run's source: a real GPU, or a real engine on a CPU."""
    kinds = set(data.get("hardware_kind", pd.Series(dtype=str)).dropna())
    return REAL_GPU if "gpu" in kinds else REAL_ENGINE


def producer(data: pd.DataFrame) -> str:
    return "; ".join(sorted(data["produced_by"].dropna().astype(str).unique())) or "?"
