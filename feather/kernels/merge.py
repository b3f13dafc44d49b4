"""The one log-sum-exp merge of partial attention results (cascade, pat, chunked KV).

A partial result is softmax attention over a subset of a query's tokens: an output o
(normalised over that subset) and the subset's log-sum-exp of scaled scores. Partials over
disjoint subsets combine exactly: weights exp(lse_i - max lse), o = sum w_i o_i / sum w_i.
"""

from __future__ import annotations

import torch


def merge_partials(
    o: torch.Tensor, lse: torch.Tensor, owner: torch.Tensor, num_queries: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partials o [P, H, D] / lse [P, H] into [num_queries, H, D] / [num_queries, H].

    `owner[p]` is the query partial p belongs to. A query with no partial (or only empty
    ones, lse = -inf) gets a zero output and lse = -inf. Computes in o's dtype (use float32).
    """
    heads = lse.shape[1]
    idx = owner.to(device=o.device, dtype=torch.long)
    best = torch.full((num_queries, heads), float("-inf"), dtype=lse.dtype, device=o.device)
    best.scatter_reduce_(0, idx[:, None].expand(-1, heads), lse, reduce="amax")
    best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))
    weight = torch.exp(lse - best[idx])  # 0 for empty partials (lse = -inf)
    weighted = torch.where(weight[..., None] > 0, o * weight[..., None], torch.zeros_like(o))
    num = torch.zeros((num_queries, *o.shape[1:]), dtype=o.dtype, device=o.device)
    num.index_add_(0, idx, weighted)
    den = torch.zeros((num_queries, heads), dtype=lse.dtype, device=o.device)
    den.index_add_(0, idx, weight)
    has = den > 0
    out = torch.where(has[..., None], num / torch.where(has, den, 1.0)[..., None], 0.0)
    merged_lse = torch.where(has, best + torch.log(torch.where(has, den, 1.0)), float("-inf"))
    return out, merged_lse
