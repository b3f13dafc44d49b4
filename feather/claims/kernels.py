"""The decode-attention kernels measured on this CPU (and an attached GPU): C1, C2 and C7 at
kernel level. Drawn by the kernel rule (feather/bench/kernel_figure.py); graded in c1.py,
c2.py and c7.py as the "real kernel" source."""

from __future__ import annotations

import json

from feather.claims.base import Claim, FigureSpec, RunOutputs
from feather.failure_record import failed


def figure_ours(figure: str, outputs: RunOutputs) -> str:
    """One line per device of the kernel benchmark's C1, C2 and C7 ratios (paged kernel)."""
    lines = []
    for path in outputs.kernel_files:
        if not path.is_file() or failed(path):
            continue
        doc = json.loads(path.read_text())
        summary, device = doc["summary"], doc.get("device", "?")
        c1 = [r for r in summary["c1"] if r["kernel"] == "paged"]
        c2 = [r for r in summary["c2"] if r["kernel"] == "paged" and r["divergent"] == 1]
        c7 = [r["paged_over_pat"] for r in summary["c7"] if r.get("paged_over_pat")]
        parts = [f"{device} ({r['implementation']}): homogeneous / mixed 8x throughput "
                 f"{r['homog_throughput_over_mixed_big']:.2f}x" for r in c1]
        parts += [f"1 divergent request: {r['slowdown']:.2f}x the time" for r in c2]
        if c7:
            parts.append(f"paged / pat time {min(c7):.2f}-{max(c7):.2f}x")
        lines.append(", ".join(parts))
    return "; ".join(lines) or "no kernel results"


CLAIM = Claim(
    key="kernels",
    rank=15,
    experiment=None,
    figures=(FigureSpec(
        "kernels", "C1, C2, C7 (kernel level)",
        "homogeneous vs mixed batches, divergent requests, paged vs cascade vs PAT-style "
        "kernels - measured on this CPU (and an attached GPU)",
        drawn_by="the kernel rule (workflow/rules/kernels.smk, feather/bench/kernel_figure.py)",
        ours=figure_ours),),
)
