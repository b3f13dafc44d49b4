"""Collecting less changes how fast a simulation runs, never what it simulates."""

from __future__ import annotations

import json
import subprocess
import sys

# fields that are measurements of this process, not simulated numbers
MEASURED = {"provenance", "wall_s", "sched_cpu_s_measured", "sched_cpu_fraction_of_gpu_time"}

SCRIPT = """
import gc, json, sys
from feather.gc_tuning import YOUNG_THRESHOLD, collect_less
from feather.sim.run import SimulationSpec, simulate

spec = SimulationSpec(
    workload="synthetic:groups=6,per_group=30,prefix=2000,suffix=50,output=64,order=shuffled,seed=3",
    scheduler="feather-static", hardware="a100-80gb", model="llama-3.1-8b", kernel="cascade",
)
def run():
    result = simulate(spec)
    summary = {k: v for k, v in result.summary.items() if k not in set(sys.argv[1:])}
    trace = result.trace.drop_columns(["sched_cpu_s"]).to_pylist()
    return summary, trace
before = run()
collect_less()
assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
after = run()
print(json.dumps({"same_summary": before[0] == after[0], "same_trace": before[1] == after[1],
                  "steps": len(after[1])}))
"""


def test_a_simulation_is_the_same_with_fewer_collections() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *sorted(MEASURED)],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] > 50
    assert result["same_summary"] and result["same_trace"], result
