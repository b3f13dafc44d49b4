"""The one run loop `feather run` drives both real engines with (feather/engines/session.py),
checked with engines that record what they are asked: where each run's directory goes, that
every session is closed (also when a run fails), and that SGLang starts one engine per
scheduler, closing each before the next starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from measuring_fakes import activity, quiet_protocol

from feather.engines.runs import EngineRun, engine_runs
from feather.engines.session import run_all
from feather.engines.sglang import runner as sglang

EVENTS: list[str] = []


class Written:
    def __init__(self, run: EngineRun) -> None:
        self.summary = {"output_tok_s": 10.0 + run.repeat, "prefix_cache_hit_rate": 0.5}

    def write(self, out_dir: str | Path) -> Path:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "summary.json").write_text("{}")
        return Path(out_dir)


class RecordingSession:
    def __init__(self, name: str, fail_on: str | None = None) -> None:
        self.name, self.fail_on = name, fail_on

    def run(self, run: EngineRun, workload: Any) -> Written:
        EVENTS.append(f"{self.name}:{run.scheduler}:r{run.repeat}")
        if run.scheduler == self.fail_on:
            raise RuntimeError(f"{run.scheduler} failed")
        return Written(run)

    def close(self) -> None:
        EVENTS.append(f"close {self.name}")


def _runs(repeats: int = 2) -> list[EngineRun]:
    return engine_runs(["fcfs", "feather-static"], seed=0, repeats=repeats)


def test_one_session_serves_every_run_interleaved_and_rotated_each_in_its_directory(
        tmp_path: Path) -> None:
    EVENTS.clear()
    runs = _runs()
    done = run_all([(RecordingSession("vllm"), runs)], None, out=tmp_path, run_prefix="w__",
                   total=len(runs), say=lambda m: None, protocol=quiet_protocol())
    # every scheduler within each repeat, the order rotated: no arm always runs first
    assert EVENTS == ["vllm:fcfs:r0", "vllm:feather-static:r0", "vllm:feather-static:r1",
                      "vllm:fcfs:r1", "close vllm"]
    assert [d.name for _, _, d in done] == ["w__fcfs__r0", "w__feather-static__r0",
                                            "w__feather-static__r1", "w__fcfs__r1"]
    assert all((d / "summary.json").exists() for _, _, d in done)
    assert [s["output_tok_s"] for _, s, _ in done] == [10.0, 10.0, 11.0, 11.0]
    records = [s["measurement"] for _, s, _ in done]
    assert [(r["repeat"], r["position"], r["order"]) for r in records] == [
        (0, 0, ["fcfs", "feather-static"]), (0, 1, ["fcfs", "feather-static"]),
        (1, 0, ["feather-static", "fcfs"]), (1, 1, ["feather-static", "fcfs"])]
    assert {r["job"] for r in records} == {f"{tmp_path}/w__"}
    assert not any(r["disturbed"] or r["discarded"] for r in records)


def test_a_repeat_on_a_busy_machine_is_taken_again_and_the_discarded_values_are_kept(
        tmp_path: Path) -> None:
    EVENTS.clear()
    runs = _runs()
    # repeat 0's second arm ran beside a process that took a whole core: the repeat (both
    # arms, same order) runs again; the retake is quiet
    busy = [activity(), activity(others_cores=1.0)]
    done = run_all([(RecordingSession("vllm"), runs)], None, out=tmp_path, run_prefix="",
                   total=len(runs), say=lambda m: None, protocol=quiet_protocol(busy))
    assert EVENTS == ["vllm:fcfs:r0", "vllm:feather-static:r0", "vllm:fcfs:r0",
                      "vllm:feather-static:r0", "vllm:feather-static:r1", "vllm:fcfs:r1",
                      "close vllm"]
    first = done[0][1]["measurement"]
    assert first["attempts"] == 2 and first["attempt"] == 1 and first["disturbed"] is None
    (discarded,) = first["discarded"]
    assert discarded["value"]["output_tok_s"] == 10.0
    assert "other processes used 100% of a core" in discarded["disturbed"]
    assert len(done) == 4


def test_a_lone_run_without_a_prefix_writes_into_out_itself(tmp_path: Path) -> None:
    (run,) = engine_runs(["fcfs"], seed=0, repeats=1)
    done = run_all([(RecordingSession("vllm"), [run])], None, out=tmp_path / "x", run_prefix="",
                   total=1, say=lambda m: None, protocol=quiet_protocol())
    assert done[0][2] == tmp_path / "x" and (tmp_path / "x" / "summary.json").exists()


def test_a_failed_run_closes_its_session_and_starts_no_other(tmp_path: Path) -> None:
    EVENTS.clear()
    runs = _runs(repeats=1)

    def groups():
        EVENTS.append("start a")
        yield RecordingSession("a", fail_on="fcfs"), runs[:1]
        EVENTS.append("start b")
        yield RecordingSession("b"), runs[1:]

    with pytest.raises(RuntimeError, match="fcfs failed"):
        run_all(groups(), None, out=tmp_path, run_prefix="", total=2, say=lambda m: None,
                protocol=quiet_protocol())
    assert EVENTS == ["start a", "a:fcfs:r0", "close a"]
    assert not any(tmp_path.iterdir())


class FakeSGLangSession:
    """Stands in for the engine: records its start and close, returns no records."""

    def __init__(self, setup, scheduler, params, seed, context_length, trace_dir) -> None:
        assert Path(trace_dir).is_dir()
        self.trace_dir = Path(trace_dir)
        EVENTS.append(f"start {scheduler} in {'tmp' if self.trace_dir.exists() else '?'}")

    def run(self, workload, repeat, run_tag):
        EVENTS.append(f"run {run_tag}r{repeat}")
        return [], []

    def close(self) -> None:
        EVENTS.append("close")


def test_sglang_starts_one_engine_per_scheduler_and_closes_it_first(tmp_path, monkeypatch):
    EVENTS.clear()
    monkeypatch.setattr(sglang, "SGLangSession", FakeSGLangSession)
    built: list[tuple] = []

    def build_result(session, workload, spec, label, params, seed, repeat, *rest):
        built.append((spec, label, repeat, session.trace_dir))
        return {"summary": {"output_tok_s": 1.0, "prefix_cache_hit_rate": 0.0}}

    monkeypatch.setattr(sglang, "build_result", build_result)
    monkeypatch.setattr(sglang.SGLangRunOutput, "write", lambda self, out: Path(out))
    runs = [r.__class__(**{**r.__dict__, "workload": "w.parquet"}) for r in _runs()]
    workload = SimpleNamespace(requests=[SimpleNamespace(prompt_len=1000, output_len=10)])
    setup = sglang.SGLangSetup(model="tiny-llama")
    groups = sglang.sessions(setup, runs, workload, say=lambda m: None)
    run_all(groups, workload, out=tmp_path, run_prefix="", total=len(runs), say=lambda m: None,
            protocol=quiet_protocol())
    assert EVENTS == [
        "start fcfs in tmp", "run fcfs:r0", "run fcfs:r1", "close",
        "start feather-static in tmp", "run feather-static:r0", "run feather-static:r1", "close",
    ]  # one scheduler per engine start: SGLang's policy is a launch option
    assert [(spec, label, repeat) for spec, label, repeat, _ in built] == [
        ("w.parquet", "fcfs", 0), ("w.parquet", "fcfs", 1),
        ("w.parquet", "feather-static", 0), ("w.parquet", "feather-static", 1),
    ]
    # each engine's record directory is removed once it is closed
    assert not any(trace_dir.exists() for *_, trace_dir in built)
