"""Starting NVML, and naming why it would not start. Standard library only, so provenance
can ask for GPU facts on a bare GPU box without pyarrow or numpy."""

from __future__ import annotations

from types import ModuleType


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def load_nvml(module: ModuleType | None = None) -> tuple[ModuleType | None, str | None]:
    """(NVML initialised, None) or (None, why not). `module`: a pynvml stand-in (tests)."""
    if module is None:
        try:
            import pynvml as module
        except ImportError as exc:
            return None, f"nvidia-ml-py is not installed (import pynvml: {exc})"
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, error_text(exc)
    return module, None
