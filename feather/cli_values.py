"""Value types for the command line's flags: each value is checked where argparse reads it,
so a bad one is a one-line usage error (exit code 2) naming the flag, before any work.

Counts are at most 2**31 - 1 (workload files store them as int32, and nothing on one machine
needs more); seeds are 0 .. 2**63 - 1 (numpy's generators refuse negative seeds).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1


def _int(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1, MAX_COUNT, f"an integer in 1..{MAX_COUNT}")


def nonnegative_int(text: str) -> int:
    return _int(text, 0, MAX_COUNT, f"an integer in 0..{MAX_COUNT}")


def seed(text: str) -> int:
    return _int(text, 0, MAX_SEED, f"a seed in 0..{MAX_SEED}")


def seeds(text: str) -> list[int]:
    """A comma-separated list of seeds, e.g. 0,1,2."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of seeds")
    return [seed(part) for part in parts]


def _float(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_float(text: str) -> float:
    return _float(text, lambda v: v > 0, "a finite number > 0")


def fraction(text: str) -> float:
    return _float(text, lambda v: 0 <= v <= 1, "a number in [0, 1]")
