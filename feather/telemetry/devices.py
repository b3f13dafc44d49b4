"""Which GPUs, driver and CUDA a run had: the facts provenance records once per run.

From NVML (every GPU the driver sees) and from torch.cuda (the device the process used).
torch is asked only when the runner already imported it: importing it costs seconds, and the
simulator never does. Each part absent here says why instead of being left out.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from feather.telemetry.nvml_lib import error_text, load_nvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(encoded: int) -> str:
    """NVML's 12080 -> "12.8"."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def nvml_facts() -> dict[str, Any]:
    """Driver, the CUDA version it supports, and each GPU's name, memory and capability."""
    nvml, reason = load_nvml()
    if nvml is None:
        return {"available": False, "reason": reason}
    try:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                {
                    "index": index,
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                    "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "compute_capability": f"{major}.{minor}",
                }
            )
        return {
            "available": True,
            "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()),
            "nvml_version": _text(nvml.nvmlSystemGetNVMLVersion()),
            "devices": devices,
        }
    except Exception as exc:
        return {"available": False, "reason": f"NVML started, then failed: {error_text(exc)}"}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def torch_cuda_facts() -> dict[str, Any]:
    """torch's CUDA build and the devices this process sees (only if torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"checked": False, "reason": "torch was not imported by this run"}
    build = getattr(torch.version, "cuda", None)
    facts: dict[str, Any] = {"checked": True, "torch_cuda_build": build}
    try:
        if not torch.cuda.is_available():
            why = "torch is a CPU build" if build is None else "no CUDA device visible"
            return {**facts, "available": False, "reason": why}
        current = torch.cuda.current_device()
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "name": props.name,
                    "memory_total_bytes": int(props.total_memory),
                    "compute_capability": f"{props.major}.{props.minor}",
                }
            )
    except Exception as exc:
        return {**facts, "available": False, "reason": error_text(exc)}
    return {**facts, "available": True, "current_device": current, "devices": devices}


def gpu_facts() -> dict[str, Any]:
    return {"nvml": nvml_facts(), "torch_cuda": torch_cuda_facts()}


def device_name(gpus: dict[str, Any]) -> str | None:
    """The GPU a run used: torch's current device, else NVML's first; None without one."""
    torch_cuda = gpus.get("torch_cuda") or {}
    if torch_cuda.get("available"):
        current = torch_cuda.get("current_device", 0)
        for device in torch_cuda.get("devices", []):
            if device["index"] == current:
                return device["name"]
    nvml = gpus.get("nvml") or {}
    if nvml.get("available") and nvml.get("devices"):
        return nvml["devices"][0]["name"]
    return None
