"""vLLM V1 scheduler classes that admit waiting requests in the order of one of our policies.

Select with vLLM's own switch, and name the policy in `additional_config`:

    LLM(..., scheduler_cls="feather.engines.vllm.scheduler.FeatherScheduler",
        additional_config={"feather": {"scheduler": "feather-static", "params": {}, "seed": 0}})

`FeatherAsyncScheduler` is the same on vLLM's `AsyncScheduler` (GPU with async scheduling),
so Feather and the FCFS baseline can run with the same async setting.

What changes: only the waiting queue (`PolicyWaitingQueue`). vLLM's KV accounting, prefix
caching, chunked prefill and preemption run unchanged. `fcfs` keeps vLLM's own FCFS queue
(a pass-through: the real baseline, with the same per-step records as every policy).

Per step the scheduler records (`step_rows`, `trace_table()`): batch size, the shared-prefix
depth of the scheduled requests, distinct prefix groups (when the runner gives the request ->
group map), admissions, STOP decisions, scheduler CPU time (`time.thread_time` around
`schedule()`, and the policy's share of it), step wall time, prefix-cache hit tokens of the
admissions, preemptions, and each scheduled request's context and new tokens (the step's
shape, which the simulator's `cpu` step-time fit regresses on). Learning policies get their
reward from the measured step times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from feather.atomic import write_text_atomic
from feather.engines.vllm import attention_plugin, attention_timer
from feather.engines.vllm.queue import PolicyWaitingQueue
from feather.policies import AdmissionPolicy, StepContext, StepOutcome, create_vllm_policy
from feather.policies.base import Action, StopReason
from feather.workloads.schema import WorkloadRequest

NATIVE_FCFS = "fcfs"  # vLLM's own queue: the baseline, untouched


@dataclass(frozen=True)
class FeatherSettings:
    """`additional_config["feather"]`: which policy, its parameters and seed."""

    scheduler: str = NATIVE_FCFS
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    groups: list[Any] | None = None  # prefix group of the k-th request added, for the records
    # where to keep a JSON snapshot of what the scheduler and its policy hold (`held()`),
    # rewritten atomically at every arrival, step and free: a served engine runs in its own
    # process, and this is how a client or a test sees that nothing leaks. None: not written.
    state_file: str | None = None
    # where a learning policy keeps its table (`save`), rewritten atomically after every step
    # that updated it: what a served engine learns outlives the server, and the next one goes
    # on from it (params `policy_file` = this file). None: kept in memory only.
    policy_out: str | None = None
    # keep a row per step and per request (the offline runner's traces, `trace_rows()`); off,
    # what a served engine keeps stays bounded however long it serves (a row per step would
    # grow without end under `vllm serve`)
    records: bool = False

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> FeatherSettings:
        raw = dict((getattr(vllm_config, "additional_config", None) or {}).get("feather") or {})
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"additional_config['feather']: unknown key(s) {sorted(unknown)}")
        return cls(**raw)


@dataclass
class StepRow:
    """One schedule() + update_from_output() of the engine."""

    step: int
    start_s: float
    sched_cpu_s: float
    sched_wall_s: float
    policy_cpu_s: float
    batch_size: int
    decode_seqs: int
    prefill_tokens: int
    scheduled_tokens: int
    shared_prefix_tokens: int
    distinct_groups: int | None
    admitted: int
    cache_hit_tokens: int
    preempted: int
    waiting: int
    free_blocks: int
    candidates: int
    decisions_add: int
    decisions_stop: int
    stop_reason: str | None
    step_time_s: float | None = None
    # the engine process's CPU time over the same span (all its threads): what the step costs
    # the engine, apart from waiting for cores other processes hold (shared machines)
    step_cpu_s: float | None = None
    # seconds in vLLM's CPU attention kernel during the step (attention_timer; None: not timed)
    attention_s: float | None = None
    # decode KV tokens not shared with the request before each in the kernel's order, from
    # the kernel's block table (attention_timer; the step-time fit's homogeneity term)
    kernel_cold_kv_tokens: int | None = None
    # each sequence the kernel read, in its order: block ids, context and new tokens (None:
    # not seen), so a cold-KV rule with a cache capacity can be counted offline
    # (feather/kernels/cache_reuse.py)
    kernel_block_ids: list[list[int]] | None = None
    kernel_context_tokens: list[int] | None = None
    kernel_new_tokens: list[int] | None = None
    sampled_tokens: int = 0
    finished: int = 0
    # per scheduled request, in the order of num_scheduled_tokens: tokens with KV before the
    # step (cached or computed) and tokens computed in it (the step's shape, for step-time fits)
    seq_context_tokens: list[int] = field(default_factory=list)
    seq_new_tokens: list[int] = field(default_factory=list)


@dataclass
class RequestTimes:
    """When one request was admitted, got its first token and finished (s since the run's
    start), and what it cost: the engine-side view of TTFT, TPOT and waiting."""

    index: int  # the order in which the engine received it (since use_policy)
    prompt_tokens: int
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_tokens: int = 0
    preemptions: int = 0
    output_tokens: int = 0


def shared_prefix_blocks(hash_lists: list[list[Any]]) -> int:
    """Blocks common to every list (cumulative hashes: equal at k <=> equal up to k)."""
    if not hash_lists:
        return 0
    first = hash_lists[0]
    lo, hi = 0, min(len(h) for h in hash_lists)
    while lo < hi:  # the largest d with block d-1 equal in all lists (monotone in d)
        mid = (lo + hi + 1) // 2
        if all(h[mid - 1] == first[mid - 1] for h in hash_lists):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _FeatherSchedulingMixin:
    """What FeatherScheduler and FeatherAsyncScheduler add to vLLM's schedulers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self, "connector", None) is not None:
            raise ValueError(
                "the Feather scheduler does not support KV connectors (disaggregated "
                "prefill, KV offload): requests holding remote KV bypass the admission policy"
            )
        self.step_rows: list[StepRow] = []
        self.admission_policy: AdmissionPolicy | None = None
        self._native_waiting = self.waiting
        self._policy_queue: PolicyWaitingQueue | None = None
        settings = FeatherSettings.from_vllm_config(self.vllm_config)
        self._state_file = Path(settings.state_file) if settings.state_file else None
        self._policy_out = Path(settings.policy_out) if settings.policy_out else None
        self._saved_updates: int | None = None  # the policy's updates when last saved
        self._records = settings.records
        self.requests_added = 0  # since the engine started, over every policy
        self.requests_freed = 0
        # the policy's decisions since the engine started (kept with records off too): what
        # a served run's mechanism is read from - how often it held requests back
        self.decisions = {"steps": 0, "admitted": 0, "add": 0, "stop": 0, "policy_stops": 0}
        self.requests_freed_twice = 0  # frees of a request the engine no longer held
        self.use_policy(settings.scheduler, settings.params, settings.seed, settings.groups)
        self._write_state()

    # ---- configuration ----------------------------------------------------------------------
    def use_policy(
        self,
        scheduler: str,
        params: dict[str, Any] | None = None,
        seed: int = 0,
        groups: list[Any] | None = None,
        workload: Sequence[WorkloadRequest] | None = None,
        policy: AdmissionPolicy | None = None,
    ) -> None:
        """Switch the admission policy (only while the engine holds no request) and start a
        fresh record: one engine start serves many runs. `groups[k]` is the prefix group of
        the k-th request added from now on (for the distinct-groups record). `workload`: the
        requests about to be added, in order, for a policy that plans over them (`batches`):
        it is bound to them and told each one's engine id as it arrives. `policy`: an object
        made by `new_policy` to run instead of a fresh one (a learner that goes on learning
        from run to run); `scheduler` and `params` then only name it."""
        if self.requests:
            raise RuntimeError(
                f"use_policy({scheduler!r}) while {len(self.requests)} request(s) are in the "
                "engine: switch policies only between runs"
            )
        self.scheduler_name = scheduler
        self._groups = groups
        # our cascade backend serves this engine's decode steps (the env is what the plugin
        # read when this engine started, and what spawned engine processes inherit)
        self._prefix_read_once = attention_plugin.mode_from_env() == "cascade"
        attention_timer.take()  # what ran before (start-up's warm-up runs) is no step's
        self._plan_ids: list[str] | None = None
        self._group_of: dict[str, Any] = {}
        self.step_rows = []
        self.request_times: dict[str, RequestTimes] = {}
        self._arrivals = 0  # requests added since use_policy
        self._rows_in_flight: dict[int, StepRow] = {}
        self._clock0 = time.perf_counter()
        self._last_update: float | None = None
        self._last_update_cpu: float | None = None
        self._first_schedule_cpu: float | None = None
        if scheduler == NATIVE_FCFS and not params:
            self.admission_policy, self._policy_queue = None, None
            self.waiting = self._native_waiting
            return
        if policy is None:
            policy = self.new_policy(scheduler, params, seed)
        self.admission_policy = policy
        self._policy_queue = PolicyWaitingQueue(self.admission_policy, self._step_context)
        self.waiting = self._policy_queue
        if self.admission_policy.plans_over_workload:
            if workload is None:
                raise ValueError(
                    f"scheduler {scheduler!r} plans over the workload's requests: "
                    "use_policy needs them (workload=...)"
                )
            self._plan_ids = [r.request_id for r in workload]
        if workload is not None:
            self.admission_policy.bind_workload(workload)

    def new_policy(
        self, scheduler: str, params: dict[str, Any] | None = None, seed: int = 0
    ) -> AdmissionPolicy:
        """A policy as this engine configures it: chunks and radix pages are its blocks, the
        radix ports mirror a cache of its KV pool's size."""
        num_blocks = self.cache_config.num_gpu_blocks
        return create_vllm_policy(
            scheduler,
            params,
            block_size=self.hash_block_size,
            cache_capacity_tokens=num_blocks * self.block_size if num_blocks else None,
            seed=seed,
        )

    def _step_context(self) -> StepContext:
        return StepContext(
            num_running=len(self.running),
            max_running=self.max_num_running_reqs,
            token_budget=self.max_num_scheduled_tokens,
            free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            prefix_read_once=self._prefix_read_once,
        )

    # ---- vLLM's hooks -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        index, self._arrivals = self._arrivals, self._arrivals + 1
        self.request_times[request.request_id] = RequestTimes(index, request.num_prompt_tokens)
        if self._groups is not None and index < len(self._groups):
            self._group_of[request.request_id] = self._groups[index]
        if self._plan_ids is not None:
            if index >= len(self._plan_ids):
                raise RuntimeError(
                    f"request {index + 1} arrived; the plan holds {len(self._plan_ids)}"
                )
            self.admission_policy.alias(self._plan_ids[index], request.request_id)
        super().add_request(request)
        self.requests_added += 1
        self._write_state()

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        running_before = {r.request_id for r in self.running}
        self._preempted_in_step = 0
        queue = self._policy_queue
        if queue is not None:
            queue.open_step()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        if self._first_schedule_cpu is None:
            self._first_schedule_cpu = time.process_time()
        output = super().schedule(*args, **kwargs)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
        took_part = queue.close_step() if queue is not None else False
        self._record_schedule(output, running_before, wall0, cpu, wall, took_part)
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any):
        self._finished_in_update = 0
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now, now_cpu = time.perf_counter(), time.process_time()
        row = self._row_for(scheduler_output)
        if row is not None:
            started = self._last_update or self._clock0 + row.start_s  # first: its schedule()
            row.step_time_s = now - started
            attention = attention_timer.take()
            if attention is not None:
                row.attention_s = attention.seconds
                row.kernel_cold_kv_tokens = attention.cold_kv_tokens
                if attention.rows is not None:
                    row.kernel_block_ids = [list(b) for b, _, _ in attention.rows]
                    row.kernel_context_tokens = [c for _, c, _ in attention.rows]
                    row.kernel_new_tokens = [n for _, _, n in attention.rows]
            cpu_started = (
                self._last_update_cpu
                if self._last_update_cpu is not None
                else self._first_schedule_cpu
            )
            row.step_cpu_s = now_cpu - cpu_started if cpu_started is not None else None
            row.sampled_tokens = sum(len(t) for t in model_runner_output.sampled_token_ids)
            for req_id, tokens in zip(
                model_runner_output.req_ids, model_runner_output.sampled_token_ids, strict=False
            ):
                times = self.request_times.get(req_id)
                if times is not None and tokens and times.first_token_s is None:
                    times.first_token_s = now - self._clock0
            row.finished = self._finished_in_update
            if self.admission_policy is not None:
                self.admission_policy.report_step(
                    StepOutcome(
                        row.batch_size, row.sampled_tokens, row.step_time_s, row.prefill_tokens
                    )
                )
                self._keep_policy()
        self._last_update, self._last_update_cpu = now, now_cpu
        self._write_state()
        return outputs

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)
        self._preempted_in_step = getattr(self, "_preempted_in_step", 0) + 1

    def _free_request(self, request: Request, *args: Any, **kwargs: Any):
        request_id = request.request_id
        if request_id not in self.requests:
            # freed already (or never held): counted, never a crash in the engine's step
            self.requests_freed_twice += 1
            return None, None
        # a request put in the engine without add_request (vLLM's own tests do) has no times
        times = (self.request_times.get(request_id) if self._records
                 else self.request_times.pop(request_id, None))
        if times is not None:
            times.finish_s = time.perf_counter() - self._clock0
            times.preemptions = request.num_preemptions
            times.output_tokens = request.num_output_tokens
        result = super()._free_request(request, *args, **kwargs)
        if self._policy_queue is not None:
            self._policy_queue.forget(request.request_id)
        self._finished_in_update = getattr(self, "_finished_in_update", 0) + 1
        self.requests_freed += 1
        self._write_state()
        return result

    # ---- what it holds ------------------------------------------------------------------------
    def held(self) -> dict[str, Any]:
        """What the engine's scheduler and the policy hold now, and the request accounting
        since the engine started: after a burst of any clients, aborts and disconnects
        included, `requests`, `waiting`, `running` and the policy's footprint return to 0,
        `freed` equals `added`, and no request was freed twice."""
        return {
            "scheduler": self.scheduler_name,
            "requests": len(self.requests),
            "waiting": len(self.waiting),
            "running": len(self.running),
            "added": self.requests_added,
            "freed": self.requests_freed,
            "freed_twice": self.requests_freed_twice,
            "records": {"steps": len(self.step_rows), "requests": len(self.request_times)},
            "decisions": dict(self.decisions),
            "policy": (self.admission_policy.footprint()
                       if self.admission_policy is not None else None),
        }

    def _keep_policy(self) -> None:
        """Save a learning policy's table where `policy_out` says, when it has changed."""
        policy = self.admission_policy
        if self._policy_out is None or policy is None or getattr(policy, "frozen", True):
            return
        updates = getattr(policy, "updates", None)
        if updates is not None and updates != self._saved_updates:
            policy.save(self._policy_out)  # type: ignore[attr-defined]
            self._saved_updates = updates

    def _write_state(self) -> None:
        if self._state_file is not None:
            write_text_atomic(self._state_file, json.dumps(self.held(), sort_keys=True))

    # ---- records ------------------------------------------------------------------------------
    def _record_schedule(
        self,
        output: SchedulerOutput,
        running_before: set[str],
        wall0: float,
        cpu: float,
        wall: float,
        took_part: bool,
    ) -> None:
        scheduled = output.num_scheduled_tokens
        requests = [self.requests[rid] for rid in scheduled]
        decode = prefill_tokens = 0
        contexts, news = [], []
        for request in requests:
            done_before = request.num_computed_tokens - scheduled[request.request_id]
            contexts.append(done_before)
            news.append(scheduled[request.request_id])
            # a decode computes one token past the prompt; anything else is prefill, the
            # recompute of a resumed request's generated tokens included (as the simulator)
            if scheduled[request.request_id] == 1 and done_before >= request.num_prompt_tokens:
                decode += 1
            else:
                prefill_tokens += scheduled[request.request_id]
        admitted = [r for r in self.running if r.request_id not in running_before]
        for request in admitted:
            times = self.request_times.get(request.request_id)  # none: not via add_request
            if times is not None and times.admitted_s is None:  # the first admission
                times.admitted_s = wall0 - self._clock0
                times.cached_tokens = max(
                    request.num_computed_tokens - scheduled.get(request.request_id, 0), 0
                )
        hits = sum(r.num_computed_tokens - scheduled.get(r.request_id, 0) for r in admitted)
        policy = self.admission_policy
        record = policy.last_step if policy is not None and took_part else None
        decisions = record.decisions if record is not None else []
        counts = self.decisions
        counts["steps"] += 1
        counts["admitted"] += len(admitted)
        counts["add"] += sum(d.action is Action.ADD for d in decisions)
        counts["stop"] += sum(d.action is Action.STOP for d in decisions)
        counts["policy_stops"] += bool(record and record.stop_reason == StopReason.POLICY)
        group_of = self._group_of if self._groups is not None else None
        row = StepRow(
            step=len(self.step_rows),
            start_s=wall0 - self._clock0,
            sched_cpu_s=cpu,
            sched_wall_s=wall,
            policy_cpu_s=self._policy_queue.take_policy_cpu_s() if self._policy_queue else 0.0,
            batch_size=len(requests),
            decode_seqs=decode,
            prefill_tokens=prefill_tokens,
            scheduled_tokens=output.total_num_scheduled_tokens,
            shared_prefix_tokens=self.hash_block_size
            * shared_prefix_blocks([r.block_hashes for r in requests]),
            distinct_groups=len({group_of.get(r.request_id) for r in requests})
            if group_of is not None
            else None,
            admitted=len(admitted),
            cache_hit_tokens=max(hits, 0),
            preempted=self._preempted_in_step,
            waiting=len(self.waiting),
            free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            candidates=len(record.admitted) + (record.refused is not None) if record else 0,
            decisions_add=sum(d.action is Action.ADD for d in decisions),
            decisions_stop=sum(d.action is Action.STOP for d in decisions),
            stop_reason=str(record.stop_reason) if record and record.stop_reason else None,
            seq_context_tokens=contexts,
            seq_new_tokens=news,
        )
        if self._records:
            self.step_rows.append(row)
        self._rows_in_flight[id(output)] = row

    def _row_for(self, output: SchedulerOutput) -> StepRow | None:
        """The row of the step this output came from (async: not always the last one)."""
        return self._rows_in_flight.pop(id(output), None)

    def trace_rows(self) -> list[dict[str, Any]]:
        return [asdict(row) for row in self.step_rows]


class FeatherScheduler(_FeatherSchedulingMixin, Scheduler):
    """vLLM V1's Scheduler, admitting in the order of a Feather-registry policy."""


class FeatherAsyncScheduler(_FeatherSchedulingMixin, AsyncScheduler):
    """The same on vLLM's AsyncScheduler (async scheduling on GPU)."""
