"""Training protocol for the learned Feather policies (UCB, Q-learning), on the simulator.

1. Train: one policy object learns online through consecutive simulated runs, seed-major -
   round r runs every training workload built with the r-th training seed, so a change of
   throughput between rounds is learning, not a change of workload. Each run is paired with
   `feather-static` on the same workload and seed (the learning curve is their ratio). After
   every run the greedy action of every state seen so far is recorded: the table has
   converged when no visited state's greedy action changed over the last K runs. A run's
   last decisions are credited with its own steps when it ends (`end_episode`), never with
   the next run's.
2. Freeze: the saved table is loaded with `frozen=True` (greedy, no updates); its file's
   SHA-256 is recorded in the provenance of every run that uses it.
3. Evaluate: frozen learner, `feather-static`, `feather-reference` and FCFS run the held-out
   workloads, each built with every held-out seed. A workload spec may hold `{seed}`
   (e.g. `synthetic:...,seed={seed}`): the seed then builds a different workload (token
   ids, arrival order); a spec without it is the same workload under every seed and is
   refused when more than one seed is asked for, so error bars over seeds are never zero by
   construction. If learning does not beat the static rule, the report says so - it is the
   honest outcome, not a failure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from feather.learning_progress import (
    CONVERGENCE_RUNS,
    WorkloadCache,
    convergence,
    greedy_changes,
    workload_for_seed,
)
from feather.policies import create_engine_policy
from feather.policies.learned import FeatherLearningPolicy
from feather.policies.registry import LEARNERS  # what `train` trains
from feather.sim.run import SimulationSpec, simulate
from feather.workloads import Workload


def _check_seeded(specs: Sequence[str], seeds: Sequence[int], what: str) -> None:
    if len(set(seeds)) > 1:
        fixed = [s for s in specs if "{seed}" not in s]
        if fixed:
            raise ValueError(
                f"{what} workload {fixed[0]!r} has no {{seed}}: every seed would run the same "
                "workload (write seed={seed} in the spec)"
            )


def _throughput(spec: SimulationSpec, workload: Workload, **changes: Any) -> float:
    return simulate(replace(spec, **changes), workload=workload).summary["output_tok_s"]


def train(
    learner: str,
    base: SimulationSpec,
    workloads: Sequence[str],
    seeds: Sequence[int],
    out: str | Path,
    params: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    convergence_runs: int = CONVERGENCE_RUNS,
) -> dict[str, Any]:
    """Train `learner` online over seeds x workloads (seed-major); save its table to `out`."""
    if learner not in LEARNERS:
        raise ValueError(f"can only train {', '.join(LEARNERS)}, not {learner!r}")
    if not workloads or not seeds:
        raise ValueError("training needs at least one workload and one seed")
    _check_seeded(workloads, seeds, "training")
    policy = create_engine_policy(
        learner, params, block_size=base.block_size, seed=seeds[0]
    )
    assert isinstance(policy, FeatherLearningPolicy)
    policy.trained_on = {
        "hardware": base.hardware,
        "model": base.model,
        "kernel": base.kernel,
        "engine_mode": base.engine_mode,
    }
    cache = WorkloadCache()
    history: list[dict[str, Any]] = []
    greedy_history: list[dict[str, str]] = []
    for round_index, seed in enumerate(seeds):
        for template in workloads:
            workload_spec = workload_for_seed(template, seed)
            workload = cache.get(workload_spec)
            spec = replace(base, workload=workload_spec, scheduler=learner, seed=seed)
            decisions_before = policy.decisions_taken
            result = simulate(spec, workload=workload, policy=policy)
            policy.end_episode()  # this run's last decisions judged on this run's steps
            static = _throughput(spec, workload, scheduler="feather-static", scheduler_params={})
            tok_s = result.summary["output_tok_s"]
            greedy = {k: v["action"] for k, v in policy.greedy_policy().items()}
            greedy_history.append(greedy)
            history.append(
                {
                    "run": len(history) + 1,
                    "round": round_index,
                    "workload": template,
                    "seed": seed,
                    "output_tok_s": tok_s,
                    "static_tok_s": static,
                    "ratio_to_static": tok_s / static if static else None,
                    "updates": policy.updates,
                    "decisions": policy.decisions_taken - decisions_before,
                    "states_visited": len(greedy),
                    "greedy_changes": greedy_changes(greedy_history),
                }
            )
            if progress is not None:
                progress(
                    f"round {round_index} {template} seed {seed}: {tok_s:,.0f} tok/s "
                    f"({tok_s / static:.3f}x feather-static), {policy.updates} updates, "
                    f"{len(greedy)} states"
                )
    path = policy.save(out)
    table = policy.greedy_policy()
    return {
        "learner": learner,
        "policy_file": str(path),
        "trained_on": policy.trained_on,
        "history": history,
        "states": len(table),
        "policy": table,
        "convergence": convergence(greedy_history, convergence_runs),
    }


def evaluate(
    policy_file: str | Path,
    learner: str,
    base: SimulationSpec,
    workloads: Sequence[str],
    seeds: Sequence[int],
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Frozen learner vs feather-static and FCFS on held-out workloads, each under every seed.
    `params`: the learner's parameters besides its table (e.g. consult), as in training."""
    _check_seeded(workloads, seeds, "held-out")
    cache = WorkloadCache()
    rows = []
    for template in workloads:
        for seed in seeds:
            workload_spec = workload_for_seed(template, seed)
            workload = cache.get(workload_spec)
            spec = replace(base, workload=workload_spec, seed=seed)
            static = _throughput(spec, workload, scheduler="feather-static", scheduler_params={})
            fcfs = _throughput(spec, workload, scheduler="fcfs", scheduler_params={})
            reference = _throughput(
                spec, workload, scheduler="feather-reference", scheduler_params={}
            )
            frozen = simulate(
                replace(
                    spec,
                    scheduler=learner,
                    scheduler_params={
                        **(params or {}),
                        "policy_file": str(policy_file),
                        "frozen": True,
                    },
                ),
                workload=workload,
            )
            learned = frozen.summary["output_tok_s"]
            rows.append(
                {
                    "workload": template,
                    "seed": seed,
                    "static_tok_s": static,
                    "fcfs_tok_s": fcfs,
                    "reference_tok_s": reference,
                    "learned_tok_s": learned,
                    "ratio": learned / static,
                    "ratio_to_fcfs": learned / fcfs,
                    "ratio_to_reference": learned / reference,
                    "static_to_fcfs": static / fcfs,
                    "reference_to_fcfs": reference / fcfs,
                    "stop_decisions": int(
                        sum(frozen.trace.column("decisions_stop").to_pylist())
                    ),
                    "policy_file_sha256": frozen.summary["provenance"]["policy"]["params"][
                        "policy_file_sha256"
                    ],
                }
            )
    ratios = [r["ratio"] for r in rows]
    per_workload = {}
    for template in workloads:
        mine = [r for r in rows if r["workload"] == template]
        per_workload[template] = {
            key: {
                "mean": statistics.fmean(r[key] for r in mine),
                "min": min(r[key] for r in mine),
                "max": max(r[key] for r in mine),
            }
            for key in (
                "ratio",
                "ratio_to_fcfs",
                "ratio_to_reference",
                "static_to_fcfs",
                "reference_to_fcfs",
            )
        }
    return {
        "learner": learner,
        "policy_file": str(policy_file),
        "seeds": list(seeds),
        "runs": rows,
        "per_workload": per_workload,
        "mean_ratio": statistics.fmean(ratios) if ratios else None,
        "learned_beats_static": bool(ratios) and statistics.fmean(ratios) > 1.0,
    }
