# The figures (feather/claims declares and draws them; figures/README.md indexes them), the
# table of our numbers and the figure index.


rule figure:
    input:
        table="results/summary.parquet",
    output:
        report("figures/{name}.png", caption="../report/figure.rst", category="Figures",
               labels=report_labels()),
    log:
        "logs/figures/{name}.log",
    wildcard_constraints:
        name="|".join(n for n in figure_names() if n not in report_figures()) or "no-figures",
    run:
        from feather.claims import draw

        with logged_to(log[0]):
            draw(wildcards.name, input.table, output[0], figure_meta(wildcards.name))


rule report_figure:
    """The learners' figures, drawn from their training reports (simulator and real engine)."""
    input:
        reports=rl_reports(),
    output:
        report("figures/{name}.png", caption="../report/figure.rst", category="Figures",
               labels=report_labels()),
    log:
        "logs/figures/{name}.log",
    wildcard_constraints:
        name="|".join(report_figures()) or "no-figures",
    run:
        from feather.claims import draw

        with logged_to(log[0]):
            draw(wildcards.name, None, output[0], figure_meta(wildcards.name), input.reports)


rule our_numbers:
    input:
        table="results/summary.parquet",
        reports=rl_reports(),
        sections=OVERHEAD_TARGETS[:1],  # the overhead report, where the experiment is on
        fidelity=FIDELITY_TARGETS[:1],  # results/fidelity/fidelity.csv, where it runs
    output:
        "figures/ours.md",
    params:
        sections=lambda wc, input: list(input.sections),
        fidelity_path=lambda wc, input: input.fidelity[0] if input.fidelity else None,
    log:
        "logs/figures/ours.log",
    run:
        from feather.pipeline.our_numbers import write_ours

        with logged_to(log[0]):  # params are write_ours' keyword arguments
            write_ours(input.table, input.reports, output[0], EXPERIMENTS, **params)


rule figure_index:
    """figures/README.md: every figure's claim, the paper's number and its command, from
    feather/claims' registry (redrawn when a claim module changes)."""
    input:
        sorted(str(p) for p in (REPO / "feather" / "claims").glob("*.py")),
    output:
        "figures/README.md",
    log:
        "logs/figures/index.log",
    run:
        from feather.pipeline.figure_index import write_index

        with logged_to(log[0]):
            write_index(output[0])


# The outputs of the jobs that may fail for their machine and leave a record instead
# (feather/pipeline/job_status.py): engine runs, the kernel benches, online serving.
GUARDED_OUTPUTS = (
    [f"{d}/summary.json" for batch in ENGINE_BATCHES for d in batch.run_dirs()]
    + ([] if KERNEL_SWEEP == "off" else [f"results/{m}/kernels/kernels.json"
                                         for m in KERNEL_MACHINES])
    + [f"{job.out_dir}/online.json" for job in ONLINE_JOBS]
    + engine_rl_reports()
    + engine_heldout_summaries()
)
# the last run's failure records (it stopped before jobs_check): removed, so this run retries
from feather.pipeline.job_status import retry_failed
retry_failed(GUARDED_OUTPUTS, main=workflow.is_main_process)


rule verdicts:
    """Claim by claim: the paper's number, ours, a verdict by the rules on the page."""
    input:
        table="results/summary.parquet",
        overhead=OVERHEAD_TARGETS[:1],  # the overhead report (and its tables), where on
        kernels=(KERNEL_RESULTS + CPU_ATTN_RESULTS) if KERNEL_SWEEP != "off" else [],
        fidelity=FIDELITY_TARGETS[:1],  # results/fidelity/fidelity.csv, where it runs
        online=[f"{job.out_dir}/online.json" for job in ONLINE_JOBS],
        reports=rl_reports(),
    output:
        page="figures/verdicts.md",
        data="results/verdicts.json",  # the rows as data: feather verdicts diff
    params:
        overhead_dir=lambda wc, input: str(Path(input.overhead[0]).parent) if input.overhead else None,
        kernel_files=lambda wc, input: list(input.kernels),
        fidelity_path=lambda wc, input: input.fidelity[0] if input.fidelity else None,
        online_files=lambda wc, input: list(input.online),
        rl_reports=lambda wc, input: list(input.reports),
        not_planned=NOT_PLANNED,
        guarded=GUARDED_OUTPUTS,  # where a failed job leaves its record
    log:
        "logs/figures/verdicts.log",
    run:
        from feather.pipeline.verdicts import write_verdicts

        with logged_to(log[0]):  # params are write_verdicts' keyword arguments
            write_verdicts(input.table, output.page, json_out=output.data, **params)


rule jobs_check:
    """Last: the run fails if any job failed for its machine (its verdict page is written
    first). It removes the failed jobs' records, so the next run retries those jobs."""
    input:
        "figures/verdicts.md",
        report_pages(),
        GUARDED_OUTPUTS,
    output:
        "results/jobs_check.json",
    log:
        "logs/jobs_check.log",
    run:
        from feather.pipeline.job_status import check_jobs

        with logged_to(log[0]):
            check_jobs(GUARDED_OUTPUTS, output[0])


# Pages of Snakemake's HTML report: our numbers, and the verdicts where there are any.
rule report_page:
    input:
        lambda wc: report_page_source(wc.page),
    output:
        report("results/report/{page}.html", caption="../report/page.rst", category="Numbers"),
    log:
        "logs/report/{page}.log",
    wildcard_constraints:
        page="ours|verdicts",
    run:
        from feather.pipeline.report import markdown_page

        with logged_to(log[0]):
            markdown_page(input[0], output[0])
