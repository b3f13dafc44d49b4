"""Make SGLang's scheduling code importable on a CPU-only machine, whatever its version.

Standard library only (plus what SGLang itself imports): this runs inside SGLang's own
environment. SGLang imports torchvision at module level for multimodal code we never call,
and older releases import `sgl_kernel.kvcacheio` (CUDA kernels) from the radix cache's
module; neither can be installed here. They are replaced by modules whose every function
raises when *called*, so an accidental use fails loudly, never silently. transformers must
still see torchvision as absent (it would otherwise import its real submodules), so its
cached availability check is made before the replacement is installed.

`SGLangAPI` hides the few differences between the releases we measure (0.5.10: lists of
token ids, `len(req.prefix_indices)`; 0.5.23: `array('q')`, `req.num_matched_prefix_tokens`,
a runtime context to publish, and the Rust `UnifiedRadixCache`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from array import array
from collections.abc import Sequence
from typing import Any

_STUB_PREFIXES = ("torchvision",)
_STUB_MODULES = ("sgl_kernel.kvcacheio",)
_EMPTY_PACKAGES = ("sgl_kernel",)  # importable, but `from sgl_kernel import x` fails as absent


class _UnavailableModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{self.__name__}.{name} is not available on this CPU machine")

        return unavailable


class _Loader(importlib.abc.Loader):
    def __init__(self, module_type: type[types.ModuleType]) -> None:
        self.module_type = module_type

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self.module_type(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in _STUB_PREFIXES or name in _STUB_MODULES:
            loader = _Loader(_UnavailableModule)
        elif name in _EMPTY_PACKAGES:
            loader = _Loader(types.ModuleType)
        else:
            return None
        return importlib.machinery.ModuleSpec(name, loader, is_package=True)


_installed = False


def install_cpu_stubs() -> None:
    global _installed
    if _installed:
        return
    if importlib.util.find_spec("torchvision") is not None:
        raise RuntimeError(
            "torchvision is installed in SGLang's environment; its CUDA build breaks "
            "transformers on CPU - rebuild the environment (feather overhead env)"
        )
    import transformers.utils.import_utils as hf_imports

    hf_imports.is_torchvision_available()  # cached as False before the stubs exist
    sys.meta_path.insert(0, _Finder())
    _installed = True


class SGLangAPI:
    """SGLang's real scheduling classes, constructed the way this release wants them."""

    def __init__(self) -> None:
        install_cpu_stubs()
        import sglang
        import torch

        self.version: str = sglang.__version__
        self._torch = torch
        try:
            from sglang.srt.runtime_context import get_context
            from sglang.srt.server_args import ServerArgs
        except ImportError:
            self.token_container = list
        else:  # 0.5.2x: the runtime config must be published before requests are built
            get_context().set_server_args(ServerArgs(model_path="dummy", device="cpu"))
            self.token_container = lambda ids: array("q", ids)
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._Req, self._SchedulePolicy = Req, SchedulePolicy
        self._InsertParams, self._RadixCache, self._RadixKey = InsertParams, RadixCache, RadixKey
        self._SamplingParams = SamplingParams

    @property
    def trees(self) -> list[str]:
        """`python`: RadixCache (what SGLang's tests simulate with); `unified`: the server
        default from 0.5.2x on, a Rust tree core."""
        found = importlib.util.find_spec("sglang.srt.mem_cache.unified_radix_cache")
        return ["python", "unified"] if found else ["python"]

    def make_tree(self, kind: str, page_size: int) -> Any:
        if kind == "python":
            return self._RadixCache.create_simulated(page_size=page_size)
        if kind != "unified" or kind not in self.trees:
            raise ValueError(f"SGLang {self.version} has no {kind!r} radix tree ({self.trees})")
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        class _NoAllocator:  # nothing is ever evicted here; the tree only needs the methods
            device = "cpu"

            def free(self, *args: Any, **kwargs: Any) -> None:
                return None

            def free_segment(self, *args: Any, **kwargs: Any) -> None:
                return None

        params = CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=_NoAllocator(),
            page_size=page_size,
            tree_components=(ComponentType.FULL,),
        )
        return UnifiedRadixCache(params)

    def cache_prefix(self, tree: Any, tokens: Sequence[int]) -> None:
        """Put `tokens` in the tree as if their KV had been computed (fake slot indices)."""
        key = self._RadixKey(token_ids=self.token_container(tokens), extra_key=None)
        value = self._torch.arange(len(tokens), dtype=self._torch.int64)
        tree.insert(self._InsertParams(key=key, value=value))

    def make_request(self, rid: str, tokens: Sequence[int], max_new_tokens: int = 16) -> Any:
        params = self._SamplingParams(max_new_tokens=max_new_tokens)
        return self._Req(rid, "", self.token_container(tokens), params)

    def make_policy(self, policy: str, tree: Any, *, fcfs_fallback: bool = True) -> Any:
        """SGLang's SchedulePolicy; without `fcfs_fallback` LPM matches at any queue length
        (its `_determine_active_policy` is bypassed, the only change made to SGLang)."""
        sched = self._SchedulePolicy(policy, tree, False, False, False)
        if not fcfs_fallback:
            sched._determine_active_policy = lambda waiting_queue: sched.policy
        return sched

    @staticmethod
    def matched_tokens(req: Any) -> int:
        """The cached prefix SGLang found for `req` in its last calc_priority."""
        if hasattr(req, "num_matched_prefix_tokens"):
            return int(req.num_matched_prefix_tokens)
        indices = getattr(req, "prefix_indices", None)
        return 0 if indices is None else len(indices)
