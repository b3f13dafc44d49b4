"""Is a GPU attached? Engines that need one run only where it is (else a logged skip)."""

from __future__ import annotations

import re
import shutil
import subprocess


def gpu_label(name: str) -> str:
    """A GPU name as a results/<label>/ folder: "NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def attached_gpus() -> list[str]:
    """Names of the NVIDIA GPUs NVML (or nvidia-smi) sees; [] where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
            ]
            return [n.decode() if isinstance(n, bytes) else n for n in names]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no device: all mean "none here"
        pass
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if done.returncode == 0:
                return [line.strip() for line in done.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return []
