"""The STOP row's grade of one real regime (`feather.claims.stop.real_state`): from its two
paired intervals and how many quiet repeats they hold - never from a repeat count alone."""

from __future__ import annotations

from types import SimpleNamespace

from feather.claims.base import DOES_NOT_HOLD, HOLDS, UNSTABLE_GRADE
from feather.claims.stop import STOP_PAYS, STOP_REPEATS, real_state
from feather.measuring.stats import median_interval


def regime(vs_fcfs: list[float], vs_nostop: list[float], disturbed: bool = False):
    fcfs, nostop = median_interval(vs_fcfs), median_interval(vs_nostop)
    if disturbed:  # no repeat was quiet: the interval is over the disturbed ones
        fcfs, nostop = (type(iv)(**{**iv.__dict__, "disturbed": True}) for iv in (fcfs, nostop))
    return SimpleNamespace(vs_fcfs_iv=fcfs, vs_nostop_iv=nostop,
                           repeats=min(fcfs.n, nostop.n))


def test_a_regime_whose_every_repeat_was_disturbed_is_not_graded_either_way() -> None:
    """Three disturbed repeats below the bar: unstable, not "does not hold" (a busy loop
    beside the STOP regime's job gave exactly this)."""
    assert real_state(regime([1.06, 1.13, 1.14], [0.90, 0.94, 1.00], disturbed=True)) == (
        UNSTABLE_GRADE)


def test_intervals_below_the_bar_do_not_hold_at_any_count_of_repeats() -> None:
    assert real_state(regime([1.04, 1.08, 1.09], [0.90, 0.98, 1.04])) == DOES_NOT_HOLD
    assert real_state(regime([1.31, 1.37], [1.00, 1.01])) == DOES_NOT_HOLD


def test_holding_asks_for_enough_quiet_repeats() -> None:
    above = [STOP_PAYS + 0.2 + 0.01 * k for k in range(STOP_REPEATS)]
    assert real_state(regime(above, above)) == HOLDS
    few = real_state(regime(above[:3], above[:3]))
    assert few == f"inconclusive (3 quiet repeats: holding asks for {STOP_REPEATS})"


def test_an_interval_across_the_bar_is_inconclusive() -> None:
    state = real_state(regime([1.3, 1.4, 1.5, 1.6, 1.7], [1.0, 1.05, 1.12, 1.2, 1.3]))
    assert state.startswith("inconclusive (interval 1.00-1.30 spans the bar 1.10")
