"""The kernel-level figure (C1, C2, C7): `feather bench kernels` results of every device that
has one (this CPU; a GPU's from `gpu/kernels.sh`), side by side, each labelled with its device.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from feather.atomic import atomic_target
from feather.figure_style import label_points, legend_beside
from feather.kernels.plan import KERNELS


def _source(doc: dict[str, Any], implementation: str) -> str:
    name = doc.get("device_name") or doc.get("device", "?")
    return f"{name} ({implementation})"


def draw(documents: Sequence[dict[str, Any]], out: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(19, 9))
    c1, c2, prefix, c7 = axes.flat
    slots = max(1, sum(len({r["implementation"] for r in d["summary"]["c1"]}) for d in documents))
    width = 0.8 / slots
    middle = (slots - 1) * width / 2  # of a group of bars, one per source
    slot = 0
    for doc in documents:
        for impl in sorted({r["implementation"] for r in doc["summary"]["c1"]}):
            source = _source(doc, impl)
            rows = {r["kernel"]: r for r in doc["summary"]["c1"] if r["implementation"] == impl}
            xs = [i + slot * width for i in range(len(KERNELS))]
            c1.bar(xs, [rows[k]["mixed_over_homog_equal_size"] if k in rows else 0
                        for k in KERNELS], width, label=source)
            for kernel in KERNELS:
                pts = sorted((r["divergent"], r["slowdown"]) for r in doc["summary"]["c2"]
                             if r["kernel"] == kernel and r["implementation"] == impl)
                if pts:
                    c2.plot([0] + [p[0] for p in pts], [1.0] + [p[1] for p in pts],
                            marker="o", label=f"{kernel}, {source}")
                sweep = sorted((r["prefix_tokens"], r["median_s"] * 1e3) for r in doc["rows"]
                               if r["benchmark"] == "prefix" and r["kernel"] == kernel
                               and r["implementation"] == impl)
                if sweep:
                    prefix.plot(*zip(*sweep, strict=True), marker="o",
                                label=f"{kernel}, {source}")
            configs = [r for r in doc["summary"]["c7"] if r["implementation"] == impl]
            ys = range(len(configs))
            c7.barh([y + slot * width for y in ys], [r["paged_over_pat"] for r in configs],
                    width, label=f"paged / pat, {source}")
            c7.set_yticks([y + middle for y in ys], [r["config"] for r in configs], fontsize=7)
            slot += 1
    c1.set_xticks([i + middle for i in range(len(KERNELS))], KERNELS)
    c1.axhline(1, color="grey", linewidth=0.8)
    c1.set_ylabel("mixed batch time / homogeneous batch time (same size)")
    c1.set_title("C1: one homogeneous batch vs a mixed one of equal size", fontsize=10)
    c2.set_xlabel("divergent requests in a homogeneous batch")
    c2.set_ylabel("slowdown vs no divergent request (x)")
    c2.set_title("C2: divergent requests (cascade loses its shared prefix)", fontsize=10)
    prefix.set_xscale("log")
    prefix.set_yscale("log")
    label_points(prefix.xaxis, {x for line in prefix.get_lines() for x in line.get_xdata()})
    prefix.set_xlabel("shared prefix (tokens, log)")
    prefix.set_ylabel("kernel time (ms, log)")
    prefix.set_title("kernel time vs shared-prefix length", fontsize=10)
    c7.axvline(1, color="grey", linewidth=0.8)
    c7.set_xlabel("paged time / pat time (x)")
    c7.set_title("C7: a prefix-tree kernel (PAT-style) vs the paged kernel", fontsize=10)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        legend_beside(ax, fontsize=7)
    scale = " | ".join(f"{d.get('device_name') or d.get('device')}: {d.get('scale', '')}"
                       for d in documents)
    fig.suptitle("Decode attention at kernel level (C1, C2, C7), measured\n"
                 + "\n".join(textwrap.wrap(scale, 170)), fontsize=9)
    fig.tight_layout()
    with atomic_target(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def draw_files(paths: Sequence[str | Path], out: str | Path) -> None:
    """The figure of every result that ran (a failed job's record is left out)."""
    from feather.pipeline.job_status import failed

    draw([json.loads(Path(p).read_text()) for p in paths if not failed(p)], Path(out))
