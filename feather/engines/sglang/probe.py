"""Run the plugin through SGLang's real admission objects on CPU, and say what happened.

    python -P -m feather.engines.sglang.probe     (in SGLang's environment, feather installed)

(`-P`: a checkout's own `feather.egg-info` in the working directory would otherwise shadow
the installed entry points.)

Prints one JSON object. Steps:

1. `entry_point`: SGLang's own `load_plugins()` with the plugin enabled: which hooks it
   registered from our entry point, and which SGLang methods are now wrapped.
2. Admission passes over SGLang's real `Req`, `SchedulePolicy`, `RadixCache` (group prefixes
   cached, as after earlier requests) and `PrefillAdder` on a real token allocator, walked as
   `Scheduler._get_new_batch_prefill_raw` walks them (`admission_pass`), with our policy
   attached as the scheduler hook attaches it, or none (SGLang's native policy). Between
   passes every admitted request finishes (or, with `finish_some`, the oldest few).

The scheduler itself (its model runner and memory pools) needs a GPU; everything that decides
admission is here. Used by tests/test_sglang_plugin.py and as a check on a GPU box.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

from feather.engines.sglang.settings import SCHEDULER_VAR, PluginSettings

KV_TOKENS = 1 << 16


class Bench:
    """SGLang's admission objects for one policy: a tree, an allocator, a SchedulePolicy."""

    def __init__(self, api: Any, policy: str, scheduler: str | None, params: dict[str, Any],
                 max_running: int, budget_tokens: int) -> None:
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

        from feather.engines.sglang.hooks import attach, new_driver

        self.api = api
        self.tree = api.make_tree("python", 1)
        self.allocator = TokenToKVPoolAllocator(KV_TOKENS, torch.float16, "cpu", None, False)
        self.tree.token_to_kv_pool_allocator = self.allocator
        self.schedule_policy = api.make_policy(policy, self.tree, fcfs_fallback=True)
        self.driver = None
        if scheduler is not None:
            settings = PluginSettings(scheduler=scheduler, params=params, seed=0)
            self.driver = new_driver(settings, self.tree, max_running=max_running)
            attach(self.schedule_policy, self.driver)
        self.max_running = max_running
        self.budget_tokens = budget_tokens
        self.waiting: list[Any] = []
        self.running: list[Any] = []

    def admission_pass(self) -> dict[str, Any]:
        """One prefill pass, as the scheduler's `_get_new_batch_prefill_raw` runs it."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

        running_batch = ScheduleBatch(reqs=list(self.running), batch_is_full=False)
        self.schedule_policy.calc_priority(self.waiting, running_batch)
        adder = PrefillAdder(1, self.tree, self.allocator, running_batch, 0.0,
                             self.budget_tokens, None, max_running_requests=self.max_running)
        visited: list[str] = []
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            if len(adder.can_run_list) + len(self.running) >= self.max_running:
                break  # get_num_allocatable_reqs: no request slot left (batch_is_full)
            req.init_next_round_input(self.tree)
            visited.append(req.rid)
            if adder.add_one_req(req, has_chunked_req=False,
                                 truncation_align_size=None) != AddReqResult.CONTINUE:
                break
        admitted = list(adder.can_run_list)
        chosen = set(admitted)
        self.waiting = [r for r in self.waiting if r not in chosen]
        self.running.extend(admitted)
        record = None
        if self.driver is not None:  # the get_next_batch_to_run hook closes the pass
            self.driver.close_pass()
            rec = self.driver.last_record
            record = {
                "stop_reason": str(rec.stop_reason) if rec.stop_reason else None,
                "decisions_stop": sum(d.action == "STOP" for d in rec.decisions),
            }
        return {
            "admitted": [r.rid for r in admitted],
            "visited": visited,
            "prefix_len": [int(r.prefix_len) for r in admitted],
            "hit_tokens": int(adder.log_hit_tokens),
            "protected_tokens": int(self.tree.protected_size()),
            "waiting": [r.rid for r in self.waiting],
            "record": record,
        }

    def finish(self, count: int | None = None) -> None:
        """The oldest `count` running requests (all: None) finish and release their lock."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        done = self.running if count is None else self.running[:count]
        for req in done:
            req.finished_reason = FINISH_LENGTH(length=1)
            self.tree.unlock(req.lock)
        self.running = self.running[len(done):]

    def run(self, requests: list[tuple[str, list[int]]], finish_some: int | None = None,
            ) -> list[dict[str, Any]]:
        self.waiting = [self.api.make_request(rid, ids, 4) for rid, ids in requests]
        passes = []
        while self.waiting and len(passes) < 4 * len(requests):
            passes.append(self.admission_pass())
            self.finish(finish_some)
        return passes


