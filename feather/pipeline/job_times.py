"""How long each job of the workflow takes: the one table, workflow/job_times.yaml.

The table states each job's expected minutes on the machine the default run is sized for (2
cores, no GPU), with what was measured and the command that measures it again. Everything
else reads it: the rules' `runtime=` resources (the wall-time limit a cluster executor gives a
job, `runtime(job, variant)`), and the docs and config comments point to it.

    python -m feather.pipeline.job_times show          # the table, with each job's limit
    python -m feather.pipeline.job_times measure LOG   # job times from a snakemake run's log,
                                                       # and the least wall time they allow
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import yaml

# the checkout this package runs from (an editable install, as install.sh makes it); else the
# workflow's directory, where Snakemake runs from it
_HERE = Path(__file__).resolve().parents[2] / "workflow" / "job_times.yaml"
TABLE = _HERE if _HERE.is_file() else Path("workflow") / "job_times.yaml"
DEFAULT_VARIANT = "default"
# An engine job that has no entry of its own (a new experiment entry): the table's fallback
# for its device.
ENGINE_FALLBACK = {"cpu": "engine_cpu"}
LEARNER_JOB = "train_learner_engine"  # the learners trained in a real engine, per regime


class JobTimesError(ValueError):
    """The table is malformed, or a rule asks for a job it does not hold."""


@cache
def load(path: Path = TABLE) -> dict[str, Any]:
    """The table, checked: every entry states minutes (or a limit and why there is none)."""
    table = yaml.safe_load(Path(path).read_text())
    limit = table.get("limit") or {}
    if not {"factor", "floor"} <= set(limit):
        raise JobTimesError(f"{path}: `limit:` needs factor and floor")
    for job, variants in (table.get("jobs") or {}).items():
        for variant, entry in _variants(job, variants).items():
            _check_entry(path, f"{job}/{variant}", entry)
    return table


def _variants(job: str, value: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A job's entries by variant: an entry itself (`minutes:` or `limit:` at its top level) is
    the job's only, `default`, variant."""
    if not isinstance(value, dict):
        raise JobTimesError(f"job_times: {job}: expected a mapping, got {value!r}")
    if "minutes" in value or "limit" in value:
        return {DEFAULT_VARIANT: value}
    return value


def _check_entry(path: Path, where: str, entry: dict[str, Any]) -> None:
    if not isinstance(entry, dict):
        raise JobTimesError(f"{path}: {where}: expected a mapping")
    minutes, limit = entry.get("minutes"), entry.get("limit")
    if minutes is None and limit is None:
        raise JobTimesError(f"{path}: {where}: needs minutes, or a limit with why")
    if minutes is not None and not (isinstance(minutes, int | float) and minutes > 0):
        raise JobTimesError(f"{path}: {where}: minutes must be a positive number")
    if limit is not None and not (isinstance(limit, int) and limit > 0):
        raise JobTimesError(f"{path}: {where}: limit must be a positive whole number of minutes")
    if minutes is not None and not entry.get("command"):
        raise JobTimesError(f"{path}: {where}: a measured time needs the command that measured it")
    if minutes is None and not entry.get("why"):
        raise JobTimesError(f"{path}: {where}: a limit without minutes needs `why`")


