"""How far a learner's training has come, as both trainers record it (the simulator's,
feather/sim/training.py, and the real engine's, feather/engines/vllm/learning.py): the
workload a seed builds (each loaded once), the greedy actions that changed from run to run,
and convergence."""

from __future__ import annotations

from typing import Any

from feather.workloads import Workload, load_workload

CONVERGENCE_RUNS = 3  # K: greedy actions unchanged over the last K training runs


def workload_for_seed(spec: str, seed: int) -> str:
    """The workload spec built with this seed (`{seed}` filled in)."""
    return spec.replace("{seed}", str(seed))


class WorkloadCache:
    """Loads each (spec, seed) once: a trainer runs the same workloads round after round."""

    def __init__(self) -> None:
        self._cache: dict[str, Workload] = {}

    def get(self, spec: str) -> Workload:
        if spec not in self._cache:
            self._cache[spec] = load_workload(spec)
        return self._cache[spec]


def greedy_changes(greedy_history: list[dict[str, str]]) -> int:
    """States whose greedy action differs from the previous run's (new states not counted)."""
    if len(greedy_history) < 2:
        return 0
    before, now = greedy_history[-2], greedy_history[-1]
    return sum(1 for k, a in now.items() if k in before and before[k] != a)


def convergence(greedy_history: list[dict[str, str]], k: int) -> dict[str, Any]:
    """Converged: over the last k runs no visited state changed its greedy action and no new
    state appeared (the final table's actions held for k runs). Actions converged: no state
    changed its action over the last k runs, new states allowed (the issue's reading)."""
    final = greedy_history[-1] if greedy_history else {}
    stable_runs = 0
    for earlier in reversed(greedy_history[:-1]):
        if earlier != final:
            break
        stable_runs += 1
    last_change = len(greedy_history) - stable_runs  # 1-based run after which nothing changed
    # the weaker reading: no state seen before changed its action (rare states may still be
    # found for the first time, taking the default ADD until credited)
    actions_stable_runs = 0
    for end in range(len(greedy_history), 1, -1):
        if greedy_changes(greedy_history[:end]):
            break
        actions_stable_runs += 1
    return {
        "k": k,
        "runs": len(greedy_history),
        "stable_runs": stable_runs,
        "last_change_run": last_change,
        "converged": len(greedy_history) > k and stable_runs >= k,
        "actions_stable_runs": actions_stable_runs,
        "actions_converged": len(greedy_history) > k and actions_stable_runs >= k,
        "new_states_last_k": (
            len(set(final) - set(greedy_history[-k - 1])) if len(greedy_history) > k else None
        ),
    }
