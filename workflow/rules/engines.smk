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
            job_status=JOB_STATUS,
            job=f"engine_{_batch.name}",
            claim=EXPERIMENTS[_batch.experiment].claim,
        log:
            f"logs/{_batch.engine}/{_batch.experiment}/{_batch.tag}.log",
        threads: all_cores
        resources:
            # the entry's `resources:`, else the CPU or GPU default (experiments.py
            # ENGINE_JOB_RESOURCES, which says where each number comes from)
            mem_mb=_batch.mem_mb,
            runtime=_batch.runtime,
            **gpu_resources(_batch.gpus),
        conda:
            "../envs/feather.yaml"
        shell:
            "{params.feather} run --spec {params.spec:q} --out {params.out:q} --quiet > {log:q} 2>&1 "
            "|| {params.job_status} --job {params.job} --claim {params.claim:q} --log {log:q} "
            "--exit-code $? {output:q}"
