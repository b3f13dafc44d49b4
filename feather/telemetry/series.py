"""An NVML time series as a table, its file, and its summary (mean, p95, max per GPU).

One row per (sample, GPU). Column names carry their units and match the recorded H200
series in tests/fixtures, so a recording and a live run are read by the same code. A
value NVML could not give is null, never zero: a missing counter must not read as idle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from feather.atomic import atomic_target

NVML_FILE = "nvml.parquet"

# metric -> what it is (the summary and the docs say the same thing)
METRICS: dict[str, str] = {
    "sm_util_pct": "SM utilisation: share of time a kernel ran (nvmlDeviceGetUtilizationRates)",
    "mem_util_pct": "memory-controller utilisation: share of time DRAM was read or written",
    "memory_used_bytes": "device memory in use",
    "power_w": "board power draw",
    "sm_clock_mhz": "SM clock",
    "mem_clock_mhz": "memory clock",
    "temperature_c": "GPU temperature",
    "pcie_tx_kbps": "PCIe transmit throughput (KB/s, NVML's 20 ms window)",
    "pcie_rx_kbps": "PCIe receive throughput (KB/s, NVML's 20 ms window)",
    "gpm_dram_bw_util_pct": "DRAM bandwidth utilisation, GPM (Hopper and newer)",
    "gpm_sm_occupancy_pct": "SM occupancy, GPM (Hopper and newer)",
}

SCHEMA = pa.schema(
    [pa.field("t_s", pa.float64()), pa.field("gpu", pa.int32())]
    + [pa.field(name, pa.float64()) for name in METRICS]
)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def series_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (t_s, gpu, metrics...) as a table of the fixed schema; NaN and absent -> null."""
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    for row in rows:
        columns["t_s"].append(float(row["t_s"]))
        columns["gpu"].append(int(row.get("gpu", 0)))
        for name in METRICS:
            columns[name].append(_number(row.get(name)))
    return pa.table(columns, schema=SCHEMA)


def metric_summary(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """mean, p95 (linear interpolation), max and the count of samples that had a value."""
    present = np.array([v for v in values if v is not None], dtype=float)
    if present.size == 0:
        return {"mean": None, "p95": None, "max": None, "samples": 0}
    return {
        "mean": float(present.mean()),
        "p95": float(np.percentile(present, 95)),
        "max": float(present.max()),
        "samples": int(present.size),
    }


def summarise(table: pa.Table) -> dict[int, dict[str, dict[str, float | int | None]]]:
    """Per GPU index, per metric: mean, p95, max, samples."""
    data = table.to_pydict()
    summary: dict[int, dict[str, dict[str, float | int | None]]] = {}
    for gpu in sorted(set(data["gpu"])):
        rows = [i for i, g in enumerate(data["gpu"]) if g == gpu]
        summary[gpu] = {name: metric_summary(data[name][i] for i in rows) for name in METRICS}
    return summary


def write_series(path: str | Path, table: pa.Table) -> Path:
    """The series as Parquet, written atomically (a reader never sees half a file)."""
    with atomic_target(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return Path(path)
