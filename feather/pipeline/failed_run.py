"""The verdicts page of a run that failed: written from what finished, naming what did not.

When a rule crashes, Snakemake stops before the rules that need its output - often the
aggregate table, the `verdicts` rule and `jobs_check` - and `figures/verdicts.md` would stay
the previous run's page, naming nothing. The Snakefile's `onerror:` handler calls
`write_failed_run` instead, which

- reads the run's Snakemake log for the jobs that failed ("Error in rule X:" blocks);
- where the `verdicts` rule already wrote this run's page (a later job failed), adds those
  jobs to it; else grades again from what finished: the summaries that exist and are not a
  failed job's record, aggregated into a temporary table, and the stages' results that
  exist, through `write_verdicts` as the rule calls it;
- heads the page with `FAILED_RUN_MARK` and a line saying the run failed, and lists the
  failed jobs and the failure records present (feather/pipeline/job_status.py).

The mark makes the next run's parse date the page back (`job_status.retry_failed`), so the
`verdicts` rule rewrites it from that run's results. The handler never raises: where even
the grading fails, the page says why and still lists the failed jobs.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feather.atomic import write_json_atomic, write_text_atomic
from feather.pipeline.job_status import (
    FAILED_RUN_MARK,
    describe,
    failures,
    reason_from_log,
    split_finished,
)

# the rule whose failure is the failed jobs' records (the page names them already)
JOBS_CHECK = "jobs_check"
VERDICTS_FORMAT = "feather-verdicts/1"  # feather.pipeline.verdicts', without its imports
FAILED_SECTION = "## Jobs that failed in this run"
_ERROR = re.compile(r"^Error in rule (\S+?):\s*$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")


@dataclass(frozen=True)
class FailedJob:
    """One "Error in rule X:" block of Snakemake's log."""

    rule: str
    jobid: str = ""
    output: str = ""
    log: str = ""
    wildcards: str = ""

    def reason(self) -> str:
        """Where its log ends (a shell rule's exception is its last line), else where to look."""
        log = self.log.split(" (check log")[0].split(", ")[0].strip()
        if log and Path(log).is_file() and Path(log).stat().st_size:
            return f"its log {log} ends: {reason_from_log(Path(log))}"
        return (f"its log {log} is empty: see Snakemake's log" if log
                else "see Snakemake's log")

    def line(self) -> str:
        """The job (its wildcards, else its first output), and why it failed."""
        job = self.wildcards or self.output.split(", ")[0]
        what = f" ({job})" if job else ""
        return f"rule {self.rule}{what} failed: {self.reason()}"


def snakemake_log(log: str | Path | Sequence[str | Path] | None) -> Path | None:
    """The path Snakemake hands its hooks (one path, or a list of them in Snakemake 9)."""
    if isinstance(log, str | Path):
        return Path(log) if str(log) else None
    paths = [Path(p) for p in log or () if str(p)]
    return paths[-1] if paths else None


def failed_jobs(text: str) -> list[FailedJob]:
    """Each "Error in rule X:" block of a Snakemake log, in order, each job once."""
    jobs: list[FailedJob] = []
    current: dict[str, str] | None = None
    for line in [*text.splitlines(), ""]:
        match = _ERROR.match(line)
        if match:
            if current is not None:
                jobs.append(FailedJob(**current))
            current = {"rule": match.group(1)}
            continue
        field = _FIELD.match(line) if current is not None else None
        if current is not None and field and field.group(1) in ("jobid", "output", "log",
                                                                 "wildcards"):
            current[field.group(1)] = field.group(2).strip()
        elif current is not None and not line.startswith((" ", "\t")):
            jobs.append(FailedJob(**current))
            current = None
    # one job, one line: on a cluster the executor's block (its job log) and the job's own
    # inner Snakemake block (another jobid) name the same rule and output
    unique: dict[tuple[str, str], FailedJob] = {}
    for job in jobs:
        key = (job.rule, job.output or job.wildcards or job.jobid)
        seen = unique.get(key)
        fields = FailedJob.__dataclass_fields__
        unique[key] = job if seen is None else FailedJob(
            **{name: getattr(seen, name) or getattr(job, name) for name in fields})
    return list(unique.values())


def failed_in_log(log: str | Path | Sequence[str | Path] | None) -> list[FailedJob]:
    path = snakemake_log(log)
    try:
        return failed_jobs(path.read_text(errors="replace")) if path is not None else []
    except OSError:
        return []


def banner(log: Path | None) -> str:
    where = f" (Snakemake's log: `{log}`)" if log else ""
    return (f"> **This run failed**{where}: this page is graded from what finished, and the "
            "jobs that failed are listed below the table. The next `snakemake` retries them "
            "and writes the page again.")


def failed_section(jobs: Iterable[FailedJob], records: Iterable[dict[str, Any]] = ()) -> str:
    """The jobs that crashed, and `records`: the failure records present where the page
    does not list them already (`write_verdicts` does, under "What this run did not
    measure")."""
    lines = ["", FAILED_SECTION, ""]
    lines += [f"- {job.line()}" for job in jobs]
    lines += [f"- {describe(record)} (its record is in `{record['path']}`)" for record in records]
    return "\n".join(lines) + "\n"


