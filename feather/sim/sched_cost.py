"""Scheduling time in simulated time: deterministic models, calibrated on real measurements.

Simulated numbers must not depend on how busy the simulating machine is, so a step's
scheduling time enters simulated time through a model of the work done in it (`StepWork`).
Named models (`cost_model(name, ...)`, `COST_MODELS`):

- `sglang-0.5.23-rust`, `sglang-0.5.23-python`, `sglang-0.5.10`: what the real code costs -
  the engine's prefix lookups, SGLang's own calc_priority for lpm/dfs-weight (that release
  and tree), the CHT policy for Feather - fitted to the overhead bench
  (`feather.sim.sched_measured`, `feather.sim.sched_fit`);
- `port`: our ports' own CPU time (below).

The `port` model is linear in the work a policy does:

    t = per_step_s + per_candidate_s * candidates + per_arrival_s * arrivals
        + per_arrival_token_s * (prompt tokens of arrivals) + per_finish_s * finished
        + per_waiting_s * waiting
        + per_scanned_token_s * (prompt tokens of waiting requests the policy scans)

(every policy call an engine makes in a step - arrivals, admission, completions - is
measured into that step).
A `radix-lpm` policy scans every waiting request's tokens unless more than 128 wait (its FCFS
fallback), a `radix-dfs-weight` one always does, the others never (the kind each policy class
declares, `SchedCostKind`). Coefficients are least-squares fits (non-negative) of the thread
CPU time the real policy objects took per step in calibration runs on a named host, stored
per policy class (by its registered name) with that host's provenance in
`data/sched_costs.json`; `feather.sim.sched_calibration.calibrate()` redoes it. A class with
no fit of its own is priced by the fit of its kind's stand-in (`PORT_STAND_INS`) and named in
the run's summary. Every simulation reports the measured CPU time beside the modelled one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feather.policies.base import (
    AdmissionPolicy,
    SchedCostKind,
    declared_cost_kind,
    policy_label,
)
from feather.policies.registry import resolve_scheduler
from feather.sim.linear_fit import nnls, r_squared
from feather.sim.sched_measured import (
    COST_MODELS,
    RELEASES,
    MeasuredCostModel,
    load_measured,
)

DATA = Path(__file__).with_name("data") / "sched_costs.json"
SCANS = {SchedCostKind.RADIX_LPM: "up_to_128", SchedCostKind.RADIX_DFS_WEIGHT: "always"}
# the calibrated policy whose fit prices a class of that kind without a fit of its own
PORT_STAND_INS = {
    SchedCostKind.FIFO: "fcfs",
    SchedCostKind.RADIX_LPM: "lpm",
    SchedCostKind.RADIX_DFS_WEIGHT: "dfs-weight",
    SchedCostKind.CHT: "feather-static",
    SchedCostKind.PLAN: "batches",
}


@dataclass(frozen=True)
class StepWork:
    """What a policy (and the engine's prefix lookups) was asked to do in one engine step.

    policy_pass: the step runs the policy's scheduling pass where the real engine would
    (SGLang calls calc_priority only if requests wait and the batch is not full, or a
    chunked prefill continues; our vLLM scheduler asks the policy only if nothing was
    preempted and the token budget and running limit leave room). waiting, waiting_tokens:
    the queue that pass sees. candidates: requests the engine looked up in its prefix cache
    (offered by the policy), with their prompt and cache-hit tokens; decisions: the
    policy's ADD/STOP answers; tree_nodes: nodes of the policy's prefix tree (0 without).
    """

    candidates: int = 0
    arrivals: int = 0
    arrival_tokens: int = 0
    finished: int = 0
    waiting: int = 0
    waiting_tokens: int = 0
    policy_pass: bool = False
    decisions: int = 0
    candidate_tokens: int = 0
    candidate_hit_tokens: int = 0
    tree_nodes: int = 0


@dataclass(frozen=True)
class Coefficients:
    per_step_s: float = 0.0
    per_candidate_s: float = 0.0
    per_arrival_s: float = 0.0
    per_arrival_token_s: float = 0.0
    per_finish_s: float = 0.0
    per_waiting_s: float = 0.0
    per_scanned_token_s: float = 0.0


def _features(kind: SchedCostKind, work: StepWork) -> list[float]:
    return [
        1.0,
        work.candidates,
        work.arrivals,
        work.arrival_tokens,
        work.finished,
        work.waiting,
        scanned_tokens(kind, work.waiting, work.waiting_tokens),
    ]


def scanned_tokens(kind: SchedCostKind, waiting: int, waiting_tokens: int) -> int:
    scan = SCANS.get(kind, "never")
    if scan == "always" or (scan == "up_to_128" and waiting <= 128):
        return waiting_tokens
    return 0


class SchedulingCostModel:
    """The `port` model: callable (policy class, StepWork) -> seconds. A class with its own
    fit is priced by it; any other by the fit of its kind's stand-in (`stand_ins`), and
    named in `uncalibrated`. An empty table prices nothing (`zero`)."""

    def __init__(
        self,
        table: Mapping[type[AdmissionPolicy], Coefficients],
        source: dict[str, Any] | None = None,
        stand_ins: Mapping[SchedCostKind, type[AdmissionPolicy]] | None = None,
    ) -> None:
        self.table = dict(table)
        self.source = source or {}
        self.stand_ins = dict(stand_ins or {})
        self.uncalibrated: set[str] = set()

    @classmethod
    def zero(cls) -> SchedulingCostModel:
        return cls({}, {"note": "scheduling time not modelled"})

    @classmethod
    def default(cls) -> SchedulingCostModel:
        data = json.loads(DATA.read_text())
        # the data names each fit by the registered name of the policy that was calibrated
        table = {resolve_scheduler(n): Coefficients(**c) for n, c in data["coefficients"].items()}
        stand_ins = {kind: resolve_scheduler(name) for kind, name in PORT_STAND_INS.items()}
        source = {k: v for k, v in data.items() if k != "coefficients"}
        return cls(table, {"name": "port", "data": DATA.name, **source}, stand_ins)

    def __call__(self, policy: type[AdmissionPolicy], work: StepWork) -> float:
        if not self.table:
            return 0.0
        kind = declared_cost_kind(policy)
        c = self.table.get(policy)
        if c is None:
            self.uncalibrated.add(policy_label(policy))
            c = self.table[self.stand_ins[kind]]
        return float(np.dot(list(asdict(c).values()), _features(kind, work)))


def cost_model(
    name: str,
    mode: str = "vllm",
    block_size: int = 16,
    measured: Path | None = None,
) -> SchedulingCostModel | MeasuredCostModel:
    """The named scheduling-cost model for an engine mode (`COST_MODELS`); `measured`: a
    refitted data file in place of the committed one."""
    if name == "port":
        return SchedulingCostModel.default()
    if name == "none":
        return SchedulingCostModel.zero()
    if name not in RELEASES:
        raise ValueError(
            f"unknown scheduling-cost model {name!r}; known: {', '.join(COST_MODELS)}"
        )
    data = load_measured(measured) if measured is not None else load_measured()
    return MeasuredCostModel(name, data, mode, block_size)


def fit(rows: list[tuple[StepWork, float]], kind: SchedCostKind) -> tuple[Coefficients, float]:
    """Non-negative least squares of measured CPU seconds on the step's work of a policy of
    that kind; returns the fit's R^2 too."""
    x = np.array([_features(kind, work) for work, _ in rows], dtype=float)
    y = np.array([cpu for _, cpu in rows], dtype=float)
    coefficients = nnls(x, y)
    return Coefficients(*coefficients.tolist()), r_squared(y, x @ coefficients)
