"""GPU telemetry for runs: the NVML sampler, its series and summary, and the GPU facts.

A runner wraps its run in one `with`; see `feather.telemetry.nvml`:

    with sample_nvml(run_dir) as nvml:      # <run_dir>/nvml.parquet on exit, if sampled
        run()
    summary["nvml"] = nvml.record           # {"available": False, "reason": ...} without NVML
"""

from feather.telemetry.nvml import NvmlSampler, not_applicable, sample_nvml
from feather.telemetry.series import METRICS, NVML_FILE, summarise

__all__ = ["METRICS", "NVML_FILE", "NvmlSampler", "not_applicable", "sample_nvml", "summarise"]
