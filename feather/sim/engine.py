"""A discrete-event continuous-batching engine that runs the real admission policies.

Simulated time advances one engine step at a time by the cost model's step time plus the
step's scheduling time (serial), or by the larger of the two where scheduling overlaps the
GPU (`overlap_scheduling`: SGLang's default `event_loop_overlap` forms the next batch on the
CPU while the GPU runs the current one). Two modes:

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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from feather.chunk_hash import chunk_hashes
from feather.engine_limits import DEFAULT_MAX_NUM_SEQS
from feather.policies.base import AdmissionPolicy, Request, StepContext, StepOutcome
from feather.sim.batch_step import BatchStep, SeqStep
from feather.sim.kv_pool import BlockPool
from feather.sim.sched_cost import StepWork
from feather.timing import SchedulingTimer
from feather.workloads.schema import WorkloadRequest

Mode = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits; defaults are the engines' own (vLLM V1 offline `LLM`, SGLang server).

    num_blocks: KV pool size in blocks (the runner derives it from the hardware and model).
    prefix_read_once: the attention kernel reads a batch-wide common prefix once (cascade);
        told to the policy in every `StepContext`.
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
    max_steps: int = 5_000_000

    def __post_init__(self) -> None:
        if self.mode not in ("vllm", "sglang"):
            raise ValueError(f"engine mode must be vllm or sglang, got {self.mode!r}")
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


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


CostFn = Callable[[BatchStep], Any]  # returns an object with .time_s
SchedCostFn = Callable[[str, StepWork], float]  # policy name, work -> seconds


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
        # vLLM's BlockPool keeps block 0 as its null block, never allocated
        usable = config.num_blocks - 1 if config.mode == "vllm" else config.num_blocks
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
        self._policy_pass = False
        self._decisions = self._candidate_tokens = self._candidate_hits = 0
        self._batch_full = False  # SGLang's running_batch.batch_is_full (sglang mode)
        self.slots: list[SimRequest | None] = []  # vLLM's persistent batch layout
        self._slot_of: dict[str, int] = {}
        self._left_batch: list[str] = []  # finished or preempted since the last layout
        self.clock = 0.0
        self.timer = SchedulingTimer()
        self._ever_computed: set = set()  # hashes of every full block computed so far
        self.result = EngineResult(self.requests)
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
            if self.config.mode == "vllm":
                self._vllm_step(step)
            else:
                self._sglang_step(step)
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

    # ---- vLLM V1 -------------------------------------------------------------------------------
    def _vllm_step(self, step: int) -> None:
        cfg, pool = self.config, self.pool
        budget = cfg.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        preempted = 0
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n_new = min(req.num_tokens - req.num_computed, budget)
            if pool.covers(req.id, req.num_computed + n_new):  # nothing to allocate or cache
                scheduled[req.id] = n_new
                budget -= n_new
                i += 1
                continue
            while not pool.allocate(req.id, req.num_computed + n_new):
                victim = running.pop()
                self._preempt(victim)
                scheduled.pop(victim.id, None)
                preempted += 1
                if victim is req:
                    break
            else:
                # vLLM caches a chunk's full blocks when it allocates them, so a request
                # admitted later in this step already hits them
                pool.cache_full_blocks(
                    req.id, req.block_hashes(cfg.block_size), req.num_computed + n_new
                )
                scheduled[req.id] = n_new
                budget -= n_new
                i += 1
                continue
            break
        admitted, hits, candidates, adds, stops, reason = 0, 0, 0, 0, 0, "preempted"
        waiting_tokens = self._waiting_prompt_tokens()
        waiting_count = len(self.waiting)
        if not preempted:
            room = budget > 0 and len(running) < cfg.max_num_seqs
            self._policy_pass = room and bool(self.waiting)  # the policy is asked for candidates
            timed, policy = self._timed, self.policy
            timed(
                policy.begin_step,
                StepContext(
                    num_running=len(running),
                    max_running=cfg.max_num_seqs,
                    token_budget=budget,
                    free_blocks=pool.num_free,
                    prefix_read_once=cfg.prefix_read_once,
                ),
            )
            while budget > 0 and len(running) < cfg.max_num_seqs:
                rid = timed(policy.next_candidate)
                if rid is None:
                    break
                candidates += 1
                req = self.by_id[rid]
                hit = pool.longest_hit(req.block_hashes(cfg.block_size), req.num_tokens - 1)
                self._note_candidate(req, len(hit) * cfg.block_size)
                n_new = min(req.num_tokens - len(hit) * cfg.block_size, budget)
                whole_prompt_fits = not cfg.reserve_full_prompt or (
                    pool.blocks_needed(req.id, req.num_tokens, hit) <= pool.num_free
                )
                if not whole_prompt_fits or not pool.allocate(
                    req.id, len(hit) * cfg.block_size + n_new, hit
                ):
                    timed(policy.refused, rid)
                    break
                timed(policy.admitted, rid)
                self._admit(req, len(hit) * cfg.block_size)
                pool.cache_full_blocks(rid, req.hashes, req.num_computed + n_new)
                hits += len(hit) * cfg.block_size
                scheduled[rid] = n_new
                budget -= n_new
                admitted += 1
            record = self.policy.last_step
            reason = (
                record.stop_reason.value
                if record.stop_reason
                else ("token_budget" if budget <= 0 else "max_num_seqs")
            )
            adds = sum(1 for d in record.decisions if not d.forced and d.action == "ADD")
            stops = sum(1 for d in record.decisions if not d.forced and d.action == "STOP")
            self._decisions = len(record.decisions)
        self._execute(
            step,
            scheduled,
            "mixed",
            admitted,
            preempted,
            hits,
            candidates,
            adds,
            stops,
            reason,
            waiting_count,
            waiting_tokens,
        )

    # ---- SGLang --------------------------------------------------------------------------------
    def _sglang_step(self, step: int) -> None:
        cfg, pool = self.config, self.pool
        scheduled: dict[str, int] = {}
        admitted = hits = candidates = adds = stops = preempted = 0
        reason = ""
        waiting_tokens = self._waiting_prompt_tokens()
        waiting_count = len(self.waiting)
        chunked = [r for r in self.running if r.num_computed < r.prompt_len]
        if chunked:  # finish the chunked prefill before anything else (SGLang's chunked_req)
            self._policy_pass = True  # SGLang's calc_priority runs with a chunked request too
            req = chunked[0]
            n_new = min(req.num_tokens - req.num_computed, cfg.chunked_prefill_size)
            if pool.allocate(req.id, req.num_computed + n_new):
                scheduled[req.id] = n_new
        elif (
            self.waiting
            and len(self.running) < cfg.max_num_seqs
            and not (self._batch_full and self.running)
        ):
            self._policy_pass = True
            rem_input = cfg.max_prefill_tokens
            rem_chunk = cfg.chunked_prefill_size
            reserve = sum(
                math.ceil((r.output_len - r.num_output) * cfg.new_token_ratio) for r in self.running
            )
            timed, policy = self._timed, self.policy
            timed(
                policy.begin_step,
                StepContext(
                    num_running=len(self.running),
                    max_running=cfg.max_num_seqs,
                    token_budget=rem_input,
                    free_blocks=pool.num_free,
                    prefix_read_once=cfg.prefix_read_once,
                ),
            )
            while len(self.running) < cfg.max_num_seqs and rem_input > 0 and rem_chunk > 0:
                rid = timed(policy.next_candidate)
                if rid is None:
                    break
                candidates += 1
                req = self.by_id[rid]
                hit = pool.longest_hit(req.block_hashes(cfg.block_size), req.num_tokens - 1)
                cached = len(hit) * cfg.block_size
                self._note_candidate(req, cached)
                extend = req.num_tokens - cached
                n_new = min(extend, rem_chunk)
                need_tokens = extend + math.ceil(
                    (req.output_len - req.num_output) * cfg.new_token_ratio
                )
                free_tokens = (pool.num_free - pool.blocks_needed(req.id, 0, hit)) * cfg.block_size
                no_token = need_tokens + reserve > free_tokens  # PrefillAdder: NO_TOKEN
                if (
                    no_token
                    or (extend > rem_input and admitted)  # PrefillAdder: OTHER
                    or not pool.allocate(req.id, cached + n_new, hit)
                ):
                    # NO_TOKEN with something running: no prefill until a request leaves
                    self._batch_full = no_token and bool(self.running)
                    timed(policy.refused, rid)
                    break
                timed(policy.admitted, rid)
                self._admit(req, cached)
                pool.cache_full_blocks(rid, req.hashes, cached + n_new)
                hits += cached
                scheduled[rid] = n_new
                rem_input -= n_new
                rem_chunk -= n_new
                reserve += need_tokens - extend
                admitted += 1
                if n_new < extend:  # this one is chunked: it continues next step
                    break
            record = policy.last_step
            reason = record.stop_reason.value if record.stop_reason else "prefill_budget"
            adds = sum(1 for d in record.decisions if not d.forced and d.action == "ADD")
            stops = sum(1 for d in record.decisions if not d.forced and d.action == "STOP")
            self._decisions = len(record.decisions)
        if scheduled:
            self._execute(
                step,
                scheduled,
                "prefill",
                admitted,
                0,
                hits,
                candidates,
                adds,
                stops,
                reason,
                waiting_count,
                waiting_tokens,
            )
            return
        running = self.running  # decode everyone; retract the least advanced on shortage
        while running:
            need = sum(pool.blocks_needed(r.id, r.num_computed + 1) for r in running)
            if need <= pool.num_free:
                break
            victim = min(running, key=lambda r: (r.num_output, -r.prompt_len))
            running.remove(victim)
            self._preempt(victim, to_front=False)
            self._batch_full = False  # a retraction frees memory, as SGLang resets the flag
            preempted += 1
        for req in running:
            pool.allocate(req.id, req.num_computed + 1)
            scheduled[req.id] = 1
        self._execute(
            step,
            scheduled,
            "decode",
            0,
            preempted,
            0,
            0,
            0,
            0,
            "decode" if not preempted else "retracted",
            waiting_count,
            waiting_tokens,
        )

    # ---- shared ----------------------------------------------------------------------------------
    def _timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """A policy call, its CPU time counted as this step's scheduling time."""
        with self.timer.measure():
            return call(*args)

    def _note_candidate(self, req: SimRequest, hit_tokens: int) -> None:
        """A request the engine looks up in its prefix cache (priced per lookup)."""
        self._candidate_tokens += req.num_tokens
        self._candidate_hits += hit_tokens

    def _layout(self, scheduled: dict[str, int]) -> list[str]:
        """Kernel order of the scheduled requests (see the module docstring)."""
        if self.config.mode == "sglang":
            return [r.id for r in self.running if r.id in scheduled]
        slots, slot_of = self.slots, self._slot_of
        for rid in self._left_batch:
            index = slot_of.pop(rid, None)
            if index is not None:
                slots[index] = None
        self._left_batch.clear()
        holes = [i for i, r in enumerate(slots) if r is None]
        holes.reverse()  # pop() gives the lowest
        for rid in scheduled:
            if rid not in slot_of:
                index = holes.pop() if holes else len(slots)
                if index == len(slots):
                    slots.append(None)
                slots[index] = self.by_id[rid]
                slot_of[rid] = index
        holes.reverse()
        for hole in holes:  # condense: the last request moves into the lowest hole
            while slots and slots[-1] is None:
                slots.pop()
            if hole >= len(slots):
                break
            moved = slots.pop()
            slots[hole] = moved
            slot_of[moved.id] = hole
        while slots and slots[-1] is None:
            slots.pop()
        return [r.id for r in slots if r is not None and r.id in scheduled]

    def _admit(self, req: SimRequest, cached_tokens: int) -> None:
        self.waiting.discard(req.id)
        self._waiting_tokens -= req.num_tokens
        req.num_computed = cached_tokens
        if req.admitted_s is None:
            req.admitted_s = self.clock
            req.cached_tokens = cached_tokens
        self.running.append(req)

    def _preempt(self, req: SimRequest, to_front: bool = True) -> None:
        del to_front  # where it waits is the policy's choice (see AdmissionPolicy.preempted)
        self.pool.free(req.id)
        req.num_computed = 0
        req.block_ids = ()
        self._left_batch.append(req.id)
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

    def _waiting_prompt_tokens(self) -> int:
        return self._waiting_tokens

    def _execute(
        self,
        step: int,
        scheduled: dict[str, int],
        phase: str,
        admitted: int,
        preempted: int,
        hits: int,
        candidates: int,
        adds: int,
        stops: int,
        reason: str,
        waiting_count: int,
        waiting_tokens: int,
    ) -> None:
        cfg, pool = self.config, self.pool
        if not scheduled and not self.running:
            if self._next_arrival < len(self.pending):  # idle: wait for the next arrival
                self.timer.end_step()
                self._policy_pass = False
                self._decisions = self._candidate_tokens = self._candidate_hits = 0
                self.clock = max(self.clock, self.pending[self._next_arrival].arrival_s)
                return
            raise RuntimeError(
                f"policy {self.policy.name!r} admitted nothing into an idle engine while "
                f"{len(self.waiting)} request(s) wait and none will arrive: it would never finish"
            )
        seqs = []
        for rid in self._layout(scheduled):
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
                self._left_batch.append(rid)
                pool.free(rid)
                with self.timer.measure():
                    self.policy.finished(rid)
                finished += 1
                self._unfinished -= 1
                self._batch_full = False  # SGLang: the running batch shrank
        self._note_computed(computed)
        timing = self.timer.end_step()
        work = StepWork(
            candidates=candidates,
            arrivals=self._arrivals,
            arrival_tokens=self._arrival_tokens,
            finished=finished,
            waiting=waiting_count,
            waiting_tokens=waiting_tokens,
            policy_pass=self._policy_pass,
            decisions=self._decisions,
            candidate_tokens=self._candidate_tokens,
            candidate_hit_tokens=self._candidate_hits,
            tree_nodes=getattr(self.policy, "tree_nodes", 0),
        )
        self._arrivals = self._arrival_tokens = 0
        self._policy_pass = False
        self._decisions = self._candidate_tokens = self._candidate_hits = 0
        sched_model = self.sched_cost_fn(self.policy.name, work)
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
                    phase=phase,
                    batch=batch,
                    decode_seqs=decode_seqs,
                    prefill_tokens=prefill_tokens,
                    sampled_tokens=sampled,
                    admitted=admitted,
                    preempted=preempted,
                    finished=finished,
                    cache_hit_tokens=hits,
                    candidates=candidates,
                    decisions_add=adds,
                    decisions_stop=stops,
                    stop_reason=reason,
                    work=work,
                    free_blocks=pool.num_free,
                    sched_cpu_s=timing.cpu_s,
                    sched_model_s=sched_model,
                    cost=cost,
                    recompute_tokens=recompute,
                )
            )
