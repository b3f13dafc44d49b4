# Workload files the experiments name (synthetic specs need no rule: they are built in place).


rule leval_workload:
    output:
        "data/workloads/leval__{options}__{model}.parquet",
    params:
        feather=FEATHER,
        code=WORKLOAD_CODE,
        source=lambda wc: (["--data-dir", LEVAL_DIR] if LEVAL_DIR else []),
        lo=lambda wc: slug_options(wc.options).get("min", "0"),
        hi=lambda wc: slug_options(wc.options).get("max", "1000000000"),
        shape=lambda wc: leval_shape_args(slug_options(wc.options)),
    log:
        "logs/workloads/leval__{options}__{model}.log",
    wildcard_constraints:
        options="[^_/]+",
        model="[^/]+",
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} workload build --source leval {params.source:q} --model {wildcards.model} "
        "--min-prefix-tokens {params.lo} --max-prefix-tokens {params.hi} {params.shape} "
        "--raw-dir data/raw --out {output:q} > {log:q} 2>&1"


rule longbench_format_archive:
    output:
        "data/raw/longbench-format/{options}/data.zip",
    params:
        words=lambda wc: int(int(slug_options(wc.options)["prefix"]) * 0.9),
    log:
        "logs/workloads/longbench-format__{options}.log",
    wildcard_constraints:
        options="[^_/]+",
    run:
        from feather.workloads.longbench_synthetic import prefix_groups

        with logged_to(log[0]):
            prefix_groups(Path(output[0]).parent, prefix_words=params.words)


rule longbench_format_workload:
    input:
        "data/raw/longbench-format/{options}/data.zip",
    output:
        "data/workloads/longbench-format__{options}__{model}.parquet",
    params:
        feather=FEATHER,
        code=WORKLOAD_CODE,
        folder=lambda wc, input: str(Path(input[0]).parent),
    log:
        "logs/workloads/longbench-format__{options}__{model}.log",
    wildcard_constraints:
        options="[^_/]+",
        model="[^/]+",
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} workload build --source longbench --tasks qasper,qmsum "
        "--data-dir {params.folder:q} --raw-dir {params.folder:q}/raw --model {wildcards.model} "
        "--min-prefix-tokens 0 --max-prefix-tokens 1000000000 --out {output:q} > {log:q} 2>&1"
