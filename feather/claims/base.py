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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from feather.pipeline.job_status import failed

REPRODUCED, PARTLY, NOT_REPRODUCED, UNTESTABLE = (
    "reproduced", "partly reproduced", "not reproduced", "not testable here",
)
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


@dataclass(frozen=True)
class SourceGrade:
    """One source's measurement of a claim: what ran (`where`), in which regime, the measure
    in a short line, and its grade (UNTESTABLE: it ran, but in no plausible regime)."""

    source: str
    where: str
    text: str
    grade: str

    def line(self) -> str:
        return f"{self.source} ({self.where}): {self.text} - **{self.grade}**"


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
