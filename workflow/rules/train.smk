# The learned policies: train online, freeze, evaluate on held-out workloads and seeds. One
# rule for every training job: an experiment's learners per device (results/<hw>/sim/rl/...)
# and the transfer table a real engine deploys (results/<hw>/sim/rl-transfer/..., trained on
# the simulator with that engine's limits; the real engine's runs are its evaluation).
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml


rule train_learner:
    output:
        policy="results/{hardware}/sim/{training}/{learner}/policy.json",
        report="results/{hardware}/sim/{training}/{learner}/report.json",
    params:
        feather=FEATHER,
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
rule train_learner_engine:
    output:
        policies=expand("results/{{hardware}}/{{engine}}/{{experiment}}/{learner}/{{regime}}/policy.json",
                        learner=ENGINE_TRAIN_LEARNERS),
        reports=expand("results/{{hardware}}/{{engine}}/{{experiment}}/{learner}/{{regime}}/report.json",
                       learner=ENGINE_TRAIN_LEARNERS),
    params:
        feather=FEATHER,
        code=RUN_CODE,
        spec=lambda wc: json.dumps(
            ENGINE_TRAIN_SPECS[f"results/{wc.hardware}/{wc.engine}/{wc.experiment}"][wc.regime],
            sort_keys=True,
        ),
        out=lambda wc: f"results/{wc.hardware}/{wc.engine}/{wc.experiment}",
        job_status=JOB_STATUS,
        job=lambda wc: f"train_learner_engine_{wc.regime}",
        claim=lambda wc: EXPERIMENTS[wc.experiment].claim,
        neighbours=neighbour_cores,
    log:
        "logs/{experiment}/{hardware}/{engine}-{regime}.log",
    wildcard_constraints:
        hardware="[^/]+",
        engine="vllm",
        experiment="[^/]+",
        regime="|".join(ENGINE_TRAIN_REGIMES) or "no-regimes",
    threads: measuring_cores  # one engine thread (the regimes' `threads: 1`)
    priority: 1  # the measuring jobs run one after another: start the chain early
    resources:
        runtime=job_runtime("train_learner_engine"),
        mem_mb=6000,
        **MEASURES_TIME,
    shell:
        "(FEATHER_NEIGHBOUR_CORES={params.neighbours} "
        "{params.feather} train-engine --spec {params.spec:q} --out {params.out:q} --quiet) "
        "> {log:q} 2>&1 || {params.job_status} --job {params.job} --claim {params.claim:q} "
        "--log {log:q} --exit-code $? {output:q}"
