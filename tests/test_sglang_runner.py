"""`feather run --engine sglang` (GPU only): it fails early and clearly without a GPU or
SGLang; it starts SGLang's native policies untouched and ours behind fcfs; the scheduler's
records become a run directory the pipeline accepts. The engine itself needs a GPU and is
not started here (gpu/sglang_c5.sh runs it; untested: no GPU box with SGLang)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from feather.cli import main
from feather.engines.sglang import runner
from feather.engines.sglang.records import request_id_for
from feather.pipeline.aggregate import summary_row
from feather.rundir import write_run_dir
from feather.telemetry import NvmlSampler
from feather.workloads import load_workload

WORKLOAD = "synthetic:groups=2,per_group=3,prefix=32,suffix=4,output=3,seed=0"


def _run_args(tmp_path: Path) -> list[str]:
    return ["run", "--engine", "sglang", "--scheduler", "feather-static", "--workload",
            str(tmp_path / "absent.parquet"), "--model", "tiny-llama", "--out", str(tmp_path)]


def test_without_a_gpu_it_fails_before_reading_anything(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("feather.engines.gpu.attached_gpus", lambda: [])
    assert main(_run_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU and none is attached" in err
    assert "absent.parquet" not in err  # the workload was never opened


def test_vllm_only_options_are_refused(tmp_path, capsys) -> None:
    assert main([*_run_args(tmp_path), "--async-scheduling"]) == 2
    assert "--async-scheduling: vLLM options" in capsys.readouterr().err


def test_with_a_gpu_but_no_sglang_it_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("feather.engines.gpu.attached_gpus", lambda: ["NVIDIA H200"])
    real_version = metadata.version

    def version(name: str) -> str:
        if name == "sglang":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(runner.metadata, "version", version)
    assert main(_run_args(tmp_path)) == 2
    assert "sglang is not installed" in capsys.readouterr().err


def test_native_policies_are_sglangs_own_and_ours_run_behind_fcfs() -> None:
    setup = runner.SGLangSetup(model="tiny-llama", max_running_requests=8, page_size=16)
    for name in ("fcfs", "lpm", "dfs-weight"):
        kwargs = runner.engine_kwargs(setup, "m", name, {})
        assert kwargs["schedule_policy"] == name
        assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert runner.engine_kwargs(setup, "m", "feather-static", {})["schedule_policy"] == "fcfs"
    # a native name with parameters is our port, so it runs behind fcfs too
    assert runner.engine_kwargs(setup, "m", "lpm", {"x": 1})["schedule_policy"] == "fcfs"
    kwargs = runner.engine_kwargs(setup, "m", "fcfs", {})
    assert kwargs["max_running_requests"] == 8 and kwargs["page_size"] == 16
    assert "max_total_tokens" not in kwargs


def _fake_records(workload) -> tuple[list[dict], list[dict]]:
    n = len(workload.requests)
    base = {"sched_wall_s": 0.001, "waiting": 0, "candidates": 0, "decisions_add": 0,
            "prefill_tokens": 0, "cache_hit_tokens": 0, "stop_reason": None, "finished": 0}
    steps = [
        {**base, "run": 1, "step": 0, "start_s": 0.0, "sched_cpu_s": 0.001, "policy_cpu_s": 0.0005,
         "forward_mode": "extend", "batch_size": n, "decode_seqs": 0, "shared_prefix_tokens": 0,
         "distinct_groups": 2, "admitted": n, "decisions_stop": 1, "step_time_s": 0.05,
         "sampled_tokens": n},
        {**base, "run": 1, "step": 1, "start_s": 0.05, "sched_cpu_s": 0.0002, "policy_cpu_s": 0.0,
         "forward_mode": "decode", "batch_size": n, "decode_seqs": n, "shared_prefix_tokens": 0,
         "distinct_groups": 2, "admitted": 0, "decisions_stop": 0, "step_time_s": 0.02,
         "sampled_tokens": n},
    ]
    reqs = [{"rid": request_id_for("x", i, r.group_id), "prompt_tokens": r.prompt_len,
             "admitted_s": 0.0, "cached_tokens": 32 if i >= 2 else 0, "first_token_s": 0.05,
             "output_tokens": r.output_len, "finish_s": 0.05 + 0.02 * (r.output_len - 1)}
            for i, r in enumerate(workload.requests)]
    return steps, list(reversed(reqs))  # the scheduler writes them as they finish


def test_records_become_a_run_directory_the_pipeline_accepts(tmp_path: Path) -> None:
    workload = load_workload(WORKLOAD)
    steps, reqs = _fake_records(workload)
    session = SimpleNamespace(
        scheduler="feather-static", setup=runner.SGLangSetup(model="tiny-llama"),
        startup_s=12.0, version="0.5.23", gpus=["NVIDIA H200"],
        facts={"name": "sglang", "version": "0.5.23", "attention_backend": "FlashInferBackend"},
    )
    with NvmlSampler(interval_ms=0) as nvml:
        pass
    result = runner.build_result(session, workload, WORKLOAD, "feather-static", {}, 0, 0,
                                 steps, reqs, "2026-11-30T00:00:00", 1.0, nvml)
    out = write_run_dir(tmp_path / "results" / "h200" / "sglang" / "c5" / "feather-static__r0",
                        result["trace"], result["requests"], result["summary"])
    row = summary_row(out / "summary.json")
    assert row["requests"] == len(workload.requests)
    assert (row["engine"], row["scheduler"]) == ("sglang", "feather-static")
    summary = result["summary"]
    assert summary["decisions_stop"] == 1 and summary["steps"] == 2
    assert summary["prefix_cache_hit_tokens"] == 32 * (len(workload.requests) - 2)
    assert summary["provenance"]["engine"]["attention_backend"] == "FlashInferBackend"
    assert summary["provenance"]["config"]["engine"] == "sglang"
    # request rows are put back in workload order from the ids
    assert result["requests"].column("cached_tokens").to_pylist()[:2] == [0, 0]


def test_requests_missing_from_the_records_are_an_error() -> None:
    workload = load_workload(WORKLOAD)
    steps, reqs = _fake_records(workload)
    with NvmlSampler(interval_ms=0) as nvml:
        pass
    session = SimpleNamespace(scheduler="fcfs", setup=runner.SGLangSetup(model="tiny-llama"),
                              startup_s=1.0, version="0.5.23", gpus=["x"], facts={})
    with pytest.raises(KeyError):
        runner.build_result(session, workload, WORKLOAD, "fcfs", {}, 0, 0, steps, reqs[1:],
                            "t", 1.0, nvml)


def test_the_pipeline_skips_sglang_with_the_reason_where_it_cannot_run(monkeypatch) -> None:
    from feather.engines import selection as engines

    runnable, skipped = engines.select_engines(["sim", "sglang"], gpus=[])
    assert runnable == ["sim"] and len(skipped) == 1 and "engine sglang" in skipped[0]
    # installed but no GPU: a logged skip, or with require_gpu a parse-time error
    monkeypatch.setattr(engines, "installed_build", lambda spec: ("sglang", True))
    runnable, skipped = engines.select_engines(["sglang"], gpus=[])
    assert runnable == [] and "needs a GPU and none is attached" in skipped[0]
    with pytest.raises(engines.EngineUnavailableError, match="require_gpu"):
        engines.select_engines(["sglang"], gpus=[], require_gpu=True)
    assert engines.select_engines(["sglang"], gpus=["NVIDIA H200"]) == (["sglang"], [])


class _Req:
    def __init__(self, rid: str, ids: list[int]) -> None:
        from array import array

        self.rid, self.origin_input_ids = rid, array("q", ids)
        self.output_ids: list[int] = []
        self.prefix_len, self.extend_input_len, self.finished_reason = 0, len(ids), None

    def finished(self) -> bool:
        return self.finished_reason is not None


class _Mode:
    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend(self) -> bool:
        return self.name == "EXTEND"


class _FakeEngine:
    """Stands in for sglang.Engine: its 'scheduler' writes records as ours does."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder

    def flush_cache(self):
        self.recorder.new_run()
        return SimpleNamespace(success=True)

    def generate(self, input_ids, sampling_params, rid):
        reqs = [_Req(r, ids) for r, ids in zip(rid, input_ids, strict=True)]
        batch = SimpleNamespace(reqs=reqs, forward_mode=_Mode("EXTEND"), decoding_reqs=None)
        self.recorder.on_schedule(batch, start_s=0.0, cpu_s=0.0, wall_s=0.0, policy_cpu_s=0.0,
                                  waiting=0, record=None)
        for req in reqs:
            req.output_ids.append(1)
        self.recorder.on_result()
        decode = SimpleNamespace(reqs=reqs, forward_mode=_Mode("DECODE"))
        for _ in range(max(p["max_new_tokens"] for p in sampling_params) - 1):
            self.recorder.on_schedule(decode, start_s=self.recorder.now(), cpu_s=0.0,
                                      wall_s=0.0, policy_cpu_s=0.0, waiting=0, record=None)
            for req, p in zip(reqs, sampling_params, strict=True):
                if not req.finished():
                    req.output_ids.append(1)
                    if len(req.output_ids) == p["max_new_tokens"]:
                        req.finished_reason = "length"
            self.recorder.on_result()
        return [{"meta_info": {"completion_tokens": len(r.output_ids)}} for r in reqs]


def test_a_session_reads_back_what_the_scheduler_recorded(tmp_path: Path) -> None:
    from feather.engines.sglang.records import StepRecorder

    workload = load_workload(WORKLOAD)
    recorder = StepRecorder(tmp_path, {"name": "sglang"})
    session = object.__new__(runner.SGLangSession)
    session.engine, session.trace_file = _FakeEngine(recorder), recorder.path
    for repeat in range(2):
        steps, reqs = session.run(workload, repeat, "feather-static:")
        assert len(reqs) == len(workload.requests)
        assert steps[0]["admitted"] == len(workload.requests)
        assert steps[0]["distinct_groups"] == 2  # the groups travel in the request ids
        assert sum(s["sampled_tokens"] for s in steps) == sum(
            r.output_len for r in workload.requests
        )
