"""A simulated engine that starts with its workload's prefixes already in the prefix cache.

A server that has answered questions on a document keeps the document's KV in vLLM's prefix
cache, so a run that starts there prefills only the questions. The real engine makes that
start with unmeasured warm-up requests (`prefix_cache: warm`,
`feather.engines.vllm.runner.VllmRunner._warm_prefixes`): one request per prefix group, the
group's shared prefix alone, one output token, finished before the run. vLLM caches the
full blocks of each warm-up prompt and frees them when it finishes, so they sit in the free
queue, hashed, where a later request hits them (or an allocation under memory pressure
evicts them, least recently freed first). `warm_prefixes` does the same to a `BlockPool`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from feather.chunk_hash import chunk_hashes
from feather.sim.kv_pool import BlockPool
from feather.workloads.schema import WorkloadRequest
from feather.workloads.warm_up import warm_up_requests


@dataclass(frozen=True, slots=True)
class WarmStart:
    """What the warm-up did: the groups it cached, the prefix tokens it had to compute (as
    the real engine's summary records them: `warm_up_prefill_tokens`) and the hashes of the
    full blocks it left in the cache."""

    groups: int
    prefill_tokens: int
    block_hashes: tuple[Hashable, ...]


def group_prefixes(requests: Sequence[WorkloadRequest]) -> dict[str, Sequence[int]]:
    """Each prefix group's shared prefix tokens, from its first request in workload order
    (the order the real warm-up takes them; `warm_up_requests`)."""
    return {r.group_id: r.prompt_token_ids[: r.shared_prefix_len]
            for r in warm_up_requests(requests)}  # fmt: skip


def warm_prefixes(pool: BlockPool, requests: Sequence[WorkloadRequest]) -> WarmStart:
    """Compute each group's shared prefix once, unmeasured, and leave its full blocks cached
    and free in `pool`. Raises where no request shares a prefix (nothing to warm), as the
    real engine does."""
    prefixes = group_prefixes(requests)
    if not pool.enable_caching:
        raise ValueError("prefix_cache 'warm' needs prefix caching on")
    bs = pool.block_size
    computed, cached = 0, []
    for group, tokens in prefixes.items():
        seq = ("warm-up", group)
        hashes = chunk_hashes(tokens, bs)
        # as a request's first admission: hit what is cached (at most prompt - 1 tokens)
        hit = pool.longest_hit(hashes, len(tokens) - 1)
        if not pool.allocate(seq, len(tokens), hit):
            raise ValueError(
                f"prefix_cache 'warm': group {group!r}'s prefix of {len(tokens)} tokens does "
                f"not fit the KV pool of {pool.num_blocks} blocks"
            )
        computed += len(tokens) - len(hit) * bs
        full = len(tokens) // bs
        pool.cache_full_blocks(seq, hashes, len(tokens))
        pool.free(seq)
        cached.extend(hashes[:full])
    return WarmStart(len(prefixes), computed, tuple(cached))
