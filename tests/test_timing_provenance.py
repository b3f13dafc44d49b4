"""The shared scheduling timer, provenance record and atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import threading
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


def _spin(iterations: int) -> int:
    """A known busy loop: pure Python arithmetic, no sleeping, no allocation to speak of."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def test_timer_cpu_time_matches_a_measured_busy_loop() -> None:
    iterations = 400_000
    _spin(iterations)  # warm up
    # reference: the same loop timed directly with the thread's CPU clock. The two are
    # interleaved, round by round, so that a drift of the machine's speed during the test
    # (a clean-clone run saw the loop go from 33 to 20 ms within it) touches both alike.
    timer = SchedulingTimer()
    reference, measured = [], []
    for _ in range(5):
        start = time.thread_time()
        _spin(iterations)
        reference.append(time.thread_time() - start)
        with timer.measure():
            _spin(iterations)
        measured.append(timer.end_step().cpu_s)
    ratio = min(measured) / min(reference)
    assert 0.7 < ratio < 1.4, (measured, reference)
    assert timer.summary()["cpu_s"] == pytest.approx(sum(measured))
    assert all(step.wall_s >= 0.9 * step.cpu_s for step in timer.steps)  # one thread: wall >= CPU


def test_timer_does_not_count_other_threads_cpu() -> None:
    stop = threading.Event()

    def spin_elsewhere() -> None:
        while not stop.is_set():
            _spin(1_000)

    other = threading.Thread(target=spin_elsewhere)
    other.start()
    timer = SchedulingTimer()
    try:
        with timer.measure():
            time.sleep(0.1)  # the engine's other thread burns CPU meanwhile
    finally:
        stop.set()
        other.join()
    step = timer.end_step()
    assert step.wall_s >= 0.1
    assert step.cpu_s < 0.2 * step.wall_s  # process-wide CPU time would be ~wall_s here


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
    assert record["engine"] == {
        "name": "sim",
        "version": None,  # not stated by this caller: present, and empty
        "attention_backend": None,
        "block_size": None,
    }
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


def test_a_write_removes_what_a_killed_writer_of_the_same_file_left(tmp_path) -> None:
    target = tmp_path / "summary.json"
    (tmp_path / ".summary.json.k1ll3d.tmp").write_text('{"half": ')  # SIGKILL mid-write
    (tmp_path / ".other.json.k1ll3d.tmp").write_text("{")  # another file's: not ours to judge
    write_json_atomic(target, {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.k1ll3d.tmp",
                                                          "summary.json"]
