"""The decode-attention kernels measured on this CPU (and an attached GPU): C1, C2 and C7 at
kernel level. Drawn by the kernel rule (feather/bench/kernel_figure.py); graded in c1.py,
c2.py and c7.py as the "real kernel" source."""

from __future__ import annotations

from feather.claims.base import Claim, FigureSpec

CLAIM = Claim(
    key="kernels",
    rank=15,
    experiment=None,
    figures=(FigureSpec(
        "kernels", "C1, C2, C7 (kernel level)",
        "homogeneous vs mixed batches, divergent requests, paged vs cascade vs PAT-style "
        "kernels - measured on this CPU (and an attached GPU)",
        drawn_by="the kernel rule (workflow/rules/kernels.smk, feather/bench/kernel_figure.py)"),),
)
