"""One simulation run: workload x scheduler x hardware x model -> trace, summary, provenance.

Outputs in the run directory, each written atomically, `summary.json` last (a directory
without it is an incomplete run):
  trace.parquet     a row per engine step
  requests.parquet  a row per request (arrival, admission, first token, finish, ...)
  summary.json      throughput, latency, batch shape, KV traffic, scheduling time, the
                    oracle, and provenance of both the simulating host and the simulated
                    hardware (a `RunSummary`, feather/run_summary.py)
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

import feather
from feather.engine_limits import DEFAULT_MAX_NUM_SEQS
from feather.engines.runs import PREFIX_CACHE_CHOICES
from feather.kernels.plan import KERNELS
from feather.metrics import latency_summary
from feather.models import get_model
from feather.policies import AdmissionPolicy, create_engine_policy, create_vllm_policy
from feather.policies.base import declared_cost_kind
from feather.provenance import collect_provenance
from feather.run_summary import RunSummary
from feather.rundir import write_run_dir
from feather.sim.attribution import StepSplit, attribute
from feather.sim.batch_step import BatchStep
from feather.sim.cost import step_cost
from feather.sim.engine import Engine, EngineConfig, EngineResult
from feather.sim.hardware import get_hardware
from feather.sim.oracle import roofline
from feather.sim.sched_cost import SchedulingCostModel, cost_model
from feather.sim.sched_measured import COST_MODELS, DEFAULT_COST_MODEL
from feather.telemetry import not_applicable
from feather.workloads import Workload, load_workload
from feather.workloads.regime import regime_fields, shared_prefix_tokens_of


@dataclass(frozen=True)
class SimulationSpec:
    """Everything a run depends on (its hash names the run in provenance)."""

    workload: str
    scheduler: str
    hardware: str
    model: str
    kernel: str = "paged"
    engine_mode: str = "vllm"
    seed: int = 0
    scheduler_params: dict[str, Any] = field(default_factory=dict)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None  # None: from the hardware's memory and the model
    # the KV pool as a fraction of the workload's distinct shared-prefix tokens (memory
    # regime sweeps); exclusive with num_blocks
    kv_pool_fraction: float | None = None
    sched_time: str = "model"  # "model" (deterministic, calibrated) or "zero"
    sched_cost_model: str = DEFAULT_COST_MODEL  # which model prices scheduling (COST_MODELS)
    overlap_scheduling: bool | None = None  # None: on in sglang mode, off in vllm mode
    # "warm": every prefix group's shared prefix cached before the first request, as the real
    # engine's `prefix_cache: warm` (feather/sim/warm_start.py); "cold": an empty cache
    prefix_cache: str = "cold"

    def __post_init__(self) -> None:
        if self.prefix_cache not in PREFIX_CACHE_CHOICES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHE_CHOICES)}, "
                f"got {self.prefix_cache!r}"
            )
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; kernels: {', '.join(KERNELS)}")
        if self.sched_time not in ("model", "zero"):
            raise ValueError(f"sched_time must be 'model' or 'zero', got {self.sched_time!r}")
        if self.kv_pool_fraction is not None:
            if self.num_blocks is not None:
                raise ValueError("give num_blocks or kv_pool_fraction, not both")
            if not self.kv_pool_fraction > 0:
                raise ValueError(f"kv_pool_fraction must be > 0, got {self.kv_pool_fraction}")
        if self.sched_cost_model not in COST_MODELS:
            raise ValueError(
                f"unknown scheduling-cost model {self.sched_cost_model!r}; "
                f"known: {', '.join(COST_MODELS)}"
            )

    @property
    def overlapped(self) -> bool:
        """Whether scheduling overlaps the GPU step (SGLang's default; vLLM here: serial)."""
        if self.overlap_scheduling is None:
            return self.engine_mode == "sglang"
        return self.overlap_scheduling

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SimulationResult:
    spec: SimulationSpec
    summary: dict[str, Any]  # a RunSummary's JSON, as summary.json holds it
    trace: pa.Table
    requests: pa.Table
    engine: EngineResult


def _shared_depth_blocks(batch: BatchStep) -> int:
    """Blocks common to every sequence of the step (binary search on the first one's)."""
    seqs = batch.seqs
    if not seqs:
        return 0
    first = seqs[0].block_ids
    lo, hi = 0, min(len(s.block_ids) for s in seqs)
    while lo < hi:  # largest d with block d-1 shared by all (cumulative: monotone in d)
        mid = (lo + hi + 1) // 2
        block = first[mid - 1]
        if all(s.block_ids[mid - 1] == block for s in seqs):
            lo = mid
        else:
            hi = mid - 1
    return lo


def make_policy(spec: SimulationSpec, workload: Workload, num_blocks: int):
    """The policy as the engine configures it. In vllm mode, as our vLLM scheduler class
    does: radix ports match whole blocks and mirror a cache of the pool's size (checked
    step by step against the real vLLM scheduler in tests/test_sim_matches_vllm.py)."""
    if spec.engine_mode == "vllm":
        policy = create_vllm_policy(
            spec.scheduler,
            spec.scheduler_params,
            block_size=spec.block_size,
            cache_capacity_tokens=num_blocks * spec.block_size,
            seed=spec.seed,
        )
    else:
        policy = create_engine_policy(
            spec.scheduler, spec.scheduler_params, block_size=spec.block_size, seed=spec.seed
        )
    policy.bind_workload(workload.requests)
    return policy


def simulate(
    spec: SimulationSpec,
    workload: Workload | None = None,
    progress: Callable[[str], None] | None = None,
    policy: AdmissionPolicy | None = None,
) -> SimulationResult:
    """Run one simulation. `workload` may be passed in to avoid reloading it; `policy` to
    carry one live policy object (a learner's table) through consecutive runs."""
    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    wall0 = time.perf_counter()
    model = get_model(spec.model)
    hardware = get_hardware(spec.hardware)
    workload = workload if workload is not None else load_workload(spec.workload)
    if not workload.requests:
        raise ValueError(f"workload {spec.workload!r} holds no requests: nothing to simulate")
    _check_fits_context(spec, workload, model)
    num_blocks, device_blocks = _kv_pool_blocks(spec, workload, model, hardware)
    regime = regime_fields(
        workload,
        num_blocks * spec.block_size,
        None if device_blocks is None else device_blocks * spec.block_size,
    )
    config = EngineConfig(
        mode=spec.engine_mode,
        num_blocks=num_blocks,
        block_size=spec.block_size,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        overlap_scheduling=spec.overlapped,
        prefix_read_once=spec.kernel == "cascade",
        prefix_cache=spec.prefix_cache,
    )
    sched_model = (
        cost_model(spec.sched_cost_model, spec.engine_mode, spec.block_size)
        if spec.sched_time == "model"
        else SchedulingCostModel.zero()
    )
    if policy is None:
        policy = make_policy(spec, workload, num_blocks)
    else:
        policy.bind_workload(workload.requests)
    if spec.sched_time == "model":  # refused before the engine runs, naming the class
        declared_cost_kind(type(policy))
    engine = Engine(
        workload.requests,
        policy,
        config,
        lambda batch: step_cost(
            model, hardware, batch, spec.kernel, unscheduled_block_ids=batch.idle_block_ids
        ),
        sched_model,
    )
    total = len(workload.requests)
    tick = None
    if progress is not None:

        def tick(steps: int, done: int, clock: float) -> None:
            progress(f"step {steps:,}: {done:,}/{total:,} requests done, {clock:.2f} s simulated")

    result = engine.run(tick)
    splits, time_split = attribute(result.steps, result.makespan_s, model, hardware)
    trace = _trace_table(result, splits)
    requests = _requests_table(result)
    oracle = roofline(workload.requests, model, hardware, spec.max_num_seqs)
    wall_s = time.perf_counter() - wall0
    summary = RunSummary(
        **_summary(result, trace, oracle.roofline_output_tok_s),
        **regime,
        time_split_s=time_split,  # sums to makespan_s (feather/sim/attribution.py)
        oracle=oracle.to_json(),
        wall_s=wall_s,
        sched_model_fallback_for=sorted(sched_model.uncalibrated),
        prefix_cache_at_start=spec.prefix_cache,
        warm_up_prefill_tokens=(
            None if result.warm_start is None else result.warm_start.prefill_tokens
        ),
        sched_cost_model=_sched_cost_summary(spec, sched_model.source),
        policy_scope_warning=_scope_warning(spec, policy),
        nvml=not_applicable(f"simulated run ({spec.hardware} profile), no device"),
        provenance=_provenance(
            spec, started, config, hardware, model, policy, sched_model.source, workload
        ),
    )
    return SimulationResult(spec, summary.to_json(), trace, requests, result)


def _check_fits_context(spec: SimulationSpec, workload: Workload, model: Any) -> None:
    """Every request fits the model's context (prompt + output), or one error naming one."""
    too_long = [
        r.request_id
        for r in workload.requests
        if r.prompt_len + r.output_len > model.context_tokens
    ]
    if too_long:
        raise ValueError(
            f"{len(too_long)} request(s) of {spec.workload!r} need more than {spec.model}'s "
            f"context of {model.context_tokens} tokens (prompt + output), e.g. {too_long[0]!r}; "
            f"build the workload for this model (feather workload build --model {spec.model})"
        )


def _kv_pool_blocks(
    spec: SimulationSpec, workload: Workload, model: Any, hardware: Any
) -> tuple[int, int | None]:
    """(the run's KV blocks, what the device's memory leaves - None for a CPU engine, whose
    pool is configured): `num_blocks`, a fraction of the workload's distinct shared-prefix
    tokens, or the device's."""
    kv_bytes_per_block = spec.block_size * model.kv_bytes_per_token
    # a CPU engine's pool is configured, not what device memory leaves (hardware.py says so)
    device_blocks = (
        None if hardware.step_time is not None
        else int(hardware.kv_pool_bytes(model) // kv_bytes_per_block)
    )
    num_blocks = spec.num_blocks or device_blocks
    if spec.kv_pool_fraction is not None:
        distinct = shared_prefix_tokens_of(workload)
        if not distinct:
            raise ValueError(
                f"{spec.workload!r} shares no prefix: a KV pool as a fraction of its shared "
                "prefix tokens is undefined (use --num-blocks)"
            )
        num_blocks = math.ceil(spec.kv_pool_fraction * distinct / spec.block_size)
    if num_blocks is None:
        hardware.kv_pool_bytes(model)  # raises: a CPU engine's pool must be given
    if num_blocks < 1:
        raise ValueError(f"{spec.model} leaves no memory for KV blocks on {spec.hardware}")
    return num_blocks, device_blocks


def _provenance(
    spec: SimulationSpec,
    started: str,
    config: EngineConfig,
    hardware: Any,
    model: Any,
    policy: AdmissionPolicy,
    sched_source: dict[str, Any],
    workload: Workload,
) -> dict[str, Any]:
    """What produced the run: the spec, the simulated engine and device, the policy as built,
    the scheduling-cost model's source and the workload file's hash."""
    return collect_provenance(
        config=spec.to_json(),
        seed=spec.seed,
        started_utc=started,
        extra={
            "engine": {
                "name": "sim",
                "version": feather.__version__,
                "attention_backend": f"simulated {spec.kernel} kernel",
                "block_size": spec.block_size,
                "mode": spec.engine_mode,
                "config": asdict(config),
                "kernel": spec.kernel,
            },
            "simulated_hardware": asdict(hardware),
            "model": asdict(model),
            "policy": {
                "name": policy.name,
                "class": type(policy).__qualname__,
                "params": policy.params(),
            },
            "sched_cost_model": sched_source,
            "workload": {
                "spec": spec.workload,
                "sha256": workload.provenance.get("parquet_sha256"),
                "statistics": workload.statistics,
            },
        },
    )


def _sched_cost_summary(spec: SimulationSpec, source: dict[str, Any]) -> dict[str, Any]:
    """Which model priced scheduling, from what data, and whether it overlapped the GPU."""
    name = spec.sched_cost_model if spec.sched_time == "model" else "zero"
    return {
        "name": name,
        "overlap_scheduling": spec.overlapped,
        "engine_base": source.get("engine_base"),
        "data": source.get("data"),
        "host_note": source.get("host_note")
        or ("CPU times of our ports measured on a 2-core VM" if name == "port" else None),
    }


def _scope_warning(spec: SimulationSpec, policy: AdmissionPolicy) -> str | None:
    """A frozen table deployed on a device, model or kernel other than its training's."""
    trained = getattr(policy, "trained_on", None)
    if not trained or not getattr(policy, "frozen", False):
        return None
    here = {"hardware": spec.hardware, "model": spec.model, "kernel": spec.kernel}
    differ = [f"{k} {trained.get(k)} -> {v}" for k, v in here.items() if trained.get(k) != v]
    return f"table trained elsewhere: {', '.join(differ)}" if differ else None


def _trace_table(result: EngineResult, splits: list[StepSplit]) -> pa.Table:
    rows: dict[str, list] = {name: [] for name in (
        "step", "start_s", "step_time_s", "cost_time_s", "phase", "batch_size", "decode_seqs",
        "prefill_tokens", "sampled_tokens", "shared_prefix_tokens", "distinct_groups",
        "kv_read_bytes", "kv_read_bytes_logical", "kv_write_bytes", "weight_bytes", "flops",
        "l2_hit_rate", "cascade_used", "bound", "admitted", "preempted", "finished",
        "cache_hit_tokens", "candidates", "decisions_add", "decisions_stop", "stop_reason",
        "waiting", "free_blocks", "sched_cpu_s", "sched_model_s", "recompute_tokens",
        "time_prefill_s", "time_recompute_s", "time_decode_s", "time_scheduling_s",
    )}  # fmt: skip
    for s, split in zip(result.steps, splits, strict=True):
        cost = s.cost
        values = {
            "step": s.step, "start_s": s.start_s, "step_time_s": s.step_time_s,
            "cost_time_s": cost.time_s, "phase": s.phase, "batch_size": len(s.batch.seqs),
            "decode_seqs": s.decode_seqs, "prefill_tokens": s.prefill_tokens,
            "sampled_tokens": s.sampled_tokens,
            "shared_prefix_tokens": _shared_depth_blocks(s.batch) * s.batch.block_size,
            "distinct_groups": len({q.group for q in s.batch.seqs}),
            "kv_read_bytes": cost.kv_read_bytes,
            "kv_read_bytes_logical": cost.kv_read_bytes_logical,
            "kv_write_bytes": cost.kv_write_bytes, "weight_bytes": cost.weight_bytes,
            "flops": cost.flops, "l2_hit_rate": cost.l2_hit_rate, "cascade_used": cost.cascade_used,
            "bound": cost.bound, "admitted": s.admitted, "preempted": s.preempted,
            "finished": s.finished, "cache_hit_tokens": s.cache_hit_tokens,
            "candidates": s.candidates, "decisions_add": s.decisions_add,
            "decisions_stop": s.decisions_stop, "stop_reason": s.stop_reason,
            "waiting": s.work.waiting, "free_blocks": s.free_blocks,
            "sched_cpu_s": s.sched_cpu_s, "sched_model_s": s.sched_model_s,
            "recompute_tokens": s.recompute_tokens, "time_prefill_s": split.prefill_s,
            "time_recompute_s": split.recompute_s, "time_decode_s": split.decode_s,
            "time_scheduling_s": split.scheduling_s,
        }  # fmt: skip
        for key, value in values.items():
            rows[key].append(value)
    return pa.table(rows)


def _requests_table(result: EngineResult) -> pa.Table:
    rs = result.requests
    return pa.table({
        "request_id": [r.id for r in rs], "group_id": [r.group for r in rs],
        "prompt_len": [r.prompt_len for r in rs], "output_len": [r.output_len for r in rs],
        "arrival_s": [r.arrival_s for r in rs], "admitted_s": [r.admitted_s for r in rs],
        "first_token_s": [r.first_token_s for r in rs], "finish_s": [r.finish_s for r in rs],
        "cached_tokens": [r.cached_tokens for r in rs], "preemptions": [r.preemptions for r in rs],
    })  # fmt: skip


def _summary(result: EngineResult, trace: pa.Table, oracle_tok_s: float) -> dict[str, Any]:
    rs, steps = result.requests, result.steps
    busy = sum(s.step_time_s for s in steps) or 1.0
    decode_steps = [s for s in steps if s.decode_seqs]
    kv_dram = sum(s.cost.kv_read_bytes for s in steps)
    kv_logical = sum(s.cost.kv_read_bytes_logical for s in steps)
    # as the real runners count it: what each request found cached when first admitted
    # (hits of re-admissions after preemption are in ..._with_readmissions)
    hits = sum(r.cached_tokens for r in rs)
    readmission_hits = sum(s.cache_hit_tokens for s in steps)
    sched_model = sum(s.sched_model_s for s in steps)
    sched_cpu = sum(s.sched_cpu_s for s in steps)
    gpu_time = sum(s.cost.time_s for s in steps)
    busy_total = sum(s.step_time_s for s in steps)
    latency = latency_summary(
        [r.arrival_s for r in rs],
        [r.admitted_s for r in rs],
        [r.first_token_s for r in rs],
        [r.finish_s for r in rs],
        [r.output_len for r in rs],
        [r.prompt_len for r in rs],
        makespan_s=result.makespan_s,  # the engine's clock, from 0
    )
    output_tok_s, prompt_tokens = latency["output_tok_s"], latency["prompt_tokens"]
    # the paper's C1 measure, as the real runners count it: tokens over time of the steps
    # that prefill nothing
    decode_only = [s for s in steps if s.prefill_tokens == 0 and s.step_time_s > 0]
    decode_only_s = sum(s.step_time_s for s in decode_only)
    return {
        **latency,
        "decode_only_steps": len(decode_only),
        "decode_only_tok_s": sum(s.sampled_tokens for s in decode_only) / decode_only_s
        if decode_only_s
        else None,
        "decode_only_step_s": decode_only_s / len(decode_only) if decode_only else None,
        "steps": len(steps),
        "decode_steps": len(decode_steps),
        "mean_batch_size": sum(len(s.batch.seqs) * s.step_time_s for s in steps) / busy,
        "mean_decode_batch_size": statistics.fmean(s.decode_seqs for s in decode_steps)
        if decode_steps
        else 0.0,
        "mean_shared_prefix_tokens": _time_weighted(trace, "shared_prefix_tokens", busy),
        "mean_distinct_groups": _time_weighted(trace, "distinct_groups", busy),
        "kv_read_bytes": kv_dram,
        "kv_read_bytes_logical": kv_logical,
        "l2_hit_rate": 1 - kv_dram / kv_logical if kv_logical else 0.0,
        "cascade_steps": sum(1 for s in steps if s.cost.cascade_used),
        "prefix_cache_hit_tokens": hits,
        "prefill_tokens_recomputed": sum(s.recompute_tokens for s in steps),
        "prefill_tokens_computed": sum(s.prefill_tokens - s.recompute_tokens for s in steps),
        "prefix_cache_hit_rate": hits / prompt_tokens if prompt_tokens else 0.0,
        "prefix_cache_hit_tokens_with_readmissions": readmission_hits,
        "preemptions": sum(r.preemptions for r in rs),
        "pool_evictions": result.pool_evictions,
        "sched_model_s": sched_model,
        "sched_exposed_s": busy_total - gpu_time,  # what scheduling added to the makespan
        "sched_cpu_s_measured": sched_cpu,
        "sched_fraction_of_step_time": sched_model / busy,
        "sched_cpu_fraction_of_gpu_time": sched_cpu / gpu_time if gpu_time else 0.0,
        "fraction_of_oracle": output_tok_s / oracle_tok_s if oracle_tok_s else None,
    }


def _time_weighted(trace: pa.Table, column: str, busy: float) -> float:
    values = trace.column(column).to_pylist()
    times = trace.column("step_time_s").to_pylist()
    return sum(v * t for v, t in zip(values, times, strict=True)) / busy


def write_run(
    result: SimulationResult, out_dir: str | Path, documents: dict[str, Any] | None = None
) -> Path:
    """trace.parquet, requests.parquet, the JSON `documents` (the run's spec.json), then
    summary.json - each atomically."""
    return write_run_dir(
        out_dir, result.trace, result.requests, result.summary, documents=documents
    )


def stderr_progress(message: str) -> None:
    print(f"[simulate] {message}", file=sys.stderr, flush=True)
