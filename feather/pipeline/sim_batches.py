"""The workflow's simulation jobs: one job per scheduler, experiment and hardware, running
that scheduler's runs one after another in one process (`feather simulate --runs`).

Why batches: one process per run spent about a third of each run starting (the interpreter,
the package, the JIT cache, the workload file) and gave the workflow 281 jobs to schedule in
a default run. Why by scheduler: a scheduler that fails (a user's class that raises) fails
its own job only, and a changed scheduler reruns only its own runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# the files a simulated run writes (feather/sim/run.py write_run), each a job's output
RUN_FILES = ("trace.parquet", "requests.parquet", "spec.json", "summary.json")


@dataclass(frozen=True)
class SimBatch:
    """One simulation job: its rule name, where its log goes, and its runs' directories."""

    name: str
    hardware: str
    experiment: str
    scheduler: str
    run_dirs: tuple[str, ...]

    @property
    def log(self) -> str:
        return f"logs/sim/{self.name}.log"

    def outputs(self) -> list[str]:
        return [f"{d}/{name}" for d in self.run_dirs for name in RUN_FILES]


def _rule_name(hardware: str, experiment: str, scheduler: str) -> str:
    return "simulate_" + re.sub(r"\W", "_", f"{experiment}_{hardware}_{scheduler}")


# At most this many runs per job: a default run's largest group (15 C5 runs on one GPU
# profile, about 1.5 minutes) stays one job; the C5 full sweep's 553 runs stay spread over
# enough jobs for a cluster to run them side by side.
MOST_RUNS = 16


def sim_batches(runs: Iterable[tuple[str, str, str, str, bool]],
                most_runs: int = MOST_RUNS) -> list[SimBatch]:
    """Batches of (run directory, hardware, experiment, scheduler label, whether its workload
    is built from another run's output), in first-seen order, at most `most_runs` runs each.
    A run of the second kind (the load sweep's: arrivals at a fraction of FCFS's measured
    capacity) goes in a batch of its own kind, so no batch waits on itself; two names that
    would collide get a number."""
    if most_runs < 1:
        raise ValueError(f"most_runs must be at least 1, not {most_runs}")
    grouped: dict[tuple[str, str, str, bool], list[str]] = {}
    for out_dir, hardware, experiment, scheduler, derived in runs:
        grouped.setdefault((hardware, experiment, scheduler, derived), []).append(out_dir)
    batches: list[SimBatch] = []
    taken: set[str] = set()
    for (hardware, experiment, scheduler, derived), dirs in grouped.items():
        base = _rule_name(hardware, experiment, scheduler) + ("_derived" if derived else "")
        for part, first in enumerate(range(0, len(dirs), most_runs), 1):
            name = base if part == 1 else f"{base}_part{part}"
            k = 1
            while name in taken:
                k += 1
                name = f"{base}_{k}" if part == 1 else f"{base}_part{part}_{k}"
            taken.add(name)
            batches.append(SimBatch(name, hardware, experiment, scheduler,
                                    tuple(dirs[first:first + most_runs])))
    return batches
