# Every run's summary in one table (results/summary.parquet and .csv), provenance included.
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml


rule aggregate:
    input:
        summaries=summary_paths() + config.get("extra_runs", []),
    output:
        parquet="results/summary.parquet",
        csv=report("results/summary.csv", caption="../report/summary.rst", category="Tables"),
    log:
        "logs/aggregate.log",
    resources:
        runtime=job_runtime("aggregate"),
    run:
        from feather.pipeline.aggregate import aggregate

        with logged_to(log[0]):
            aggregate(list(input.summaries), output.parquet, output.csv)


rule never_worse_cases:
    """The pipeline-scale cases of `feather bench never-worse` (frozen learners included): they
    need only the trained tables, so they run beside the simulations, not after every run."""
    input:
        policies=list(never_worse_policies().values()),
    output:
        "results/never_worse_cases.json",
    params:
        feather=FEATHER_NICE,
        code=RUN_CODE,
        args=lambda wc: shlex.join(
            [a for learner, path in never_worse_policies().items()
             for a in ("--policy", f"{learner}={path}")]
            + ["--cases", "large" if config.get("never_worse", "large") == "large" else "none"]
        ),
    log:
        "logs/never_worse_cases.log",
    benchmark:
        "logs/benchmarks/never_worse_cases.tsv",
    resources:
        runtime=job_runtime("never_worse_cases"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} bench never-worse {params.args} --out {output:q} --quiet > {log:q} 2>&1"


rule never_worse:
    """Every Feather policy against FCFS: the cases above and every setting of the summary table
    that ran both (feather/bench/never_worse.py)."""
    input:
        cases="results/never_worse_cases.json",
        table="results/summary.parquet",
    output:
        "results/never_worse.json",
    params:
        feather=FEATHER_NICE,
        code=RUN_CODE,
    log:
        "logs/never_worse.log",
    resources:
        runtime=job_runtime("never_worse"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} bench never-worse --cases none --cases-from {input.cases:q} "
        "--summary {input.table:q} --out {output:q} --quiet > {log:q} 2>&1"
