"""C5's memory regime: Feather's gain against the KV pool, as a fraction of the distinct
shared-prefix tokens (the paper does not state its pool sizes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from feather.claims.base import Claim, Evidence, FigureSpec
from feather.claims.c5 import c5_lines
from feather.claims.plot import producers, save
from feather.figure_style import label_points, legend_beside
from feather.pipeline import c5_tables as c5t


def draw_memory_regime(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Feather / each baseline against the KV pool as a fraction of the distinct shared-prefix
    tokens, and each scheduler's share of time spent recomputing evicted KV."""
    data = c5t.with_ratios(c5t.offline(table, "memory"))
    hardware = sorted(data.hardware.unique())
    fig, axes = plt.subplots(2, max(1, len(hardware)), squeeze=False,
                             figsize=(5.6 * max(1, len(hardware)), 7.6))
    for col, hw in enumerate(hardware):
        part = data[data.hardware == hw]
        ax = axes[0][col]
        for feather_policy, fp in c5t.feather_rows(part).groupby("scheduler"):
            for baseline in c5t.BASELINES:
                stats = fp.groupby("pool_to_prefix_ratio")[f"vs_{baseline}"].mean().dropna()
                if stats.empty:
                    continue
                hypothetical = fp.groupby("pool_to_prefix_ratio")["pool_hypothetical"].first()
                line = ax.plot(stats.index, stats.values, marker="o",
                               label=f"{feather_policy} / {baseline}")[0]
                hyp = hypothetical.reindex(stats.index).fillna(False).astype(bool)
                ax.scatter(stats.index[hyp], stats.values[hyp], s=90, facecolors="white",
                           edgecolors=line.get_color(), zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", xlabel="KV pool / distinct shared-prefix tokens",
               ylabel="output throughput ratio", title=f"{hw}: Feather / baseline")
        label_points(ax.xaxis, part.pool_to_prefix_ratio.dropna().unique())
        legend_beside(ax, fontsize=7)
        ax = axes[1][col]
        share = part.assign(recompute_share=part.time_recompute_s / part.makespan_s)
        for scheduler, sp in share.groupby("scheduler"):
            stats = sp.groupby("pool_to_prefix_ratio")["recompute_share"].mean()
            ax.plot(stats.index, stats.values, marker="o", label=scheduler)
        ax.set(xscale="log", xlabel="KV pool / distinct shared-prefix tokens",
               ylabel="share of makespan recomputing lost KV", title=f"{hw}: the mechanism",
               ylim=(0, 1))
        label_points(ax.xaxis, part.pool_to_prefix_ratio.dropna().unique())
        legend_beside(ax, fontsize=7)
    fig.suptitle(meta["title"], wrap=True)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: {producers(data)}. "
        "L-Eval, shuffled (seed 0), offline. Hollow markers: a pool larger than the "
        "GPU's memory leaves (hypothetical).",
    )


def headline(evidence: Evidence) -> list[str]:
    return c5_lines(evidence.table, "memory")


CLAIM = Claim(
    key="memory",
    rank=5.1,
    experiment="memory",
    figures=(FigureSpec(
        "memory_regime", "C5 (memory regime)",
        "Feather / each baseline against the KV pool as a fraction of the distinct "
        "shared-prefix tokens (the paper does not state its pool sizes)",
        draw=draw_memory_regime),),
    headline=headline,
)
