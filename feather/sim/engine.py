"""A discrete-event continuous-batching engine that runs the real admission policies.

Simulated time advances one engine step at a time by the cost model's step time plus the
step's scheduling time (serial), or by the larger of the two where scheduling overlaps the
GPU (`overlap_scheduling`: SGLang's default `event_loop_overlap` forms the next batch on the
CPU while the GPU runs the current one). Two modes, each a step rule in its own module
(`vllm_step.py`, `sglang_step.py`: what to schedule and in which kernel order), executed
here alike:

Kernel order: in `vllm` mode sequences are laid out as vLLM's persistent `InputBatch` keeps
them - a finished or preempted request leaves a hole, new requests fill the lowest holes
first, then the batch is condensed by moving requests from the end into the remaining
holes; in `sglang` mode, as its running batch keeps them (merge appends, filter keeps order).

`vllm` (vLLM V1's `Scheduler.schedule`): each step first continues running requests in
order (a decode token, or the next prefill chunk) under the token budget
`max_num_batched_tokens`; if a running request cannot get blocks, the last running request
is preempted (recompute: its blocks are freed, it waits again). Only if nothing was
preempted are waiting requests admitted, one candidate at a time from the policy, each
with its prefix-cache hit (at most prompt - 1 tokens, whole blocks), its prefill chunked to
the remaining budget, until the budget, `max_num_seqs` or memory stops it. Memory: a new
request is admitted only if blocks for its whole prompt are free, though only its first
chunk is allocated (`reserve_full_prompt`, vLLM's `scheduler_reserve_full_isl`, on by
default in vLLM 0.32; off, only the first chunk must fit, as in older vLLM). Prefill chunks
and decodes share one step.

`sglang` (SGLang's event loop): a step is either a prefill batch or a decode batch. If
requests wait, new ones are admitted PrefillAdder-style - at most `max_prefill_tokens` new
input tokens, one request chunked at `chunked_prefill_size`, memory reserved for the
running requests' remaining outputs times `new_token_ratio` - and run as a prefill batch
(decode pauses); otherwise all running requests decode. A decode that cannot get memory
retracts the running request with the least progress. After a request is refused for
memory, no prefill is tried (and no policy pass runs) until a running request leaves: SGLang's
`batch_is_full`.

Both use one `BlockPool` (prefix caching on cumulative block hashes). Generated tokens get
blocks hashed per request, so they are never shared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from feather.chunk_hash import chunk_hashes
from feather.engine_limits import DEFAULT_MAX_NUM_SEQS, ENGINE_MODES
from feather.engines.runs import PREFIX_CACHE_CHOICES
from feather.policies.base import AdmissionPolicy, Request, StepContext, StepOutcome
from feather.sim.batch_step import BatchStep, SeqStep
from feather.sim.kv_pool import BlockPool
from feather.sim.sched_cost import StepWork
from feather.sim.sglang_step import SglangStep
from feather.sim.step_plan import StepPlan
from feather.sim.vllm_step import VllmStep
from feather.sim.warm_start import WarmStart, warm_prefixes
from feather.timing import SchedulingTimer
from feather.workloads.schema import WorkloadRequest

Mode = Literal["vllm", "sglang"]
# each engine's step behind one interface: schedule(engine) -> StepPlan, layout(engine,
# scheduled) -> kernel order, left(request id), reserved_blocks
STEP_RULES: dict[str, type[VllmStep] | type[SglangStep]] = {"vllm": VllmStep, "sglang": SglangStep}


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits; defaults are the engines' own (vLLM V1 offline `LLM`, SGLang server).

    num_blocks: KV pool size in blocks (the runner derives it from the hardware and model).
    prefix_read_once: the attention kernel reads a batch-wide common prefix once (cascade);
        told to the policy in every `StepContext`.
    prefix_cache: "cold" starts with an empty prefix cache; "warm" with every prefix group's
        shared prefix cached (`feather.sim.warm_start`, the real engine's option of that name).
    """

    mode: Mode = "vllm"
    num_blocks: int = 4096
    block_size: int = 16
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 8192
    new_token_ratio: float = 0.7
    overlap_scheduling: bool = False
    reserve_full_prompt: bool = True
    prefix_read_once: bool = False
    prefix_cache: str = "cold"
    max_steps: int = 5_000_000

    def __post_init__(self) -> None:
        if self.mode not in ENGINE_MODES:
            raise ValueError(f"engine mode must be vllm or sglang, got {self.mode!r}")
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.prefix_cache not in PREFIX_CACHE_CHOICES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHE_CHOICES)}, "
                f"got {self.prefix_cache!r}"
            )
        if self.prefix_cache == "warm" and not self.enable_prefix_caching:
            raise ValueError("prefix_cache 'warm' needs enable_prefix_caching")