def entry(job: str, variant: str = DEFAULT_VARIANT, table: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """The table's entry for a job (a rule's name) and variant (a sweep, or gpu-<sweep>)."""
    table = table or load()
    jobs = table.get("jobs") or {}
    name = job
    if name not in jobs and job.startswith("engine_") and job not in ENGINE_FALLBACK.values():
        name = ENGINE_FALLBACK["cpu"]  # a CPU engine job not measured yet
    if name not in jobs and job.startswith(f"{LEARNER_JOB}_"):
        name = LEARNER_JOB  # an engine-trained regime not measured on its own
    if name not in jobs:
        raise JobTimesError(f"workflow/job_times.yaml has no entry for job {job!r}: add its "
                            "expected minutes and the command that measured them")
    variants = _variants(name, jobs[name])
    if variant not in variants:
        raise JobTimesError(f"workflow/job_times.yaml: job {name!r} has no variant {variant!r} "
                            f"(it has {', '.join(variants)})")
    return variants[variant]


def expected_minutes(job: str, variant: str = DEFAULT_VARIANT) -> float | None:
    """What the job takes on the table's machine; None where it has not been measured."""
    return entry(job, variant).get("minutes")


def limit_minutes(minutes: float, table: dict[str, Any] | None = None) -> int:
    """The wall-time limit for a job expected to take `minutes`: the table's factor of it, at
    least its floor (whole minutes, as SLURM's -t takes them)."""
    rule = (table or load())["limit"]
    return max(int(rule["floor"]), math.ceil(float(rule["factor"]) * minutes))


def runtime(job: str, variant: str = DEFAULT_VARIANT, runs: int = 1) -> int:
    """A rule's `runtime=` resource (minutes): the entry's own limit where it states one (a job
    whose time is not measured, or bound by a download), else limit_minutes(its minutes), its
    minutes being per run where one job does `runs` of them (the simulation jobs)."""
    found = entry(job, variant)
    if found.get("limit") is not None:
        return int(found["limit"])
    return limit_minutes(float(found["minutes"]) * runs)


# ---- measuring: job times from a snakemake run's log ----

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
_OUTPUT = re.compile(r"^\s+output: (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\S+)\)$")


_THREADS = re.compile(r"^\s+threads: (\d+)$")
_RESOURCES = re.compile(r"^\s+resources: (.*)$")
_CORES = re.compile(r"^Provided cores: (\d+)$")


@dataclass(frozen=True)
class JobTime:
    """One finished job: its key (`simulate[c5]`), seconds, threads and whether it measures
    time (`measures_time` in its resources: such jobs run one at a time)."""

    key: str
    seconds: float
    threads: int = 1
    measures_time: bool = False


def measure_jobs(log_text: str) -> list[JobTime]:
    """Every finished job in the log `snakemake` prints (its console output: a timestamp line
    before each job starts and before each `Finished jobid:` line), keyed by rule (and by
    experiment for rules that have that wildcard, and for the simulation jobs, whose
    outputs name it: `simulate[c5]`, each job one scheduler's runs)."""
    now: datetime | None = None
    rule: str | None = None
    job: str | None = None  # the job whose block is being read
    sim_key: str | None = None  # that block's simulation key, from its output line
    started: dict[str, dict[str, Any]] = {}
    jobs: list[JobTime] = []
    for line in log_text.splitlines():
        if stamp := _STAMP.match(line):
            now = datetime.strptime(" ".join(stamp.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif head := _RULE.match(line):
            rule = head.group(1)
        elif (jobid := _JOBID.match(line)) and rule and now:
            job = jobid.group(1)
            started[job] = {"key": sim_key or rule, "start": now, "threads": 1,
                            "measures_time": False}
        elif rule and rule.startswith("simulate_") and (output := _OUTPUT.match(line)):
            # a simulation job (one scheduler's runs of one experiment): its outputs name it
            if experiment := re.match(r"results/[^/]+/sim/([^/]+)/", output.group(1)):
                sim_key = f"simulate[{experiment.group(1)}]"
        elif job in started and rule and (wildcards := _WILDCARDS.match(line)):
            experiment = re.search(r"(?:^|, )experiment=([^,]+)", wildcards.group(1))
            if experiment:
                started[job]["key"] = f"{rule}[{experiment.group(1)}]"
        elif job in started and rule and (threads := _THREADS.match(line)):
            started[job]["threads"] = int(threads.group(1))
        elif job in started and rule and (resources := _RESOURCES.match(line)):
            started[job]["measures_time"] = "measures_time=1" in resources.group(1).split(", ")
        elif (done := _FINISHED.match(line)) and now and done.group(1) in started:
            one = started.pop(done.group(1))
            jobs.append(JobTime(one["key"], (now - one["start"]).total_seconds(),
                                one["threads"], one["measures_time"]))
        if not line.strip():
            rule = job = sim_key = None
    return jobs


def measure(log_text: str) -> dict[str, list[float]]:
    """Seconds per finished job, grouped by key (`measure_jobs`)."""
    return seconds_by_key(measure_jobs(log_text))


def seconds_by_key(jobs: list[JobTime]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for one in jobs:
        times[one.key].append(one.seconds)
    return dict(times)


def provided_cores(log_text: str) -> int | None:
    """The cores the run was given (`Provided cores: N`)."""
    for line in log_text.splitlines():
        if found := _CORES.match(line):
            return int(found.group(1))
    return None


def shortest_run(jobs: list[JobTime], cores: int) -> dict[str, Any]:
    """The least wall time these jobs allow on `cores` (minutes), and what binds it.

    Jobs that measure time run one at a time: those that take every core (`exclusive`: the
    kernel benches, online serving) with nothing beside them, the others (`chain`: an engine
    with one thread, given every core but one) with one other job beside them; every other
    job takes a core. So the
    run lasts at least exclusive + chain, and at least exclusive + chain + what the other jobs
    leave over after the one core beside the chain, spread over every core. A bound: a real
    run adds the waits of its dependencies and the figures after the last measurement."""
    exclusive = sum(j.seconds for j in jobs if j.measures_time and j.threads >= cores) / 60
    chain = sum(j.seconds for j in jobs if j.measures_time and j.threads < cores) / 60
    others = sum(j.seconds for j in jobs if not j.measures_time) / 60
    rest = max(0.0, others - chain) / cores  # a chain job leaves one core: one job beside it
    return {
        "cores": cores,
        "exclusive_min": exclusive,
        "chain_min": chain,
        "other_job_min": others,
        "bound_min": exclusive + chain + rest,
        "binds": "the measuring jobs" if rest == 0 else "the measuring jobs and the other jobs",
    }


def shortest_run_text(bound: dict[str, Any]) -> str:
    return (
        f"on {bound['cores']} cores: measuring jobs alone {bound['exclusive_min']:.1f} min, "
        f"measuring jobs with one job beside {bound['chain_min']:.1f} min, other jobs "
        f"{bound['other_job_min']:.1f} job-min: at least {bound['bound_min']:.1f} min "
        f"({bound['binds']} bind it)"
    )


def measure_table(times: dict[str, list[float]]) -> str:
    """Markdown: per rule the jobs, their total minutes, median and longest seconds."""
    rows = ["| job | jobs | total min | median s | longest s |", "|---|---|---|---|---|"]
    for key, seconds in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        rows.append(f"| {key} | {len(seconds)} | {sum(seconds) / 60:.1f} | "
                    f"{statistics.median(seconds):.0f} | {max(seconds):.0f} |")
    total = sum(sum(s) for s in times.values())
    rows.append(f"| every job | {sum(len(s) for s in times.values())} | {total / 60:.1f} | | |")
    return "\n".join(rows)


def show_table(table: dict[str, Any] | None = None) -> str:
    """Markdown: the whole runs' minutes, then every job's expected minutes and the limit the
    rules declare."""
    table = table or load()
    rows = ["| run | minutes | measured |", "|---|---|---|"]
    for name, found in (table.get("runs") or {}).items():
        rows.append(f"| {name} | {found['minutes']} | {' '.join(str(found['how']).split())} |")
    rows += ["", "| job | variant | expected min | runtime limit | measured, or why not |",
             "|---|---|---|---|---|"]
    for job, value in (table.get("jobs") or {}).items():
        for variant, found in _variants(job, value).items():
            minutes = found.get("minutes")
            limit = (found["limit"] if found.get("limit") is not None
                     else limit_minutes(float(minutes), table))
            how = " ".join(str(found.get("how") or found.get("why") or "").split())
            rows.append(f"| {job} | {variant} | {'-' if minutes is None else minutes} | "
                        f"{limit} | {how} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feather.pipeline.job_times",
                                     description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("show", help="the table, with the runtime limit each job gets")
    measured = verbs.add_parser("measure", help="job times from a snakemake run's console log")
    measured.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "show":
        print(show_table())
    else:
        log_text = args.log.read_text(errors="replace")
        jobs = measure_jobs(log_text)
        if not jobs:
            print(f"{args.log}: no finished jobs with timestamps found", file=sys.stderr)
            return 1
        print(measure_table(seconds_by_key(jobs)))
        if cores := provided_cores(log_text):
            print("\n" + shortest_run_text(shortest_run(jobs, cores)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
