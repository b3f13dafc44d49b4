"""A failed job's record, told from a result: what every reader of run outputs checks first.

A pipeline job that fails for its machine writes a small JSON record into each output it
did not write (feather/pipeline/job_status.py); a reader anywhere in the package - the
summary table, fidelity, the capacity run a load is retimed from, the step-time fit - asks
`failure(path)` before it reads a run, so it skips the job and names it instead of crashing
on a missing field. Here, in the core, so the workloads and the simulator can ask it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FAILED = "failed"


def failure(path: str | Path) -> dict[str, Any] | None:
    """The failure record at `path`, or None where the file is a result (or is missing)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("status") == FAILED else None


def failed(path: str | Path) -> bool:
    return failure(path) is not None


def describe(record: dict[str, Any]) -> str:
    return f"{record['job']} failed: {record['reason']}, log {record['log']}"
