"""The learners trained inside the real engine (feather/engines/vllm/learning.py): their
figure and the verdict's real-engine grade, read from their reports. The RL claim
(feather/claims/rl.py) declares both.

A learner learned where, frozen on held-out workloads (seeds it never saw), its throughput
paired within each repeat is at least LEARNED_PAYS x Feather without STOP where stopping pays
(the regime where feather-static itself pays that), at least NEAR_BEST x the best baseline
(FCFS, Feather without STOP, feather-static) and at least NEVER_WORSE x FCFS in every regime -
each read from the ratio's interval over the held-out seeds' quiet repeats: met where its
lower end reaches the bar, missed where its upper end stays below, else undecided.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from feather.claims.base import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    PARTLY,
    REAL_ENGINE,
    REPRODUCED,
    Measure,
    SourceGrade,
    holds_interval,
    is_inconclusive,
)
from feather.claims.plot import save
from feather.measuring.protocol import unstable_text
from feather.measuring.stats import Interval, median_interval

LEARNED_PAYS, NEAR_BEST, NEVER_WORSE = 1.1, 0.97, 0.99
STOP_PAYS = 1.1  # feather-static over Feather without STOP: the regime where stopping pays
BASELINE_ORDER = ("fcfs", "feather-nostop", "feather-static")
# a report's kernel kind (learning._kernel) as the figure names it
KERNEL_LABELS = {"cascade": "our cascade backend", "paged": "vLLM's own kernel"}


def engine_reports(reports: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[dict]:
    return [r for r in reports if r.get("engine", "sim") != "sim" and r.get("evaluation")]


def _medians(report: dict[str, Any]) -> dict[str, float]:
    """Median held-out throughput per scheduler (baselines and this learner, frozen)."""
    runs = report["evaluation"]["runs"]
    learner = report["training"]["learner"]
    per: dict[str, list[float]] = {}
    for run in runs:
        for name, tok_s in run["baselines_tok_s"].items():
            per.setdefault(name, []).append(tok_s)
        per.setdefault(f"{learner} (frozen)", []).append(run["learned_tok_s"])
    return {name: statistics.median(values) for name, values in per.items()}


def _quiet(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The held-out rows (a seed's repeat each) the protocol kept quiet."""
    return [r for r in report["evaluation"]["runs"] if not r.get("disturbed")]


def _ratio_interval(rows: list[dict[str, Any]], numerator, denominator) -> Interval | None:
    """numerator(row) / denominator(row) paired within each row, median and interval (marked
    disturbed where every row was)."""
    found = median_interval(numerator(r) / denominator(r) for r in rows if denominator(r))
    if found is not None and rows and all(r.get("disturbed") for r in rows):
        return replace(found, disturbed=True)
    return found


def _flag(runs: list[dict[str, Any]]) -> str | None:
    """The page's flag: how many held-out repeats stayed disturbed, and how busy it was."""
    busy = [r for r in runs if r.get("disturbed")]
    if not busy:
        return None
    cores = max(((r.get("measurement") or {}).get("activity") or {}).get("others_cores", 0.0)
                for r in busy)
    return unstable_text(cores, len(busy), len(runs), [r.get("disturbed") for r in busy],
                         "(those repeats not graded)")


def regime_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (regime, held-out shape, learner): the held-out ratios paired within each
    quiet repeat (seeds x repeats) with their intervals, whether stopping pays there, what it
    learned. A shape the learner never trained on is graded as its own row."""
    rows = []
    for whole in reports:
        shapes = dict.fromkeys(r.get("shape", "") for r in whole["evaluation"]["runs"])
        for shape in shapes:
            report = {**whole, "evaluation": {**whole["evaluation"], "runs": [
                r for r in whole["evaluation"]["runs"] if r.get("shape", "") == shape]}}
            rows.append(_row(report, shape))
    return rows


def _row(report: dict[str, Any], shape: str) -> dict[str, Any]:
    """The row of one report's runs on one held-out shape."""
    learner = report["training"]["learner"]
    quiet = _quiet(report)
    policy = report["training"].get("policy", {})
    runs = report["evaluation"]["runs"]
    # no repeat quiet: the ratios are shown over the disturbed ones, never graded
    quiet = quiet or runs

    def learned(run: dict[str, Any]) -> float:
        return run["learned_tok_s"]

    def baseline(name: str) -> Any:
        return lambda run: run["baselines_tok_s"][name]

    pays = _ratio_interval(quiet, baseline("feather-static"), baseline("feather-nostop"))
    return {
        "regime": report["regime"] + (f" / {shape}" if shape else ""), "learner": learner,
        "stop_pays": holds_interval(pays, STOP_PAYS), "static_vs_nostop": pays,
        "vs_nostop": _ratio_interval(quiet, learned, baseline("feather-nostop")),
        "vs_fcfs": _ratio_interval(quiet, learned, baseline("fcfs")),
        "vs_best": _ratio_interval(quiet, learned,
                                   lambda run: max(run["baselines_tok_s"].values())),
        "seeds": report["evaluation"]["seeds"],
        "repeats": len(runs),
        "disturbed": len(runs) - len(quiet),
        "flag": _flag(runs),
        "states": report["training"]["states"],
        "stop_states": sum(1 for e in policy.values() if e["action"] == "STOP"),
        "updates": (report["training"]["history"] or [{}])[-1].get("updates", 0),
        "converged": (report["training"].get("convergence") or {}).get("actions_converged"),
        "k": (report["training"].get("convergence") or {}).get("k"),
    }


