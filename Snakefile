# Feather: regenerate the paper's results and figures.  snakemake --cores all
# What runs is config.yaml (validated against workflow/schemas/config.schema.yaml); what
# each figure sweeps is experiments/<name>.yaml; the logic lives in the feather package.
import time

from snakemake.utils import min_version, validate

from feather.pipeline.checks import check_config_schema

min_version("9.0")
WORKFLOW_START = time.time()


configfile: "config.yaml"


check_config_schema(config, f"{workflow.basedir}/workflow/schemas/config.schema.yaml")  # one line
validate(config, "workflow/schemas/config.schema.yaml")  # fills in the schema's defaults


report: "workflow/report/workflow.rst"  # snakemake --report report.html: the figures, captioned


include: "workflow/rules/common.smk"
include: "workflow/rules/workloads.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/engines.smk"
include: "workflow/rules/overhead.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/fidelity.smk"
include: "workflow/rules/online.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"  # last: the verdicts read every stage's targets


# Your own rules (e.g. a patched engine run by an external command): config extra_rules.
for _extra in config.get("extra_rules", []):

    include: _extra



rule all:
    default_target: True
    input:
        all_targets(),


onsuccess:
    report_time_budget(WORKFLOW_START)


# A job crashed: the verdicts page is still written, from what finished, and names the jobs
# that failed (feather/pipeline/failed_run.py); never the previous run's page, unmarked.
onerror:
    from feather.pipeline.failed_run import write_failed_run

    write_failed_run(  # the verdicts rule's inputs (workflow/rules/figures.smk)
        log,
        WORKFLOW_START,
        summaries=summary_paths() + config.get("extra_runs", []),
        guarded=GUARDED_OUTPUTS,
        not_planned=NOT_PLANNED,
        overhead=OVERHEAD_TARGETS[:1],
        kernel_files=(KERNEL_RESULTS + CPU_ATTN_RESULTS) if KERNEL_SWEEP != "off" else [],
        fidelity=FIDELITY_TARGETS[:1],
        online_files=[f"{job.out_dir}/online.json" for job in ONLINE_JOBS],
        rl_reports=rl_reports(),
    )
