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
            + ["--kernel", training().get("kernel", "paged")]
            + ["--engine-mode", training().get("engine_mode", "vllm")]
            + [a for k, v in learner_params(training(), wc.learner).items()
               for a in ("--param", f"{k}={json.dumps(v)}")]
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


rule train_transfer:
    """The table a real engine deploys: trained on the simulator with that engine's limits
    (training.transfer in experiments/rl.yaml), no held-out evaluation here - the real engine's
    runs are the evaluation."""
    output:
        policy="results/{hardware}/sim/rl-transfer/{learner}/policy.json",
        report="results/{hardware}/sim/rl-transfer/{learner}/report.json",
    params:
        feather=FEATHER,
        code=RUN_CODE,
        args=lambda wc: shlex.join(
            [arg for w in transfer()["train_workloads"] for arg in ("--train-workload", w)]
            + ["--train-seeds", ",".join(map(str, transfer()["train_seeds"]))]
            + ["--model", transfer()["model"], "--kernel", transfer()["kernel"]]
            + [a for k, v in transfer()["engine"].items()
               for a in (f"--{k.replace('_', '-')}", str(v))]
            + [a for k, v in transfer()["params"].items()
               for a in ("--param", f"{k}={json.dumps(v)}")]
        ),
    log:
        "logs/rl-transfer/{hardware}/{learner}.log",
    benchmark:
        "logs/benchmarks/rl-transfer/{hardware}/{learner}.tsv",
    wildcard_constraints:
        hardware="[^/]+",
        learner="feather-ucb|feather-qlearn",
    conda:
        "../envs/feather.yaml"
    shell:
        "{params.feather} train --learner {wildcards.learner} --hardware {wildcards.hardware} "
        "{params.args} --out {output.policy:q} --quiet > {output.report:q}.tmp 2> {log:q} "
        "&& mv {output.report:q}.tmp {output.report:q}"
