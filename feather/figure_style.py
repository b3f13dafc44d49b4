"""Where every figure puts its legends and how it labels log axes, so that no legend covers
data and no tick labels collide (tests/figure_layout.py checks every figure for both)."""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.axis import Axis
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter


def label_points(axis: Axis, values: Iterable[float]) -> None:
    """Label a log axis at the swept values only, in plain numbers ("25", "1,000"): its
    default labels minor ticks on short spans ("3x10^1 4x10^1 6x10^1", colliding)."""
    axis.set_major_locator(FixedLocator(sorted({float(v) for v in values})))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    axis.set_minor_formatter(NullFormatter())
