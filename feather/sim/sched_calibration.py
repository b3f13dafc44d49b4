"""Refit the scheduling-time model: every policy through the simulator's engine on small
calibration workloads, its measured CPU time per step fitted to the step's work.

Kept apart from `sched_cost` (the model the engine prices steps with) because it drives the
engine itself.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from feather.atomic import write_json_atomic
from feather.policies import create_scheduler, resolve_scheduler
from feather.policies.base import declared_cost_kind
from feather.policies.registry import scheduler_parameters
from feather.provenance import collect_provenance
from feather.sim.engine import Engine, EngineConfig
from feather.sim.sched_cost import DATA, fit
from feather.workloads import load_workload


def calibrate(policies: list[str] | None = None, out: Path = DATA) -> dict[str, Any]:
    """Run every policy through the engine on calibration workloads, fit, write `out`."""
    names = policies or [
        "fcfs",
        "lpm",
        "dfs-weight",
        "feather-static",
        "feather-ucb",
        "feather-qlearn",
        "batches",
    ]
    specs = [
        "synthetic:groups=16,per_group=40,prefix=2000,suffix=50,output=16,order=shuffled,seed=11",
        "synthetic:groups=4,per_group=120,prefix=500,suffix=20,output=8,order=shuffled,seed=12",
    ]
    coefficients, quality = {}, {}
    for name in names:
        cls = resolve_scheduler(name)
        # chunk-based policies on the engine's 16-token blocks (EngineConfig's default)
        params = {"chunk_size": 16} if "chunk_size" in scheduler_parameters(cls) else {}
        rows = []
        for spec in specs:
            workload = load_workload(spec)
            policy = create_scheduler(name, **params)
            policy.bind_workload(workload.requests)
            engine = Engine(
                workload.requests,
                policy,
                EngineConfig(num_blocks=40_000, max_num_seqs=64),
                lambda batch: SimpleNamespace(time_s=1e-3),
                lambda *a: 0.0,
            )
            for step in engine.run().steps:
                rows.append((step.work, step.sched_cpu_s))
        fitted, r2 = fit(rows, declared_cost_kind(cls))
        coefficients[name] = asdict(fitted)
        quality[name] = {"r2": r2, "steps": len(rows)}
    data = {
        "format": "feather-sched-costs/1",
        "calibration_workloads": specs,
        "fit_quality": quality,
        "provenance": collect_provenance(config={"policies": names, "workloads": specs}),
        "coefficients": coefficients,
    }
    write_json_atomic(out, data)
    return data
