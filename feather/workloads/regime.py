"""What regime a workload puts an engine in: how much prefix there is to keep, and in what
order and at what pace requests come.

A prefix-aware scheduler can only gain where the KV pool cannot hold every shared prefix at
once (otherwise FCFS reuses them all by itself) and where requests of one prefix do not
already arrive together. So every C5-style result is labelled with the arrival order, the
order seed, the output-length regime and the ratio of the KV pool to the workload's distinct
shared-prefix tokens; this module computes the workload's side of those labels.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from feather.workloads.schema import Workload, WorkloadRequest


def distinct_shared_prefix_tokens(requests: Sequence[WorkloadRequest]) -> int:
    """Tokens of prompt prefix that at least two requests share, each position counted
    once: the size of the part of the prefix trie with two or more requests beneath.

    With the prompts sorted lexicographically a prefix shared by several prompts is shared
    by a contiguous run of them, and is first seen at the first adjacent pair of the run, so
    the count is sum_i max(0, LCP(i, i+1) - LCP(i-1, i)). Token-exact, independent of any
    block size; nested sharing (a system prompt over several documents) is counted once.
    """
    if len(requests) < 2:
        return 0
    # big-endian bytes of non-negative ids sort exactly as the id sequences do
    keys = sorted(np.asarray(r.prompt_token_ids, dtype=">i4").tobytes() for r in requests)
    arrays = [np.frombuffer(k, dtype=">i4") for k in keys]
    total, previous = 0, 0
    for a, b in itertools.pairwise(arrays):
        n = min(len(a), len(b))
        mismatch = np.flatnonzero(a[:n] != b[:n])
        lcp = int(mismatch[0]) if len(mismatch) else n
        total += max(0, lcp - previous)
        previous = lcp
    return total


def arrival_regime(provenance: dict[str, Any]) -> dict[str, Any]:
    """Arrival order, order seed, output regime and arrival process of a workload, from its
    provenance (built workloads: the build options; synthetic: the spec; retimed ones: the
    new arrival process over its base's order and outputs)."""
    retimed = provenance.get("retimed")
    if retimed:
        base = arrival_regime(retimed.get("base") or {})
        return {**base, "arrival": retimed.get("arrival"), "load_factor": retimed["load_factor"]}
    config = provenance.get("config") or {}
    options = config.get("options") or {}
    source = str(config.get("source") or "")
    if source.startswith("synthetic:"):
        options = dict(
            item.split("=", 1) for item in source[len("synthetic:") :].split(",") if "=" in item
        )
    output = options.get("output")
    return {
        "arrival_order": options.get("order"),
        "order_seed": _int_or_none(options.get("seed")),
        "output_regime": None if output is None else str(output),
        "arrival": options.get("arrival"),
        "load_factor": None,
    }


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def shared_prefix_tokens_of(workload: Workload) -> int:
    """The workload's distinct shared-prefix tokens (its statistic, or computed for a file
    written before the statistic existed)."""
    known = workload.statistics.get("distinct_shared_prefix_tokens")
    return int(known) if known is not None else distinct_shared_prefix_tokens(workload.requests)


def regime_fields(
    workload: Workload, kv_pool_tokens: int, device_pool_tokens: int | None
) -> dict[str, Any]:
    """The regime columns every run summary carries (results/summary.csv): order, seed,
    output regime, arrival, and the KV pool against the distinct shared-prefix tokens.
    device_pool_tokens: what the device's memory holds; a larger pool is hypothetical."""
    distinct = shared_prefix_tokens_of(workload)
    return {
        **arrival_regime(workload.provenance),
        "kv_pool_tokens": kv_pool_tokens,
        "distinct_shared_prefix_tokens": distinct,
        "pool_to_prefix_ratio": kv_pool_tokens / distinct if distinct else None,
        "device_kv_pool_tokens": device_pool_tokens,
        "pool_hypothetical": (
            None if device_pool_tokens is None else kv_pool_tokens > device_pool_tokens
        ),
    }
