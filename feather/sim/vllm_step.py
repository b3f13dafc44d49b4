"""vLLM V1's step in the simulated engine: `Scheduler.schedule` and the persistent batch's
kernel order (the behaviour is described in feather/sim/engine.py's module docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feather.sim.step_plan import StepPlan

if TYPE_CHECKING:
    from feather.sim.engine import Engine, SimRequest


class VllmStep:
    """Continue running requests under the token budget (preempting the last on a memory
    shortage), then, if nothing was preempted, admit the policy's candidates."""

    reserved_blocks = 1  # vLLM's BlockPool keeps block 0 as its null block, never allocated

    def __init__(self) -> None:
        self.slots: list[SimRequest | None] = []  # vLLM's persistent batch (InputBatch)
        self._slot_of: dict[str, int] = {}
        self._left: list[str] = []  # finished or preempted since the last layout

    def left(self, request_id: str) -> None:
        """A request finished or was preempted: its slot becomes a hole at the next layout."""
        self._left.append(request_id)

    def schedule(self, engine: Engine) -> StepPlan:
        cfg, pool = engine.config, engine.pool
        budget = cfg.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        preempted = 0
        running = engine.running
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
                engine.preempt(victim)
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
        plan = StepPlan(
            scheduled,
            "mixed",
            waiting_count=len(engine.waiting),
            waiting_tokens=engine.waiting_tokens,
            preempted=preempted,
            reason="preempted",
        )
        if preempted:
            return plan
        room = budget > 0 and len(running) < cfg.max_num_seqs
        engine.begin_policy_pass(asked=room and bool(engine.waiting), token_budget=budget)
        policy, timed = engine.policy, engine.timed
        while budget > 0 and len(running) < cfg.max_num_seqs:
            offer = engine.next_offer(plan)
            if offer is None:
                break
            req, hit = offer
            rid = req.id
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
            engine.admit(req, len(hit) * cfg.block_size)
            pool.cache_full_blocks(rid, req.hashes, req.num_computed + n_new)
            plan.hits += len(hit) * cfg.block_size
            scheduled[rid] = n_new
            budget -= n_new
            plan.admitted += 1
        stop_reason, plan.adds, plan.stops = engine.end_policy_pass()
        plan.reason = stop_reason or ("token_budget" if budget <= 0 else "max_num_seqs")
        return plan

    def layout(self, engine: Engine, scheduled: dict[str, int]) -> list[str]:
        """Kernel order: a finished or preempted request leaves a hole, new requests fill the
        lowest holes first, then the last requests move into the remaining holes."""
        slots, slot_of = self.slots, self._slot_of
        for rid in self._left:
            index = slot_of.pop(rid, None)
            if index is not None:
                slots[index] = None
        self._left.clear()
        holes = [i for i, r in enumerate(slots) if r is None]
        holes.reverse()  # pop() gives the lowest
        for rid in scheduled:
            if rid not in slot_of:
                index = holes.pop() if holes else len(slots)
                if index == len(slots):
                    slots.append(None)
                slots[index] = engine.by_id[rid]
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
