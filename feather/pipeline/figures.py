"""The paper's figures, redrawn from the summary table (one function per figure).

Every figure names the claim it tests in its title, labels its axes with units, says in a
caption what produced the numbers (simulated profile, real engine on CPU, real GPU), and
shows the spread over seeds where there are several (error bars: min-max over seeds).
Every registered figure must also be readable - no colliding tick labels, no legend on the
data - which tests/test_figures_readable.py checks on a default-shaped table
(feather/figure_style.py: legends beside the axes, log axes labelled at the swept values).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from feather.atomic import atomic_target
from feather.figure_style import label_points, legend_beside

FIGURES: dict[str, Callable[..., None]] = {}


def figure(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        FIGURES[name] = fn
        return fn

    return register


def _params(frame: pd.DataFrame) -> pd.DataFrame:
    expanded = frame["params"].map(json.loads).apply(pd.Series)
    return pd.concat([frame.reset_index(drop=True), expanded.reset_index(drop=True)], axis=1)


def _producers(frame: pd.DataFrame) -> str:
    return "; ".join(sorted(frame["produced_by"].dropna().unique()))


def _save(fig: plt.Figure, out: Path, caption: str) -> None:
    text = fig.text(0.01, 0.005, caption, fontsize=7, ha="left", va="bottom", wrap=True)
    renderer = fig.canvas.get_renderer()
    # the axes start above the caption, however many lines it wraps to, and end left of a
    # figure legend (at the right edge, loc="center right"), however wide it is
    caption_top = 0.005 + text.get_window_extent(renderer).height / fig.bbox.height
    right = min(
        [1.0] + [1 - lg.get_window_extent(renderer).width / fig.bbox.width for lg in fig.legends]
    )
    fig.tight_layout(rect=(0, caption_top + 0.01, right - (0.01 if fig.legends else 0), 1))
    with atomic_target(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _grid(n: int, width: float = 5.2) -> tuple[plt.Figure, list[plt.Axes]]:
    """n panels side by side, each `width` inches wide (more where a legend sits beside)."""
    fig, axes = plt.subplots(1, max(1, n), figsize=(width * max(1, n), 4.0), squeeze=False)
    return fig, list(axes[0])


def _errorbars(ax: plt.Axes, data: pd.DataFrame, x: str, y: str, hue: str, **kw: Any) -> None:
    """Mean over seeds with min-max bars, one line per hue."""
    for label, part in data.groupby(hue, sort=True):
        stats = part.groupby(x)[y].agg(["mean", "min", "max"]).sort_index()
        ax.errorbar(
            stats.index,
            stats["mean"],
            yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
            marker="o",
            capsize=3,
            label=str(label),
            **kw,
        )


@figure("c1_homogeneous_vs_mixed")
def c1(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = _params(table[table.experiment == "c1"])
    fig, axes = _grid(data.hardware.nunique())
    for ax, (hw, part) in zip(axes, data.groupby("hardware"), strict=False):
        _errorbars(ax, part, "size", "output_tok_s", "plan")
        ax.set(
            xscale="log",
            xlabel="batch size (requests per dispatched batch)",
            ylabel="output throughput (tokens/s)",
            title=hw,
        )
        label_points(ax.xaxis, part["size"].unique())
        ax.legend(title="batch composition")
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. Workload: 8 prefix groups x 100 requests, 4,000-token prefixes.",
    )


@figure("c2_divergent_requests")
def c2(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c2"].copy()
    data["divergent"] = data["workload"].map(divergent_requests)
    base = data[data.divergent == 0].groupby(["hardware", "kernel"])["output_tok_s"].mean()
    data["relative"] = [r.output_tok_s / base[(r.hardware, r.kernel)] for r in data.itertuples()]
    fig, axes = _grid(data.hardware.nunique())
    for ax, (hw, part) in zip(axes, data.groupby("hardware"), strict=False):
        _errorbars(ax, part, "divergent", "relative", "kernel")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(
            xlabel="divergent requests in a batch of 100",
            ylabel="throughput relative to 0 divergent",
            title=hw,
        )
        ax.legend(title="attention kernel")
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. cascade: vLLM <= 0.31 rules (off when any request diverges).",
    )


def divergent_requests(spec: str) -> int:
    """How many requests of a synthetic spec's groups are made unshared."""
    fraction = re.search(r"unshared=([0-9.]+)", spec)
    if not fraction:
        return 0
    per_group = re.search(r"per_group=(\d+)", spec)
    groups = re.search(r"groups=(\d+)", spec)
    total = int(per_group.group(1) if per_group else 100) * int(groups.group(1) if groups else 8)
    return round(float(fraction.group(1)) * total)


