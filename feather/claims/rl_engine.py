"""The learners trained inside the real engine (feather/engines/vllm/learning.py): their
figure and the verdict's real-engine grade, read from their reports. The RL claim
(feather/claims/rl.py) declares both.

A learner learned where, frozen on held-out workloads (seeds it never saw), its median
throughput is at least LEARNED_PAYS x Feather without STOP where stopping pays (the regime
where feather-static itself pays that), at least NEAR_BEST x the best baseline (FCFS, Feather
without STOP, feather-static) and at least NEVER_WORSE x FCFS in every regime.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from feather.claims.base import (
    NOT_REPRODUCED,
    PARTLY,
    REAL_ENGINE,
    REPRODUCED,
    SourceGrade,
    times,
)
from feather.claims.plot import save

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


def regime_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (regime, learner): held-out medians, the ratios graded, what it learned."""
    rows = []
    for report in reports:
        med = _medians(report)
        learner = report["training"]["learner"]
        learned = med[f"{learner} (frozen)"]
        baselines = {k: v for k, v in med.items() if not k.endswith("(frozen)")}
        pays = baselines["feather-static"] / baselines["feather-nostop"] >= STOP_PAYS
        policy = report["training"].get("policy", {})
        rows.append({
            "regime": report["regime"], "learner": learner, "stop_pays": pays,
            "vs_nostop": learned / baselines["feather-nostop"],
            "vs_fcfs": learned / baselines["fcfs"],
            "vs_best": learned / max(baselines.values()),
            "seeds": report["evaluation"]["seeds"],
            "states": report["training"]["states"],
            "stop_states": sum(1 for e in policy.values() if e["action"] == "STOP"),
            "updates": (report["training"]["history"] or [{}])[-1].get("updates", 0),
            "converged": (report["training"].get("convergence") or {}).get("actions_converged"),
            "k": (report["training"].get("convergence") or {}).get("k"),
        })
    return rows


def _meets(row: dict[str, Any]) -> list[str]:
    """The criteria a row misses (none: it learned)."""
    missed = []
    if row["stop_pays"] and row["vs_nostop"] < LEARNED_PAYS:
        missed.append(f"{times(row['vs_nostop'])} no-STOP < {LEARNED_PAYS}x where stopping pays")
    if row["vs_best"] < NEAR_BEST:
        missed.append(f"{times(row['vs_best'])} the best baseline < {NEAR_BEST}x")
    if row["vs_fcfs"] < NEVER_WORSE:
        missed.append(f"{times(row['vs_fcfs'])} FCFS < {NEVER_WORSE}x")
    return missed


def engine_grade(reports: tuple[dict[str, Any], ...]) -> SourceGrade | None:
    """The real engine's grade: reproduced where every learner meets every criterion in every
    regime; partly where some do; else not."""
    mine = engine_reports(reports)
    if not mine:
        return None
    rows = regime_rows(mine)
    missed = {(r["regime"], r["learner"]): _meets(r) for r in rows}
    text = "; ".join(
        f"{r['regime']} ({'stopping pays' if r['stop_pays'] else 'stopping does not pay'}) "
        f"{r['learner']} frozen: {times(r['vs_nostop'])} no-STOP, {times(r['vs_best'])} best "
        f"baseline, {times(r['vs_fcfs'])} FCFS over held-out seeds "
        f"{', '.join(map(str, r['seeds']))} ({r['states']} states, {r['stop_states']} STOP, "
        f"{r['updates']} updates)"
        + (f" - misses {', '.join(missed[(r['regime'], r['learner'])])}"
           if missed[(r["regime"], r["learner"])] else "")
        for r in rows)
    met = sum(1 for m in missed.values() if not m)
    grade = REPRODUCED if met == len(rows) else PARTLY if met else NOT_REPRODUCED
    where = ", ".join(sorted({r["produced_by"] for r in mine}))
    return SourceGrade(REAL_ENGINE, f"learned inside {where}", text, grade)


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
