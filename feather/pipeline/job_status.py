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

A run that stops before `jobs_check` (another job crashed) leaves the records behind, and
Snakemake would take them for finished outputs; so each run, when its Snakefile is parsed,
removes the records it finds (`retry_failed`), and its plan retries those jobs. A verdicts
page written after a failed run (feather/pipeline/failed_run.py) carries `FAILED_RUN_MARK`;
the next parse dates it back, so the `verdicts` rule grades that run's results again.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from feather.atomic import write_json_atomic, write_text_atomic
from feather.failure_record import FAILED, describe, failed, failure  # noqa: F401 (re-exported)

REASON_CHARS = 300
# the first line of a page written after a failed run, and the pages that may carry it
FAILED_RUN_MARK = "<!-- feather: written after a failed run -->"
FAILED_RUN_PAGES = ("figures/verdicts.md", "results/verdicts.json")
# Snakemake's lock files: a run in progress in the same directory
LOCKS = Path(".snakemake/locks")


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


def split_finished(paths: Iterable[str | Path]) -> tuple[list[Path], list[dict[str, Any]]]:
    """(the paths that are not failure records, one record per failed job among the others,
    with its `path`): what a reader of run outputs reads, and what it says it left out. A
    missing file is not a record: the reader still complains about it."""
    paths = [Path(p) for p in paths]
    records = {p: failure(p) for p in paths}
    return [p for p in paths if records[p] is None], failures(
        p for p in paths if records[p] is not None)


def failures(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """One record per failed job (a job with several outputs counts once), in path order."""
    seen: dict[str, dict[str, Any]] = {}
    for path in paths:
        record = failure(path)
        if record is not None and record["job"] not in seen:
            seen[record["job"]] = {**record, "path": str(path)}
    return list(seen.values())


def written_after_a_failed_run(path: str | Path) -> bool:
    """Whether `path` is a page the failed-run handler wrote (`FAILED_RUN_MARK` in it)."""
    try:
        with open(path, errors="replace") as f:
            return FAILED_RUN_MARK in f.read(4096)
    except OSError:
        return False


def retry_failed(
    outputs: Iterable[str | Path],
    main: bool = True,
    pages: Iterable[str | Path] = FAILED_RUN_PAGES,
    locks: Path = LOCKS,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """At parse time: remove the failure records among `outputs` (the last run stopped
    before `jobs_check` removed them), so this run's plan, a dry run's too, retries those
    jobs; and date back a page written after a failed run, so the `verdicts` rule rewrites
    it. Only in Snakemake's main process (`main`: a cluster job parses the Snakefile again,
    while its run needs the records) and where no other run holds the directory (its jobs
    may be reading them). Returns the records removed, one per job."""
    if not main:
        return []
    if locks.is_dir() and any(locks.iterdir()):
        say(f"feather: another Snakemake run holds this directory ({locks}): failure records "
            "of the last run are left in place")
        return []
    records = [(Path(p), failure(p)) for p in outputs]
    removed = failures(p for p, r in records if r is not None)
    for path, record in records:
        if record is not None:
            path.unlink(missing_ok=True)
    for record in removed:
        say(f"feather: {record['job']} failed in the last run ({record['reason']}): its record "
            "is removed so this run retries it")
    page = next((Path(p) for p in pages if str(p).endswith(".md")), None)
    if page is not None and written_after_a_failed_run(page):
        for path in map(Path, pages):
            if path.exists():
                os.utime(path, (0, 0))  # older than every input: the rule that writes it reruns
    return removed


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
