"""A job that fails for its machine leaves a status with its reason, not a hole in the run.

Without this, one engine job that crashes (no CUDA, out of memory, an engine bug) would leave
its summaries missing, so the aggregate, the figures and `figures/verdicts.md` would never be
written. Instead the rule's shell ends `cmd > log || python -m feather.pipeline.job_status
...`: each output the job did not write becomes a small JSON record

    {"status": "failed", "job": ..., "claim": ..., "reason": <the log's last line>,
     "log": ..., "exit_code": ...}

which every reader skips (`failed`), and which the verdicts page names. The run still ends
non-zero: the last rule (`jobs_check`) lists the failed jobs, removes their records so the
next run retries them, and fails. Outputs the job did write before it failed (some repeats of
an engine job) are kept: they are real results.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from feather.atomic import write_json_atomic, write_text_atomic

FAILED = "failed"
REASON_CHARS = 300


def reason_from_log(log: Path) -> str:
    """The log's last non-blank line (where Python puts the exception), shortened."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log was written"
    last = next((line for line in reversed(lines) if line), "the log is empty")
    return last if len(last) <= REASON_CHARS else last[: REASON_CHARS - 3] + "..."


def record_failure(
    outputs: Iterable[str | Path], job: str, claim: str, log: str | Path, exit_code: int
) -> list[Path]:
    """Write the failure record to each output the job left unwritten; returns those paths."""
    log = Path(log)
    record = {
        "status": FAILED,
        "job": job,
        "claim": claim,
        "reason": reason_from_log(log),
        "log": str(log),
        "exit_code": exit_code,
    }
    written = []
    for out in map(Path, outputs):
        if out.exists():
            continue
        write_text_atomic(out, json.dumps(record, indent=1) + "\n")
        written.append(out)
    return written


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


def failures(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """One record per failed job (a job with several outputs counts once), in path order."""
    seen: dict[str, dict[str, Any]] = {}
    for path in paths:
        record = failure(path)
        if record is not None and record["job"] not in seen:
            seen[record["job"]] = {**record, "path": str(path)}
    return list(seen.values())


def describe(record: dict[str, Any]) -> str:
    return f"{record['job']} failed: {record['reason']}, log {record['log']}"


class FailedJobsError(RuntimeError):
    """Some jobs failed for their machine: the run's exit status must say so."""


def check_jobs(outputs: Iterable[str | Path], out: str | Path) -> None:
    """Write `out` (the guarded jobs, all fine) or, where any failed, remove their records
    (so the next run retries them) and raise naming each job, its reason and its log."""
    outputs = [Path(p) for p in outputs]
    records = [(path, failure(path)) for path in outputs]
    failed_jobs = failures(p for p, r in records if r is not None)
    if not failed_jobs:
        write_json_atomic(out, {"outputs": len(outputs), "failed": []})
        return
    for path, record in records:
        if record is not None:
            path.unlink()
    lines = "\n".join(f"  {describe(f)}" for f in failed_jobs)
    raise FailedJobsError(
        f"{len(failed_jobs)} job(s) failed; figures/verdicts.md names them, and the next run "
        f"retries them:\n{lines}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m feather.pipeline.job_status",
        description="Record a failed job's reason in each output it did not write.",
    )
    parser.add_argument("--job", required=True)
    parser.add_argument("--claim", default="")
    parser.add_argument("--log", required=True)
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("outputs", nargs="+")
    args = parser.parse_args(argv)
    written = record_failure(args.outputs, args.job, args.claim, args.log, args.exit_code)
    print(f"feather: {args.job} failed (exit {args.exit_code}): {reason_from_log(Path(args.log))}"
          f"; recorded in {len(written)} output(s), log {args.log}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
