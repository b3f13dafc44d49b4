"""Record a real NVML time series around decode-attention load (a fixture for telemetry).

Samples every ~20 ms through four phases - idle, back-to-back launches of the paged decode
kernel over 800 unshared sequences (DRAM-bound), over 800 sequences sharing one prefix
(L2-bound), idle again - every counter NVML offers here: SM and memory-controller
utilisation, memory used, power, SM and memory clocks, temperature, PCIe throughput, and
DRAM bandwidth utilisation through NVML's GPM metrics (Hopper and newer). Each field that
fails is recorded with its error instead. Writes `$OUT/nvml_series.json`.

    python gpu/nvml_series.py       # ~20 s on an H200
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PERIOD_S = 0.02
PHASE_S = {
    "idle_before": 2.0,
    "decode_unshared_800": 4.0,
    "decode_homog_800": 4.0,
    "idle_after": 2.0,
}


def _sampler(nvml, handle, samples: list, phase: list, stop: threading.Event, errors: dict):
    gpm = None
    try:  # GPM: DRAM bandwidth utilisation needs two samples per reading
        if nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            nvml.nvmlGpmSampleGet(handle, gpm[0])
    except Exception as exc:
        errors["gpm"] = repr(exc)
    fields = {
        "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
        "memory_used_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used,
        "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "pcie_tx_kbps": lambda: nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_TX_BYTES
        ),
        "pcie_rx_kbps": lambda: nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_RX_BYTES
        ),
    }
    start = time.monotonic()
    while not stop.is_set():
        row = {"t_s": time.monotonic() - start, "phase": phase[0]}
        for name, read in fields.items():
            try:
                value = read()
                if name == "utilization":
                    row["sm_util_pct"], row["mem_util_pct"] = value.gpu, value.memory
                else:
                    row[name] = value
            except Exception as exc:
                errors.setdefault(name, repr(exc))
        if gpm is not None:
            try:
                nvml.nvmlGpmSampleGet(handle, gpm[1])
                get = nvml.c_nvmlGpmMetricsGet_t()
                get.version = nvml.NVML_GPM_METRICS_GET_VERSION
                get.numMetrics = 2
                get.sample1, get.sample2 = gpm[0], gpm[1]
                get.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
                get.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_OCCUPANCY
                nvml.nvmlGpmMetricsGet(get)
                row["gpm_dram_bw_util_pct"] = get.metrics[0].value
                row["gpm_sm_occupancy_pct"] = get.metrics[1].value
                gpm.reverse()
            except Exception as exc:
                errors.setdefault("gpm_read", repr(exc))
        samples.append(row)
        time.sleep(PERIOD_S)


def main() -> int:
    import pynvml as nvml
    import torch

    from feather.kernels.paged_decode import paged_decode_triton

    out = Path(os.environ.get("OUT", "gpu_out"))
    out.mkdir(parents=True, exist_ok=True)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    device = torch.device("cuda")
    block, seqs, tokens, heads, kv_heads, dim = 16, 800, 4000, 32, 8, 128
    blocks_per_seq = tokens // block
    inputs = {}
    for name, shared in (("decode_unshared_800", False), ("decode_homog_800", True)):
        num_blocks = blocks_per_seq if shared else seqs * blocks_per_seq
        tables = torch.arange(blocks_per_seq, dtype=torch.int32, device=device).repeat(seqs, 1)
        if not shared:
            tables = (
                tables
                + blocks_per_seq * torch.arange(seqs, dtype=torch.int32, device=device)[:, None]
            )
        k = torch.randn(num_blocks, block, kv_heads, dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(seqs, heads, dim, device=device, dtype=torch.bfloat16)
        lens = torch.full((seqs,), tokens, dtype=torch.int32, device=device)
        inputs[name] = (q, k, v, tables, lens)
        paged_decode_triton(q, k, v, tables, lens, dim**-0.5)  # compile outside the series
    torch.cuda.synchronize()
    samples: list = []
    errors: dict = {}
    phase = ["idle_before"]
    stop = threading.Event()
    thread = threading.Thread(target=_sampler, args=(nvml, handle, samples, phase, stop, errors))
    thread.start()
    launches = {}
    for name, seconds in PHASE_S.items():
        phase[0] = name
        end = time.monotonic() + seconds
        count = 0
        while time.monotonic() < end:
            if name in inputs:
                for _ in range(8):
                    paged_decode_triton(*inputs[name], dim**-0.5)
                torch.cuda.synchronize()
                count += 8
            else:
                time.sleep(0.05)
        launches[name] = count
    stop.set()
    thread.join()
    result = {
        "schema": "feather.nvml_series/1",
        "gpu": nvml.nvmlDeviceGetName(handle),
        "driver": nvml.nvmlSystemGetDriverVersion(),
        "nvml_version": nvml.nvmlSystemGetNVMLVersion(),
        "period_s": PERIOD_S,
        "phases_s": PHASE_S,
        "launches": launches,
        "field_errors": errors,
        "samples": samples,
    }
    (out / "nvml_series.json").write_text(json.dumps(result, indent=1, default=str))
    for name in PHASE_S:
        rows = [s for s in samples if s["phase"] == name]
        mean = {
            k: round(sum(r.get(k, 0) or 0 for r in rows) / max(1, len(rows)), 1)
            for k in ("sm_util_pct", "mem_util_pct", "power_w", "gpm_dram_bw_util_pct")
        }
        print(name, len(rows), "samples", mean, flush=True)
    print("errors:", errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
