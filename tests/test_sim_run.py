"""Simulation runs end to end: determinism, outputs, errors, oracle, training, CLI."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from feather.cli import main
from feather.learning_progress import convergence
from feather.policies import UnknownSchedulerError
from feather.sim.run import SimulationSpec, simulate, write_run
from feather.sim.training import evaluate, train

SMALL = "synthetic:groups=4,per_group=12,prefix=1024,suffix=32,output=24,order=shuffled,seed=1"
NUMBERS = (
    "output_tok_s",
    "makespan_s",
    "kv_read_bytes",
    "sched_model_s",
    "mean_batch_size",
    "prefix_cache_hit_tokens",
    "steps",
    "ttft_s",
    "tpot_s",
    "fraction_of_oracle",
)


def spec(**changes) -> SimulationSpec:
    base = {
        "workload": SMALL,
        "scheduler": "feather-ucb",
        "hardware": "a100-80gb",
        "model": "llama-3.1-8b",
    }
    return SimulationSpec(**{**base, **changes})


def test_same_inputs_and_seed_give_identical_numbers() -> None:
    first = simulate(spec(seed=3)).summary
    second = simulate(spec(seed=3)).summary
    assert {k: first[k] for k in NUMBERS} == {k: second[k] for k in NUMBERS}
    assert first["provenance"]["config_hash"] == second["provenance"]["config_hash"]
    qlearn = [simulate(spec(scheduler="feather-qlearn", seed=s)).summary for s in (1, 1, 2)]
    assert qlearn[0]["output_tok_s"] == qlearn[1]["output_tok_s"]
    assert qlearn[0]["provenance"]["config_hash"] != qlearn[2]["provenance"]["config_hash"]


def test_run_directory_holds_trace_requests_and_summary(tmp_path) -> None:
    result = simulate(spec(scheduler="fcfs", kernel="cascade", engine_mode="sglang"))
    out = write_run(result, tmp_path / "run")
    trace = pq.read_table(out / "trace.parquet")
    requests = pq.read_table(out / "requests.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert trace.num_rows == summary["steps"] > 0
    assert {
        "step_time_s",
        "batch_size",
        "shared_prefix_tokens",
        "distinct_groups",
        "kv_read_bytes",
        "l2_hit_rate",
        "sched_model_s",
        "sched_cpu_s",
    } <= set(trace.column_names)
    assert requests.num_rows == 48
    assert sum(trace.column("sampled_tokens").to_pylist()) == summary["output_tokens"] == 48 * 24
    provenance = summary["provenance"]
    assert provenance["engine"]["name"] == "sim" and provenance["engine"]["mode"] == "sglang"
    assert provenance["simulated_hardware"]["name"] == "a100-80gb"
    assert provenance["host"]["cpu_count"] >= 1  # the machine that ran the simulation
    assert provenance["policy"]["name"] == "fcfs"


def test_the_roofline_oracle_bounds_every_schedule() -> None:
    for scheduler in ("fcfs", "feather-static", "lpm"):
        for hardware in ("a100-80gb", "rtx-6000-ada"):
            summary = simulate(spec(scheduler=scheduler, hardware=hardware)).summary
            assert 0 < summary["fraction_of_oracle"] <= 1.0


def test_without_sharing_feather_matches_fcfs_within_3_percent() -> None:
    unshared = "synthetic:groups=2,per_group=24,prefix=512,suffix=64,output=32,unshared=1.0,seed=4"
    fcfs = simulate(spec(workload=unshared, scheduler="fcfs")).summary["output_tok_s"]
    for name in ("feather-static", "feather-ucb", "feather-qlearn"):
        ratio = simulate(spec(workload=unshared, scheduler=name)).summary["output_tok_s"] / fcfs
        assert abs(ratio - 1) <= 0.03, (name, ratio)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown hardware 'b200'"):
        simulate(spec(hardware="b200"))
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        simulate(spec(model="gpt-5"))
    with pytest.raises(UnknownSchedulerError, match="unknown scheduler 'sjf'"):
        simulate(spec(scheduler="sjf"))
    with pytest.raises(ValueError, match="unknown kernel 'flash'"):
        spec(kernel="flash")
    long = "synthetic:groups=1,per_group=2,prefix=9000,suffix=10,output=8"
    with pytest.raises(ValueError, match="need more than llama-3-8b's context of 8192"):
        simulate(spec(workload=long, model="llama-3-8b"))
    with pytest.raises(ValueError, match="chunk_size 32 must equal the engine's block size 16"):
        simulate(spec(scheduler="feather-static", scheduler_params={"chunk_size": 32}))


def test_training_freezes_a_table_and_reports_held_out_runs(tmp_path) -> None:
    # cascade attention: the kernel under which Feather's rules are consulted
    base = spec(scheduler="feather-ucb", kernel="cascade")
    seeded = SMALL.replace("seed=1", "spread=0.3,seed={seed}")  # the seed changes the shape
    trained = train("feather-ucb", base, [seeded], seeds=[0, 1], out=tmp_path / "ucb.json")
    assert [h["seed"] for h in trained["history"]] == [0, 1]
    assert trained["history"][-1]["updates"] > 0 and trained["history"][0]["decisions"] > 0
    assert all(h["static_tok_s"] > 0 for h in trained["history"])
    assert trained["policy"] and all(
        v["action"] in ("ADD", "STOP") and sum(v["visits"].values()) > 0
        for v in trained["policy"].values()
    )
    assert trained["convergence"]["k"] == 3 and trained["convergence"]["runs"] == 2
    report = evaluate(tmp_path / "ucb.json", "feather-ucb", base, [seeded], seeds=[5, 6])
    assert [r["seed"] for r in report["runs"]] == [5, 6]
    assert report["runs"][0]["static_tok_s"] != report["runs"][1]["static_tok_s"] or (
        report["runs"][0]["fcfs_tok_s"] != report["runs"][1]["fcfs_tok_s"]
    )  # the seed builds a different workload
    for run in report["runs"]:
        assert run["static_tok_s"] > 0 and run["learned_tok_s"] > 0 and run["fcfs_tok_s"] > 0
        assert len(run["policy_file_sha256"]) == 64
    assert set(report["per_workload"][seeded]["ratio"]) == {"mean", "min", "max"}
    assert isinstance(report["learned_beats_static"], bool)
    with pytest.raises(ValueError, match="has no \\{seed\\}: every seed would run the same"):
        evaluate(tmp_path / "ucb.json", "feather-ucb", base, [SMALL], seeds=[5, 6])


def test_cli_simulate_prints_the_summary(tmp_path, capsys) -> None:
    code = main(
        [
            "simulate",
            "--workload",
            SMALL,
            "--scheduler",
            "feather-static",
            "--param",
            "min_batch=4",
            "--hardware",
            "h200",
            "--model",
            "qwen2.5-7b",
            "--out",
            str(tmp_path / "r"),
            "--json",
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 48 and summary["output_tok_s"] > 0
    assert (
        main(
            [
                "simulate",
                "--workload",
                SMALL,
                "--scheduler",
                "fcfs",
                "--hardware",
                "tpu",
                "--model",
                "llama-3.1-8b",
                "--out",
                str(tmp_path / "x"),
                "--quiet",
            ]
        )
        == 2
    )


def test_convergence_tells_a_changed_action_from_a_newly_found_state() -> None:
    """Greedy tables after each of 6 runs: "s" flips at run 3, a new state "t" appears at
    run 5. Strictly (the final table held for k runs) only the last run is stable; by
    actions (no seen state changed) the last three are."""
    history = [
        {"s": "ADD"},
        {"s": "ADD"},
        {"s": "STOP"},
        {"s": "STOP"},
        {"s": "STOP", "t": "ADD"},
        {"s": "STOP", "t": "ADD"},
    ]
    report = convergence(history, 3)
    assert report["stable_runs"] == 1 and report["converged"] is False
    assert report["actions_stable_runs"] == 3 and report["actions_converged"] is True
    assert report["new_states_last_k"] == 1 and report["last_change_run"] == 5
    history[4] = {"s": "ADD", "t": "ADD"}  # s flips at run 5 and back at run 6
    assert convergence(history, 3)["actions_stable_runs"] == 0


def test_on_the_cpu_profile_no_stop_rule_beats_the_chts_order_on_c1s_shape() -> None:
    """`feather bench stop --regimes cpu` on C1's real-engine shape with all four documents
    resident (200 blocks): every variant that stops, held or not, loses to Feather without
    STOP (the reference rule by 5%, the paper's from 4 or 8 requests by 13%); the rest (never
    asked where they would stop) tie with it, within the scheduling cost. FCFS is not above
    it: on this host's profile (the kv-llama fit counts cold KV against the L3) FCFS ties it,
    where the real engine gave 0.93 - the profile's known miss (docs/stop.md); on the AMD
    host's fit it was below 0.7."""
    from feather.bench import stop

    (case,) = [c for c in stop.CPU_REGIMES if c.num_blocks == 200]
    (result,) = stop.characterise([case], with_stop=stop.CPU_WITH_STOP)
    rows = result["rows"]
    assert set(rows) == {"fcfs", stop.NO_STOP[0], *(label for label, _, _ in stop.CPU_WITH_STOP)}
    assert result["case"]["block_size"] == 128 and result["case"]["hardware"] == "cpu"
    assert result["stop_pays_by"] <= 1.001
    stopping = [row for row in rows.values() if row["stop_decisions"] > 0]
    assert len(stopping) >= 6 and all(row["vs_no_stop"] < 0.96 for row in stopping)
    assert min(row["vs_no_stop"] for row in stopping) < 0.9
    assert rows["fcfs"]["vs_no_stop"] <= 1.0
