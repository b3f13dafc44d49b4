"""The real vLLM V1 scheduler without a model: construct it as vLLM's own tests do, feed it
requests with real block hashes, answer every step with a fake model output.

Only the scheduler runs here - vLLM's KV cache manager, prefix cache, preemption and our
policy queue - so admission behaviour is checked exactly and quickly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from feather.engines.model_dir import model_directory
from feather.engines.vllm.scheduler import FeatherScheduler
from feather.models import get_model

init_none_hash(sha256)


def make_scheduler(
    tmp: Path,
    policy: str,
    *,
    params: dict | None = None,
    num_blocks: int = 1000,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    max_model_len: int = 8192,
    records: bool = True,
    state_file: Path | None = None,
    scheduling_policy: str = "fcfs",
) -> FeatherScheduler:
    model_dir = model_directory(get_model("tiny-llama"), tmp)
    settings = {"scheduler": policy, "params": params or {}, "records": records}
    if state_file is not None:
        settings["state_file"] = str(state_file)
    vllm_config = VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            policy=scheduling_policy,
        ),
        model_config=ModelConfig(
            model=str(model_dir),
            dtype="float32",
            seed=0,
            skip_tokenizer_init=True,
            max_model_len=max_model_len,
        ),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
        additional_config={"feather": settings},
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float32
                ),
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return FeatherScheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )


def make_request(req_id: str, tokens: Sequence[int], max_tokens: int, block_size: int = 16,
                 priority: int = 0):
    return Request(
        request_id=req_id,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
        priority=priority,
    )


def step(scheduler: FeatherScheduler) -> list[str]:
    """One schedule() and a fake model output. Returns the ids admitted in this step."""
    before = {r.request_id for r in scheduler.running}
    output = scheduler.schedule()
    answer(scheduler, output)
    return [r for r in output.num_scheduled_tokens if r not in before]


def answer(scheduler: FeatherScheduler, output) -> None:
    """The model's reply to a step: token 7 from every request whose KV now covers all its
    tokens. As vLLM's model runner (`discard_request_mask`: seq_len < num_tokens), a chunk
    that ends short of them samples nothing - after a preemption that includes a recompute
    that has passed the prompt but not yet the generated tokens."""
    req_ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append([7] if done else [])
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        ),
    )


def run_to_completion(scheduler: FeatherScheduler, max_steps: int = 10_000) -> list[list[str]]:
    """Admissions per step until the scheduler holds no request."""
    admissions = []
    for _ in range(max_steps):
        if not scheduler.has_requests():
            return admissions
        admissions.append(step(scheduler))
    raise AssertionError("the scheduler did not drain")
