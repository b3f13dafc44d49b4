"""The C5 tables (feather/pipeline/c5_tables.py) compare schedulers on the same workload only.

The full sweep runs the prefix buckets and LongBench-format workloads beside whole L-Eval with
the same order, seed, outputs and pool; a ratio must still divide by its own workload's FCFS,
and every summary must keep the workloads apart."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from feather.claims import c5
from feather.claims.base import Evidence
from feather.pipeline import c5_tables as c5t

WHOLE = "data/workloads/leval__min=1000-max=10000-order=shuffled-seed=0__llama-3.1-8b.parquet"
BUCKET = "data/workloads/leval__min=8000-max=10000-order=shuffled-seed=0__llama-3.1-8b.parquet"


@pytest.mark.parametrize(
    ("path", "family"),
    [
        (WHOLE, "leval min=1000 max=10000"),
        (BUCKET, "leval min=8000 max=10000"),
        ("data/workloads/leval__min=1000-max=10000-order=grouped-output=256__qwen2.5-7b.parquet",
         "leval min=1000 max=10000"),
        ("data/workloads/longbench-format__prefix=8000-order=shuffled-seed=2__qwen2.5-7b.parquet",
         "longbench-format prefix=8000"),
        ("synthetic:groups=8,per_group=100", "synthetic:groups=8,per_group=100"),
    ],
)
def test_a_workloads_family_drops_only_its_order_seed_and_outputs(path, family) -> None:
    assert c5t.workload_family(path) == family


def _row(workload: str, scheduler: str, tok_s: float) -> dict:
    return {
        "engine": "sim", "experiment": "c5", "run": f"{scheduler}", "arrival": "all",
        "workload": workload, "hardware": "a100-80gb", "model": "llama-3.1-8b",
        "engine_mode": "vllm", "arrival_order": "shuffled", "order_seed": 0,
        "output_regime": "reference", "kv_pool_tokens": 450_000, "pool_to_prefix_ratio": 0.5,
        "pool_hypothetical": False, "scheduler": scheduler, "output_tok_s": tok_s,
        "kernel": "paged", "params": "{}", "produced_by": "simulator (a100-80gb profile)",
        "git_revision": "abc", "makespan_s": 100.0, "time_recompute_s": 10.0,
        "l2_hit_rate": 0.5, "kv_read_bytes": 1.0, "sched_cost_model": "port",
    }


def _two_workloads() -> pd.DataFrame:
    rows = []
    for workload, fcfs, feather in ((WHOLE, 100.0, 300.0), (BUCKET, 10.0, 5.0)):
        rows += [_row(workload, "fcfs", fcfs), _row(workload, "lpm", fcfs),
                 _row(workload, "dfs-weight", fcfs), _row(workload, "feather-static", feather)]
    return pd.DataFrame(rows)


def test_ratios_divide_by_the_same_workloads_fcfs() -> None:
    data = c5t.with_ratios(c5t.offline(_two_workloads(), "c5"))
    static = data[data.scheduler == "feather-static"].set_index("workload_family").vs_fcfs
    # pooled over both workloads, FCFS would be 55 tok/s: 5.45x and 0.09x
    assert static.to_dict() == {"leval min=1000 max=10000": 3.0, "leval min=8000 max=10000": 0.5}


def test_summaries_keep_each_workload_apart() -> None:
    table = _two_workloads()
    lines = [line for line in c5.c5_lines(table, "c5") if "/ fcfs" in line]
    assert len(lines) == 2
    assert any(line.startswith("leval min=1000 max=10000,") and "= 3.00x" in line
               for line in lines)
    assert any(line.startswith("leval min=8000 max=10000,") and "= 0.50x" in line
               for line in lines)
    simulated = c5.verdict(Evidence(table)).grades[0].text
    assert "/ fcfs 0.50x-3.00x" in simulated


def test_a_tie_names_feather_static_not_a_learner_that_made_its_decisions() -> None:
    table = _two_workloads()
    twins = table[table.scheduler == "feather-static"].assign(scheduler="feather-qlearn")
    better = table[(table.scheduler == "feather-static") & (table.workload == BUCKET)]
    table = pd.concat([table, twins, better.assign(scheduler="feather-ucb", output_tok_s=6.0)])
    data = c5t.with_ratios(c5t.offline(table, "c5"))
    best = c5t.best_feather(data, "fcfs", ["workload_family"]).set_index("workload_family")
    assert best.scheduler.to_dict() == {"leval min=1000 max=10000": "feather-static",
                                        "leval min=8000 max=10000": "feather-ucb"}
    assert best["mean"].round(2).to_dict() == {"leval min=1000 max=10000": 3.0,
                                               "leval min=8000 max=10000": 0.6}


def test_a_synthetic_family_is_named_by_what_it_sets_less_its_regime() -> None:
    spec = ("synthetic:groups=128,per_group=8,prefix=6000,suffix=100,suffix_spread=0.9,"
            "output=32,order=shuffled,seed=2")
    assert c5t.workload_family(spec) == spec  # its own family: seeds are not pooled
    assert c5t.family_label(spec) == (
        "synthetic groups=128 per_group=8 prefix=6000 suffix_spread=0.9")
    assert c5t.family_label("leval min=1000 max=10000") == "leval min=1000 max=10000"
    assert c5t.family_label("synthetic:nonsense=1") == "synthetic:nonsense=1"


def _with_control(control: float, feather: float) -> pd.DataFrame:
    rows = []
    for seed, jitter in ((0, 1.0), (1, 1.1)):
        for scheduler, tok_s in (("fcfs", 100.0), ("lpm", 100.0), ("dfs-weight", 100.0),
                                 ("feather-static", feather * jitter),
                                 ("feather-ucb", feather * 0.5),
                                 (c5t.CONTROL, control * jitter)):
            rows.append({**_row(WHOLE, scheduler, tok_s), "order_seed": seed})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("control", "feather", "feather_vs_control", "share"),
    [(310.0, 300.0, 300 / 310, 1.0),  # the control ahead of Feather: all of the gain is order
     (102.0, 300.0, 300 / 102, 0.06)],  # the control near FCFS: the gain is prefix awareness
)
def test_the_control_splits_feathers_gain_and_never_counts_as_feather(
        control, feather, feather_vs_control, share) -> None:
    data = c5t.with_ratios(c5t.offline(_with_control(control, feather), "c5"))
    assert set(c5t.feather_rows(data).scheduler) == {"feather-static", "feather-ucb"}
    best = c5t.best_feather(data, "fcfs", ["workload_family"])
    assert list(best.scheduler) == ["feather-static"]  # never the control, even ahead
    (row,) = c5t.control_split(data, ["workload_family"]).itertuples()
    assert row.control_vs_fcfs == pytest.approx(control * 1.05 / 100)
    assert row.feather_vs_fcfs == pytest.approx(feather * 1.05 / 100)
    assert row.feather_vs_control == pytest.approx(feather_vs_control)
    expected = math.log(control * 1.05 / 100) / math.log(feather * 1.05 / 100)
    assert row.order_share == pytest.approx(expected)
    assert min(1.0, row.order_share) == pytest.approx(share, abs=0.01)


def test_no_control_no_split() -> None:
    data = c5t.with_ratios(c5t.offline(_two_workloads(), "c5"))
    assert c5t.control_split(data, ["workload_family"]).empty