def _ratio_to(data: pd.DataFrame, baseline: str, keys: list[str]) -> pd.Series:
    base = data[data.scheduler == baseline].groupby(keys)["output_tok_s"].mean()
    return pd.Series(
        [
            r.output_tok_s / base[tuple(getattr(r, k) for k in keys)]
            if len(keys) > 1
            else r.output_tok_s / base[getattr(r, keys[0])]
            for r in data.itertuples()
        ],
        index=data.index,
    )


@figure("c5_schedulers_by_prefix_length")
def c5(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c5"].copy()
    data["prefix"] = data["workload"].map(_prefix_label)
    data["family"] = data["workload"].map(
        lambda w: "L-Eval" if "leval" in w else "LongBench format (synthetic text)"
    )
    data["relative"] = _ratio_to(data, "fcfs", ["hardware", "workload"])
    families, hardware = sorted(data.family.unique()), sorted(data.hardware.unique())
    fig, axes = plt.subplots(
        len(families),
        len(hardware),
        squeeze=False,
        figsize=(6.0 * len(hardware) + 1.8, 3.6 * len(families)),  # + the legend beside
    )
    low, high = data.relative.min(), data.relative.max()
    for row, family in enumerate(families):
        for col, hw in enumerate(hardware):
            ax = axes[row][col]
            part = data[(data.family == family) & (data.hardware == hw)]
            order = sorted(part.prefix.unique(), key=_prefix_sort)
            sns.barplot(
                data=part,
                x="prefix",
                y="relative",
                hue="scheduler",
                order=order,
                hue_order=sorted(data.scheduler.unique()),
                ax=ax,
                errorbar=("pi", 100),
            )
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set(
                xlabel="shared prefix length (tokens)",
                ylabel="output throughput / FCFS",
                title=f"{family} - {hw}",
                ylim=(min(0.9, low - 0.02), max(1.1, high + 0.02)),
            )
            ax.get_legend().remove()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="scheduler", loc="center right")
    fig.subplots_adjust(right=0.85)
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. Bars: mean over seeds, whiskers: min-max.",
    )


def _prefix_label(workload: str) -> str:
    match = re.search(r"min=(\d+)[-,]max=(\d+)", workload) or re.search(
        r"min-(\d+)-max-(\d+)", workload
    )
    if match:
        return f"{int(match.group(1)) // 1000}K-{int(match.group(2)) // 1000}K"
    match = re.search(r"prefix[=-](\d+)", workload)
    return f"{int(match.group(1)) // 1000}K" if match else workload


def _prefix_sort(label: str) -> float:
    match = re.match(r"(\d+)K", label)
    return float(match.group(1)) if match else 1e9


@figure("c6_no_sharing")
def c6(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c6"].copy()
    data["relative"] = _ratio_to(data, "fcfs", ["hardware"])
    fig, axes = _grid(1, width=7.5)
    sns.barplot(
        data=data, x="hardware", y="relative", hue="scheduler", ax=axes[0], errorbar=("pi", 100)
    )
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].set(ylim=(0.9, 1.05), xlabel="hardware", ylabel="output throughput / FCFS")
    legend_beside(axes[0], title="scheduler")
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. Every request has its own prefix.",
    )


@figure("c7_vs_prefix_aware_kernel")
def c7(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c7"].copy()
    data["setup"] = data["scheduler"] + " + " + data["kernel"]
    fig, axes = _grid(data.hardware.nunique())
    for ax, (hw, part) in zip(axes, data.groupby("hardware"), strict=False):
        sns.barplot(
            data=part, x="setup", y="output_tok_s", ax=ax, errorbar=("pi", 100), color="tab:blue"
        )
        ax.set(
            xlabel="scheduler + attention kernel", ylabel="output throughput (tokens/s)", title=hw
        )
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. pat: each distinct prefix block read once per step.",
    )


