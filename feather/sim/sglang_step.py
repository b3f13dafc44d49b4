"""SGLang's step in the simulated engine: its event loop's prefill-or-decode batch with
PrefillAdder's admission, and the running batch's order as kernel order (the behaviour is
described in feather/sim/engine.py's module docstring)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from feather.sim.step_plan import StepPlan

if TYPE_CHECKING:
    from feather.sim.engine import Engine


class SglangStep:
    """A chunked prefill first; else, while requests wait and memory allows, a prefill batch
    of the policy's candidates; else every running request decodes, retracting the least
    advanced on a memory shortage."""

    reserved_blocks = 0

    def __init__(self) -> None:
        # SGLang's running_batch.batch_is_full: after a request is refused for memory, no
        # prefill (and no policy pass) until a running request leaves
        self.batch_full = False

    def left(self, request_id: str) -> None:
        """A request finished or was retracted: the running batch shrank."""
        del request_id
        self.batch_full = False

    def layout(self, engine: Engine, scheduled: dict[str, int]) -> list[str]:
        """Kernel order: the running batch's (a merge appends, a filter keeps the order)."""
        return [r.id for r in engine.running if r.id in scheduled]

    def schedule(self, engine: Engine) -> StepPlan:
        cfg, pool = engine.config, engine.pool
        scheduled: dict[str, int] = {}
        plan = StepPlan(
            scheduled,
            "prefill",
            waiting_count=len(engine.waiting),
            waiting_tokens=engine.waiting_tokens,
        )
        chunked = [r for r in engine.running if r.num_computed < r.prompt_len]
        if chunked:  # finish the chunked prefill before anything else (SGLang's chunked_req)
            engine.policy_pass = True  # SGLang's calc_priority runs with a chunked request too
            req = chunked[0]
            n_new = min(req.num_tokens - req.num_computed, cfg.chunked_prefill_size)
            if pool.allocate(req.id, req.num_computed + n_new):
                scheduled[req.id] = n_new
        elif (
            engine.waiting
            and len(engine.running) < cfg.max_num_seqs
            and not (self.batch_full and engine.running)
        ):
            self._admit_prefill(engine, plan)
        if scheduled:
            return plan
        return self._decode(engine, plan)

    def _admit_prefill(self, engine: Engine, plan: StepPlan) -> None:
        """PrefillAdder: new input tokens up to `max_prefill_tokens`, one request chunked at
        `chunked_prefill_size`, memory reserved for the running requests' remaining outputs
        times `new_token_ratio`."""
        cfg, pool, running, scheduled = engine.config, engine.pool, engine.running, plan.scheduled
        rem_input = cfg.max_prefill_tokens
        rem_chunk = cfg.chunked_prefill_size
        reserve = sum(
            math.ceil((r.output_len - r.num_output) * cfg.new_token_ratio) for r in running
        )
        engine.begin_policy_pass(asked=True, token_budget=rem_input)
        policy, timed = engine.policy, engine.timed
        while len(running) < cfg.max_num_seqs and rem_input > 0 and rem_chunk > 0:
            offer = engine.next_offer(plan)
            if offer is None:
                break
            req, hit = offer
            rid = req.id
            cached = len(hit) * cfg.block_size
            extend = req.num_tokens - cached
            n_new = min(extend, rem_chunk)
            remaining_output = req.output_len - req.num_output
            need_tokens = extend + math.ceil(remaining_output * cfg.new_token_ratio)
            free_tokens = (pool.num_free - pool.blocks_needed(req.id, 0, hit)) * cfg.block_size
            no_token = need_tokens + reserve > free_tokens  # PrefillAdder: NO_TOKEN
            if (
                no_token
                or (extend > rem_input and plan.admitted)  # PrefillAdder: OTHER
                or not pool.allocate(req.id, cached + n_new, hit)
            ):
                # NO_TOKEN with something running: no prefill until a request leaves
                self.batch_full = no_token and bool(running)
                timed(policy.refused, rid)
                break
            timed(policy.admitted, rid)
            engine.admit(req, cached)
            pool.cache_full_blocks(rid, req.hashes, cached + n_new)
            plan.hits += cached
            scheduled[rid] = n_new
            rem_input -= n_new
            rem_chunk -= n_new
            reserve += need_tokens - extend
            plan.admitted += 1
            if n_new < extend:  # this one is chunked: it continues next step
                break
        stop_reason, plan.adds, plan.stops = engine.end_policy_pass()
        plan.reason = stop_reason or "prefill_budget"

    def _decode(self, engine: Engine, plan: StepPlan) -> StepPlan:
        """Every running request decodes; the least advanced is retracted while memory is
        short (its candidates' counts are not this step's: a decode batch admits nothing)."""
        pool, running = engine.pool, engine.running
        scheduled: dict[str, int] = {}
        preempted = 0
        while running:
            need = sum(pool.blocks_needed(r.id, r.num_computed + 1) for r in running)
            if need <= pool.num_free:
                break
            victim = min(running, key=lambda r: (r.num_output, -r.prompt_len))
            running.remove(victim)
            engine.preempt(victim)  # left() resets batch_full: a retraction frees memory
            preempted += 1
        for req in running:
            pool.allocate(req.id, req.num_computed + 1)
            scheduled[req.id] = 1
        return StepPlan(
            scheduled,
            "decode",
            waiting_count=plan.waiting_count,
            waiting_tokens=plan.waiting_tokens,
            preempted=preempted,
            reason="decode" if not preempted else "retracted",
        )
