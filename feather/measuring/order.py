"""The order arms run in: all arms within each repeat, rotated by one from repeat to repeat,
so no arm always runs first (after a warm-up, a cache reset, a neighbour's start)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(arms: Sequence[T], repeat: int) -> list[T]:
    """The arms in repeat `repeat`'s order: arm `repeat mod len` first."""
    if not arms:
        return []
    shift = repeat % len(arms)
    return list(arms[shift:]) + list(arms[:shift])


def schedule(arms: Sequence[T], repeats: int) -> list[tuple[int, T]]:
    """(repeat, arm) in run order: every arm of repeat 0 (rotated by 0), then of repeat 1, ..."""
    return [(repeat, arm) for repeat in range(repeats) for arm in rotated(arms, repeat)]
