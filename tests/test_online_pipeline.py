"""The online experiment's pieces that need no engine: its spec is checked at parse time
(each mistake one message naming the key), its jobs carry the configured schedulers and the
right `feather online` flags, and the verdicts page's online row follows its stated rule."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from feather.engines.vllm.online import OnlineDataset, OnlineSweep
from feather.engines.vllm.online_cli import register
from feather.pipeline.experiments import ExperimentError
from feather.pipeline.online import load_online_jobs
from feather.pipeline.online_figure import online_verdict

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "experiments" / "online.yaml"
CONFIG = {"schedulers": {"fcfs": {}, "lpm": {}, "feather-static": {"params": {"min_batch": 4}},
                         "mine": {"class": "feather.policies.lpm:LPMPolicy"}}}


def online_document(dataset: str, schedulers, fractions, ttft_ratio: float = 1.0,
                    capacity: float = 3.9) -> str:
    """An online.json shaped like `feather online`'s: FCFS's TTFT grows with the load; the
    others' is FCFS's x `ttft_ratio` below saturation."""
    rows = []
    for scheduler in schedulers:
        scale = 1.0 if scheduler == "fcfs" else ttft_ratio
        for fraction in (*fractions, None):
            saturated = fraction is None
            ttft = (6000.0 if saturated else 500 + 800 * fraction) * (
                1.0 if scheduler == "fcfs" or not saturated else 0.4)
            ttft = ttft if saturated else ttft * scale
            throughput = (capacity if scheduler == "fcfs" else 2.4 * capacity) if saturated \
                else 0.95 * fraction * capacity
            rows.append({
                "scheduler": scheduler, "saturated": saturated, "load_fraction": fraction,
                "rate_rps": None if saturated else fraction * capacity, "completed": 24,
                "errors": 0, "request_throughput": throughput, "p50_ttft_ms": 0.6 * ttft,
                "p99_ttft_ms": ttft, "p99_tpot_ms": 14.0 + 3 * (fraction or 1.2),
                "scheduler_state_after": {"requests": 0},
                # each repeat's own p99, the repeats drifting alike for every scheduler
                "repeats_detail": [{"repeat": k, "p99_ttft_ms": ttft * (1 + 0.05 * k),
                                    "measurement": {"repeat": k, "disturbed": None}}
                                   for k in range(3)],
            })  # fmt: skip
    return json.dumps({"rows": rows, "capacity_rps": capacity, "dataset": {"label": dataset}})


def test_the_shipped_spec_expands_to_jobs_with_the_configured_schedulers() -> None:
    default = load_online_jobs(SPEC, "default", CONFIG)
    assert [j.dataset for j in default] == ["leval_online"]
    job = default[0]
    assert [label for label, _, _ in job.schedulers] == ["fcfs", "feather-static"]
    args = job.cli_args()
    assert json.loads(args[args.index("--scheduler", 2) + 1]) == {
        "label": "feather-static", "class": "feather-static", "params": {"min_batch": 4}}
    assert args[args.index("--workload") + 1] == job.workload_spec
    assert job.workload_spec.startswith("data/workloads/leval__") and "order=shuffled" in args[
        args.index("--workload") + 1]
    assert args[args.index("--load-fractions") + 1] == "0.9"
    assert args[args.index("--num-blocks") + 1] == "80"
    full = load_online_jobs(SPEC, "full", CONFIG)
    assert [j.dataset for j in full] == ["leval_online", "prefix_repetition"]
    assert [label for label, _, _ in full[0].schedulers] == list(CONFIG["schedulers"])
    repetition = full[1].cli_args()
    assert repetition[repetition.index("--prefix-repetition") + 1] == "4,2048,64,16"
    assert "--workload" not in repetition


def test_feather_online_parses_what_the_jobs_pass() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    for job in load_online_jobs(SPEC, "full", CONFIG):
        args = parser.parse_args(["online", *shlex.split(shlex.join(job.cli_args())),
                                  "--out", "x"])  # fmt: skip
        assert args.load_fractions == job.load_fractions
        assert len(args.scheduler) == len(job.schedulers)


def _repetition_without(spec: dict, key: str) -> None:
    del spec["prefix_repetition"][key]
    spec["sweeps"]["default"]["datasets"] = ["prefix_repetition"]


def test_a_sweep_gives_its_own_repeats_else_the_files(tmp_path: Path) -> None:
    spec = yaml.safe_load(SPEC.read_text())
    spec["repeats"] = 4
    spec["sweeps"]["default"]["repeats"] = 2
    spec["sweeps"]["full"].pop("repeats", None)
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert {job.repeats for job in load_online_jobs(path, "default", CONFIG)} == {2}
    assert {job.repeats for job in load_online_jobs(path, "full", CONFIG)} == {4}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda s: s["sweeps"]["default"].update(schedulers=["lpm"]), "must include fcfs"),
        (lambda s: s["sweeps"]["default"].update(schedulers=["fcfs", "nope"]), "['nope']"),
        (lambda s: s["sweeps"]["default"].update(load_fractions=[0.5, -1]), "load_fractions"),
        (lambda s: s["sweeps"]["default"].update(datasets=["absent"]), "'absent'"),
        (lambda s: s["sweeps"]["default"].pop("datasets"), "sweeps.default needs"),
        (lambda s: s["engine"].update(num_blocks=0), "engine takes whole numbers"),
        (lambda s: s["engine"].update(swap=1), "engine takes whole numbers"),
        (lambda s: s.update(surprise=1), "unknown keys ['surprise']"),
        (lambda s: _repetition_without(s, "suffix_len"), "prefix_repetition needs"),
        (lambda s: s["sweeps"]["default"].update(repeats=0), "sweeps.default.repeats"),
        (lambda s: s["sweeps"]["default"].update(rates=[1]), "may give ['repeats']"),
    ],
    ids=["no-fcfs", "unknown-scheduler", "fraction", "dataset", "sweep-keys", "engine-range",
         "engine-key", "top-key", "repetition", "sweep-repeats", "sweep-extra-key"],
)
def test_a_broken_spec_stops_with_the_key_named(change, says, tmp_path: Path) -> None:
    spec = yaml.safe_load(SPEC.read_text())
    change(spec)
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ExperimentError) as error:
        load_online_jobs(path, "default", CONFIG)
    assert str(path) in str(error.value) and says in str(error.value), str(error.value)


def test_the_sweep_measures_capacity_under_fcfs_and_refuses_bad_shapes() -> None:
    dataset = OnlineDataset(kind="prefix-repetition")
    with pytest.raises(ValueError, match="include fcfs"):
        OnlineSweep(schedulers=(("lpm", "lpm", ()),), dataset=dataset)
    with pytest.raises(ValueError, match="distinct"):
        OnlineSweep(schedulers=(("fcfs", "fcfs", ()), ("fcfs", "lpm", ())), dataset=dataset)
    with pytest.raises(ValueError, match="needs the workload"):
        OnlineDataset(kind="workload")
    assert dataset.label == "prefix-repetition-4x1024+64-out16"


@pytest.mark.parametrize(("ratio", "verdict"), [(1.05, "holds"), (1.3, "does not hold")])
def test_the_online_row_holds_only_within_its_tolerance(ratio, verdict, tmp_path) -> None:
    path = tmp_path / "online.json"
    path.write_text(online_document("leval_online", ("fcfs", "feather-static"), (0.5, 0.9),
                                    ttft_ratio=ratio))  # fmt: skip
    ours, got, mechanism = online_verdict([path])
    assert got == verdict
    assert f"{ratio:.2f}x [{ratio:.2f}-{ratio:.2f}] (n=3, 75% coverage)" in ours
    assert "at 0.5" in ours and "at 0.9" in ours
    assert "2.40x FCFS's throughput" in mechanism  # the saturated run, said beside it


def test_the_online_row_is_untestable_without_runs() -> None:
    assert online_verdict([])[1] == "not testable here"


def test_pooled_percentiles_take_every_successful_request_of_every_repeat() -> None:
    import numpy as np

    from feather.engines.vllm.online import pooled

    def raw(ttfts, latencies, outs, errors, throughput):
        return {"ttfts": ttfts, "latencies": latencies, "output_lens": outs,
                "itls": [[0.01] * (n - 1) for n in outs], "errors": errors,
                "request_throughput": throughput, "output_throughput": 10 * throughput,
                "completed": sum(1 for e in errors if not e), "duration": 5.0}  # fmt: skip

    one = raw([0.1, 0.2, 9.9], [1.1, 1.2, 10.0], [11, 11, 1], ["", "", "boom"], 2.0)
    two = raw([0.3, 0.4], [2.3, 0.4], [21, 1], ["", ""], 3.0)
    row = pooled([one, two])
    ttfts = [100.0, 200.0, 300.0, 400.0]  # the failed request is left out
    assert row["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99))
    assert row["p50_ttft_ms"] == pytest.approx(250.0)
    # TPOT = (latency - ttft) / (outputs - 1), only where there is more than one output token
    assert row["p50_tpot_ms"] == pytest.approx(100.0)
    assert row["request_throughput"] == 2.5 and row["request_throughput_max"] == 3.0
    assert (row["completed"], row["errors"], row["repeats"]) == (4, 1, 2)


def test_an_online_interval_that_spans_the_tolerance_is_inconclusive(tmp_path) -> None:
    doc = json.loads(online_document("leval_online", ("fcfs", "feather-static"), (0.5, 0.9),
                                     ttft_ratio=1.05))
    row = next(r for r in doc["rows"] if r["scheduler"] == "feather-static"
               and r["load_fraction"] == 0.9)
    row["repeats_detail"][2]["p99_ttft_ms"] *= 1.3 / 1.05  # one repeat at 1.3x FCFS's
    path = tmp_path / "online.json"
    path.write_text(json.dumps(doc))
    ours, got, _ = online_verdict([path])
    assert got == "inconclusive (interval 1.05-1.30 spans the bar 1.10)"
    # that repeat ran beside a busy process and stayed so: not graded, and said; two quiet
    # repeats are fewer than the row asks for
    row["repeats_detail"][2]["measurement"] = {
        "repeat": 2, "disturbed": "fcfs: other processes used 90% of a core",
        "activity": {"others_cores": 0.9}}
    path.write_text(json.dumps(doc))
    ours, got, _ = online_verdict([path])
    assert got == ("inconclusive (2 quiet repeat(s) at feather-static leval_online at 0.9: "
                   "the row asks for 3)")
    assert "unstable: another process used 90% of a core during 1 of 3 repeats" in ours


def test_the_graded_tail_is_the_highest_percentile_a_repeat_resolves() -> None:
    from feather.pipeline.online_figure import graded_percentile

    assert graded_percentile(300) == 99  # 3 requests above its p99
    assert graded_percentile(299) == 90
    assert graded_percentile(36) == 90  # 3.6 above p90; its p99 is its slowest request
    assert graded_percentile(29) == 50
    assert graded_percentile(2) == 50  # nothing resolves a tail: the median, said


def test_a_run_of_36_requests_is_graded_at_p90_not_at_its_slowest_request(tmp_path) -> None:
    """One late request per repeat (each repeat's p99) puts Feather at 1.5x FCFS's; the tail
    below it (p90) stays at 1.0x: the row grades p90 and says why."""
    doc = json.loads(online_document("leval_online", ("fcfs", "feather-static"), (0.9,)))
    doc["num_prompts"] = 36
    for row in doc["rows"]:
        for d in row["repeats_detail"]:
            d["p90_ttft_ms"] = 0.8 * d["p99_ttft_ms"]
            if row["scheduler"] != "fcfs" and not row["saturated"]:
                d["p99_ttft_ms"] *= 1.5
    path = tmp_path / "online.json"
    path.write_text(json.dumps(doc))
    ours, got, _ = online_verdict([path])
    assert got == "holds"
    assert "TTFT p90 / FCFS paired within repeats 1.00x" in ours
    assert "36 requests have no p99 of their own" in ours
    # the same repeats with a p99 of their own (300 requests each): the late requests decide
    doc["num_prompts"] = 300
    path.write_text(json.dumps(doc))
    assert online_verdict([path])[1] == "does not hold"
