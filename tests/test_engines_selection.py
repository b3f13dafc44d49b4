"""Which configured engines run where: GPU engines skip without a GPU unless demanded."""

import pytest

from feather.engines.selection import ENGINES, EngineSpec, EngineUnavailableError, select_engines

TABLE = {
    "sim": EngineSpec("sim", needs_gpu=False, description="simulator"),
    "gpu-engine": EngineSpec("gpu-engine", needs_gpu=True, description="a GPU server"),
}


def test_a_gpu_engine_is_skipped_with_a_reason_where_there_is_no_gpu() -> None:
    runnable, skipped = select_engines(["sim", "gpu-engine"], gpus=[], engines=TABLE)
    assert runnable == ["sim"]
    assert skipped == ["engine gpu-engine (a GPU server) needs a GPU and none is attached"]


def test_a_gpu_engine_runs_where_a_gpu_is_attached() -> None:
    runnable, skipped = select_engines(["sim", "gpu-engine"], gpus=["NVIDIA H200"], engines=TABLE)
    assert runnable == ["sim", "gpu-engine"] and skipped == []


def test_require_gpu_turns_the_skip_into_an_error() -> None:
    with pytest.raises(EngineUnavailableError, match=r"needs a GPU.*require_gpu: true"):
        select_engines(["gpu-engine"], gpus=[], require_gpu=True, engines=TABLE)


def test_an_unknown_engine_is_named_with_the_valid_ones() -> None:
    with pytest.raises(EngineUnavailableError, match=r"unknown engine.*trt; engines: sim"):
        select_engines(["trt"], gpus=[], engines=TABLE)


def test_the_simulator_never_needs_a_gpu() -> None:
    assert select_engines(["sim"], gpus=[], require_gpu=True) == (["sim"], [])
    assert not ENGINES["sim"].needs_gpu


def test_an_engine_runs_only_where_one_of_its_builds_is_installed() -> None:
    table = {
        "absent": EngineSpec("absent", False, "x", builds=(("no-such-dist-feather", False),)),
        "present": EngineSpec("present", False, "y", builds=(("pyarrow", False),)),
        "cuda": EngineSpec("cuda", False, "z", builds=(("pyarrow", True),)),
    }
    runnable, skipped = select_engines(["absent", "present", "cuda"], gpus=[], engines=table)
    assert runnable == ["present"]
    assert skipped[0] == "engine absent (x) is not installed (no-such-dist-feather)"
    assert skipped[1] == "engine cuda (z) needs a GPU and none is attached"


def test_vllm_runs_here_on_its_cpu_build() -> None:
    assert select_engines(["sim", "vllm"], gpus=[]) == (["sim", "vllm"], [])
