# Simulated runs: results/{hardware}/sim/{experiment}/{run}/ (trace, requests, the run's spec,
# summary). One job per scheduler, experiment and hardware runs that scheduler's runs in one
# process (feather/pipeline/sim_batches.py says why).
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
from feather.pipeline.sim_batches import sim_batches

SIM_BATCHES = sim_batches(
    (out, run.hardware, run.experiment, run.scheduler,
     SIM_SPECS[out]["simulation"]["workload"] in LOAD_WORKLOADS)
    for out, run in RUNS.items() if run.engine == "sim")


def _sim_workloads(batch):
    """The workload files a batch's runs read (a synthetic spec is built in the job)."""
    return sorted({w for w in (SIM_SPECS[d]["simulation"]["workload"] for d in batch.run_dirs)
                   if not w.startswith("synthetic:")})


for _sim in SIM_BATCHES:

    rule:
        name:
            _sim.name
        input:
            _sim_workloads(_sim),
        output:
            _sim.outputs(),
        params:
            feather=FEATHER_NICE,
            code=RUN_CODE,
            # every run's whole specification, built once at parse time (common.smk
            # SIM_SPECS), with its directory; each run keeps its spec as spec.json
            runs=json.dumps([{"out": d, "spec": SIM_SPECS[d]} for d in _sim.run_dirs],
                            sort_keys=True),
        log:
            _sim.log,
        resources:
            runtime=job_runtime("simulate", runs=len(_sim.run_dirs)),
        conda:
            "../envs/feather.yaml"
        shell:
            "{params.feather} simulate --runs {params.runs:q} > {log:q} 2>&1"
