"""The simulator's warm prefix-cache start (`prefix_cache="warm"`): the workload's group
prefixes are cached before the first request, as the real engine's unmeasured warm-up leaves
them, so a warm run prefills only what follows each prefix and a cold one also each prefix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.chunk_hash import chunk_hashes
from feather.pipeline.experiments import Run
from feather.sim.engine import EngineConfig
from feather.sim.kv_pool import BlockPool
from feather.sim.run import SimulationSpec, simulate
from feather.sim.warm_start import group_prefixes, warm_prefixes
from feather.workloads import load_workload
from feather.workloads.schema import WorkloadRequest

BLOCK = 16
SPEC = "synthetic:groups=3,per_group=4,prefix=200,suffix=20,output=4,order=shuffled,seed=2"


def _run(prefix_cache: str, **kw):
    spec = SimulationSpec(
        workload=SPEC, scheduler="fcfs", hardware="a100-80gb", model="llama-3.1-8b",
        block_size=BLOCK, num_blocks=kw.pop("num_blocks", 400), max_num_seqs=4,
        prefix_cache=prefix_cache, **kw,
    )  # fmt: skip
    return simulate(spec)


def test_a_warm_run_computes_no_prefix_prefill_and_a_cold_one_does() -> None:
    workload = load_workload(SPEC)
    prefixes = group_prefixes(workload.requests)
    full = {g: len(t) // BLOCK * BLOCK for g, t in prefixes.items()}
    prompt = sum(r.prompt_len for r in workload.requests)
    warm, cold = _run("warm"), _run("cold")
    warm_prefill = sum(s.prefill_tokens for s in warm.engine.steps)
    cold_prefill = sum(s.prefill_tokens for s in cold.engine.steps)
    # warm: every request hits its group's full prefix blocks, so each prefill is its tail
    assert warm_prefill == prompt - sum(full[r.group_id] for r in workload.requests)
    hits = {r.id: r.cached_tokens for r in warm.engine.requests}
    assert all(hits[r.request_id] == full[r.group_id] for r in workload.requests)
    # cold: each group's first admission computes its prefix (later ones hit it)
    assert cold_prefill >= warm_prefill + sum(full.values())
    assert warm.summary["prefix_cache_at_start"] == "warm"
    assert warm.summary["warm_up_prefill_tokens"] == sum(len(t) for t in prefixes.values())
    assert cold.summary["prefix_cache_at_start"] == "cold"
    assert cold.summary["warm_up_prefill_tokens"] is None
    assert warm.summary["provenance"]["config"]["prefix_cache"] == "warm"
    # the warm-up is outside simulated time: the warm run is no slower
    assert warm.summary["makespan_s"] < cold.summary["makespan_s"]


def test_a_warm_prefix_evicted_later_is_a_recompute() -> None:
    # a pool that holds the prefixes but not them and every running request: the warm blocks
    # are the free queue's oldest cached ones, the first evicted
    result = _run("warm", num_blocks=40)
    assert result.engine.pool_evictions > 0
    assert sum(s.recompute_tokens for s in result.engine.steps) > 0


@settings(max_examples=60, deadline=None)
@given(
    prefixes=st.lists(st.integers(0, 90), min_size=1, max_size=5),
    blocks=st.integers(8, 40),
    size=st.sampled_from([4, 8]),
)
def test_warm_prefixes_leaves_exactly_the_full_prefix_blocks_cached_and_free(
    prefixes, blocks, size
) -> None:
    requests = [
        WorkloadRequest(
            request_id=f"r{i}", source="test", task="t", group_path=[f"g{i}"],
            prefix_lens=[p], prompt_token_ids=np.arange(1000 * i, 1000 * i + p + 3,
                                                        dtype=np.int32),
            output_len=1,
        )
        for i, p in enumerate(prefixes)
    ]  # fmt: skip
    pool = BlockPool(blocks, size)
    if not any(prefixes):
        with pytest.raises(ValueError, match="no request of the workload shares a prefix"):
            warm_prefixes(pool, requests)
        return
    if any(-(-p // size) > blocks for p in prefixes):
        return  # one prefix alone overflows the pool: refused (checked below)
    warm = warm_prefixes(pool, requests)
    pool.check_invariants()
    assert pool.num_free == blocks  # nothing held: the warm-up finished
    # the last group's full blocks are always still cached (freed last, evicted last)
    last = next(r for r in reversed(requests) if r.shared_prefix_len)
    want = chunk_hashes(last.prompt_token_ids[: last.shared_prefix_len], size)
    assert len(pool.longest_hit(want, 10**9)) == len(want)
    assert warm.prefill_tokens == sum(p for p in prefixes if p)
    assert warm.groups == sum(1 for p in prefixes if p)


def test_prefix_cache_is_validated_and_reaches_the_simulation_spec() -> None:
    with pytest.raises(ValueError, match="prefix_cache must be one of cold, warm"):
        SimulationSpec(workload=SPEC, scheduler="fcfs", hardware="a100-80gb",
                       model="llama-3.1-8b", prefix_cache="hot")
    with pytest.raises(ValueError, match="prefix_cache must be one of"):
        EngineConfig(prefix_cache="hot")
    with pytest.raises(ValueError, match="needs enable_prefix_caching"):
        EngineConfig(prefix_cache="warm", enable_prefix_caching=False)
    run = Run(
        experiment="stop", hardware="a100-80gb", engine="sim", model="llama-3.1-8b",
        workload="w", workload_spec=SPEC, scheduler="fcfs", scheduler_class="fcfs", params=(),
        engine_options=(("num_blocks", 400), ("prefix_cache", "warm")),
    )  # fmt: skip
    spec = run.run_spec({})["simulation"]
    assert spec["prefix_cache"] == "warm" and spec["num_blocks"] == 400