def criteria(row: dict[str, Any]) -> list[tuple[str, Interval | None, float, str]]:
    """(what, interval, bar, HOLDS / DOES_NOT_HOLD / inconclusive) for each criterion a row is
    held to; where stopping pays is itself undecided, learning to stop is too."""
    out = []
    if row["stop_pays"] == HOLDS:
        out.append(("no-STOP", row["vs_nostop"], LEARNED_PAYS,
                    holds_interval(row["vs_nostop"], LEARNED_PAYS)))
    elif is_inconclusive(row["stop_pays"]):
        out.append(("stopping pays (feather-static / no-STOP)", row["static_vs_nostop"],
                    STOP_PAYS, row["stop_pays"]))
    out.append(("the best baseline", row["vs_best"], NEAR_BEST,
                holds_interval(row["vs_best"], NEAR_BEST)))
    out.append(("FCFS", row["vs_fcfs"], NEVER_WORSE, holds_interval(row["vs_fcfs"], NEVER_WORSE)))
    return out


def _ratio(interval: Interval | None) -> str:
    return "n/a" if interval is None else interval.text()


def engine_grade(reports: tuple[dict[str, Any], ...]) -> SourceGrade | None:
    """The real engine's grade: reproduced where every learner meets every criterion in every
    regime (each interval's lower end at its bar); not reproduced where every criterion is
    decided and some row misses one (partly: some rows meet all); inconclusive where an
    interval spans its bar."""
    mine = engine_reports(reports)
    if not mine:
        return None
    rows = regime_rows(mine)
    parts, states, measures = [], [], []
    for r in rows:
        checks = criteria(r)
        states.append([state for *_, state in checks])
        missed = [f"{name} {_ratio(iv)} < {bar}x" for name, iv, bar, state in checks
                  if state == DOES_NOT_HOLD]
        open_ = [f"{name} {_ratio(iv)} spans {bar}x" for name, iv, bar, state in checks
                 if is_inconclusive(state)]
        pays = ("stopping pays" if r["stop_pays"] == HOLDS else "stopping does not pay"
                if r["stop_pays"] == DOES_NOT_HOLD else "stopping undecided")
        parts.append(
            f"{r['regime']} ({pays}: feather-static / no-STOP {_ratio(r['static_vs_nostop'])}) "
            f"{r['learner']} frozen: / no-STOP {_ratio(r['vs_nostop'])}, / best baseline "
            f"{_ratio(r['vs_best'])}, / FCFS {_ratio(r['vs_fcfs'])}, paired over held-out seeds "
            f"{', '.join(map(str, r['seeds']))} x their repeats ({r['states']} states, "
            f"{r['stop_states']} STOP, {r['updates']} updates)"
            + (f" - misses {', '.join(missed)}" if missed else "")
            + (f" - undecided: {', '.join(open_)}" if open_ else ""))
        for name, iv, _, _ in [("no-STOP", r["vs_nostop"], 0, ""), *checks]:
            if iv is not None:
                measures.append(Measure(f"{r['regime']}: {r['learner']} / {name}", interval=iv))
    if any(is_inconclusive(s) for row in states for s in row):
        grade = f"{INCONCLUSIVE} (an interval spans its bar)"
    else:
        met = sum(1 for row in states if all(s == HOLDS for s in row))
        grade = REPRODUCED if met == len(rows) else PARTLY if met else NOT_REPRODUCED
    where = ", ".join(sorted({r["produced_by"] for r in mine}))
    flags = [r["flag"] for r in rows if r["flag"]]
    return SourceGrade(REAL_ENGINE, f"learned inside {where}", "; ".join(parts), grade,
                       measures=tuple(dict.fromkeys(measures)), flag=flags[0] if flags else None)