@figure("load_latency")
def load(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "load"].copy()
    data["rate"] = data["workload"].map(
        lambda w: float(re.search(r"poisson:([0-9.]+)", w).group(1))
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for metric, ax, label in (
        ("ttft", axes[0], "time to first token (s)"),
        ("tpot", axes[1], "time per output token (s)"),
    ):
        for scheduler, part in data.groupby("scheduler"):
            stats = part.groupby("rate")[[f"{metric}_p50_s", f"{metric}_p99_s"]].mean()
            line = ax.plot(
                stats.index, stats[f"{metric}_p50_s"], marker="o", label=f"{scheduler} p50"
            )[0]
            ax.plot(
                stats.index,
                stats[f"{metric}_p99_s"],
                marker="x",
                ls="--",
                color=line.get_color(),
                label=f"{scheduler} p99",
            )
        ax.set(xlabel="arrival rate (requests/s)", ylabel=label, yscale="log")
        ax.legend(fontsize=7)
    sns.barplot(
        data=data, x="rate", y="longest_wait_s", hue="scheduler", ax=axes[2], errorbar=("pi", 100)
    )
    axes[2].set(xlabel="arrival rate (requests/s)", ylabel="longest wait before admission (s)")
    fig.suptitle(meta["title"], wrap=True)
    _save(fig, out, f"{meta['paper']} Produced by: {_producers(data)}. Poisson arrivals.")


@figure("hardware_comparison")
def hardware(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "hardware"].copy()
    fig, axes = _grid(1, width=8.0)
    sns.barplot(
        data=data, x="hardware", y="output_tok_s", hue="scheduler", ax=axes[0], errorbar=("pi", 100)
    )
    axes[0].set(
        xlabel="hardware (from each run's provenance)", ylabel="output throughput (tokens/s)"
    )
    axes[0].tick_params(axis="x", rotation=30)
    legend_beside(axes[0], title="scheduler")
    fig.suptitle(meta["title"], wrap=True)
    _save(fig, out, f"{meta['paper']} Produced by: {_producers(data)}.")


@figure("vllm_real_vs_sim")
def vllm_real_vs_sim(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Real engine vs simulator, each relative to its own FCFS: the simulator's fidelity in
    the quantity the claims are about (the ratio), not in absolute tokens/s."""
    data = table[table.experiment == "vllm"].copy()
    data["source"] = data["produced_by"]
    baseline = (
        data[data.scheduler == "fcfs"].groupby("source")["output_tok_s"].median().rename("base")
    )
    data = data.join(baseline, on="source")
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
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Bars: median over repeats (real) or "
        f"seeds (simulator), whiskers: min-max. Real runs: {workloads or 'none'}.",
    )


def _wrap_spec(spec: str, width: int = 36) -> str:
    """A workload spec on lines of at most about `width` characters, broken after commas."""
    lines = [""]
    for part in spec.split(","):
        if lines[-1] and len(lines[-1]) + len(part) + 1 > width:
            lines.append("")
        lines[-1] += ("," if lines[-1] else "") + part
    return ",\n".join(lines)


@figure("rl_policies")
def rl(reports: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for report in reports:
        history = report["training"]["history"]
        axes[0].plot(
            range(1, len(history) + 1),
            [h["output_tok_s"] for h in history],
            marker="o",
            label=f"{report['training']['learner']} ({report['hardware']})",
        )
    axes[0].set(
        xlabel="training run (workload x seed, in order)",
        ylabel="output throughput while learning (tokens/s)",
        title="learning curves",
    )
    axes[0].legend(fontsize=7)
    rows = [
        {
            "learner": f"{r['training']['learner']}\n({r['hardware']})",
            "workload": _wrap_spec(run["workload"].split(",seed")[0].replace("synthetic:", "")),
            "ratio": run["ratio"],
        }
        for r in reports
        for run in r["evaluation"]["runs"]
    ]
    frame = pd.DataFrame(rows)
    sns.barplot(
        data=frame, x="learner", y="ratio", hue="workload", ax=axes[1], errorbar=("pi", 100)
    )
    axes[1].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[1].set(
        xlabel="frozen learned policy",
        ylabel="throughput / feather-static",
        title="held-out workloads and seeds",
    )
    legend_beside(axes[1], title="held-out workload", fontsize=6, title_fontsize=7)
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"{meta['paper']} Produced by: simulator ("
        f"{', '.join(sorted({r['hardware'] for r in reports}))} profile).",
    )


def draw(
    name: str,
    table_path: str | Path,
    out: str | Path,
    meta: dict[str, Any],
    reports: Iterable[str | Path] = (),
) -> None:
    """Draw one registered figure from the summary table (or, for rl, training reports)."""
    if name == "rl_policies":
        loaded = [json.loads(Path(p).read_text()) for p in reports]
        FIGURES[name](loaded, Path(out), meta)
        return
    FIGURES[name](pd.read_parquet(table_path), Path(out), meta)
