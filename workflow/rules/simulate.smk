# One simulated run: results/{hardware}/sim/{experiment}/{run}/ (trace, requests, summary).


rule simulate:
    input:
        workload=lambda wc: [] if run_of(wc).workload_spec.startswith("synthetic:")
        else [run_of(wc).workload_spec],
    output:
        trace="results/{hardware}/sim/{experiment}/{run}/trace.parquet",
        requests="results/{hardware}/sim/{experiment}/{run}/requests.parquet",
        summary="results/{hardware}/sim/{experiment}/{run}/summary.json",
    params:
        feather=FEATHER,
        code=RUN_CODE,
        args=lambda wc: shlex.join(run_of(wc).cli_args() + profile_args()),
        out=lambda wc, output: str(Path(output.summary).parent),
    log:
        "logs/sim/{hardware}/{experiment}/{run}.log",
    wildcard_constraints:
        hardware="[^/]+",
        experiment="[^/]+",
        run="[^/]+",
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} simulate {params.args} --out {params.out:q} --quiet > {log:q} 2>&1"
