"""`feather bench sim`: the simulator's own cost, against the work it simulates.

Runs FCFS on C1-shaped synthetic workloads of growing size (8 groups, 4,000-token prefixes,
128 output tokens; per-group requests doubling) on the A100 profile and reports wall time
per simulated sequence-step (steps x sequences per step): about constant means the cost
grows linearly with steps x batch size.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from feather.sim.run import SimulationSpec, simulate


def run(per_group_sizes: list[int], progress: Callable[[str], None] | None = None) -> list[dict]:
    rows = []
    for per_group in per_group_sizes:
        workload = (
            f"synthetic:groups=8,per_group={per_group},prefix=4000,suffix=100,"
            f"output=128,order=shuffled,seed=0"
        )
        spec = SimulationSpec(
            workload=workload,
            scheduler="fcfs",
            hardware="a100-80gb",
            model="llama-3.1-8b",
            max_num_seqs=1024,
        )
        t0 = time.perf_counter()
        result = simulate(spec)
        wall = time.perf_counter() - t0
        seq_steps = sum(len(s.batch.seqs) for s in result.engine.steps)
        rows.append(
            {
                "requests": 8 * per_group,
                "steps": len(result.engine.steps),
                "sequence_steps": seq_steps,
                "wall_s": wall,
                "us_per_sequence_step": wall / seq_steps * 1e6,
            }
        )
        if progress is not None:
            progress(f"{8 * per_group} requests: {wall:.2f} s")
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'requests':>9} {'steps':>7} {'seq-steps':>10} {'wall s':>8} {'us/seq-step':>12}"]
    lines += [
        f"{r['requests']:>9,} {r['steps']:>7,} {r['sequence_steps']:>10,} "
        f"{r['wall_s']:>8.2f} {r['us_per_sequence_step']:>12.2f}"
        for r in rows
    ]
    return "\n".join(lines)
