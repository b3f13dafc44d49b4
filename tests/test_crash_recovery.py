"""After a crash: a pipeline killed with SIGKILL resumes with `snakemake --unlock` and a rerun.

README's two lines on what to do after a crash are what this test does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from test_pipeline import tiny_config

REPO = Path(__file__).resolve().parents[1]
SCHEDULERS = ("fcfs", "feather-static", "feather-ucb", "feather-qlearn")


def _outputs(log: str, which: set[str] | None = None) -> set[str]:
    """Outputs of the jobs Snakemake printed (`[local]rule X:` blocks), or of those `which`."""
    found = set()
    for block in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", log, re.MULTILINE):
        fields = dict(re.findall(r"^    (\w+): (.*)$", block.group(2), re.MULTILINE))
        if "output" in fields and (which is None or fields["jobid"] in which):
            found |= set(fields["output"].split(", "))
    return found


def _count(pattern: str, path: Path) -> int:
    return len(re.findall(pattern, path.read_text(), re.MULTILINE)) if path.is_file() else 0


def test_a_killed_run_unlocks_and_reruns_only_what_did_not_finish(tmp_path) -> None:
    config = tiny_config(
        tmp_path, experiments=["c6"], engines=["sim"], hardware_comparison=[], overhead=None,
        kernel_bench="off", extra_rules=[], extra_runs=[],
        schedulers={name: {} for name in SCHEDULERS},
    )
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
            "--directory", str(tmp_path), "--configfile", str(config)]

    def snakemake(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=600,
                              check=False)

    plan = snakemake("-n", "--cores", "1")
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = _outputs(plan.stdout + plan.stderr)
    # 4 runs x 4 files (trace, requests, spec, summary); the table (parquet, csv); the
    # figure; ours and verdicts, each with its report page, and the verdicts as data; the
    # never-worse cases, and the benchmark joining them with the table; the last check that no
    # job failed; the figure index written from feather/claims
    assert len(planned) == 4 * 4 + 2 + 1 + 2 * 2 + 1 + 2 + 1 + 1, sorted(planned)

    # one job at a time; killed (snakemake and its jobs: the whole process group) while the
    # third job runs
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        run = subprocess.Popen([*base, "--cores", "1"], stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            finished = _count(r"^Finished jobid: ", log)
            if finished >= 2 and _count(r"^(?:local)?rule \w+:$", log) > finished:
                break
            time.sleep(0.05)
        assert run.poll() is None, "the run ended before it could be killed"
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    killed = log.read_text()
    done_ids = set(re.findall(r"^Finished jobid: (\d+)", killed, re.MULTILINE))
    finished = _outputs(killed, done_ids)
    assert len(done_ids) >= 2 and finished < planned

    # the killed run's lock stays until `snakemake --unlock` (typed without --cores)
    refused = snakemake("--cores", "1")
    assert refused.returncode != 0 and "--unlock" in refused.stdout + refused.stderr
    unlocked = snakemake("--unlock")
    assert unlocked.returncode == 0, unlocked.stderr[-3000:]

    rerun = snakemake("--cores", "1")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    again = _outputs(rerun.stdout + rerun.stderr)
    assert again.isdisjoint(finished) and again | finished == planned

    # no partial result: every file is a planned output, complete; no temp file is left
    left = {p.relative_to(tmp_path).as_posix() for d in ("results", "figures")
            for p in (tmp_path / d).rglob("*") if p.is_file()}
    assert left == planned
    for path in left:
        full = tmp_path / path
        if full.suffix == ".json":
            json.loads(full.read_text())
        elif full.suffix == ".parquet":
            pd.read_parquet(full)
        else:
            assert full.stat().st_size > 0, path
    assert "Nothing to be done" in (lambda d: d.stdout + d.stderr)(snakemake("-n", "--cores", "1"))

    # the other metadata commands need no --cores either
    cleaned = snakemake("--cleanup-metadata", "results/summary.csv")
    assert cleaned.returncode == 0, cleaned.stderr[-3000:]
