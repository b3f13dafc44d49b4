# The learned policies: train online, freeze, evaluate on held-out workloads and seeds.


rule train_learner:
    output:
        policy="results/{hardware}/sim/rl/{learner}/policy.json",
        report="results/{hardware}/sim/rl/{learner}/report.json",
    params:
        feather=FEATHER,
        code=RUN_CODE,
        args=lambda wc: shlex.join(
            [arg for w in training()["train_workloads"] for arg in ("--train-workload", w)]
            + ["--train-seeds", ",".join(map(str, training()["train_seeds"]))]
            + [arg for w in training()["eval_workloads"] for arg in ("--eval-workload", w)]
            + ["--eval-seeds", ",".join(map(str, training()["eval_seeds"]))]
            + ["--model", config["models"][0]]
        ),
    log:
        "logs/rl/{hardware}/{learner}.log",
    benchmark:
        "logs/benchmarks/rl/{hardware}/{learner}.tsv",
    wildcard_constraints:
        hardware="[^/]+",
        learner="feather-ucb|feather-qlearn",
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} train --learner {wildcards.learner} --hardware {wildcards.hardware} "
        "{params.args} --out {output.policy:q} --quiet > {output.report:q}.tmp 2> {log:q} "
        "&& mv {output.report:q}.tmp {output.report:q}"
