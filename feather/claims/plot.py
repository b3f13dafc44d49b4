"""What every figure shares: a caption that says what produced the numbers, panels side by
side, min-max error bars, atomic writes (feather/figure_style.py: legends and log axes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from feather.atomic import atomic_target


def producers(frame: pd.DataFrame) -> str:
    return "; ".join(sorted(frame["produced_by"].dropna().unique()))


def save(fig: plt.Figure, out: Path, caption: str) -> None:
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


def grid(n: int, width: float = 5.2) -> tuple[plt.Figure, list[plt.Axes]]:
    """n panels side by side, each `width` inches wide (more where a legend sits beside)."""
    fig, axes = plt.subplots(1, max(1, n), figsize=(width * max(1, n), 4.0), squeeze=False)
    return fig, list(axes[0])


def errorbars(ax: plt.Axes, data: pd.DataFrame, x: str, y: str, hue: str, **kw: Any) -> None:
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
