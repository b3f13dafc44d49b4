"""Training protocol for the learned Feather policies (UCB, Q-learning), on the simulator.

1. Train: one policy object learns online through consecutive simulated runs - every
   training workload under every training seed, in that order - and is saved as JSON.
2. Freeze: the saved table is loaded with `frozen=True` (greedy, no updates); its file's
   SHA-256 is recorded in the provenance of every run that uses it.
3. Evaluate: frozen learner and `feather-static` run the held-out workloads and seeds;
   the report gives both throughputs per run and their ratio. If learning does not beat the
   static rule, the report says so - it is the honest outcome, not a failure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from feather.policies import create_scheduler
from feather.sim.run import SimulationSpec, simulate
from feather.workloads import load_workload

LEARNERS = ("feather-ucb", "feather-qlearn")


def train(
    learner: str,
    base: SimulationSpec,
    workloads: Sequence[str],
    seeds: Sequence[int],
    out: str | Path,
    params: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train `learner` online over workloads x seeds; save its table to `out`."""
    if learner not in LEARNERS:
        raise ValueError(f"can only train {', '.join(LEARNERS)}, not {learner!r}")
    policy = create_scheduler(
        learner, chunk_size=base.block_size, seed=seeds[0] if seeds else 0, **(params or {})
    )
    history = []
    for workload_spec in workloads:
        workload = load_workload(workload_spec)
        for seed in seeds:
            spec = replace(base, workload=workload_spec, scheduler=learner, seed=seed)
            result = simulate(spec, workload=workload, policy=policy)
            history.append(
                {
                    "workload": workload_spec,
                    "seed": seed,
                    "output_tok_s": result.summary["output_tok_s"],
                    "updates": policy.updates,
                }
            )
            if progress is not None:
                progress(
                    f"trained on {workload_spec} seed {seed}: "
                    f"{result.summary['output_tok_s']:,.0f} tok/s, {policy.updates} updates"
                )
    path = policy.save(out)
    return {
        "learner": learner,
        "policy_file": str(path),
        "history": history,
        "states": len(policy.table.to_json()),
    }


def evaluate(
    policy_file: str | Path,
    learner: str,
    base: SimulationSpec,
    workloads: Sequence[str],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Frozen learner vs feather-static on held-out workloads and seeds."""
    rows = []
    for workload_spec in workloads:
        workload = load_workload(workload_spec)
        for seed in seeds:
            spec = replace(base, workload=workload_spec, seed=seed)
            static = simulate(replace(spec, scheduler="feather-static"), workload=workload)
            frozen = simulate(
                replace(
                    spec,
                    scheduler=learner,
                    scheduler_params={"policy_file": str(policy_file), "frozen": True},
                ),
                workload=workload,
            )
            rows.append(
                {
                    "workload": workload_spec,
                    "seed": seed,
                    "static_tok_s": static.summary["output_tok_s"],
                    "learned_tok_s": frozen.summary["output_tok_s"],
                    "ratio": frozen.summary["output_tok_s"] / static.summary["output_tok_s"],
                    "policy_file_sha256": frozen.summary["provenance"]["policy"]["params"][
                        "policy_file_sha256"
                    ],
                }
            )
    ratios = [r["ratio"] for r in rows]
    return {
        "learner": learner,
        "policy_file": str(policy_file),
        "runs": rows,
        "mean_ratio": statistics.fmean(ratios) if ratios else None,
        "learned_beats_static": bool(ratios) and statistics.fmean(ratios) > 1.0,
    }
