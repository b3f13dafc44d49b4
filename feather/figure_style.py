"""Where every figure puts its legends and how it labels log axes, so that no legend covers
data and no tick labels collide (tests/figure_layout.py checks every figure for both)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.legend import Legend
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter


def legend_beside(ax: Axes, *args: Any, **kwargs: Any) -> Legend:
    """The axes' legend outside it, to its right, top-aligned: it can cover no data, whatever
    the data; `tight_layout` makes room for it (it is part of the axes' tight box)."""
    return ax.legend(*args, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     **kwargs)


def label_points(axis: Axis, values: Iterable[float]) -> None:
    """Label a log axis at the swept values only, in plain numbers ("25", "1,000"): its
    default labels minor ticks on short spans ("3x10^1 4x10^1 6x10^1", colliding)."""
    axis.set_major_locator(FixedLocator(sorted({float(v) for v in values})))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    axis.set_minor_formatter(NullFormatter())
