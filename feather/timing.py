"""The scheduling timer: CPU and wall time of scheduling calls, per step and in total.

Every runner measures scheduling the same way, so overhead numbers compare across engines:
`time.thread_time()` (CPU time of the calling thread only: other threads, such as an
engine's model runner, do not count) and `time.perf_counter()` (wall time) around each call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Scheduling time spent in one step."""

    step: int
    calls: int
    cpu_s: float
    wall_s: float


class SchedulingTimer:
    """Accumulates `measure()` blocks into the current step; `end_step()` closes it.

    Nested `measure()` blocks count once (the outermost), so a policy call made inside a
    measured engine call is not counted twice.
    """

    def __init__(self) -> None:
        self.steps: list[StepTiming] = []
        self._calls = 0
        self._cpu_s = 0.0
        self._wall_s = 0.0
        self._depth = 0

    @contextmanager
    def measure(self) -> Iterator[None]:
        self._depth += 1
        if self._depth > 1:
            try:
                yield
            finally:
                self._depth -= 1
            return
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self._cpu_s += time.thread_time() - cpu0
            self._wall_s += time.perf_counter() - wall0
            self._calls += 1
            self._depth -= 1

    def end_step(self) -> StepTiming:
        """Close the current step (even one with no calls) and start the next."""
        timing = StepTiming(len(self.steps), self._calls, self._cpu_s, self._wall_s)
        self.steps.append(timing)
        self._calls, self._cpu_s, self._wall_s = 0, 0.0, 0.0
        return timing

    @property
    def total_cpu_s(self) -> float:
        return sum(s.cpu_s for s in self.steps) + self._cpu_s

    @property
    def total_wall_s(self) -> float:
        return sum(s.wall_s for s in self.steps) + self._wall_s

    @property
    def total_calls(self) -> int:
        return sum(s.calls for s in self.steps) + self._calls

    def summary(self) -> dict[str, float | int]:
        """Totals and per-step CPU-time percentiles of the closed steps."""
        cpu = sorted(s.cpu_s for s in self.steps)

        def pct(q: float) -> float:
            return cpu[min(len(cpu) - 1, round(q * (len(cpu) - 1)))] if cpu else 0.0

        return {
            "steps": len(self.steps),
            "calls": self.total_calls,
            "cpu_s": self.total_cpu_s,
            "wall_s": self.total_wall_s,
            "step_cpu_s_p50": pct(0.50),
            "step_cpu_s_p99": pct(0.99),
            "step_cpu_s_max": cpu[-1] if cpu else 0.0,
        }
