# Scheduling overhead (C3, C4): experiments/overhead.yaml says what is swept, config.yaml's
# `overhead:` turns it on. SGLang's releases each get their own environment, built here by
# pip (never by hand); one that cannot be built is reported as skipped and the run goes on.
from feather.overhead.envs import lock_file
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
from feather.overhead.sweep import load_spec

# What this stage plans (config.yaml `overhead:`, experiments/overhead.yaml).
OVERHEAD = config.get("overhead")
OVERHEAD_SPEC = EXPERIMENTS_DIR / "overhead.yaml"
OVERHEAD_DIR = "results/cpu/overhead"
OVERHEAD_BASELINES = list(load_spec(OVERHEAD_SPEC)["baselines"]) if OVERHEAD else []
OVERHEAD_TARGETS = (
    [f"{OVERHEAD_DIR}/overhead.md", f"{OVERHEAD_DIR}/sched_cost_drift.md"]
    + [f"figures/{n}.png" for n in OVERHEAD_FIGURES]
    if OVERHEAD
    else []
)
# Real vLLM-on-CPU runs of the vllm experiment (tiny-llama, the C5 shape): their decode steps
# are the measured step (C1's kv-llama runs measure another model).
VLLM_CPU_TRACES = [
    f"{d}/summary.json"
    for b in ENGINE_BATCHES
    if b.engine == "vllm" and b.hardware == "cpu" and b.experiment == "vllm"
    and b.model == "tiny-llama" and b.attention == "vllm"
    for d in b.run_dirs()
]

rule overhead_env:
    output:
        "results/envs/{env}.json",
    params:
        feather=FEATHER_NICE,
        dest=lambda wc: str(Path((OVERHEAD or {}).get("envs_dir", ".envs")) / wc.env),
        lock=lambda wc: hashlib.sha256(lock_file(wc.env).read_bytes()).hexdigest(),
    log:
        "logs/overhead/env_{env}.log",
    resources:
        runtime=job_runtime("overhead_env"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} overhead env --name {wildcards.env} --dest {params.dest:q} "
        "--status-out {output:q} > {log:q} 2>&1"


rule overhead_bench:
    input:
        spec=str(OVERHEAD_SPEC),
        envs=expand("results/envs/{env}.json", env=OVERHEAD_BASELINES),
    output:
        table=f"{OVERHEAD_DIR}/bench.parquet",
        record=f"{OVERHEAD_DIR}/bench.json",
    params:
        feather=FEATHER_HERE,
        code=overhead_code_digest(),
        sweep=(OVERHEAD or {}).get("sweep", "default"),
        envs=lambda wc, input: " ".join(f"--env-status {shlex.quote(p)}" for p in input.envs),
    log:
        "logs/overhead/bench.log",
    threads: cpu_time_cores  # it measures a thread's CPU time, one policy call at a time
    priority: 1  # the measuring jobs run one after another: start the chain early
    resources:
        **MEASURES_TIME,
        # peak RSS measured here: default sweep 1.5 GB, full about 15 GB
        mem_mb=16000 if (OVERHEAD or {}).get("sweep") == "full" else 4000,
        runtime=job_runtime("overhead_bench", (OVERHEAD or {}).get("sweep", "default")),
    shell:
        "{params.feather} overhead run --spec {input.spec:q} --sweep {params.sweep} "
        "{params.envs} --out {output.table:q} > {log:q} 2>&1"


rule overhead_report:
    input:
        table=f"{OVERHEAD_DIR}/bench.parquet",
        vllm=VLLM_CPU_TRACES,
    output:
        f"{OVERHEAD_DIR}/overhead.md",
        [report(f"figures/{n}.png", caption="../report/figure.rst", category="Figures",
                labels=report_labels(n)) for n in OVERHEAD_FIGURES],
    params:
        feather=FEATHER_NICE,
        spec=str(OVERHEAD_SPEC),
        out_dir=lambda wc, output: str(Path(output[0]).parent),
        model=lambda wc: load_spec(OVERHEAD_SPEC).get("model", config["models"][0]),
        hardware=" ".join(f"--hardware {h}" for h in config["hardware"]
                          + config.get("hardware_comparison", [])),
        traces=lambda wc, input: " ".join(
            f"--vllm-trace {shlex.quote(str(Path(p).with_name('trace.parquet')))}"
            for p in input.vllm),
    log:
        "logs/overhead/report.log",
    resources:
        runtime=job_runtime("overhead_report"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} overhead report --spec {params.spec:q} --bench {input.table:q} "
        "--model {params.model} {params.hardware} {params.traces} --out-dir {params.out_dir} "
        "--figures-dir figures > {log:q} 2>&1"


# The simulator's measured scheduling-cost models, refitted from this run's bench, with how far
# they drift from the committed default (feather/sim/data/sched_costs_measured.json), which the
# simulator keeps using: results stay deterministic whatever this machine measured.
rule sched_cost_refit:
    input:
        table=f"{OVERHEAD_DIR}/bench.parquet",
        record=f"{OVERHEAD_DIR}/bench.json",
    output:
        f"{OVERHEAD_DIR}/sched_costs_refit.json",
        f"{OVERHEAD_DIR}/sched_cost_drift.md",
    params:
        feather=FEATHER_NICE,
        out_dir=lambda wc, output: str(Path(output[0]).parent),
    log:
        "logs/overhead/sched_cost_refit.log",
    resources:
        runtime=job_runtime("sched_cost_refit"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} sched-cost refit --bench {input.table:q} --out-dir {params.out_dir:q} "
        "> {log:q} 2>&1"
