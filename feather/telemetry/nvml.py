"""The NVML sampler: GPU counters on a background thread for the duration of a run.

    with NvmlSampler(out="results/.../nvml.parquet") as nvml:
        run_the_benchmark()
    summary["nvml"] = nvml.record

Where NVML cannot start (no library, no driver, no GPU) the record says so and why -
`{"available": False, "reason": ...}` - and nothing else happens: telemetry never fails a run
and never invents numbers. A counter the GPU does not offer is null in the series and named
in the record's `field_errors`.

One sample is taken as the block starts and one as it ends, so even a short run has two.
NVML's PCIe throughput calls each block for about 20 ms, so a sample of one GPU takes ~40 ms
and intervals below that are met as fast as the reads allow.
GPM metrics (DRAM bandwidth, SM occupancy) are rates between consecutive GPM samples, so the
first sample has none. NVML sometimes answers NaN (40% of DRAM readings in the recorded H200
series, sampled every ~62 ms); those are null, and each summary counts the samples it used.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from feather.telemetry.nvml_lib import error_text, load_nvml
from feather.telemetry.series import NVML_FILE, series_table, summarise_rows, write_series

if TYPE_CHECKING:
    import pyarrow as pa

INTERVAL_ENV = "FEATHER_NVML_INTERVAL_MS"
DEFAULT_INTERVAL_MS = 100.0
GPM_METRICS = ("gpm_dram_bw_util_pct", "gpm_sm_occupancy_pct")


def default_interval_ms() -> float:
    """$FEATHER_NVML_INTERVAL_MS, else 100 ms; 0 turns sampling off."""
    return float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_MS))


def not_applicable(reason: str) -> dict[str, Any]:
    """The record of a run that has no device to sample (the simulator)."""
    return {"available": False, "applicable": False, "reason": f"not applicable: {reason}"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Device:
    """One GPU: its identity, the readers of its counters, and its GPM state."""

    def __init__(self, nvml: ModuleType, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = _text(nvml.nvmlDeviceGetName(self.handle))
        try:
            self.uuid: str | None = _text(nvml.nvmlDeviceGetUUID(self.handle))
        except Exception:
            self.uuid = None
        self.field_errors: dict[str, str] = {}
        self.readers = self._readers()
        self.gpm: list[Any] | None = None
        self.gpm_primed = False
        try:
            if nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                self.gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            else:
                self.field_errors["gpm"] = "GPM not supported on this GPU (Hopper and newer)"
        except Exception as exc:
            self.field_errors["gpm"] = error_text(exc)

    def _readers(self) -> dict[str, Callable[[], dict[str, float]]]:
        n, h = self.nvml, self.handle

        def utilisation() -> dict[str, float]:
            rates = n.nvmlDeviceGetUtilizationRates(h)
            return {"sm_util_pct": rates.gpu, "mem_util_pct": rates.memory}

        return {
            "utilisation": utilisation,
            "memory_used_bytes": lambda: {"memory_used_bytes": n.nvmlDeviceGetMemoryInfo(h).used},
            "power_w": lambda: {"power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0},
            "sm_clock_mhz": lambda: {"sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)},
            "mem_clock_mhz": lambda: {
                "mem_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
            },
            "temperature_c": lambda: {
                "temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            },
            "pcie_tx_kbps": lambda: {
                "pcie_tx_kbps": n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)
            },
            "pcie_rx_kbps": lambda: {
                "pcie_rx_kbps": n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)
            },
        }

    def read(self) -> dict[str, float | None]:
        """One sample of every counter; a failing one is null (and named once)."""
        row: dict[str, float | None] = {}
        for name, reader in list(self.readers.items()):
            try:
                row.update(reader())
            except Exception as exc:
                self.field_errors.setdefault(name, error_text(exc))
                if type(exc).__name__ == "NVMLError_NotSupported":
                    del self.readers[name]  # it will not start working mid-run
        if self.gpm is not None:
            row.update(self._read_gpm())
        return row

    def _read_gpm(self) -> dict[str, float | None]:
        n = self.nvml
        try:
            if not self.gpm_primed:
                n.nvmlGpmSampleGet(self.handle, self.gpm[0])
                self.gpm_primed = True
                return {}
            n.nvmlGpmSampleGet(self.handle, self.gpm[1])
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = 2
            get.sample1, get.sample2 = self.gpm[0], self.gpm[1]
            get.metrics[0].metricId = n.NVML_GPM_METRIC_DRAM_BW_UTIL
            get.metrics[1].metricId = n.NVML_GPM_METRIC_SM_OCCUPANCY
            n.nvmlGpmMetricsGet(get)
            values = [get.metrics[0].value, get.metrics[1].value]
        except Exception as exc:
            self.field_errors.setdefault("gpm", error_text(exc))
            return {}
        self.gpm.reverse()  # this sample is the next reading's base
        return dict(zip(GPM_METRICS, values, strict=True))

    def close(self) -> None:
        for sample in self.gpm or []:
            with contextlib.suppress(Exception):
                self.nvml.nvmlGpmSampleFree(sample)

    def facts(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "gpm_supported": self.gpm is not None,
            "field_errors": dict(self.field_errors),
        }


class NvmlSampler:
    """Samples every GPU NVML sees, every `interval_ms`, while the `with` block runs.

    out: where the Parquet series goes on exit (nothing is written when NVML was
        unavailable or the block took no sample). nvml: a pynvml-like module (tests pass a
        replay of a recorded series); None imports the real pynvml.
    """

    def __init__(
        self,
        out: str | Path | None = None,
        interval_ms: float | None = None,
        nvml: ModuleType | None = None,
    ) -> None:
        self.out = Path(out) if out is not None else None
        self.interval_ms = default_interval_ms() if interval_ms is None else float(interval_ms)
        self._nvml = nvml
        self._rows: list[dict[str, Any]] = []
        self._devices: list[_Device] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unavailable: str | None = None
        self._thread_error: str | None = None
        self._started_utc: str | None = None
        self._duration_s = 0.0
        self._written: Path | None = None
        self.started_monotonic: float | None = None
        self._write_error: str | None = None

    def __enter__(self) -> NvmlSampler:
        self._started_utc = datetime.now(UTC).isoformat(timespec="milliseconds")
        if self.interval_ms <= 0:
            self._unavailable = f"sampling turned off ({INTERVAL_ENV}={self.interval_ms:g})"
            return self
        nvml, reason = load_nvml(self._nvml)
        if nvml is None:
            self._unavailable = reason
            return self
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            self._devices = [_Device(nvml, i) for i in range(count)]
        except Exception as exc:
            self._unavailable = f"NVML started but its devices could not be read: {error_text(exc)}"
            self._shutdown()
            return self
        if not self._devices:
            self._unavailable = "NVML sees no GPU"
            self._shutdown()
            return self
        self.started_monotonic = time.monotonic()  # t_s = 0 of the series
        self._thread = threading.Thread(target=self._loop, name="feather-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        for device in self._devices:
            device.close()
        self._shutdown()
        if self.out is not None and self._rows:
            try:
                self._written = write_series(self.out, self.table())
            except ImportError as exc:  # a bare GPU box without pyarrow: the summary stays
                self._write_error = f"series not written: {error_text(exc)}"

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()

    def _loop(self) -> None:
        interval_s = self.interval_ms / 1000.0
        start = self.started_monotonic
        deadline = start
        try:
            while True:
                self._sample(start)
                deadline += interval_s
                late = time.monotonic() - deadline
                if late > 0:  # reads took longer than the interval: skip the missed ticks
                    deadline += math.ceil(late / interval_s) * interval_s
                if self._stop.wait(max(0.0, deadline - time.monotonic())):
                    break
            self._sample(start)  # the state as the block ends
        except Exception as exc:  # never let telemetry take the run down
            self._thread_error = error_text(exc)
        self._duration_s = time.monotonic() - start

    def _sample(self, start: float) -> None:
        for device in self._devices:
            t_s = time.monotonic() - start
            self._rows.append({"t_s": t_s, "gpu": device.index, **device.read()})

    def table(self) -> pa.Table:
        """The series so far (complete once the block has ended)."""
        return series_table(self._rows)

    @property
    def record(self) -> dict[str, Any]:
        """What goes into summary.json["nvml"]: availability, devices, per-GPU summary."""
        if self._unavailable is not None:
            return {"available": False, "applicable": True, "reason": self._unavailable}
        summary = summarise_rows(self._rows)
        record: dict[str, Any] = {
            "available": True,
            "applicable": True,
            "interval_ms": self.interval_ms,
            "started_utc": self._started_utc,
            "duration_s": self._duration_s,
            "samples": len(self._rows),
            "file": self._written.name if self._written is not None else None,
            "gpus": [
                {**device.facts(), "metrics": summary.get(device.index, {})}
                for device in self._devices
            ],
        }
        if self._thread_error is not None:
            record["sampler_error"] = self._thread_error
        if self._write_error is not None:
            record["file_error"] = self._write_error
        return record


def sample_nvml(run_dir: str | Path | None = None, interval_ms: float | None = None) -> NvmlSampler:
    """The sampler for a run directory: its series goes to `<run_dir>/nvml.parquet`."""
    return NvmlSampler(None if run_dir is None else Path(run_dir) / NVML_FILE, interval_ms)
