"""Each job's time is stated once, in workflow/job_times.yaml, and the rules' `runtime=`
resources are read from it.

The workflow is planned (`snakemake -n`, nothing runs) for the default config, for every
family's full sweep, and for a GPU box (a declared GPU, CUDA vLLM faked in metadata); every
planned job's run-time limit must be the table's for its rule and sweep. The rule files are
also read as text: a `runtime=` anywhere that does not call the table fails, planned or not.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_cuda import fake_cuda_install

from feather.pipeline import job_times
from feather.pipeline.job_times import JobTimesError, limit_minutes, measure, measure_jobs, runtime

REPO = Path(__file__).resolve().parents[1]
RULE_FILES = [*sorted((REPO / "workflow" / "rules").glob("*.smk")), REPO / "Snakefile"]
# rules that declare no run time (they take the cluster profile's default): figures.smk's
# figures and pages, and the target rule
NO_RUNTIME = {"figure", "report_figure", "our_numbers", "figure_index", "verdicts", "jobs_check",
              "report_page", "all"}
FULL = {
    "engine_runs": {"sweep": "full"},
    "fidelity": {"sweep": "full"},
    "online": {"sweep": "full", "cpu": True},
    "overhead": {"sweep": "full", "envs_dir": ".envs"},
    "c5": {"sweep": "full"},
    "kernel_bench": "full",
}
H100 = "NVIDIA H100 80GB HBM3"


def plan(workdir: Path, *args: str, configs: tuple[Path, ...] = (),
         pythonpath: str | None = None) -> dict[str, list[dict]]:
    """rule -> its planned jobs' resources, from `snakemake -n -p`'s printout; `configs` are
    laid over config.yaml."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
         str(workdir), "--configfile", str(REPO / "config.yaml"), *map(str, configs), "-n", "-p",
         "--cores", "16",
         *args],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    planned: dict[str, list[dict]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \S+:\n)", done.stdout):
        head = re.match(r"(?:local)?rule (\S+):\n", block)
        if not head:
            continue
        found = re.search(r"^    resources: (.*)$", block, re.M)
        fields = dict(p.split("=", 1) for p in found.group(1).split(", ")) if found else {}
        outputs = re.search(r"^    output: (.*)$", block, re.M)
        fields["runs"] = str(sum(o.endswith("/summary.json")
                                 for o in outputs.group(1).split(", "))) if outputs else "0"
        planned.setdefault(head.group(1), []).append(fields)
    return planned


def expected(rule: str, sweeps: dict, gpu: bool = False) -> int | None:
    """The limit the table gives a planned job of this rule, under these sweeps."""
    if rule in NO_RUNTIME:
        return None
    if rule in ("overhead_bench",):
        return runtime(rule, sweeps.get("overhead", {}).get("sweep", "default"))
    if rule in ("kernels_bench", "cpu_attn_bench"):
        return runtime(rule, sweeps.get("kernel_bench", "default"))
    if rule == "kernels_bench_gpu":
        return runtime(rule, "quick" if sweeps.get("kernel_bench") == "quick" else "full")
    if rule.startswith("simulate_"):
        return None  # per job: its runs times the table's minutes per run (check_plan)
    if rule.startswith("online_") and rule != "online_figure":
        sweep = sweeps.get("online", {}).get("sweep", "default")
        return runtime(rule, ("gpu-" if gpu else "") + sweep)
    return runtime(rule)


def check_plan(planned: dict[str, list[dict]], sweeps: dict, gpu: bool = False) -> int:
    checked = 0
    for rule, jobs in planned.items():
        if gpu and rule.startswith("engine_") and rule != "engine_env":
            continue  # a GPU engine job: its experiment entry's estimate (tests/test_gpu_plan.py)
        want = expected(rule, sweeps, gpu)
        for job in jobs:
            if rule.startswith("simulate_"):  # one job, several runs: minutes per run x runs
                assert int(job["runs"]) >= 1, rule
                want = runtime("simulate", runs=int(job["runs"]))
            got = job.get("runtime")
            assert (int(got) if got else None) == want, (
                f"rule {rule}: runtime {got}, workflow/job_times.yaml gives {want}")
            checked += 1
    return checked


def test_the_default_plans_every_rule_s_runtime_from_the_table(tmp_path) -> None:
    planned = plan(tmp_path / "work")
    assert {"simulate_c5_a100_80gb_fcfs", "overhead_bench", "kernels_bench",
            "engine_vllm_c1_c1_cpu"} <= set(planned)
    assert check_plan(planned, {}) > 100


def test_every_full_sweep_plans_its_runtime_from_the_table(tmp_path) -> None:
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(FULL))
    planned = plan(tmp_path / "work", configs=(tmp_path / "full.yaml",))
    # the full sweeps' own jobs are there, and take their sweep's entry
    assert {"engine_vllm_stop_cascade_16k_cascade", "online_prefix_repetition",
            "longbench_format_workload"} <= set(planned)
    assert planned["overhead_bench"][0]["runtime"] == str(runtime("overhead_bench", "full"))
    assert runtime("overhead_bench", "full") > runtime("overhead_bench", "default")
    assert check_plan(planned, FULL) > 250


def test_a_gpu_box_plans_its_gpu_jobs_runtime_from_the_table(tmp_path) -> None:
    fake = fake_cuda_install(tmp_path / "fake-cuda")
    planned = plan(tmp_path / "work", "--config", f'gpus=["{H100}"]', pythonpath=str(fake))
    assert {"kernels_bench_gpu", "engine_env", "online_leval_online"} <= set(planned)
    assert check_plan(planned, {}, gpu=True) > 100


