"""One run directory, written the same way by every runner (simulator, vLLM, ...).

trace.parquet, requests.parquet, then summary.json - each atomically; summary.json is the
marker of a complete run and goes last, so a crash leaves a directory nothing trusts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feather.atomic import atomic_target, write_json_atomic


def write_run_dir(
    out_dir: str | Path, trace: pa.Table, requests: pa.Table, summary: dict[str, Any]
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    for name, table in (("trace.parquet", trace), ("requests.parquet", requests)):
        with atomic_target(out / name) as tmp:
            pq.write_table(table, tmp, compression="zstd")
    write_json_atomic(out / "summary.json", summary)
    return out
