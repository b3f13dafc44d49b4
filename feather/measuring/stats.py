"""The median of repeated measurements and its distribution-free interval.

Why order statistics and not a bootstrap: with 3-9 repeats a percentile bootstrap's interval is
too narrow (it never reaches past the sample's range and undercovers), while the interval
[x_(k), x_(n+1-k)] of the sorted values covers the true median with a probability that
follows from the binomial distribution alone, whatever the values' distribution - so it can be
stated exactly. k is the largest rank whose coverage is still at least 95%; with fewer than 6
values no pair of ranks reaches 95% and the interval is the range, whose coverage (1 - 2^(1-n):
93.8% for 5 values, 75% for 3) is stated beside it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

CONFIDENCE = 0.95
METHOD = "order statistics"


def coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) for n values from any continuous distribution: one
    minus twice the chance that fewer than k of them fall below the median."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"rank {k} is not in 1..{(n + 1) // 2} for {n} values")
    below = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1.0 - 2.0 * below


def interval_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The largest k with coverage(n, k) >= confidence (1, the range, when none reaches it)."""
    best = 1
    for k in range(1, (n + 1) // 2 + 1):
        if coverage(n, k) >= confidence:
            best = k
    return best


@dataclass(frozen=True)
class Interval:
    """A median over n values with its order-statistic interval and that interval's coverage."""

    median: float
    low: float
    high: float
    n: int
    coverage: float
    method: str = METHOD
    # no repeat was quiet: the interval is over disturbed ones, shown but never graded
    disturbed: bool = False

    def text(self, digits: int = 2, unit: str = "x") -> str:
        """`1.38x [1.35-1.41] (n=9)`; the coverage shown where it is not the nominal 95%:
        `1.38x [1.31-1.45] (n=5, 94% coverage)`."""
        shown = "" if self.coverage >= CONFIDENCE else f", {self.coverage:.0%} coverage"
        shown += ", every repeat disturbed" if self.disturbed else ""
        return (f"{self.median:.{digits}f}{unit} [{self.low:.{digits}f}-{self.high:.{digits}f}]"
                f" (n={self.n}{shown})")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Interval:
        return cls(**{k: data[k] for k in ("median", "low", "high", "n", "coverage")},
                   method=str(data.get("method", METHOD)),
                   disturbed=bool(data.get("disturbed", False)))


def median_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval | None:
    """The median of the finite values and its interval; None where there are none."""
    data = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not data:
        return None
    n = len(data)
    k = interval_rank(n, confidence)
    return Interval(statistics.median(data), data[k - 1], data[n - k], n, coverage(n, k))


def unpaired_ratio_interval(numerator: Iterable[float],
                            denominator: Iterable[float]) -> Interval | None:
    """numerator / denominator where the two were not measured side by side (separate engine
    starts): the ratio of medians, bounded by each median's interval (low/high, high/low).
    Both intervals hold with a probability of at least their coverages' sum less one
    (Bonferroni), the coverage stated; wider than a paired interval, as it should be."""
    top, bottom = median_interval(numerator), median_interval(denominator)
    if top is None or bottom is None or bottom.low <= 0:
        return None
    return Interval(top.median / bottom.median, top.low / bottom.high, top.high / bottom.low,
                    min(top.n, bottom.n), max(0.0, top.coverage + bottom.coverage - 1.0),
                    "unpaired: each median's order-statistic interval, combined")


def paired_ratios(numerator: Mapping[Any, float], denominator: Mapping[Any, float]) -> list[float]:
    """numerator[key] / denominator[key] for every key both measured (a repeat, or a seed and
    a repeat): ratios taken within a repeat, so what drifts between repeats cancels."""
    return [numerator[k] / denominator[k] for k in sorted(numerator, key=str)
            if denominator.get(k)]
