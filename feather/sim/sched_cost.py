"""Scheduling time in simulated time: a deterministic model, calibrated on real measurements.

Simulated numbers must not depend on how busy the simulating machine is, so a step's
scheduling time enters simulated time through a linear model of the work a policy does:

    t = per_step_s + per_candidate_s * candidates + per_arrival_s * arrivals
        + per_arrival_token_s * (prompt tokens of arrivals) + per_finish_s * finished
        + per_waiting_s * waiting
        + per_scanned_token_s * (prompt tokens of waiting requests the policy scans)

(every policy call an engine makes in a step - arrivals, admission, completions - is
measured into that step).
`lpm` scans every waiting request's tokens unless more than 128 wait (its FCFS fallback),
`dfs-weight` always does, the others never. Coefficients are least-squares fits (non-negative)
of the thread CPU time the real policy objects took per step in calibration runs on a named
host, stored with that host's provenance in `data/sched_costs.json`;
`feather.sim.sched_calibration.calibrate()` redoes it. Every simulation reports the
measured CPU time beside the modelled one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).with_name("data") / "sched_costs.json"
SCANS = {"lpm": "up_to_128", "dfs-weight": "always"}


@dataclass(frozen=True)
class StepWork:
    """What a policy was asked to do in one engine step."""

    candidates: int = 0
    arrivals: int = 0
    arrival_tokens: int = 0
    finished: int = 0
    waiting: int = 0
    waiting_tokens: int = 0


@dataclass(frozen=True)
class Coefficients:
    per_step_s: float = 0.0
    per_candidate_s: float = 0.0
    per_arrival_s: float = 0.0
    per_arrival_token_s: float = 0.0
    per_finish_s: float = 0.0
    per_waiting_s: float = 0.0
    per_scanned_token_s: float = 0.0


def _features(policy: str, work: StepWork) -> list[float]:
    return [
        1.0,
        work.candidates,
        work.arrivals,
        work.arrival_tokens,
        work.finished,
        work.waiting,
        scanned_tokens(policy, work.waiting, work.waiting_tokens),
    ]


def scanned_tokens(policy: str, waiting: int, waiting_tokens: int) -> int:
    scan = SCANS.get(policy, "never")
    if scan == "always" or (scan == "up_to_128" and waiting <= 128):
        return waiting_tokens
    return 0


class SchedulingCostModel:
    """Callable (policy name, StepWork) -> seconds."""

    def __init__(
        self,
        table: dict[str, Coefficients],
        source: dict[str, Any] | None = None,
        fallback: str = "fcfs",
    ) -> None:
        self.table = table
        self.source = source or {}
        self.fallback = fallback
        self.uncalibrated: set[str] = set()

    @classmethod
    def zero(cls) -> SchedulingCostModel:
        return cls({}, {"note": "scheduling time not modelled"}, fallback="")

    @classmethod
    def default(cls) -> SchedulingCostModel:
        data = json.loads(DATA.read_text())
        table = {name: Coefficients(**c) for name, c in data["coefficients"].items()}
        return cls(table, {k: v for k, v in data.items() if k != "coefficients"})

    def __call__(self, policy: str, work: StepWork) -> float:
        c = self.table.get(policy)
        if c is None:
            if not self.fallback:
                return 0.0
            self.uncalibrated.add(policy)
            c = self.table[self.fallback]
        return float(np.dot(list(asdict(c).values()), _features(policy, work)))


def fit(rows: list[tuple[StepWork, float]], policy: str) -> tuple[Coefficients, float]:
    """Non-negative least squares of measured CPU seconds on the step's work (an active-set
    loop: drop the most negative coefficient and refit). Returns the fit's R^2 too."""
    x = np.array([_features(policy, work) for work, _ in rows], dtype=float)
    y = np.array([cpu for _, cpu in rows], dtype=float)
    active = [i for i in range(x.shape[1]) if x[:, i].any()]
    while True:
        beta, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (beta >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(beta)))
    coefficients = np.zeros(x.shape[1])
    coefficients[active] = np.clip(beta, 0, None)
    residual = y - x @ coefficients
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1 - (residual**2).sum() / total if total > 0 else 1.0
    return Coefficients(*coefficients.tolist()), float(r2)
