"""The shared scheduling timer, provenance record and atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from feather.atomic import write_json_atomic
from feather.provenance import collect_provenance, config_hash
from feather.timing import SchedulingTimer


def _busy(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def test_timer_counts_cpu_not_sleep_and_nests_once() -> None:
    timer = SchedulingTimer()
    with timer.measure():
        _busy(0.05)
    with timer.measure(), timer.measure():  # nested: counted once
        time.sleep(0.05)
    first = timer.end_step()
    assert first.calls == 2
    assert first.cpu_s >= 0.05
    assert first.wall_s >= first.cpu_s + 0.04  # the sleep shows in wall time only
    assert first.cpu_s < 0.05 + 0.04  # ... and not in CPU time
    empty = timer.end_step()
    assert (empty.step, empty.calls, empty.cpu_s) == (1, 0, 0.0)
    summary = timer.summary()
    assert summary["steps"] == 2 and summary["calls"] == 2
    assert summary["step_cpu_s_max"] == first.cpu_s
    assert summary["cpu_s"] == pytest.approx(first.cpu_s)


def test_config_hash_is_stable_and_sensitive() -> None:
    a = {"scheduler": "feather-static", "params": {"min_batch": 8, "path": Path("x")}}
    b = {"params": {"path": Path("x"), "min_batch": 8}, "scheduler": "feather-static"}
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash({**a, "params": {"min_batch": 9, "path": Path("x")}})
    with pytest.raises(TypeError, match="cannot hash a config value of type object"):
        config_hash({"x": object()})


def test_provenance_record_names_what_produced_a_result() -> None:
    record = collect_provenance(
        config={"seed": 3}, seed=3, command=["feather", "x"], extra={"engine": {"name": "sim"}}
    )
    json.dumps(record)  # serialisable
    assert record["seed"] == 3 and record["command"] == ["feather", "x"]
    assert record["config_hash"] == config_hash({"seed": 3})
    assert record["packages"]["feather"] == record["feather_version"]
    assert record["host"]["cpu_count"] >= 1 and record["python"]["version"].startswith("3.")
    assert record["engine"] == {"name": "sim"}
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    if head.returncode == 0:  # tests run from a checkout
        assert record["git"]["revision"] == head.stdout.strip()
        assert isinstance(record["git"]["dirty"], bool)
    with pytest.raises(ValueError, match="would overwrite core fields"):
        collect_provenance(extra={"seed": 1})


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path) -> None:
    target = tmp_path / "out" / "summary.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"b": 2})
    assert json.loads(target.read_text()) == {"b": 2}
    with pytest.raises(TypeError):
        write_json_atomic(target, {"c": object()})  # fails before anything is written
    assert json.loads(target.read_text()) == {"b": 2}
    assert [p.name for p in target.parent.iterdir()] == ["summary.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # readable like any plain file
