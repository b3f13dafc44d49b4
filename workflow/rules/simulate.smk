# One simulated run: results/{hardware}/sim/{experiment}/{run}/ (trace, requests, the run's
# spec, summary).
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml


rule simulate:
    input:
        workload=lambda wc: [] if sim_spec(wc)["simulation"]["workload"].startswith("synthetic:")
        else [sim_spec(wc)["simulation"]["workload"]],
    output:
        trace="results/{hardware}/sim/{experiment}/{run}/trace.parquet",
        requests="results/{hardware}/sim/{experiment}/{run}/requests.parquet",
        spec="results/{hardware}/sim/{experiment}/{run}/spec.json",
        summary="results/{hardware}/sim/{experiment}/{run}/summary.json",
    params:
        feather=FEATHER_NICE,
        code=RUN_CODE,
        # the run's whole specification, built once at parse time (common.smk SIM_SPECS); the
        # job keeps it as spec.json beside its summary
        spec=lambda wc: json.dumps(sim_spec(wc), sort_keys=True),
        out=lambda wc, output: str(Path(output.summary).parent),
    log:
        "logs/sim/{hardware}/{experiment}/{run}.log",
    wildcard_constraints:
        hardware="[^/]+",
        experiment="[^/]+",
        run="[^/]+",
    resources:
        runtime=job_runtime("simulate"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} simulate --spec {params.spec:q} --out {params.out:q} --quiet > {log:q} 2>&1"
