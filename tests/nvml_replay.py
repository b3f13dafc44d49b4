"""A FAKE pynvml for tests: it replays the recorded H200 series instead of reading a GPU.

Not a measurement. Each `nvmlDeviceGetUtilizationRates` call (the first read of a sample)
moves to the next recorded row; every other counter answers that row's value in the unit
NVML uses (power in mW), and GPM answers the row's recorded metrics, NaN included. Fields
listed in `unsupported` raise NVMLError_NotSupported like a GPU without that counter.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

RECORDED = Path(__file__).parent / "fixtures" / "h200_nvml_series.json"


def recorded_series() -> dict:
    return json.loads(RECORDED.read_text())  # Python's json reads the recording's NaN


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class ReplayNvml:
    """Module-like: the sampler calls it exactly as it calls pynvml."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_DRAM_BW_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 10, 3
    NVMLError, NVMLError_NotSupported = NVMLError, NVMLError_NotSupported

    def __init__(self, rows: list[dict], unsupported: tuple[str, ...] = (), gpm: bool = True):
        self.rows = rows
        self.unsupported = set(unsupported)
        self.gpm = gpm
        self.served = -1  # index of the row being served
        self.reached = {}  # row count -> Event, set once that many rows were served
        self.calls: dict[str, int] = {}
        self.initialised = 0

    def when_served(self, count: int) -> threading.Event:
        return self.reached.setdefault(count, threading.Event())

    def _row(self) -> dict:
        return self.rows[self.served % len(self.rows)]

    def _value(self, field: str):
        self.calls[field] = self.calls.get(field, 0) + 1
        if field in self.unsupported:
            raise NVMLError_NotSupported("Not Supported")
        return self._row()[field]

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200 (replayed recording)"

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-replay"

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.served += 1
        for count, event in self.reached.items():
            if self.served + 1 >= count:
                event.set()
        return SimpleNamespace(gpu=self._value("sm_util_pct"), memory=self._value("mem_util_pct"))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self._value("memory_used_bytes"), total=150_000_000_000)

    def nvmlDeviceGetPowerUsage(self, handle):
        return round(self._value("power_w") * 1000)  # NVML answers milliwatts

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._value("sm_clock_mhz" if clock == self.NVML_CLOCK_SM else "mem_clock_mhz")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._value("temperature_c")

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        tx = counter == self.NVML_PCIE_UTIL_TX_BYTES
        return self._value("pcie_tx_kbps" if tx else "pcie_rx_kbps")

    # GPM: a sample is a token; metrics between two samples are the current row's values
    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return object()

    def nvmlGpmSampleFree(self, sample):
        pass

    def nvmlGpmSampleGet(self, handle, sample):
        pass

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, value=0.0) for _ in range(2)])

    def nvmlGpmMetricsGet(self, get):
        recorded = {
            self.NVML_GPM_METRIC_DRAM_BW_UTIL: "gpm_dram_bw_util_pct",
            self.NVML_GPM_METRIC_SM_OCCUPANCY: "gpm_sm_occupancy_pct",
        }
        for metric in get.metrics[: get.numMetrics]:
            metric.value = self._value(recorded[metric.metricId])
        return get