def test_no_rule_file_states_a_runtime_of_its_own() -> None:
    """Every `runtime=` in the workflow calls the table; the one exception is a GPU engine
    job's estimate, declared in its experiment entry (`_batch.runtime`, CPU jobs excluded)."""
    for path in RULE_FILES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bruntime\s*=", line) and not line.lstrip().startswith("#"):
                assert "job_runtime(" in line, f"{path.name}:{number}: {line.strip()}"
                if "_batch.runtime" in line:
                    assert "if _batch.gpus else job_runtime(" in line, line


def test_the_limit_is_the_factor_of_the_expected_minutes_with_a_floor() -> None:
    table = job_times.load()
    factor, floor = table["limit"]["factor"], table["limit"]["floor"]
    assert limit_minutes(0.1) == floor
    assert limit_minutes(36) == max(floor, math.ceil(factor * 36))
    measured = job_times.entry("engine_vllm_stop_cascade_16k_cascade")
    assert runtime("engine_vllm_stop_cascade_16k_cascade") == limit_minutes(measured["minutes"])
    # an entry's own limit (a download, or a time not measured) wins, and says why
    assert job_times.entry("engine_env")["why"] and runtime("engine_env") == 60


def test_every_entry_says_how_it_was_measured_or_why_not() -> None:
    table = job_times.load()
    for job, value in table["jobs"].items():
        for variant, found in job_times._variants(job, value).items():
            if found.get("minutes") is not None:
                assert found.get("how") and found.get("command"), f"{job}/{variant}"
            else:
                assert found.get("why") and found.get("limit"), f"{job}/{variant}"
    for name, found in table["runs"].items():
        assert found["minutes"] > 0 and found["how"] and found["command"], name


def test_a_cpu_engine_job_without_an_entry_takes_the_fallback() -> None:
    assert runtime("engine_vllm_someexp_new_cpu") == runtime("engine_cpu")
    with pytest.raises(JobTimesError, match="no entry for job 'nonesuch'"):
        runtime("nonesuch")
    with pytest.raises(JobTimesError, match="no variant 'huge'"):
        runtime("overhead_bench", "huge")


def test_a_malformed_table_is_refused(tmp_path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text(yaml.safe_dump({"limit": {"factor": 3, "floor": 10},
                                   "jobs": {"x": {"minutes": 2}}}))
    with pytest.raises(JobTimesError, match="needs the command"):
        job_times.load(bad)
    bad.write_text(yaml.safe_dump({"limit": {"factor": 3, "floor": 10},
                                   "jobs": {"x": {"limit": 5}}}))
    with pytest.raises(JobTimesError, match="needs `why`"):
        job_times.load(bad)


LOG = """\
Provided cores: 2
[Sun Dec  6 13:13:55 2026]
localrule simulate_c5_a_fcfs:
    output: results/a/sim/c5/r1/trace.parquet, results/a/sim/c5/r1/summary.json
    log: logs/sim/simulate_c5_a_fcfs.log
    jobid: 20
    resources: tmpdir=/tmp

[Sun Dec  6 13:13:56 2026]
rule overhead_bench:
    output: results/cpu/overhead/bench.parquet
    jobid: 7
    threads: 1
    resources: tmpdir=/tmp, measures_time=1, runtime=10

[Sun Dec  6 13:14:35 2026]
Finished jobid: 20 (Rule: simulate_c5_a_fcfs)
1 of 3 steps (33%) done
[Sun Dec  6 13:15:07 2026]
Finished jobid: 7 (Rule: overhead_bench)
"""


def test_measure_reads_each_job_s_time_from_snakemake_s_log() -> None:
    times = measure(LOG)
    assert times == {"simulate[c5]": [40.0], "overhead_bench": [71.0]}
    table = job_times.measure_table(times)
    assert "| overhead_bench | 1 | 1.2 | 71 | 71 |" in table
    assert table.splitlines()[-1].startswith("| every job | 2 |")


def test_the_shortest_run_is_bound_by_the_measuring_chain_or_by_the_other_jobs() -> None:
    jobs = measure_jobs(LOG)
    assert [(j.key, j.threads, j.measures_time) for j in jobs] == [
        ("simulate[c5]", 1, False), ("overhead_bench", 1, True)]
    assert job_times.provided_cores(LOG) == 2
    chain_binds = [job_times.JobTime("engine", 600, 1, True),
                   job_times.JobTime("online", 120, 2, True),
                   job_times.JobTime("simulate", 300, 1, False)]
    bound = job_times.shortest_run(chain_binds, cores=2)
    assert bound["bound_min"] == 12.0 and bound["binds"] == "the measuring jobs"
    # three times the simulations: 10 of their 15 job-minutes fit beside the engine, 5 spread
    # over both cores
    others_bind = [*chain_binds, *[job_times.JobTime("simulate", 300, 1, False)] * 2]
    bound = job_times.shortest_run(others_bind, cores=2)
    assert bound["bound_min"] == 14.5 and "other jobs" in bound["binds"]
    assert "at least 14.5 min" in job_times.shortest_run_text(bound)


def test_a_simulation_job_s_limit_is_its_runs_times_the_minutes_per_run() -> None:
    minutes = job_times.entry("simulate")["minutes"]
    assert runtime("simulate", runs=1) == limit_minutes(minutes)
    assert runtime("simulate", runs=40) == limit_minutes(40 * minutes) > runtime("simulate")
