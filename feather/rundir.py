"""One run directory, written the same way by every runner (simulator, vLLM, ...).

trace.parquet, requests.parquet (and any extra table, such as the NVML series, and any JSON
document, such as a simulated run's spec.json), then summary.json - each atomically;
summary.json is the marker of a complete run and goes last,
so a crash leaves a directory nothing trusts. An extra table given as None is removed, so a
rerun never leaves an earlier run's file beside its summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feather.atomic import atomic_target, write_json_atomic


def write_run_dir(
    out_dir: str | Path,
    trace: pa.Table,
    requests: pa.Table,
    summary: dict[str, Any],
    extra_tables: dict[str, pa.Table | None] | None = None,
    documents: dict[str, Any] | None = None,
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    tables = {"trace.parquet": trace, "requests.parquet": requests, **(extra_tables or {})}
    for name, table in tables.items():
        if table is None:
            (out / name).unlink(missing_ok=True)
            continue
        with atomic_target(out / name) as tmp:
            pq.write_table(table, tmp, compression="zstd")
    for name, document in (documents or {}).items():
        write_json_atomic(out / name, document)
    write_json_atomic(out / "summary.json", summary)
    return out
