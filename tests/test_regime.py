"""The regime labels of a run (feather/workloads/regime.py): distinct shared-prefix tokens
against a brute-force trie, the arrival labels from provenance, the KV pool as a fraction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.sim.run import SimulationSpec, simulate
from feather.workloads import load_workload
from feather.workloads.regime import arrival_regime, distinct_shared_prefix_tokens
from feather.workloads.schema import WorkloadRequest


def _request(i: int, ids: list[int]) -> WorkloadRequest:
    return WorkloadRequest(f"r{i}", "t", "t", ["g"], [0], np.asarray(ids, dtype=np.int32), 1)


def _brute_force(prompts: list[list[int]]) -> int:
    """Prefixes (as tuples) that two or more prompts start with."""
    seen: dict[tuple[int, ...], int] = {}
    for p in prompts:
        for k in range(1, len(p) + 1):
            seen[tuple(p[:k])] = seen.get(tuple(p[:k]), 0) + 1
    return sum(1 for n in seen.values() if n >= 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=0, max_size=9))
def test_distinct_shared_prefix_tokens_matches_a_trie(prompts: list[list[int]]) -> None:
    requests = [_request(i, p) for i, p in enumerate(prompts)]
    assert distinct_shared_prefix_tokens(requests) == _brute_force(prompts)


def test_nested_sharing_is_counted_once() -> None:
    w = load_workload("synthetic:groups=5,per_group=3,prefix=200,system=50,suffix=10,seed=4")
    assert distinct_shared_prefix_tokens(w.requests) == 50 + 5 * 150
    assert w.statistics["distinct_shared_prefix_tokens"] == 800


def test_arrival_labels_come_from_provenance() -> None:
    w = load_workload("synthetic:groups=2,per_group=2,prefix=10,order=grouped,output=7,seed=9")
    assert arrival_regime(w.provenance) == {
        "arrival_order": "grouped", "order_seed": 9, "output_regime": "7", "arrival": "all",
        "load_factor": None,
    }
    retimed = {"retimed": {"base": w.provenance, "arrival": "poisson:2.5", "load_factor": 0.5}}
    assert arrival_regime(retimed)["arrival"] == "poisson:2.5"
    assert arrival_regime(retimed)["arrival_order"] == "grouped"
    assert arrival_regime(retimed)["load_factor"] == 0.5


def test_a_kv_pool_fraction_sizes_the_pool_from_the_shared_prefixes() -> None:
    workload = "synthetic:groups=4,per_group=6,prefix=1000,suffix=20,output=8,seed=1"
    base = {"workload": workload, "scheduler": "fcfs", "hardware": "a100-80gb",
            "model": "llama-3.1-8b"}
    s = simulate(SimulationSpec(**base, kv_pool_fraction=0.5)).summary
    assert s["distinct_shared_prefix_tokens"] == 4000
    assert s["kv_pool_tokens"] == 2000 and s["pool_to_prefix_ratio"] == 0.5
    assert s["pool_hypothetical"] is False
    huge = simulate(SimulationSpec(**base, kv_pool_fraction=1e4)).summary
    assert huge["pool_hypothetical"] is True  # more than an A100's memory holds
    with pytest.raises(ValueError, match="not both"):
        SimulationSpec(**base, kv_pool_fraction=0.5, num_blocks=10)
    with pytest.raises(ValueError, match="shares no prefix"):
        simulate(SimulationSpec(**{**base, "workload": workload + ",unshared=1.0"},
                                kv_pool_fraction=0.5))
