"""Latency under load (not in the paper): the price of holding requests back, on the
simulator at fractions of FCFS's offline capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from feather.claims.base import Claim, Evidence, FigureSpec, plain
from feather.claims.plot import producers, save
from feather.figure_style import label_log_plainly, legend_beside
from feather.pipeline import c5_tables as c5t


def draw_load_latency(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """TTFT and TPOT (p50, p99) and the longest wait against the load factor (arrival rate /
    FCFS's offline capacity on the same hardware, model and requests)."""
    data = c5t.load_rows(table)
    hardware = sorted(data.hardware.unique())
    metrics = (
        ("ttft", "time to first token (s)"),
        ("tpot", "time per output token (s)"),
    )
    fig, axes = plt.subplots(max(1, len(hardware)), 3, squeeze=False,
                             figsize=(15, 4.3 * max(1, len(hardware))))
    for row, hw in enumerate(hardware):
        part = data[data.hardware == hw]
        for ax, (metric, label) in zip(axes[row][:2], metrics, strict=True):
            for scheduler, sp in part.groupby("scheduler"):
                stats = sp.groupby("load_factor")[[f"{metric}_p50_s", f"{metric}_p99_s"]].mean()
                line = ax.plot(stats.index, stats[f"{metric}_p50_s"], marker="o",
                               label=f"{scheduler} p50")[0]
                ax.plot(stats.index, stats[f"{metric}_p99_s"], marker="x", ls="--",
                        color=line.get_color(), label=f"{scheduler} p99")
            ax.set(xlabel="load (arrival rate / FCFS's offline capacity)", ylabel=label,
                   yscale="log", title=f"{hw} / {', '.join(sorted(part.model.unique()))}")
            label_log_plainly(ax.yaxis)
            ax.axvline(1.0, color="grey", lw=0.8, ls=":")
            legend_beside(ax, fontsize=7)
        ax = axes[row][2]
        for scheduler, sp in part.groupby("scheduler"):
            stats = sp.groupby("load_factor")["longest_wait_s"].mean()
            ax.plot(stats.index, stats.values, marker="o", label=scheduler)
        ax.set(xlabel="load (arrival rate / FCFS's offline capacity)",
               ylabel="longest wait before admission (s)", yscale="log")
        label_log_plainly(ax.yaxis)
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        legend_beside(ax, fontsize=7)
    fig.suptitle(meta["title"], wrap=True)
    rates = sorted({float(str(a).split(":")[1]) for a in data.get("arrival", pd.Series()).dropna()
                    if str(a).startswith("poisson:")})
    save(fig, out, f"{meta['paper']} Produced by: {producers(data)}. L-Eval, shuffled, "
          f"Poisson arrivals at {', '.join(f'{r:.3g}' for r in rates) or 'no'} requests/s; "
          "dotted line: FCFS's capacity.")


def headline(evidence: Evidence) -> list[str]:
    data = c5t.load_rows(evidence.table)
    lines = []
    for (hw, factor), part in data.groupby(["hardware", "load_factor"]):
        cells = ", ".join(
            f"{r.scheduler} TTFT p99 {plain(r.ttft_p99_s)} s / longest wait "
            f"{plain(r.longest_wait_s)} s"
            for r in part.sort_values("scheduler").itertuples()
        )
        lines.append(f"{hw} at {factor:g}x capacity: {cells}")
    return lines or ["no runs"]


CLAIM = Claim(
    key="latency",
    rank=9,
    experiment="load",
    figures=(FigureSpec(
        "load_latency", "(not in the paper)",
        "the latency price of holding requests back: TTFT/TPOT p50/p99 and the longest wait "
        "at 0.5-1.5x FCFS's offline capacity", draw=draw_load_latency),),
    headline=headline,
)
