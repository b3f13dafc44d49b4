"""Depth-first weighted order: SGLang's `dfs-weight` schedule policy, over our radix tree.

Followed from SGLang's `SchedulePolicy._sort_by_dfs_weight`
(`python/sglang/srt/managers/schedule_policy.py`) and `_dfs_weight_order`
(`python/sglang/srt/mem_cache/base_prefix_cache.py`):

- every waiting request is matched against the cache tree, in waiting-list order
  (`_compute_prefix_matches`; a match may split a node); its last matched node is kept;
- node weight = number of waiting requests whose last node it is, plus the weights of its
  children (a pass over the whole tree);
- a DFS from the root visits children by descending weight, ties in the children's
  insertion order (a stable sort of the child table), and emits a node's own requests
  *after* its children (post-order), in waiting-list order.

Unlike LPM there is no FCFS fallback for long queues: SGLang's `_determine_active_policy`
applies it only to LPM (and HRRN).
"""

from __future__ import annotations

from collections.abc import Sequence

from feather.policies._prefix_cache import CacheAwarePolicy
from feather.policies.base import RequestId, SchedCostKind
from feather.radix import RadixNode


def dfs_weight_order(root: RadixNode, last_nodes: Sequence[RadixNode]) -> list[int]:
    """Indices into `last_nodes` in SGLang's dfs-weight order (see the module docstring)."""
    indices_at: dict[RadixNode, list[int]] = {}
    for index, node in enumerate(last_nodes):
        indices_at.setdefault(node, []).append(index)

    preorder: list[RadixNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        preorder.append(node)
        stack.extend(node.children.values())
    weight: dict[RadixNode, int] = {}
    for node in reversed(preorder):  # every child before its parent
        weight[node] = len(indices_at.get(node, ())) + sum(
            weight[child] for child in node.children.values()
        )

    order: list[int] = []
    visit: list[tuple[RadixNode, bool]] = [(root, False)]
    while visit:
        node, children_done = visit.pop()
        if children_done:
            order.extend(indices_at.get(node, ()))
            continue
        visit.append((node, True))
        children = sorted(node.children.values(), key=lambda child: -weight[child])
        # weight-0 subtrees emit nothing; reversed so the heaviest child is visited first
        visit.extend((child, False) for child in reversed(children) if weight[child] > 0)
    if len(order) != len(last_nodes):
        raise ValueError("a last node is not in the tree under `root` (evicted or foreign)")
    return order


class DFSWeightPolicy(CacheAwarePolicy):
    """Offer waiting requests subtree by subtree, heaviest subtree first (SGLang `dfs-weight`).

    Requests sharing a cached prefix are offered together, so a step's admissions stay in
    one region of the tree. Parameters: `page_size`, `cache_capacity_tokens` (see
    `CacheAwarePolicy`).
    """

    name = "dfs-weight"
    sched_cost_kind = SchedCostKind.RADIX_DFS_WEIGHT

    def _sort_waiting_queue(self, queue: list[RequestId]) -> list[RequestId]:
        last_nodes = [self._match(r)[1] for r in queue]
        return [queue[i] for i in dfs_weight_order(self.tree_cache.root, last_nodes)]
