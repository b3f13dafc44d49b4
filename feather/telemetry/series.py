"""An NVML time series as a table, its file, and its summary (mean, p95, max per GPU).

One row per (sample, GPU). Column names carry their units and match the recorded H200
series in tests/fixtures, so a recording and a live run are read by the same code. A
value NVML could not give is null, never zero: a missing counter must not read as idle.
pyarrow is imported only to build or write a table: the summary is plain Python, so a bare
GPU box without pyarrow still gets its counters summarised.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feather.atomic import atomic_target

if TYPE_CHECKING:
    import pyarrow as pa

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


def schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
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
    import pyarrow as pa

    columns: dict[str, list] = {"t_s": [], "gpu": [], **{name: [] for name in METRICS}}
    for row in rows:
        columns["t_s"].append(float(row["t_s"]))
        columns["gpu"].append(int(row.get("gpu", 0)))
        for name in METRICS:
            columns[name].append(_number(row.get(name)))
    return pa.table(columns, schema=schema())


def metric_summary(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """mean, p95 (linear interpolation between ranks), max, and how many samples had a value
    (None and NaN are skipped)."""
    present = sorted(v for v in (_number(x) for x in values) if v is not None)
    if not present:
        return {"mean": None, "p95": None, "max": None, "samples": 0}
    rank = 0.95 * (len(present) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(present) - 1)
    return {
        "mean": math.fsum(present) / len(present),
        "p95": present[low] + (present[high] - present[low]) * (rank - low),
        "max": present[-1],
        "samples": len(present),
    }


def summarise_rows(
    rows: Iterable[Mapping[str, Any]],
) -> dict[int, dict[str, dict[str, float | int | None]]]:
    """Per GPU index, per metric: mean, p95, max, samples."""
    by_gpu: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_gpu.setdefault(int(row.get("gpu", 0)), []).append(row)
    return {
        gpu: {name: metric_summary(r.get(name) for r in by_gpu[gpu]) for name in METRICS}
        for gpu in sorted(by_gpu)
    }


def summarise(table: pa.Table) -> dict[int, dict[str, dict[str, float | int | None]]]:
    """`summarise_rows` of a series table (a written nvml.parquet, read back)."""
    return summarise_rows(table.to_pylist())


def write_series(path: str | Path, table: pa.Table) -> Path:
    """The series as Parquet, written atomically (a reader never sees half a file)."""
    import pyarrow.parquet as pq

    with atomic_target(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return Path(path)
