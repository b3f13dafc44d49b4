# The learned policies: train online, freeze, evaluate on held-out workloads and seeds. One
# rule for every training job: an experiment's learners per device (results/<hw>/sim/rl/...)
# and the transfer table a real engine deploys (results/<hw>/sim/rl-transfer/..., trained on
# the simulator with that engine's limits; the real engine's runs are its evaluation).
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
from feather.engines.vllm.learning import EngineTraining


rule train_learner:
    output:
        policy="results/{hardware}/sim/{training}/{learner}/policy.json",
        report="results/{hardware}/sim/{training}/{learner}/report.json",
    params:
        feather=FEATHER_NICE,
        code=RUN_CODE,
        # the job's whole specification, built once at parse time (common.smk TRAIN_SPECS)
        spec=lambda wc, output: json.dumps(
            TRAIN_SPECS[str(Path(output.policy).parent)], sort_keys=True
        ),
    log:
        "logs/{training}/{hardware}/{learner}.log",
    benchmark:
        "logs/benchmarks/{training}/{hardware}/{learner}.tsv",
    wildcard_constraints:
        hardware="[^/]+",
        training="[^/]+",
        learner="feather-ucb|feather-qlearn",
    resources:
        runtime=job_runtime("train_learner"),
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} train --spec {params.spec:q} --out {output.policy:q} --quiet "
        "> {output.report:q}.tmp 2> {log:q} && mv {output.report:q}.tmp {output.report:q}"


# The learners trained inside a real engine (experiments/rl.yaml `engine_training`;
# feather/engines/vllm/learning.py): one job and one engine start per regime, each learner's
# table and report under results/<hw>/<engine>/<experiment>/<learner>/<regime>/. Like an
# engine job it takes every core (its measured steps are the reward), and a failure leaves a
# record in each output it did not write (feather/pipeline/job_status.py).
for _root, _regimes in ENGINE_TRAIN_SPECS.items():
    for _regime, _spec in _regimes.items():
        _job = EngineTraining.from_json(_spec)

        rule:
            name:
                f"train_learner_engine_{_regime}"
            input:
                # the built workloads it reads (L-Eval documents; synthetic ones are built in
                # the job)
                _job.workload_files(),
            output:
                policies=[str(_job.policy_path(_root, learner)) for learner in _job.learners],
                reports=[str(_job.report_path(_root, learner)) for learner in _job.learners],
                # every held-out run, a run directory of the summary table (as an engine job's)
                heldout=[f"{d}/summary.json" for d in _job.heldout_dirs(_root)],
            params:
                feather=FEATHER,
                code=RUN_CODE,
                # a function: the spec's `{seed}` templates are not wildcards
                spec=lambda wc, spec=json.dumps(_spec, sort_keys=True): spec,
                # <out>/<learner>/<regime>/report.json
                out=lambda wc, output: str(Path(output.reports[0]).parents[2]),
                job_status=JOB_STATUS,
                job=f"train_learner_engine_{_regime}",
                claim=EXPERIMENTS[Path(_root).name].claim,
            log:
                f"logs/{Path(_root).name}/{Path(_root).parts[1]}/{Path(_root).parts[2]}-{_regime}.log",
            threads: measuring_cores  # one engine thread (the regimes' `threads: 1`)
            priority: 1  # the measuring jobs run one after another: start the chain early
            resources:
                runtime=job_runtime(f"train_learner_engine_{_regime}"),
                mem_mb=6000,
                **MEASURES_TIME,
            shell:
                "({params.feather} train-engine --spec {params.spec:q} --out {params.out:q} --quiet) "
                "> {log:q} 2>&1 || {params.job_status} --job {params.job} --claim {params.claim:q} "
                "--log {log:q} --exit-code $? {output:q}"
