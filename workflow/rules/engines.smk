# Real-engine jobs (experiments' `engine_runs`): one job per engine start, all schedulers and
# repeats inside it. It takes every core so no other job disturbs the times it measures.

for _batch in ENGINE_BATCHES:

    rule:
        name:
            f"engine_{_batch.name}"
        input:
            _batch.workload_spec,
            _batch.inputs(),
        output:
            [f"{d}/summary.json" for d in _batch.run_dirs()],
        params:
            feather=FEATHER,
            code=RUN_CODE,
            args=shlex.join(_batch.cli_args()),
            out=lambda wc, output: str(Path(output[0]).parent.parent),
        log:
            f"logs/{_batch.engine}/{_batch.experiment}/{_batch.workload}.log",
        threads: workflow.cores
        conda:
            "../envs/feather.yaml"
        shell:
            "{params.feather} run {params.args} --out {params.out:q} --quiet > {log:q} 2>&1"