def _marked(page_text: str, log: Path | None, section: str) -> str:
    """The page with the mark and the banner under its title, and `section` at its end (an
    earlier handler's banner and section replaced)."""
    lines = [line for line in page_text.split(FAILED_SECTION)[0].rstrip("\n").splitlines()
             if line != FAILED_RUN_MARK and not line.startswith("> **This run failed**")]
    title, rest = (lines[:1], lines[1:]) if lines and lines[0].startswith("# ") else ([], lines)
    head = [FAILED_RUN_MARK, *title, "", banner(log)]
    return "\n".join(head + rest) + "\n" + section


def _grade(
    summaries: Sequence[str | Path],
    page: Path,
    data: Path,
    verdict_inputs: dict[str, Any],
) -> list[str]:
    """Grade what finished into `page` and `data` through `write_verdicts`; returns the
    summaries that could not be read (a user's run the aggregate refuses)."""
    from feather.pipeline.aggregate import InvalidRunError, aggregate, summary_row
    from feather.pipeline.verdicts import write_verdicts

    finished, _ = split_finished(p for p in summaries if Path(p).is_file())
    unread: list[str] = []
    with tempfile.TemporaryDirectory(prefix="feather-failed-run-") as tmp:
        table, csv = Path(tmp) / "summary.parquet", Path(tmp) / "summary.csv"
        try:
            aggregate(list(finished), table, csv)
        except InvalidRunError:  # keep the readable ones, name the others
            readable = []
            for path in finished:
                try:
                    summary_row(path)
                    readable.append(path)
                except InvalidRunError as exc:
                    unread.append(str(exc))
            aggregate(readable, table, csv)
        write_verdicts(table, page, json_out=data, **verdict_inputs)
    return unread


def write_failed_run(
    log: str | Path | Sequence[str | Path] | None,
    started: float,
    *,
    summaries: Sequence[str | Path],
    guarded: Sequence[str | Path] = (),
    not_planned: Sequence[str] = (),
    overhead: Sequence[str | Path] = (),
    kernel_files: Sequence[str | Path] = (),
    fidelity: Sequence[str | Path] = (),
    online_files: Sequence[str | Path] = (),
    rl_reports: Sequence[str | Path] = (),
    page: str | Path = "figures/verdicts.md",
    data: str | Path = "results/verdicts.json",
    say: Callable[[str], None] = print,
) -> Path:
    """Rewrite `page` (and `data`) after a failed run, from what finished (module docstring).
    `started`: the run's start (time.time()); the other arguments are the `verdicts` rule's
    inputs (`overhead`, `fidelity`: its first target, where the stage is on). Never raises."""
    page, data = Path(page), Path(data)
    path = snakemake_log(log)
    jobs = failed_in_log(log)
    records = failures(guarded)
    named = [j for j in jobs if j.rule != JOBS_CHECK]  # jobs_check's failure is the records
    this_runs = page.is_file() and page.stat().st_mtime >= started
    try:
        if this_runs:
            # the verdicts rule graded this run; only jobs after it failed: add them
            if not named:
                say(f"feather: {page} is this run's; it names the jobs that failed")
                return page
            text = page.read_text()
        else:
            exists = [p for p in (*kernel_files, *fidelity, *online_files, *rl_reports)
                      if Path(p).is_file()]
            overhead_md = next((Path(p) for p in overhead if Path(p).is_file()), None)
            inputs = {
                "overhead_dir": str(overhead_md.parent) if overhead_md else None,
                "kernel_files": [p for p in kernel_files if p in exists],
                "fidelity_path": next((p for p in fidelity if p in exists), None),
                "online_files": [p for p in online_files if p in exists],
                "rl_reports": [p for p in rl_reports if p in exists],
                "not_planned": list(not_planned),
                "guarded": list(guarded),
            }
            unread = _grade(summaries, page, data, inputs)
            text = page.read_text()
            if unread:
                text += "\n" + "\n".join(f"- not read: {u}" for u in unread) + "\n"
        write_text_atomic(page, _marked(text, path, failed_section(named)))
        _note_in_data(data, path, named, records)
    except Exception as exc:  # the hook must not hide Snakemake's own error: say why instead
        say(f"feather: the verdicts could not be graded from what finished: {exc!r}")
        text = "\n".join([FAILED_RUN_MARK, "# Verdicts: the paper's claims against this run's "
                          "results", "", banner(path), "",
                          f"No verdict could be graded: {type(exc).__name__}: {exc}", ""])
        try:
            write_text_atomic(page, text + failed_section(named, records))
            write_json_atomic(data, {"format": VERDICTS_FORMAT, "git_revision": "unknown",
                                     "rows": [], "failed_run": _failed_doc(path, named, records)})
        except OSError as again:
            say(f"feather: {page} could not be written either: {again}")
            return page
    say(f"feather: this run failed; {page} is written from what finished and names "
        f"{len(named) + len(records)} failed job(s)")
    return page


def _failed_doc(log: Path | None, jobs: Sequence[FailedJob],
                records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"snakemake_log": str(log) if log else None,
            "jobs": [job.line() for job in jobs], "records": [describe(r) for r in records]}


def _note_in_data(data: Path, log: Path | None, jobs: Sequence[FailedJob],
                  records: Sequence[dict[str, Any]]) -> None:
    """results/verdicts.json says the run failed too (`failed_run`), beside its rows."""
    try:
        doc = json.loads(data.read_text())
    except (OSError, ValueError):
        return
    if isinstance(doc, dict):
        doc["failed_run"] = _failed_doc(log, jobs, records)
        write_json_atomic(data, doc)