class SimRequest:
    """A request's life in the engine."""

    __slots__ = (
        "admitted_s",
        "arrival_s",
        "block_ids",
        "cached_tokens",
        "finish_s",
        "first_token_s",
        "group",
        "hashes",
        "high_water",
        "id",
        "num_computed",
        "num_output",
        "output_len",
        "preemptions",
        "prompt",
        "prompt_len",
    )  # fmt: skip

    def __init__(self, w: WorkloadRequest, block_size: int) -> None:
        self.id = w.request_id
        self.prompt = w.prompt_token_ids
        self.prompt_len = len(w.prompt_token_ids)
        self.output_len = w.output_len
        self.arrival_s = w.arrival_time_s
        self.group = w.group_id
        self.hashes: list = chunk_hashes(w.prompt_token_ids, block_size)
        self.num_computed = 0  # tokens whose KV exists (prefix hits included)
        self.num_output = 0
        self.admitted_s: float | None = None
        self.cached_tokens = 0  # prefix-cache hit at its first admission (as vLLM's runner)
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.preemptions = 0
        self.block_ids: tuple = ()  # the blocks it attends over, rebuilt only when they grow
        self.high_water = 0  # most tokens it ever had KV for (recomputation is below it)

    @property
    def num_tokens(self) -> int:
        """Tokens that need KV before the next token can be sampled."""
        return self.prompt_len + self.num_output

    def block_hashes(self, block_size: int) -> list:
        """Prompt hashes, extended by per-request hashes for blocks holding generated tokens."""
        full = self.num_tokens // block_size
        while len(self.hashes) < full:
            self.hashes.append(("generated", self.id, len(self.hashes)))
        return self.hashes


@dataclass
class StepRecord:
    step: int
    start_s: float
    step_time_s: float
    phase: str
    batch: BatchStep
    decode_seqs: int
    prefill_tokens: int
    sampled_tokens: int
    admitted: int
    preempted: int
    finished: int
    cache_hit_tokens: int
    candidates: int
    decisions_add: int
    decisions_stop: int
    stop_reason: str
    work: StepWork
    free_blocks: int
    sched_cpu_s: float
    sched_model_s: float
    cost: Any = None
    recompute_tokens: int = 0  # prefill tokens whose KV had existed before (see _recomputed)


@dataclass
class EngineResult:
    requests: list[SimRequest]
    steps: list[StepRecord] = field(default_factory=list)
    makespan_s: float = 0.0
    pool_evictions: int = 0
    warm_start: WarmStart | None = None  # what a warm prefix cache start computed, unmeasured


CostFn = Callable[[BatchStep], Any]  # returns an object with .time_s
# the policy's class (priced by the kind it declares, never by its name), work -> seconds
SchedCostFn = Callable[[type[AdmissionPolicy], StepWork], float]


