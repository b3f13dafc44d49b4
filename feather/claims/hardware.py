"""What a GPU changes, per configured profile: the homogeneity effect (C1), C5's gain on
shuffled L-Eval in the pool the profile's memory leaves, and where stopping pays - the
figure a user reads after editing config.yaml's `hardware:`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from feather.claims.base import Claim, Evidence, FigureSpec, plain
from feather.claims.data import with_params
from feather.claims.plot import producers, save

QUESTIONS = (
    ("c1", "C1: homogeneous 8x100 / mixed 800\n(output throughput)"),
    ("c5", "C5: feather-static / FCFS\n(shuffled L-Eval, the GPU's pool)"),
    ("stop", "STOP: the paper's rule / Feather without STOP\n(C1's shape, cascade attention)"),
)


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (profile, question): the ratio that answers it, and the pool it ran in."""
    data = table[(table.experiment == "hardware") & (table.engine == "sim")]
    rows = []
    for hw, part in data.groupby("hardware"):
        c1 = part[part.scheduler == "batches"]
        if len(c1):
            plans = with_params(c1).groupby("plan").output_tok_s.mean()
            if {"homogeneous", "mixed"} <= set(plans.index):
                rows.append({"hardware": hw, "question": "c1",
                             "ratio": plans["homogeneous"] / plans["mixed"]})
        leval = part[part.workload.astype(str).str.contains("leval")]
        paged = part.kernel != "cascade"
        means = leval.groupby("scheduler").output_tok_s.mean()
        if {"fcfs", "feather-static"} <= set(means.index):
            pool = leval.get("pool_to_prefix_ratio", pd.Series(dtype=float)).dropna()
            rows.append({"hardware": hw, "question": "c5",
                         "ratio": means["feather-static"] / means["fcfs"],
                         "pool": float(pool.iloc[0]) if len(pool) else float("nan")})
        stop = part[~paged].groupby("scheduler").output_tok_s.mean()
        rules = [s for s in stop.index if s != "feather-nostop"]
        if "feather-nostop" in stop and rules:
            rows.append({"hardware": hw, "question": "stop", "rule": rules[0],
                         "ratio": stop[rules[0]] / stop["feather-nostop"]})
    return pd.DataFrame(rows, columns=["hardware", "question", "ratio", "pool", "rule"])


def draw_hardware_comparison(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    data = ratios(table)
    fig, axes = plt.subplots(1, len(QUESTIONS), figsize=(5.0 * len(QUESTIONS), 4.4),
                             squeeze=False)
    for ax, (question, label) in zip(axes[0], QUESTIONS, strict=True):
        part = data[data.question == question].sort_values("hardware")
        bars = ax.bar(part.hardware, part.ratio, color="tab:blue")
        ax.bar_label(bars, labels=[
            f"{r.ratio:.2f}" + (f"\npool {r.pool:.2f}x" if question == "c5"
                                and pd.notna(r.pool) else "") for r in part.itertuples()],
            fontsize=7, padding=2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.margins(y=0.2)
        ax.set(xlabel="hardware profile", ylabel="throughput ratio", title=label)
        ax.title.set_fontsize(9)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(meta["title"], wrap=True)
    runs = table[table.experiment == "hardware"]
    save(fig, out, f"{meta['paper']} Produced by: {producers(runs)}. Ratios of means within "
         "one profile; dashed: no difference; C5's labels give the KV pool the profile's "
         "memory leaves over the distinct shared-prefix tokens.")


def headline(evidence: Evidence) -> list[str]:
    data = ratios(evidence.table)
    lines = []
    for hw, part in data.groupby("hardware"):
        by = dict(zip(part.question, part.ratio, strict=True))
        lines.append(f"{hw}: C1 homogeneous / mixed {plain(by.get('c1'))}x, C5 feather-static "
                     f"/ FCFS {plain(by.get('c5'))}x, STOP the paper's rule / no-STOP under "
                     f"cascade {plain(by.get('stop'))}x")
    return lines or ["no runs"]


CLAIM = Claim(
    key="hardware",
    rank=11,
    experiment="hardware",
    figures=(FigureSpec(
        "hardware_comparison", "(hardware)",
        "the paper used an RTX 6000 Ada and an A100; every configured profile is compared on "
        "what a GPU changes: the homogeneity effect, C5's gain on shuffled arrivals, where "
        "stopping pays", draw=draw_hardware_comparison),),
    headline=headline,
)
