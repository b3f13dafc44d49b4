"""Longest prefix match: SGLang's `lpm` schedule policy, ported over our mirrored radix tree.

Followed from SGLang's `python/sglang/srt/managers/schedule_policy.py` (`SchedulePolicy`):

- `_determine_active_policy`: with more than 128 requests waiting, LPM silently turns into
  FCFS - no matching, no sorting; the waiting list keeps whatever order it already has.
- `_compute_prefix_matches`: every waiting request, in list order, is matched against the
  cache tree. "In-batch prefix caching": a request whose cache match is at most 32 tokens
  is matched against a temporary tree of the waiting queue (page size 1, emptied each
  step); if that match is at least 32 tokens another waiting request already brings the
  prefix, and the request is deprioritized; otherwise it is inserted into the temporary tree.
- `_sort_by_longest_prefix`: a stable sort by matched length, longest first, with the
  deprioritized requests last (in their list order). The matched length used for sorting
  is `Req.num_matched_prefix_tokens`, capped at prompt length - 1 as SGLang caps it
  (`Req._compute_max_prefix_len`: one token must be computed); the in-batch check uses the
  uncapped cache match, as SGLang's `len(r.prefix_indices)`.
"""

from __future__ import annotations

import math
from typing import Any

from feather.policies._prefix_cache import CacheAwarePolicy
from feather.policies.base import RequestId, SchedCostKind
from feather.radix import RadixTree


class LPMPolicy(CacheAwarePolicy):
    """Offer waiting requests by longest cached prefix, once sorted per step (SGLang `lpm`).

    Parameters (besides `page_size`, `cache_capacity_tokens`, see `CacheAwarePolicy`):
        in_batch_check_threshold: a request whose cache match is <= this many tokens is
            checked against the other waiting requests (SGLang's
            IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD, default 32; -1 disables the check).
        in_batch_deprioritize_threshold: a checked request sharing >= this many tokens
            with an earlier waiting request is sorted last (SGLang's
            IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD, default 32).
        fcfs_fallback_above: with more than this many requests waiting, no matching and no
            sorting happen (SGLang's hard-coded 128); None disables the fallback.
    """

    name = "lpm"
    sched_cost_kind = SchedCostKind.RADIX_LPM

    def __init__(
        self,
        *,
        seed: int = 0,
        page_size: int = 1,
        cache_capacity_tokens: int | None = None,
        in_batch_check_threshold: int = 32,
        in_batch_deprioritize_threshold: int = 32,
        fcfs_fallback_above: int | None = 128,
    ) -> None:
        super().__init__(
            seed=seed, page_size=page_size, cache_capacity_tokens=cache_capacity_tokens
        )
        if fcfs_fallback_above is not None and fcfs_fallback_above < 0:
            raise ValueError(f"fcfs_fallback_above must be >= 0 or None, got {fcfs_fallback_above}")
        self.in_batch_check_threshold = in_batch_check_threshold
        self.in_batch_deprioritize_threshold = in_batch_deprioritize_threshold
        self.fcfs_fallback_above = fcfs_fallback_above
        self.waiting_queue_radix_tree = RadixTree(page_size=1)  # as SGLang's simulated tree
        self.last_fcfs_fallback = False  # whether the last sort fell back to FCFS

    def _sort_waiting_queue(self, queue: list[RequestId]) -> list[RequestId]:
        if self.fcfs_fallback_above is not None and len(queue) > self.fcfs_fallback_above:
            self.last_fcfs_fallback = True
            return queue
        self.last_fcfs_fallback = False
        in_batch = self.waiting_queue_radix_tree
        in_batch.reset()
        deprioritized: set[RequestId] = set()
        matched: dict[RequestId, int] = {}
        for req_id in queue:
            tokens = self._tokens[req_id]
            cache_len, _ = self._match(req_id)
            matched[req_id] = min(cache_len, max(len(tokens) - 1, 0))
            if cache_len <= self.in_batch_check_threshold:
                in_batch_len, _ = in_batch.match_prefix(tokens)
                if in_batch_len >= self.in_batch_deprioritize_threshold:
                    deprioritized.add(req_id)
                else:
                    in_batch.insert(tokens)
        return sorted(queue, key=lambda r: math.inf if r in deprioritized else -matched[r])

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "in_batch_check_threshold": self.in_batch_check_threshold,
            "in_batch_deprioritize_threshold": self.in_batch_deprioritize_threshold,
            "fcfs_fallback_above": self.fcfs_fallback_above,
        }
