"""Where a run's time goes: its makespan split into parts that add up to it exactly.

    makespan = prefill + recompute + decode + scheduling + idle

- prefill: computing prompt tokens for the first time (tokens served from the prefix cache
  cost nothing and are counted, not timed);
- recompute: computing again tokens whose KV existed before - a preempted request's own
  progress, or prefix blocks some request computed and the pool evicted since;
- decode: one new token for running requests;
- scheduling: the part of each step's scheduling time the GPU step did not hide (all of it
  when scheduling is serial);
- idle: no request to run (waiting for arrivals).

A step that mixes prefill chunks and decodes (vLLM's chunked prefill) is split by a stated
rule, not measured: the dense part (GEMMs, activations, launch) by new tokens, the attention
kernels' part by each side's standalone attention time (its FLOPs at peak or its requested
KV bytes at L2 bandwidth, whichever is longer); the prefill side is then split between first
computation and recomputation by tokens. Steps that are all prefill or all decode need no rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from feather.models import ModelProfile
from feather.sim.cost import attention_flops
from feather.sim.hardware import HardwareProfile

PARTS = ("prefill", "recompute", "decode", "scheduling", "idle")


@dataclass(frozen=True)
class StepSplit:
    prefill_s: float
    recompute_s: float
    decode_s: float
    scheduling_s: float


def split_step(
    model: ModelProfile,
    hardware: HardwareProfile,
    seqs: Sequence[Any],
    cost: Any,
    step_time_s: float,
    recompute_tokens: int,
) -> StepSplit:
    """One step's time by part (see the module docstring). `seqs`: the step's SeqSteps;
    `cost`: its StepCost (anything with time_s; attention_time_s where the model has it)."""
    gpu = float(cost.time_s)
    scheduling = max(0.0, step_time_s - gpu)
    decode = [s for s in seqs if s.is_decode]
    prefill = [s for s in seqs if not s.is_decode]
    prefill_tokens = sum(s.new_tokens for s in prefill)
    if not prefill:
        return StepSplit(0.0, 0.0, gpu, scheduling)
    if not decode:
        prefill_gpu = gpu
    else:
        attention = float(getattr(cost, "attention_time_s", 0.0))
        dense = gpu - attention
        share_dense = prefill_tokens / (prefill_tokens + len(decode))
        t_prefill = _attention_estimate(model, hardware, prefill)
        t_decode = _attention_estimate(model, hardware, decode)
        share_attention = t_prefill / (t_prefill + t_decode) if t_prefill + t_decode else 0.5
        prefill_gpu = dense * share_dense + attention * share_attention
    redo = min(recompute_tokens, prefill_tokens)
    recompute = prefill_gpu * redo / prefill_tokens if prefill_tokens else 0.0
    return StepSplit(prefill_gpu - recompute, recompute, gpu - prefill_gpu, scheduling)


def _attention_estimate(
    model: ModelProfile, hardware: HardwareProfile, seqs: Sequence[Any]
) -> float:
    flops = sum(attention_flops(model, s.context_tokens, s.new_tokens) for s in seqs)
    kv_bytes = sum(s.context_tokens + s.new_tokens for s in seqs) * model.kv_bytes_per_token
    return max(flops / hardware.achievable_flops(), kv_bytes / hardware.l2_bandwidth_bytes_per_s())


def attribute(
    steps: Sequence[Any], makespan_s: float, model: ModelProfile, hardware: HardwareProfile
) -> tuple[list[StepSplit], dict[str, float]]:
    """Per-step splits and the run's totals per part (seconds); the totals sum to the
    makespan (idle is what no step covers)."""
    splits = [
        split_step(model, hardware, s.batch.seqs, s.cost, s.step_time_s, s.recompute_tokens)
        for s in steps
    ]
    totals = {
        "prefill": sum(x.prefill_s for x in splits),
        "recompute": sum(x.recompute_s for x in splits),
        "decode": sum(x.decode_s for x in splits),
        "scheduling": sum(x.scheduling_s for x in splits),
    }
    totals["idle"] = max(0.0, makespan_s - sum(s.step_time_s for s in steps))
    return splits, totals
