"""Retiming a built workload (feather/workloads/retime.py): same requests and order, new
arrivals; Poisson at a fraction of a measured capacity, with the capacity run recorded."""

from __future__ import annotations

import json

import pytest

from feather.cli import main
from feather.workloads import load_workload, read_workload, write_workload
from feather.workloads.regime import arrival_regime
from feather.workloads.schema import WorkloadError

SPEC = "synthetic:groups=4,per_group=50,prefix=200,suffix=10,output=8,order=shuffled,seed=5"


def _capacity(tmp_path, rate: float, arrival: str = "all"):
    path = tmp_path / "fcfs" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"requests_s": rate, "arrival": arrival, "provenance": {
        "config": {"scheduler": "fcfs", "hardware": "a100-80gb", "model": "m"}}}))
    return path


def test_retimed_at_load_keeps_the_requests_and_draws_poisson_arrivals(tmp_path) -> None:
    base_path = write_workload(load_workload(SPEC), tmp_path / "base.parquet")
    capacity = _capacity(tmp_path, 40.0)
    out = tmp_path / "load.parquet"
    assert main(["workload", "retime", str(base_path), "--load", "0.5", "--capacity",
                 str(capacity), "--seed", "3", "--out", str(out)]) == 0
    base, retimed = read_workload(base_path), read_workload(out)
    assert [r.request_id for r in retimed.requests] == [r.request_id for r in base.requests]
    assert all((a.prompt_token_ids == b.prompt_token_ids).all() and a.output_len == b.output_len
               for a, b in zip(base.requests, retimed.requests, strict=True))
    times = [r.arrival_time_s for r in retimed.requests]
    assert times == sorted(times) and times[0] == 0.0
    mean_gap = times[-1] / (len(times) - 1)
    assert mean_gap == pytest.approx(1 / 20.0, rel=0.2)  # 0.5 x 40 requests/s
    labels = arrival_regime(retimed.provenance)
    assert labels["load_factor"] == 0.5 and labels["arrival"] == "poisson:20"
    assert labels["arrival_order"] == "shuffled" and labels["order_seed"] == 5
    recorded = retimed.provenance["retimed"]["capacity"]
    assert recorded["requests_s"] == 40.0 and len(recorded["summary_sha256"]) == 64
    again = tmp_path / "again.parquet"
    main(["workload", "retime", str(base_path), "--load", "0.5", "--capacity", str(capacity),
          "--seed", "3", "--out", str(again)])
    assert [r.arrival_time_s for r in read_workload(again).requests] == times  # seeded


def test_a_capacity_that_is_not_an_offline_run_is_refused(tmp_path) -> None:
    base = load_workload(SPEC)
    from feather.workloads.retime import retime_at_load

    with pytest.raises(WorkloadError, match="not offline"):
        retime_at_load(base, _capacity(tmp_path, 5.0, arrival="poisson:3"), 0.5)
    with pytest.raises(WorkloadError, match="requests_s"):
        retime_at_load(base, _capacity(tmp_path, 0.0), 0.5)
    with pytest.raises(WorkloadError, match="load factor"):
        retime_at_load(base, _capacity(tmp_path, 5.0), 0.0)
