"""Where every figure puts its legends and how it labels log axes, so that no legend covers
data and no tick labels collide (tests/figure_layout.py checks every figure for both)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.legend import Legend
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter


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


def label_log_plainly(axis: Axis) -> None:
    """Label a log axis over continuous data plainly (0.2, 1, 10): at 1-2-5 steps when its
    view spans under two decades (else a short span gets no label at all), else at powers of
    ten; minor ticks unlabelled."""
    low, high = axis.get_view_interval()
    decades = math.log10(high / low) if low > 0 and high > low else 0.0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 2 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