class Engine:
    def __init__(
        self,
        requests: Sequence[WorkloadRequest],
        policy: AdmissionPolicy,
        config: EngineConfig,
        cost_fn: CostFn,
        sched_cost_fn: SchedCostFn,
        *,
        record_steps: bool = True,
    ) -> None:
        self.config = config
        self.policy = policy
        self.cost_fn = cost_fn
        self.sched_cost_fn = sched_cost_fn
        self.record_steps = record_steps
        self.rule = STEP_RULES[config.mode]()
        usable = config.num_blocks - self.rule.reserved_blocks
        if usable < 1:
            raise ValueError(f"num_blocks {config.num_blocks} leaves no usable block")
        self.pool = BlockPool(usable, config.block_size, config.enable_prefix_caching)
        self.requests = [SimRequest(r, config.block_size) for r in requests]
        self.by_id = {r.id: r for r in self.requests}
        if len(self.by_id) != len(self.requests):
            raise ValueError("duplicate request ids in the workload")
        too_big = [
            r.id
            for r in self.requests
            if -(-(r.prompt_len + r.output_len) // config.block_size) > usable
        ]
        if too_big:
            raise ValueError(
                f"{len(too_big)} request(s) need more KV blocks than the whole pool holds "
                f"({usable} usable blocks), e.g. {too_big[0]!r}"
            )
        # arrival order, ties in workload order (the order FCFS must keep; sorting ties by
        # id would regroup an interleaved or shuffled workload whose ids name their groups)
        self.pending = sorted(self.requests, key=lambda r: r.arrival_s)
        self._next_arrival = 0
        self.running: list[SimRequest] = []
        self.waiting: set[str] = set()
        self._waiting_tokens = 0
        self._arrivals = 0
        self._arrival_tokens = 0
        # this step's work, for the scheduling-cost model (StepWork)
        self.policy_pass = False  # the policy was asked for candidates
        self._decisions = self._candidate_tokens = self._candidate_hits = 0
        self.clock = 0.0
        self.timer = SchedulingTimer()
        self._ever_computed: set = set()  # hashes of every full block computed so far
        self.result = EngineResult(self.requests)
        if config.prefix_cache == "warm":  # before the first request, outside simulated time
            warm = warm_prefixes(self.pool, requests)
            self._ever_computed.update(warm.block_hashes)
            self.result.warm_start = warm
        self._unfinished = len(self.requests)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int, float], None] | None = None) -> EngineResult:
        step = 0
        while self._unfinished:
            self._arrive()
            if not self.running and not self.waiting:
                self.clock = max(self.clock, self.pending[self._next_arrival].arrival_s)
                continue
            if step >= self.config.max_steps:
                raise RuntimeError(f"simulation did not finish within {step} steps")
            self._execute(step, self.rule.schedule(self))
            step += 1
            if progress is not None and step % 200 == 0:
                progress(step, len(self.requests) - self._unfinished, self.clock)
        self.result.makespan_s = self.clock
        self.result.pool_evictions = self.pool.evictions
        return self.result

    def _arrive(self) -> None:
        pending = self.pending
        while (
            self._next_arrival < len(pending)
            and pending[self._next_arrival].arrival_s <= self.clock
        ):
            r = pending[self._next_arrival]
            self._next_arrival += 1
            with self.timer.measure():
                self.policy.add_request(
                    Request(
                        r.id,
                        prompt_token_ids=r.prompt,
                        chunk_hashes=r.hashes[: len(r.hashes)],
                        arrival_time=r.arrival_s,
                    )
                )
            self.waiting.add(r.id)
            self._waiting_tokens += r.num_tokens
            self._arrivals += 1
            self._arrival_tokens += r.prompt_len

    # ---- shared ----------------------------------------------------------------------------------
    # ---- what a step rule calls ------------------------------------------------------------------
    def timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """A policy call, its CPU time counted as this step's scheduling time."""
        with self.timer.measure():
            return call(*args)

    def begin_policy_pass(self, *, asked: bool, token_budget: int) -> None:
        """Tell the policy a step is being formed (`asked`: it will be asked for candidates,
        which the scheduling-cost model prices)."""
        self.policy_pass = asked
        cfg = self.config
        self.timed(
            self.policy.begin_step,
            StepContext(
                num_running=len(self.running),
                max_running=cfg.max_num_seqs,
                token_budget=token_budget,
                free_blocks=self.pool.num_free,
                prefix_read_once=cfg.prefix_read_once,
            ),
        )

    def end_policy_pass(self) -> tuple[str | None, int, int]:
        """The policy's own reason to stop admitting (None if it did not stop) and its
        unforced ADD and STOP decisions this step."""
        record = self.policy.last_step
        self._decisions = len(record.decisions)
        adds = sum(1 for d in record.decisions if not d.forced and d.action == "ADD")
        stops = sum(1 for d in record.decisions if not d.forced and d.action == "STOP")
        return (record.stop_reason.value if record.stop_reason else None), adds, stops

    def next_offer(self, plan: StepPlan) -> tuple[SimRequest, list] | None:
        """The policy's next candidate and its prefix-cache hit (whole blocks, at most
        prompt - 1 tokens), counted in the plan and priced per lookup; None when the policy
        offers no more."""
        rid = self.timed(self.policy.next_candidate)
        if rid is None:
            return None
        plan.candidates += 1
        req = self.by_id[rid]
        bs = self.config.block_size
        hit = self.pool.longest_hit(req.block_hashes(bs), req.num_tokens - 1)
        self._candidate_tokens += req.num_tokens
        self._candidate_hits += len(hit) * bs
        return req, hit

    def admit(self, req: SimRequest, cached_tokens: int) -> None:
        self.waiting.discard(req.id)
        self._waiting_tokens -= req.num_tokens
        req.num_computed = cached_tokens
        if req.admitted_s is None:
            req.admitted_s = self.clock
            req.cached_tokens = cached_tokens
        self.running.append(req)

    def preempt(self, req: SimRequest) -> None:
        """Free its KV and make it wait again (where it waits is the policy's choice: see
        AdmissionPolicy.preempted)."""
        self.pool.free(req.id)
        req.num_computed = 0
        req.block_ids = ()
        self.rule.left(req.id)
        req.preemptions += 1
        self.waiting.add(req.id)
        self._waiting_tokens += req.num_tokens
        with self.timer.measure():
            self.policy.preempted(req.id)

    def _recomputed(self, req: SimRequest, n_new: int) -> int:
        """Tokens of this chunk whose KV existed before: below the request's own high-water
        mark (it was preempted), or in full blocks someone computed and the pool evicted."""
        start, stop = req.num_computed, req.num_computed + n_new
        own = max(0, min(stop, req.high_water) - start)
        bs = self.config.block_size
        hashes = req.block_hashes(bs)
        first = -(-max(start, req.high_water) // bs)
        ever = self._ever_computed
        evicted = sum(1 for b in range(first, min(stop // bs, len(hashes))) if hashes[b] in ever)
        return own + evicted * bs

    def _note_computed(self, computed: list[tuple[SimRequest, int, int]]) -> None:
        """After a step: its full blocks exist now (a later computation is a recompute)."""
        bs = self.config.block_size
        for req, start, n_new in computed:
            stop = start + n_new
            req.high_water = max(req.high_water, stop)
            if stop // bs == start // bs:
                continue  # no block completed (most decode steps)
            self._ever_computed.update(req.block_hashes(bs)[start // bs : stop // bs])

    @property
    def waiting_tokens(self) -> int:
        """Tokens of the waiting requests."""
        return self._waiting_tokens

    # ---- running the planned step ----------------------------------------------------------------
    def _execute(self, step: int, plan: StepPlan) -> None:
        cfg, pool, scheduled = self.config, self.pool, plan.scheduled
        if not scheduled and not self.running:
            if self._next_arrival < len(self.pending):  # idle: wait for the next arrival
                self.timer.end_step()
                self.policy_pass = False
                self._decisions = self._candidate_tokens = self._candidate_hits = 0
                self.clock = max(self.clock, self.pending[self._next_arrival].arrival_s)
                return
            raise RuntimeError(
                f"policy {self.policy.name!r} admitted nothing into an idle engine while "
                f"{len(self.waiting)} request(s) wait and none will arrive: it would never finish"
            )
        seqs = []
        for rid in self.rule.layout(self, scheduled):
            n_new = scheduled[rid]
            req = self.by_id[rid]
            total = req.num_computed + n_new
            used = -(-total // cfg.block_size)
            if len(req.block_ids) != used:
                req.block_ids = tuple(pool.blocks_of(rid)[:used])
                pool.cache_full_blocks(rid, req.block_hashes(cfg.block_size), total)
            seqs.append(SeqStep(req.block_ids, req.num_computed, n_new, req.group))
        idle = tuple(r.block_ids for r in self.running if r.id not in scheduled and r.block_ids)
        batch = BatchStep(tuple(seqs), cfg.block_size, idle)
        cost = self.cost_fn(batch)
        start = self.clock
        self.clock += cost.time_s
        sampled = finished = prefill_tokens = decode_seqs = recompute = 0
        computed: list[tuple[SimRequest, int, int]] = []
        for rid, n_new in scheduled.items():
            req = self.by_id[rid]
            if n_new == 1 and req.num_computed >= req.prompt_len:
                decode_seqs += 1
            else:
                prefill_tokens += n_new
                recompute += self._recomputed(req, n_new)
            computed.append((req, req.num_computed, n_new))
            req.num_computed += n_new
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            req.num_output += 1
            sampled += 1
            if req.first_token_s is None:
                req.first_token_s = self.clock
            if req.num_output >= req.output_len:
                req.finish_s = self.clock
                self.running.remove(req)
                self.rule.left(rid)
                pool.free(rid)
                with self.timer.measure():
                    self.policy.finished(rid)
                finished += 1
                self._unfinished -= 1
        self._note_computed(computed)
        timing = self.timer.end_step()
        work = StepWork(
            candidates=plan.candidates,
            arrivals=self._arrivals,
            arrival_tokens=self._arrival_tokens,
            finished=finished,
            waiting=plan.waiting_count,
            waiting_tokens=plan.waiting_tokens,
            policy_pass=self.policy_pass,
            decisions=self._decisions,
            candidate_tokens=self._candidate_tokens,
            candidate_hit_tokens=self._candidate_hits,
            tree_nodes=self.policy.tree_nodes,
        )
        self._arrivals = self._arrival_tokens = 0
        self.policy_pass = False
        self._decisions = self._candidate_tokens = self._candidate_hits = 0
        sched_model = self.sched_cost_fn(type(self.policy), work)
        if cfg.overlap_scheduling:  # the next batch is formed while this one runs
            self.clock += max(0.0, sched_model - cost.time_s)
        else:  # vLLM V1's default path, SGLang's event_loop_normal: schedule, then run
            self.clock += sched_model
        step_time = self.clock - start
        self.policy.report_step(StepOutcome(len(scheduled), sampled, step_time, prefill_tokens))
        if self.record_steps:
            self.result.steps.append(
                StepRecord(
                    step=step,
                    start_s=start,
                    step_time_s=step_time,
                    phase=plan.phase,
                    batch=batch,
                    decode_seqs=decode_seqs,
                    prefill_tokens=prefill_tokens,
                    sampled_tokens=sampled,
                    admitted=plan.admitted,
                    preempted=plan.preempted,
                    finished=finished,
                    cache_hit_tokens=plan.hits,
                    candidates=plan.candidates,
                    decisions_add=plan.adds,
                    decisions_stop=plan.stops,
                    stop_reason=plan.reason,
                    work=work,
                    free_blocks=pool.num_free,
                    sched_cpu_s=timing.cpu_s,
                    sched_model_s=sched_model,
                    cost=cost,
                    recompute_tokens=recompute,
                )
            )
