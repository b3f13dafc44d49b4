"""`figures/ours.md`: the headline number of each figure, from this run's results.

figures/README.md states each claim and the paper's number; this file, rewritten by every
pipeline run, gives ours beside them, computed from results/summary.parquet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from feather.atomic import write_text_atomic
from feather.pipeline import c5_tables as c5t
from feather.pipeline.figures import _params, divergent_requests, learning_summary
from feather.pipeline.verdicts import stop_ratios


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.2f}"


def _mean(frame: pd.DataFrame, **where: Any) -> float | None:
    part = frame
    for key, value in where.items():
        part = part[part[key] == value]
    return None if part.empty else float(part["output_tok_s"].mean())


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def c5_lines(table: pd.DataFrame, experiment: str) -> list[str]:
    """Best Feather policy / each baseline per setting and order (mean over order seeds)."""
    data = c5t.with_ratios(c5t.offline(table, experiment))
    by = ["workload_family", "hardware", "model", "engine_mode", "arrival_order",
          "output_regime", "pool_to_prefix_ratio"]
    lines = []
    for baseline in c5t.BASELINES:
        best = c5t.best_feather(data, baseline, by)
        for _, r in best.iterrows():
            lines.append(
                f"{r.workload_family}, {r.hardware} {r.model} {r.engine_mode}, {r.arrival_order}, "
                f"{c5t.output_label(r.output_regime)}, pool {r.pool_to_prefix_ratio:.2f}x: "
                f"{r.scheduler} / {baseline} = {_fmt(r['mean'])}x "
                f"({_fmt(r['min'])}-{_fmt(r['max'])}, {int(r['count'])} seed(s))"
            )
    return lines or ["no runs"]


def load_lines(table: pd.DataFrame) -> list[str]:
    data = c5t.load_rows(table)
    lines = []
    for (hw, factor), part in data.groupby(["hardware", "load_factor"]):
        cells = ", ".join(
            f"{r.scheduler} TTFT p99 {_fmt(r.ttft_p99_s)} s / longest wait "
            f"{_fmt(r.longest_wait_s)} s"
            for r in part.sort_values("scheduler").itertuples()
        )
        lines.append(f"{hw} at {factor:g}x capacity: {cells}")
    return lines or ["no runs"]


def headline(table: pd.DataFrame, experiment: str) -> list[str]:
    data = table[table.experiment == experiment]
    if data.empty:
        return ["no runs"]
    if experiment in ("c5", "memory"):
        return c5_lines(table, experiment)
    if experiment == "load":
        return load_lines(table)
    if experiment == "stop":
        return [f"{source}, {r.regime} ({r.attention}): {r.rule} {_fmt(r.vs_nostop)}x "
                f"Feather without STOP, {_fmt(r.vs_fcfs)}x FCFS"
                for source, engine in (("real", True), ("simulator", False))
                for r in stop_ratios(table, engine).itertuples()] or ["no runs"]
    lines = []
    for hw, part in data.groupby("hardware"):
        if experiment == "c1":
            p = _params(part)
            r = _ratio(_mean(p, plan="homogeneous", size=100), _mean(p, plan="mixed", size=800))
            lines.append(f"{hw}: homogeneous 8x100 / mixed 800 = {_fmt(r)}x")
        elif experiment == "c2":
            for kernel, k in part.groupby("kernel"):
                divergent = k.workload.map(divergent_requests)
                base, one = k[divergent == 0], k[divergent == 1]
                r = _ratio(one.output_tok_s.mean(), base.output_tok_s.mean())
                lines.append(f"{hw} {kernel}: 1 divergent / 0 = {_fmt(r)}x")
        elif experiment == "hardware":
            fcfs = _mean(part, scheduler="fcfs")
            best = (
                part[part.scheduler.str.startswith("feather")]
                .groupby("scheduler")["output_tok_s"]
                .mean()
            )
            if not best.empty:
                lines.append(
                    f"{hw}: best Feather ({best.idxmax()}) / FCFS = "
                    f"{_fmt(_ratio(best.max(), fcfs))}x"
                )
        elif experiment == "c6":
            fcfs = _mean(part, scheduler="fcfs")
            worst = part[part.scheduler != "fcfs"].output_tok_s.min()
            lines.append(f"{hw}: worst Feather / FCFS = {_fmt(_ratio(worst, fcfs))}x")
        elif experiment == "c7":
            ours = _mean(part[part.kernel == "paged"], scheduler="feather-static")
            pat = _mean(part[part.kernel == "pat"], scheduler="fcfs")
            lines.append(f"{hw}: feather-static + paged / fcfs + pat = {_fmt(_ratio(ours, pat))}x")
        elif experiment == "vllm":
            for source, src in part.groupby("produced_by"):
                medians = src.groupby("scheduler")["output_tok_s"].median()
                hits = src.groupby("scheduler")["prefix_cache_hit_rate"].median()
                if "fcfs" not in medians:
                    continue
                lines += [
                    f"{source}: {name} / FCFS = {_fmt(_ratio(value, medians['fcfs']))}x "
                    f"(prefix-cache hit {_fmt(hits[name])})"
                    for name, value in medians.items()
                    if name != "fcfs"
                ]
    return lines


def write_ours(
    table_path: str | Path,
    reports: list[str | Path],
    out: str | Path,
    experiments: dict[str, Any],
    sections: list[str | Path] = (),
) -> None:
    """The table of claims vs our numbers; `sections` (markdown files of experiments with
    their own rules, e.g. the overhead report) are appended as they are."""
    table = pd.read_parquet(table_path)
    rows = ["| figure | claim | paper | ours (this run) |", "|---|---|---|---|"]
    for exp in experiments.values():
        if exp.name == "rl":
            loaded = [json.loads(Path(p).read_text()) for p in reports]
            ours = [
                f"{learning_summary(r)}; held out, x feather-static per shape: "
                + ", ".join(
                    _fmt(shape["ratio"]["mean"])
                    for shape in r["evaluation"]["per_workload"].values()
                )
                + ", x FCFS: "
                + ", ".join(
                    _fmt(shape["ratio_to_fcfs"]["mean"])
                    for shape in r["evaluation"]["per_workload"].values()
                )
                for r in loaded
            ]
        else:
            ours = headline(table, exp.name)
        rows.append(
            f"| {', '.join(exp.figures)} | {exp.claim} | {exp.paper} | {'<br>'.join(ours)} |"
        )
    revision = table["git_revision"].dropna().unique()
    text = (
        "# Our numbers, from the last pipeline run\n\n"
        "Claim by claim, with a verdict and the rules that give it: `figures/verdicts.md`.\n\n"
        f"Git revision(s): {', '.join(map(str, revision)) or 'unknown'}. Produced by: "
        f"{'; '.join(sorted(table['produced_by'].dropna().unique()))}.\n\n" + "\n".join(rows) + "\n"
    )
    for section in sections:
        text += "\n" + Path(section).read_text()
    write_text_atomic(out, text)