def interleaved_groups(groups: int, per_group: int, prefix: int, suffix: int
                       ) -> tuple[list[tuple[str, list[int]]], dict[int, list[int]]]:
    """Requests g<group>-<k> arriving interleaved; each group shares a `prefix`-token prefix."""
    prefixes = {g: [1000 * (g + 1) + t for t in range(prefix)] for g in range(groups)}
    requests = []
    for k in range(per_group):
        for g in range(groups):
            tail = [500_000 + 1000 * len(requests) + t for t in range(suffix)]
            requests.append((f"g{g}-{k}", prefixes[g] + tail))
    return requests, prefixes


def unshared(count: int, seed: int) -> list[tuple[str, list[int]]]:
    """Requests sharing no token at all (no prefix to protect), of varied lengths."""
    rng = random.Random(seed)
    return [(f"u{i}", [10_000_000 + 10_000 * i + t for t in range(rng.randint(40, 160))])
            for i in range(count)]


def entry_point_check() -> dict[str, Any]:
    """SGLang's loader runs our entry point. The Scheduler's own module needs GPU-side
    packages this environment lacks, so its hooks are registered but not applied here
    (`applied` says which are); SGLang logs each such target, silenced here."""
    import logging

    from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    logging.getLogger("sglang.srt.plugins.hook_registry").setLevel(logging.CRITICAL)
    load_plugins()
    registered = {
        target: sorted({f"{src.plugin_name}:{src.dist_name}" for _, _, src in hooks if src})
        for target, hooks in HookRegistry._hooks.items()
    }
    return {
        "registered": registered,
        "applied": sorted(HookRegistry._patched),
        "wrapped": {
            "calc_priority": hasattr(SchedulePolicy.calc_priority, "__wrapped__"),
            "add_one_req": hasattr(PrefillAdder.add_one_req, "__wrapped__"),
        },
    }


def main() -> int:
    from feather.engines.sglang.api import SGLangAPI

    api = SGLangAPI()  # CPU stubs and SGLang's runtime context, before any SGLang import
    os.environ.setdefault(SCHEDULER_VAR, "feather-static")
    out: dict[str, Any] = {"sglang": api.version, "entry_point": entry_point_check()}

    # SGLang's kernels read each request's own pages, where Feather's rule is not consulted by
    # default; ask it anyway: this probes the plugin's STOP path through SGLang's real adder
    static = {"min_batch": 4, "min_delta_tokens": 32, "consult": "always", "min_share_tokens": 0}
    grouped, prefixes = interleaved_groups(groups=4, per_group=6, prefix=64, suffix=8)
    out["grouped"] = {}
    for label, policy, scheduler, params in (
        ("fcfs", "fcfs", None, {}),
        ("lpm", "lpm", None, {}),
        ("feather-static", "fcfs", "feather-static", static),
    ):
        bench = Bench(api, policy, scheduler, params, max_running=8, budget_tokens=4096)
        for tokens in prefixes.values():
            api.cache_prefix(bench.tree, tokens)
        out["grouped"][label] = bench.run(grouped)

    requests = unshared(24, seed=1)
    out["unshared"] = {}
    for label, scheduler, params in (
        ("fcfs", None, {}),
        ("feather-static", "feather-static", {"min_batch": 2, "min_delta_tokens": 16}),
        ("feather-ucb", "feather-ucb", {"seed": 3}),
        ("feather-qlearn", "feather-qlearn", {"seed": 5}),
    ):
        bench = Bench(api, "fcfs", scheduler, params, max_running=6, budget_tokens=300)
        out["unshared"][label] = bench.run(requests, finish_some=2)
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
