"""Where a simulated run's time goes (feather/sim/attribution.py): the parts add up to the
makespan, recomputation appears exactly where KV was lost, and mixed steps split by the
documented rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather.models import get_model
from feather.sim.attribution import split_step
from feather.sim.batch_step import SeqStep
from feather.sim.cost import attention_flops
from feather.sim.hardware import get_hardware
from feather.sim.run import SimulationSpec, simulate

MODEL, HW = get_model("llama-3.1-8b"), get_hardware("a100-80gb")


def _run(workload: str, **changes):
    base = {"workload": workload, "scheduler": "fcfs", "hardware": "a100-80gb",
            "model": "llama-3.1-8b"}
    return simulate(SimulationSpec(**{**base, **changes}))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.integers(1, 4),
    per_group=st.integers(1, 6),
    prefix=st.sampled_from([64, 300, 1000]),
    output=st.integers(1, 40),
    order=st.sampled_from(["grouped", "shuffled", "interleaved"]),
    arrival=st.sampled_from(["all", "poisson:50", "bursts:3:0.05"]),
    blocks=st.sampled_from([None, 200, 400]),
    mode=st.sampled_from(["vllm", "sglang"]),
    scheduler=st.sampled_from(["fcfs", "lpm", "feather-static"]),
    overlap=st.booleans(),
)
def test_the_parts_add_up_to_the_makespan(
    groups, per_group, prefix, output, order, arrival, blocks, mode, scheduler, overlap
) -> None:
    spec = (f"synthetic:groups={groups},per_group={per_group},prefix={prefix},suffix=20,"
            f"output={output},order={order},arrival={arrival},seed=3")
    result = _run(spec, num_blocks=blocks, engine_mode=mode, scheduler=scheduler,
                  max_num_seqs=8, max_num_batched_tokens=512, overlap_scheduling=overlap)
    summary, trace = result.summary, result.trace
    parts = summary["time_split_s"]
    assert set(parts) == {"prefill", "recompute", "decode", "scheduling", "idle"}
    assert all(v >= -1e-12 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(summary["makespan_s"], rel=1e-9, abs=1e-12)
    if arrival == "all":
        assert parts["idle"] == pytest.approx(0.0, abs=1e-12)
    per_step = [trace.column(c).to_pylist() for c in
                ("time_prefill_s", "time_recompute_s", "time_decode_s", "time_scheduling_s")]
    steps = trace.column("step_time_s").to_pylist()
    for i, total in enumerate(steps):
        assert sum(col[i] for col in per_step) == pytest.approx(total, rel=1e-9, abs=1e-15)
    recomputed = trace.column("recompute_tokens").to_pylist()
    prefilled = trace.column("prefill_tokens").to_pylist()
    assert all(0 <= r <= p for r, p in zip(recomputed, prefilled, strict=True))
    assert (summary["prefill_tokens_computed"] + summary["prefill_tokens_recomputed"]
            == sum(prefilled))


def test_nothing_is_recomputed_when_the_pool_keeps_everything() -> None:
    result = _run("synthetic:groups=4,per_group=10,prefix=1000,suffix=30,output=16,"
                  "order=shuffled,seed=2")
    s = result.summary
    assert s["pool_evictions"] == 0 and s["preemptions"] == 0
    assert s["prefill_tokens_recomputed"] == 0 and s["time_split_s"]["recompute"] == 0.0
    # every prompt token is computed once or served from the cache
    assert s["prefill_tokens_computed"] + s["prefix_cache_hit_tokens"] == s["prompt_tokens"]


def test_a_pool_too_small_for_the_prefixes_makes_fcfs_recompute_them() -> None:
    spec = "synthetic:groups=6,per_group=8,prefix=2000,suffix=30,output=16,order=shuffled,seed=2"
    tight = _run(spec, kv_pool_fraction=0.3).summary
    ample = _run(spec).summary
    assert tight["pool_evictions"] > 0
    assert tight["prefill_tokens_recomputed"] > 0
    assert tight["time_split_s"]["recompute"] > 0
    assert ample["prefill_tokens_recomputed"] == 0
    # what is first computed is the same work either way: the distinct prompt tokens
    assert tight["prefill_tokens_computed"] == ample["prefill_tokens_computed"]


def test_a_mixed_step_splits_by_the_documented_rule() -> None:
    prefill = SeqStep(tuple(range(8)), 0, 128)  # 128 new prompt tokens, no context
    decodes = [SeqStep(tuple(range(100 + 8 * i, 108 + 8 * i)), 127, 1) for i in range(4)]
    cost = SimpleNamespace(time_s=10.0, attention_time_s=4.0)
    split = split_step(MODEL, HW, [prefill, *decodes], cost, step_time_s=10.5,
                       recompute_tokens=32)
    t_p = max(attention_flops(MODEL, 0, 128) / HW.achievable_flops(),
              128 * MODEL.kv_bytes_per_token / HW.l2_bandwidth_bytes_per_s())
    t_d = 4 * max(attention_flops(MODEL, 127, 1) / HW.achievable_flops(),
                  128 * MODEL.kv_bytes_per_token / HW.l2_bandwidth_bytes_per_s())
    prefill_gpu = 6.0 * 128 / 132 + 4.0 * t_p / (t_p + t_d)
    assert split.prefill_s + split.recompute_s == pytest.approx(prefill_gpu)
    assert split.recompute_s == pytest.approx(prefill_gpu * 32 / 128)
    assert split.decode_s == pytest.approx(10.0 - prefill_gpu)
    assert split.scheduling_s == pytest.approx(0.5)
    only_decode = split_step(MODEL, HW, decodes, cost, 10.0, 0)
    assert (only_decode.decode_s, only_decode.prefill_s, only_decode.scheduling_s) == (10.0, 0, 0)