def draw_rl_engine(reports: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    """Per regime: held-out throughput of the baselines and each frozen learner (median over
    seeds, whiskers min-max), and the learning runs' throughput, from the engine reports."""
    mine = engine_reports(reports)
    regimes = sorted({r["regime"] for r in mine})
    fig, axes = plt.subplots(2, max(1, len(regimes)), figsize=(6.5 * max(1, len(regimes)), 9.0),
                             squeeze=False)
    for column, regime in enumerate(regimes):
        part = [r for r in mine if r["regime"] == regime]
        held, curve = axes[0][column], axes[1][column]
        values: dict[str, list[float]] = {}
        for report in part:
            learner = report["training"]["learner"]
            for run in report["evaluation"]["runs"]:
                for name, tok_s in run["baselines_tok_s"].items():
                    if report is part[0]:
                        values.setdefault(name, []).append(tok_s)
                values.setdefault(f"{learner} (frozen)", []).append(run["learned_tok_s"])
        names = [n for n in BASELINE_ORDER if n in values] + sorted(
            n for n in values if n not in BASELINE_ORDER)
        med = [float(np.median(values[n])) for n in names]
        low = [m - min(values[n]) for m, n in zip(med, names, strict=True)]
        high = [max(values[n]) - m for m, n in zip(med, names, strict=True)]
        colors = ["#999999" if n in BASELINE_ORDER else "#1f77b4" for n in names]
        bars = held.bar(range(len(names)), med, yerr=[low, high], capsize=3, color=colors)
        held.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
        held.set_xticks(range(len(names)), [n.replace(" (frozen)", "\n(frozen)") for n in names],
                        fontsize=7)
        seeds = part[0]["evaluation"]["seeds"]
        kernel = KERNEL_LABELS.get(part[0]["kernel"], part[0]["kernel"])
        held.set(ylabel="output throughput (tokens/s)",
                 title=f"{regime}: held out (seeds {', '.join(map(str, seeds))})\n"
                       f"{part[0]['model']}, {kernel}")
        for report in part:
            history = report["training"]["history"]
            training = report["training"]
            convergence = training.get("convergence") or {}
            curve.plot([h["run"] for h in history], [h["output_tok_s"] for h in history],
                       marker="o", ms=3,
                       label=f"{training['learner']}: {training['states']} states, "
                             f"{history[-1]['updates']} updates, actions converged (K="
                             f"{convergence.get('k')}) "
                             f"{'yes' if convergence.get('actions_converged') else 'no'}")
        for name, style in (("feather-static", "--"), ("feather-nostop", ":")):
            if name in values:
                curve.axhline(float(np.median(values[name])), color="grey", ls=style, lw=0.8,
                              label=f"{name}, held out (median)")
        trained = list(dict.fromkeys(h["seed"] for h in part[0]["training"]["history"]))
        curve.set(xlabel=f"training run (seeds {', '.join(map(str, trained))} in turn)",
                  ylabel="output throughput (tokens/s)", title=f"{regime}: learning in the engine")
        curve.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    if not regimes:
        axes[0][0].text(0.5, 0.5, "no learner trained inside a real engine in this run",
                        ha="center", va="center", transform=axes[0][0].transAxes)
        for ax in axes.flat:
            ax.axis("off")
    fig.suptitle(meta["title"] + " - learned inside real vLLM", wrap=True)
    produced = ", ".join(sorted({r["produced_by"] for r in mine})) or "no engine reports"
    save(fig, out,
         f"{meta['paper']} Each learner (the paper's reading: asked at every group change, a "
         "STOP held until the running groups change, credited with the decode throughput of "
         "the batch it formed, measured by the engine) trains online over the training seeds "
         "inside the engine, is frozen, and runs held-out seeds beside FCFS, Feather without "
         "STOP and feather-static (experiments/rl.yaml engine_training; "
         f"feather/engines/vllm/learning.py). Produced by: {produced}.")
