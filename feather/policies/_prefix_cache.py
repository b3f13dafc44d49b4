"""What SGLang's cache-aware policies (`lpm`, `dfs-weight`) share: a mirrored prefix cache
and SGLang's persistent waiting queue.

In SGLang the radix tree *is* the KV cache, and `SchedulePolicy.calc_priority` reads it
directly. Through our admission interface the engine's cache is not visible, so the policy
keeps a model of it in its own `RadixTree`:

- a request's prompt tokens are inserted (in whole pages) when it is admitted - its KV now
  exists - and the node ending them is locked while it runs;
- on finish it is unlocked and stays cached; a preempted request is unlocked too (its
  prefix stays cached, as after SGLang's retraction);
- when `cache_capacity_tokens` is set and exceeded, unlocked leaves are evicted, least
  recently used first.

This is an approximation of the engine's real cache: the engine's own memory pressure,
its eviction timing, the decoded tokens SGLang also caches at finish, and vLLM's block-hash
cache are not seen. Matching the tree touches nodes (LRU) and may split them, as in SGLang.

The waiting queue mirrors SGLang's `Scheduler.waiting_queue`: one Python list kept across
steps. New arrivals and retracted (preempted) requests are appended at its end
(`_add_request_to_queue`, `_extend_requests_to_queue`), it is re-sorted in place once per
step before admission (`get_new_batch_prefill` -> `calc_priority`), and admitted requests
are removed without disturbing the rest. So ties, and the FCFS fallback, keep the order
the list already had - not arrival order.

Each waiting request's last match is kept as a hint for the next (`RadixTree.match_prefix`):
the walk resumes at the node it ended in while that node is still cached, so a step's pass
costs a few node visits per waiting request instead of comparing its whole cached prefix
again - with the same answers, splits and LRU touches.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from feather.policies.base import AdmissionPolicy, Request, RequestId, StepContext
from feather.radix import RadixNode, RadixTree


class CacheAwarePolicy(AdmissionPolicy):
    """Base of the ports of SGLang's cache-aware policies over our mirrored radix tree.

    Subclasses implement `_sort_waiting_queue`, called once per step at the step's first
    candidate request; candidates are then offered in that order for the rest of the step.

    Parameters:
        page_size: tokens per KV page; matching and insertion work in whole pages, as
            SGLang's RadixCache with `--page-size` > 1 (vLLM: the block size).
        cache_capacity_tokens: tokens the mirrored cache may hold before unlocked leaves
            are evicted LRU; None = unbounded (nothing is ever evicted).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        page_size: int = 1,
        cache_capacity_tokens: int | None = None,
    ) -> None:
        super().__init__(seed=seed)
        if cache_capacity_tokens is not None and cache_capacity_tokens < 0:
            raise ValueError(
                f"cache_capacity_tokens must be >= 0 or None, got {cache_capacity_tokens}"
            )
        self.tree_cache = RadixTree(page_size)
        self.page_size = page_size
        self.cache_capacity_tokens = cache_capacity_tokens
        self._tokens: dict[RequestId, tuple[int, ...]] = {}
        # SGLang's waiting_queue as an ordered set: insertion order is the list order.
        self._waiting_queue: dict[RequestId, None] = {}
        self._locked_node: dict[RequestId, RadixNode] = {}
        self._match_hint: dict[RequestId, tuple[int, RadixNode]] = {}
        self._step_order: list[RequestId] = []
        self._cursor = 0
        self._needs_sort = False

    # ---- protocol hooks ------------------------------------------------------------------
    def begin_step(self, ctx: StepContext) -> None:
        super().begin_step(ctx)
        self._needs_sort = True  # sorted at the step's first candidate, if it has one

    def _on_arrival(self, request: Request) -> None:
        if request.prompt_token_ids is None:
            raise ValueError(
                f"request {request.req_id!r} has no prompt_token_ids (only chunk hashes): "
                f"the {self.name!r} policy matches token ids against a radix tree and needs them"
            )
        tokens = request.prompt_token_ids
        # numpy arrays (workloads) become plain ints: the radix tree compares tuples
        self._tokens[request.req_id] = tuple(
            tokens.tolist() if hasattr(tokens, "tolist") else tokens
        )
        self._waiting_queue[request.req_id] = None

    def _on_admit(self, req_id: RequestId) -> None:
        del self._waiting_queue[req_id]
        self._match_hint.pop(req_id, None)
        node = self.tree_cache.insert(self._tokens[req_id])
        self.tree_cache.lock(node)  # before evicting, so its own prompt stays
        self._locked_node[req_id] = node
        self._enforce_capacity()

    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        self.tree_cache.unlock(self._locked_node.pop(req_id))
        if finished:
            del self._tokens[req_id]
        else:
            self._waiting_queue[req_id] = None  # retracted: appended at the end, as SGLang
        self._enforce_capacity()

    def _on_drop_waiting(self, req_id: RequestId) -> None:
        del self._waiting_queue[req_id]
        del self._tokens[req_id]
        self._match_hint.pop(req_id, None)

    def _choose(self) -> RequestId | None:
        if self._needs_sort:
            self._needs_sort = False
            order = self._sort_waiting_queue(list(self._waiting_queue))
            self._waiting_queue = dict.fromkeys(order)
            self._step_order = order
            self._cursor = 0
        order, queue = self._step_order, self._waiting_queue
        while self._cursor < len(order):
            req_id = order[self._cursor]
            if req_id in queue:  # skips what was admitted (or aborted) since the sort
                return req_id
            self._cursor += 1
        return None  # only requests that arrived after this step's sort remain

    # ---- what subclasses implement -------------------------------------------------------
    @abstractmethod
    def _sort_waiting_queue(self, queue: list[RequestId]) -> list[RequestId]:
        """The waiting queue (in its current order) re-ordered for this step."""

    # ---- helpers -------------------------------------------------------------------------
    def _match(self, req_id: RequestId) -> tuple[int, RadixNode]:
        """A waiting request's cache match (matched tokens, last node), as SGLang's
        `match_prefix`, resumed from its previous match where that is still valid."""
        result = self.tree_cache.match_prefix(self._tokens[req_id], self._match_hint.get(req_id))
        self._match_hint[req_id] = result
        return result

    def _enforce_capacity(self) -> None:
        if self.cache_capacity_tokens is not None:
            self.tree_cache.evict_to(self.cache_capacity_tokens)

    @property
    def tree_nodes(self) -> int:
        """Nodes of the mirrored cache tree (what pricing SGLang's pass over it reads)."""
        return self.tree_cache.num_nodes

    def waiting_queue(self) -> list[RequestId]:
        """The waiting queue in its current (last sorted, then appended) order."""
        return list(self._waiting_queue)

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "page_size": self.page_size,
            "cache_capacity_tokens": self.cache_capacity_tokens,
        }
