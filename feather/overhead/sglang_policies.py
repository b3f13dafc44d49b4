"""SGLang's real `SchedulePolicy.calc_priority` (lpm, dfs-weight) over its real radix trees.

The tree holds every cached group's prefix, as SGLang's cache would after serving one request
of each group; the waiting queue is one persistent list of real `Req` objects, re-sorted in
place by every pass, as in SGLang's scheduler. One pass is what SGLang pays per scheduling
step before its PrefillAdder admits the batch, so a pass is charged as `batch` decisions.
Variants: `lpm` (as shipped: FCFS above 128 waiting), `lpm-nofallback` (matching at any queue
length - the cost the fallback avoids), `dfs-weight`, and `match`: `Req.init_next_round_input`
(a prefix match against the tree) for each of the first `batch` requests in arrival order -
what `Scheduler.get_new_batch_prefill` calls for every request it considers, whatever the
policy, just before `PrefillAdder.add_one_req`.
"""

from __future__ import annotations

import time
from typing import Any

from feather.engines.sglang.api import SGLangAPI
from feather.overhead.base import Implementation, Measured, Prepared, cpu_time
from feather.overhead.scenario import Case, group_prefixes, waiting_requests

VARIANTS = ("lpm", "lpm-nofallback", "dfs-weight", "match")


class SGLangPolicies(Implementation):
    family = "sglang"

    def __init__(self, tree: str = "python", page_size: int = 1) -> None:
        self.api = SGLangAPI()
        if tree not in self.api.trees:
            raise ValueError(f"SGLang {self.api.version} has no {tree!r} tree: {self.api.trees}")
        self.tree_kind = tree
        self.page_size = page_size
        self._queue: list[Any] = []
        self._arrival_order: list[Any] = []
        self._tree: Any = None
        self._policies: dict[str, Any] = {}
        self._batch = 0

    def facts(self) -> dict[str, Any]:
        import torch

        tree = "RadixCache (Python)" if self.tree_kind == "python" else "UnifiedRadixCache (Rust)"
        return {
            "impl": f"sglang-{self.api.version}/{self.tree_kind}",
            "engine": "sglang",
            "engine_version": self.api.version,
            "structure": tree,
            "page_size": self.page_size,
            "torch": torch.__version__,
        }

    def variants(self) -> list[str]:
        return list(VARIANTS)

    def prepare(self, case: Case) -> Prepared:
        api = self.api
        tree = api.make_tree(self.tree_kind, self.page_size)
        prefixes = group_prefixes(case)
        for prefix in prefixes[: case.cached_groups]:
            api.cache_prefix(tree, prefix)
        start = time.perf_counter()
        self._queue = [
            api.make_request(str(i), tokens)
            for i, tokens in enumerate(waiting_requests(case, prefixes))
        ]
        arrival = (time.perf_counter() - start) / case.waiting
        self._arrival_order = list(self._queue)
        self._tree = tree
        self._policies = {
            "lpm": api.make_policy("lpm", tree),
            "lpm-nofallback": api.make_policy("lpm", tree, fcfs_fallback=False),
            "dfs-weight": api.make_policy("dfs-weight", tree),
        }
        self._batch = case.batch
        self._policies["lpm-nofallback"].calc_priority(self._queue)
        matches = [0] * case.waiting
        for req in self._queue:
            matches[int(req.rid)] = api.matched_tokens(req)
        return Prepared(matches=matches, arrival_s_per_request=arrival)

    def measure(self, variant: str) -> Measured:
        if variant == "match":
            head, tree = self._arrival_order[: self._batch], self._tree
            seconds, _ = cpu_time(lambda: [req.init_next_round_input(tree) for req in head])
            return Measured(seconds=seconds, decisions=len(head), admitted=len(head))
        policy = self._policies[variant]
        seconds, _ = cpu_time(lambda: policy.calc_priority(self._queue))
        batch = min(self._batch, len(self._queue))
        return Measured(seconds=seconds, decisions=batch, admitted=batch)

    def release(self) -> None:
        self._queue, self._arrival_order, self._tree, self._policies = [], [], None, {}
