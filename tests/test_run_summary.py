"""One typed run summary: every writer builds a `RunSummary`, and the summary table reads each
summary.json through it - refusing, with the file and the fields named, one that lacks a field
the table needs, taking fields some producers legitimately lack as empty cells, and skipping a
failed job's record."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from feather.atomic import write_json_atomic
from feather.pipeline.aggregate import REGIME_COLUMNS, InvalidRunError, aggregate, summary_row
from feather.pipeline.job_status import record_failure
from feather.run_summary import InvalidSummaryError, RunSummary
from feather.sim.run import SimulationSpec, simulate

SMALL = "synthetic:groups=2,per_group=6,prefix=256,suffix=16,output=8,order=shuffled,seed=1"
FIELDS = {f.name for f in fields(RunSummary)}
# what every producer writes: a field without a default
REQUIRED = {f.name for f in fields(RunSummary) if f.default is not None}


@pytest.fixture(scope="module")
def simulated() -> dict:
    spec = SimulationSpec(SMALL, "feather-static", "a100-80gb", "llama-3.1-8b", num_blocks=200)
    return simulate(spec).summary


def _write(tmp_path: Path, summary: dict, run: str = "w__fcfs__s0") -> Path:
    return write_json_atomic(tmp_path / "results" / "a100-80gb" / "sim" / "c5" / run /
                             "summary.json", summary)  # fmt: skip


def test_the_simulators_summary_is_a_run_summary_with_every_field(simulated) -> None:
    assert set(simulated) == FIELDS
    again = RunSummary.from_json(json.loads(json.dumps(simulated)))
    assert again.to_json() == simulated
    # what it cannot measure is null, declared so: a real engine's attention and start-up
    assert simulated["attention"] is None and simulated["engine_startup_s"] is None
    assert simulated["l2_hit_rate"] is not None and simulated["time_split_s"]


def test_the_required_fields_are_what_every_producer_writes() -> None:
    """The fields every writer passes; the rest are declared optional with their reason."""
    assert {
        "requests", "output_tokens", "prompt_tokens", "makespan_s", "output_tok_s",
        "total_tok_s", "requests_s", "ttft_s", "tpot_s", "wait_s", "longest_wait_s", "steps",
        "decode_steps", "mean_batch_size", "mean_decode_batch_size", "mean_shared_prefix_tokens",
        "mean_distinct_groups", "prefix_cache_hit_tokens", "prefix_cache_hit_rate",
        "sched_cpu_s_measured", "wall_s", "provenance",
    } == REQUIRED  # fmt: skip
    assert set(REGIME_COLUMNS) <= FIELDS


@pytest.mark.parametrize(
    "drop,named",
    [
        (["mean_batch_size"], "mean_batch_size"),  # a column of the table
        (["total_tok_s", "wall_s"], "total_tok_s, wall_s"),
        (["output_tok_s"], "output_tok_s"),
    ],
)
def test_a_summary_missing_a_field_the_table_needs_is_refused_naming_file_and_fields(
    tmp_path, simulated, drop, named
) -> None:
    broken = {k: v for k, v in simulated.items() if k not in drop}
    path = _write(tmp_path, broken)
    with pytest.raises(InvalidRunError) as raised:
        aggregate([path], tmp_path / "t.parquet", tmp_path / "t.csv")
    assert str(path) in str(raised.value)
    assert f"invalid run summary, missing {named}" in str(raised.value)
    assert not (tmp_path / "t.csv").exists()  # refused before any table is written


def test_missing_quantiles_provenance_keys_and_wrong_types_are_each_named(
    tmp_path, simulated
) -> None:
    broken = dict(simulated, ttft_s={"p50": 0.1}, output_tok_s="fast",
                  provenance={k: v for k, v in simulated["provenance"].items() if k != "git"})
    with pytest.raises(InvalidRunError) as raised:
        summary_row(_write(tmp_path, broken))
    message = str(raised.value)
    assert "missing ttft_s.p99, provenance.git" in message
    assert "wrong type: output_tok_s (float expected, got 'fast')" in message


def test_fields_some_producers_lack_are_empty_cells(tmp_path, simulated) -> None:
    """A summary as an older run or a user's rule wrote it: none of the optional fields."""
    lean = {k: v for k, v in simulated.items() if k in REQUIRED}
    lean["a_users_own_key"] = 1  # not ours: ignored
    row = summary_row(_write(tmp_path, lean))
    assert row["output_tok_s"] == simulated["output_tok_s"]
    for column in ("l2_hit_rate", "preemptions", "decode_only_attention_share", "attention",
                   "sched_cost_model", "time_decode_s", "nvml_available", "arrival_order"):
        assert row[column] is None, column


def test_a_failed_jobs_record_is_no_row(tmp_path, simulated) -> None:
    done = _write(tmp_path, simulated, "w__fcfs__s0")
    failed = done.parent.parent / "w__broken__s0" / "summary.json"
    log = tmp_path / "job.log"
    log.write_text("RuntimeError: this scheduler fails on purpose\n")
    record_failure([failed], "simulate_w", "C5", log, 1)
    assert summary_row(failed) is None
    frame = aggregate([done, failed], tmp_path / "t.parquet", tmp_path / "t.csv")
    assert list(frame.run) == ["w__fcfs__s0"]


def test_a_writers_mistake_is_caught_where_it_is_made(simulated) -> None:
    fields_given = {k: v for k, v in simulated.items() if k in REQUIRED}
    with pytest.raises(InvalidSummaryError, match=r"mean_batch_size \(float \| None expected"):
        RunSummary(**{**fields_given, "mean_batch_size": "large"})
    with pytest.raises(InvalidSummaryError, match="steps"):
        RunSummary(**{**fields_given, "steps": 2.5})
    with pytest.raises(TypeError, match="mean_batch"):  # a misspelt field
        RunSummary(**fields_given, mean_batch=3.0)
    assert math.isclose(RunSummary(**fields_given).output_tok_s, simulated["output_tok_s"])
