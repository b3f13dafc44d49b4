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
