"""An upper bound on a workload's throughput, so results read as a fraction of the limit.

`roofline`: a lower bound on the time any scheduler needs, from the step cost model's own
physics with every inefficiency removed (tokens counted at the workload's two measured
prefix levels, task and document):
- prefill: each *distinct* prompt token computed once (perfect prefix reuse), at the
  achievable FLOP rate (2 x non-embedding parameters per token);
- decode: at least ceil(output tokens / max batch) steps, each reading the weights once,
  plus every KV byte read the fewest times possible: each request's own (unshared) KV once
  per decode step of its own, each shared prefix node once per step in which any request
  below it decodes - at the achievable bandwidth, no launch or scheduling overhead.
The bound's throughput (output tokens / time) is then the most any schedule could reach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from feather.models import ModelProfile
from feather.workloads.schema import WorkloadRequest


@dataclass(frozen=True)
class Oracle:
    roofline_time_s: float
    roofline_output_tok_s: float
    prefill_time_s: float
    decode_time_s: float
    distinct_prompt_tokens: int
    max_batch: int

    def to_json(self) -> dict:
        return asdict(self)


def roofline(
    requests: Sequence[WorkloadRequest], model: ModelProfile, hardware, max_batch: int
) -> Oracle:
    """The bound described in the module docstring, using the workload's measured prefix
    levels (`prefix_lens`: tokens shared by a whole task group, then by a document group)."""
    k = model.kv_bytes_per_token
    non_embedding = model.weight_bytes - model.embedding_bytes
    flops_per_token = 2 * non_embedding / 2  # 2 FLOPs per bf16 (2-byte) parameter
    shared: dict[tuple[int, str], tuple[int, int]] = {}  # (level, group) -> (tokens, max out)
    distinct = own_kv = 0
    for r in requests:
        previous = 0
        for level, (group, length) in enumerate(zip(r.group_path, r.prefix_lens, strict=True)):
            if length > previous:
                tokens, longest = shared.get((level, group), (length - previous, 0))
                shared[(level, group)] = (tokens, max(longest, r.output_len))
                previous = length
        own = r.prompt_len - previous
        distinct += own
        # each decode step reads its own prompt tokens and the tokens generated so far
        own_kv += k * (own * r.output_len + r.output_len * (r.output_len - 1) / 2)
    distinct += sum(tokens for tokens, _ in shared.values())
    shared_kv = k * sum(tokens * longest for tokens, longest in shared.values())
    total_output = sum(r.output_len for r in requests)
    steps = math.ceil(total_output / max_batch) if total_output else 0
    prefill_s = distinct * flops_per_token / hardware.achievable_flops()
    decode_bytes = steps * non_embedding + own_kv + shared_kv
    decode_s = decode_bytes / hardware.achievable_bandwidth_bytes_per_s()
    total_s = prefill_s + decode_s
    return Oracle(
        roofline_time_s=total_s,
        roofline_output_tok_s=total_output / total_s if total_s > 0 else 0.0,
        prefill_time_s=prefill_s,
        decode_time_s=decode_s,
        distinct_prompt_tokens=distinct,
        max_batch=max_batch,
    )
