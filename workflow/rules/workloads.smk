# Workload files the experiments name (synthetic specs need no rule: they are built in place).
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml


rule leval_workload:
    output:
        "data/workloads/leval__{options}__{model}.parquet",
    params:
        feather=FEATHER_NICE,
        code=WORKLOAD_CODE,
        source=lambda wc: (["--data-dir", LEVAL_DIR] if LEVAL_DIR else []),
        lo=lambda wc: slug_options(wc.options).get("min", "0"),
        hi=lambda wc: slug_options(wc.options).get("max", "1000000000"),
        shape=lambda wc: shlex.join(builder_flags(slug_options(wc.options))),
    log:
        "logs/workloads/leval__{options}__{model}.log",
    wildcard_constraints:
        options="[^_/]+",
        model="[^/]+",
    resources:
        runtime=job_runtime("leval_workload"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} workload build --source leval {params.source:q} --model {wildcards.model} "
        "--min-prefix-tokens {params.lo} --max-prefix-tokens {params.hi} {params.shape} "
        "--raw-dir data/raw --out {output:q} > {log:q} 2>&1"


rule longbench_format_archive:
    output:
        "data/raw/longbench-format/prefix={prefix}/data.zip",
    params:
        words=lambda wc: int(int(wc.prefix) * 0.9),
    log:
        "logs/workloads/longbench-format__prefix={prefix}.log",
    wildcard_constraints:
        prefix="[0-9]+",
    resources:
        runtime=job_runtime("longbench_format_archive"),
    run:
        from feather.workloads.longbench_synthetic import prefix_groups

        with logged_to(log[0]):
            prefix_groups(Path(output[0]).parent, prefix_words=params.words)


rule longbench_format_workload:
    input:
        lambda wc: f"data/raw/longbench-format/prefix={slug_options(wc.options)['prefix']}/data.zip",
    output:
        "data/workloads/longbench-format__{options}__{model}.parquet",
    params:
        feather=FEATHER_NICE,
        code=WORKLOAD_CODE,
        folder=lambda wc, input: str(Path(input[0]).parent),
        shape=lambda wc: shlex.join(builder_flags(slug_options(wc.options), "longbench-format")),
    log:
        "logs/workloads/longbench-format__{options}__{model}.log",
    wildcard_constraints:
        options="[^_/]+",
        model="[^/]+",
    resources:
        runtime=job_runtime("longbench_format_workload"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} workload build --source longbench --tasks qasper,qmsum "
        "--data-dir {params.folder:q} --raw-dir {params.folder:q}/raw-{wildcards.options} "
        "--model {wildcards.model} --min-prefix-tokens 0 --max-prefix-tokens 1000000000 "
        "{params.shape} --out {output:q} > {log:q} 2>&1"


rule load_workload:
    """Poisson arrivals at a fraction of FCFS's offline capacity on this hardware and model."""
    input:
        base=lambda wc: LOAD_WORKLOADS[f"data/workloads/load/{wc.hardware}/{wc.stem}__load={wc.factor}.parquet"][0],
        capacity=lambda wc: LOAD_WORKLOADS[f"data/workloads/load/{wc.hardware}/{wc.stem}__load={wc.factor}.parquet"][1],
    output:
        "data/workloads/load/{hardware}/{stem}__load={factor}.parquet",
    params:
        feather=FEATHER_NICE,
        code=WORKLOAD_CODE,
        # a load= workload's arrival seed: its base's order seed (0 when it has none)
        seed=lambda wc: slug_options(wc.stem.partition("__")[2].partition("__")[0]).get("seed", "0"),
    log:
        "logs/workloads/load/{hardware}/{stem}__load={factor}.log",
    wildcard_constraints:
        hardware="[^/]+",
        stem="[^/]+",
        factor="[0-9.]+",
    resources:
        runtime=job_runtime("load_workload"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} workload retime {input.base:q} --load {wildcards.factor} "
        "--capacity {input.capacity:q} --seed {params.seed} --out {output:q} > {log:q} 2>&1"
