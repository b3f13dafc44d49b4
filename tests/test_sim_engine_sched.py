"""What the engine tells the scheduling-cost model: the work SGLang's and vLLM's real
schedulers would do in each step, only in the steps they would do it (SGLang's calc_priority
gating and batch_is_full; our vLLM scheduler's admission conditions), and a step's time with
scheduling serial (sum) or overlapped with the GPU (max)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from feather.policies import create_scheduler
from feather.sim.engine import Engine, EngineConfig
from feather.sim.sched_cost import StepWork
from feather.workloads import load_workload

# ---- the engine reports the work, and when the real scheduler does it ---------------------------


class Recorder:
    """A scheduling-cost function that keeps every step's work and charges a fixed price."""

    def __init__(self, price: float = 0.0) -> None:
        self.works: list[StepWork] = []
        self.price = price

    def __call__(self, policy: type, work: StepWork) -> float:
        self.works.append(work)
        return self.price


def gpu_ms(batch) -> SimpleNamespace:
    return SimpleNamespace(time_s=1e-3 + 1e-6 * sum(s.new_tokens for s in batch.seqs))


def drive(spec: str, name: str, sched=None, cost=gpu_ms, **config):
    workload = load_workload(spec)
    policy = create_scheduler(name)
    sched = sched or Recorder()
    engine = Engine(workload.requests, policy, EngineConfig(**config), cost, sched)
    return engine.run(), sched


SHARED = "synthetic:groups=3,per_group=8,prefix=256,suffix=16,output=12,order=shuffled,seed=1"


@pytest.mark.parametrize("mode", ["vllm", "sglang"])
def test_no_pass_while_the_running_limit_is_full_or_nothing_waits(mode) -> None:
    result, rec = drive(SHARED, "dfs-weight", mode=mode, num_blocks=4000, max_num_seqs=4)
    assert len(rec.works) == len(result.steps)
    full_seen = idle_seen = 0
    for step, work in zip(result.steps, rec.works, strict=True):
        # running at the step's start (less any preempted in it): scheduled or idle, not new
        running_at_start = len(step.batch.seqs) + len(step.batch.idle_block_ids) - step.admitted
        if running_at_start >= 4 or work.waiting == 0:
            full_seen += running_at_start >= 4
            idle_seen += work.waiting == 0
            assert not work.policy_pass and work.candidates == 0
        if work.candidates:
            assert work.policy_pass
    assert full_seen and idle_seen
    passes = [w for w in rec.works if w.policy_pass]
    assert passes and all(w.waiting > 0 for w in passes)
    # every candidate was looked up: its prompt tokens, and cached tokens up to them
    assert sum(w.candidates for w in rec.works) >= len(result.requests)
    assert all(0 <= w.candidate_hit_tokens <= w.candidate_tokens for w in rec.works)
    assert sum(w.candidate_hit_tokens for w in rec.works) > 0  # shared prefixes hit
    assert all(w.tree_nodes >= 0 for w in rec.works) and max(w.tree_nodes for w in rec.works) > 0


def test_sglang_mode_waits_for_a_request_to_leave_after_a_memory_refusal() -> None:
    """SGLang's batch_is_full: after NO_TOKEN, no prefill and no calc_priority until the
    running batch shrinks (a finish or a retraction)."""
    spec = "synthetic:groups=4,per_group=10,prefix=512,suffix=32,output=24,order=shuffled,seed=3"
    result, rec = drive(spec, "lpm", mode="sglang", num_blocks=150, max_num_seqs=64,
                        max_prefill_tokens=10**6, chunked_prefill_size=10**6)
    gaps = 0
    blocked = False
    for step, work in zip(result.steps, rec.works, strict=True):
        if blocked:
            assert not work.policy_pass and step.admitted == 0, step.step
            gaps += 1
        if step.stop_reason == "refused" and (step.admitted or step.decode_seqs):
            blocked = True
        if step.finished or step.preempted:
            blocked = False
    assert gaps > 0  # the situation arose
    assert all(r.finish_s is not None for r in result.requests)


def test_overlap_takes_the_larger_of_gpu_and_scheduling_time() -> None:
    prices = itertools.cycle([0.4e-3, 3e-3, 0.0])

    class Alternating(Recorder):
        def __call__(self, policy, work):
            super().__call__(policy, work)
            self.works[-1] = (work, next(prices))
            return self.works[-1][1]

    for overlap in (True, False):
        result, rec = drive(SHARED, "fcfs", sched=Alternating(), num_blocks=4000,
                            overlap_scheduling=overlap)
        for step, (_, sched) in zip(result.steps, rec.works, strict=True):
            gpu = step.cost.time_s
            expected = max(gpu, sched) if overlap else gpu + sched
            assert step.step_time_s == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert result.makespan_s == pytest.approx(sum(s.step_time_s for s in result.steps))
