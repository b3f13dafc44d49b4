"""Simulator jobs as one specification each, from the experiment file to the job.

A simulated run (`RunSpec`): the label the figures show, everything the simulation depends on
(`SimulationSpec`), and the user-defined hardware or model profile it runs on, if any. The
pipeline writes it once per run, the job reads it (`feather simulate --spec`) and keeps it
beside the summary (`spec.json`), so the run directory says what produced it and
`feather simulate --spec <dir>/spec.json` reruns it. A training job (`TrainSpec`, `feather
train --spec`) likewise; its report carries it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from feather.sim.run import SimulationSpec

RUN_SPEC_FORMAT = "feather-run-spec/1"
RUN_SPEC_FILE = "spec.json"
_SIMULATION_FIELDS = {f.name for f in fields(SimulationSpec)}
_KEYS = {"format", "label", "simulation", "hardware_profile", "model_profile"}


class RunSpecError(ValueError):
    """A run specification that cannot be run."""


@dataclass(frozen=True)
class RunSpec:
    label: str  # the scheduler's name in the figures (the experiment file's label)
    simulation: SimulationSpec
    hardware_profile: dict[str, Any] | None = None  # a user profile's fields, name included
    model_profile: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RUN_SPEC_FORMAT,
            "label": self.label,
            "simulation": self.simulation.to_json(),
            "hardware_profile": self.hardware_profile,
            "model_profile": self.model_profile,
        }

    def register_profiles(self) -> None:
        """Make the user profiles this run names known to this process."""
        register_profiles(self.hardware_profile, self.model_profile)

    @classmethod
    def from_json(cls, data: Any, where: str = "spec") -> RunSpec:
        """Checked: the format, the keys, the simulation's fields and the scheduler's
        parameters, each error naming what is wrong."""
        from feather.policies import check_scheduler_params

        if not isinstance(data, dict) or data.get("format") != RUN_SPEC_FORMAT:
            raise RunSpecError(f"{where}: not a run specification of format {RUN_SPEC_FORMAT!r}")
        unknown = set(data) - _KEYS
        if unknown or not isinstance(data.get("label"), str) or not data["label"]:
            raise RunSpecError(
                f"{where}: needs a non-empty 'label' and 'simulation'; unknown keys: "
                f"{sorted(unknown)}"
            )
        simulation = data.get("simulation")
        if not isinstance(simulation, dict):
            raise RunSpecError(f"{where}: 'simulation' must be a mapping of SimulationSpec fields")
        strange = set(simulation) - _SIMULATION_FIELDS
        lacking = {"workload", "scheduler", "hardware", "model"} - set(simulation)
        if strange or lacking:
            raise RunSpecError(
                f"{where}: simulation has unknown fields {sorted(strange)}, lacks "
                f"{sorted(lacking)}; fields: {sorted(_SIMULATION_FIELDS)}"
            )
        _check_profiles(data, where)
        params = simulation.get("scheduler_params") or {}
        try:
            check_scheduler_params(simulation["scheduler"], params, where=f"{where} params")
            spec = SimulationSpec(**simulation)
        except (TypeError, ValueError) as exc:
            raise RunSpecError(f"{where}: {exc}") from None
        return cls(data["label"], spec, data.get("hardware_profile"), data.get("model_profile"))

    @classmethod
    def load(cls, text_or_path: str) -> RunSpec:
        """From JSON text, or from a file holding it."""
        return cls.from_json(*read_spec(text_or_path))


@dataclass(frozen=True)
class TrainSpec:
    """A training job (`feather train --spec`): the learner, the simulated engine it trains on
    (`simulation`: hardware, model, kernel, engine mode and limits; its workload is the first
    training workload), the workloads x seeds it trains on and is evaluated on held out, its
    parameters, and the user profiles it names."""

    learner: str
    simulation: SimulationSpec
    train_workloads: tuple[str, ...]
    train_seeds: tuple[int, ...]
    eval_workloads: tuple[str, ...] = ()
    eval_seeds: tuple[int, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    hardware_profile: dict[str, Any] | None = None
    model_profile: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TRAIN_SPEC_FORMAT,
            "learner": self.learner,
            "simulation": self.simulation.to_json(),
            "train_workloads": list(self.train_workloads),
            "train_seeds": list(self.train_seeds),
            "eval_workloads": list(self.eval_workloads),
            "eval_seeds": list(self.eval_seeds),
            "params": self.params,
            "hardware_profile": self.hardware_profile,
            "model_profile": self.model_profile,
        }

    def register_profiles(self) -> None:
        register_profiles(self.hardware_profile, self.model_profile)

    @classmethod
    def from_json(cls, data: Any, where: str = "spec") -> TrainSpec:
        """Checked: format, keys, the simulation's fields, the seeds and the learner's params."""
        from feather.policies import check_scheduler_params

        if not isinstance(data, dict) or data.get("format") != TRAIN_SPEC_FORMAT:
            raise RunSpecError(
                f"{where}: not a training specification of format {TRAIN_SPEC_FORMAT!r}"
            )
        unknown, lacking = set(data) - _TRAIN_KEYS, _TRAIN_REQUIRED - set(data)
        if unknown or lacking:
            raise RunSpecError(
                f"{where}: unknown keys {sorted(unknown)}, missing {sorted(lacking)}"
            )
        for key in ("train_workloads", "eval_workloads"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
                raise RunSpecError(f"{where}: {key} must be a list of workload specs")
        for key in ("train_seeds", "eval_seeds"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                raise RunSpecError(f"{where}: {key} must be a list of whole numbers >= 0")
        if not data["train_workloads"] or not data["train_seeds"]:
            raise RunSpecError(f"{where}: training needs a workload and a seed")
        params = data.get("params") or {}
        if not isinstance(params, dict) or not isinstance(data["simulation"], dict):
            raise RunSpecError(f"{where}: params and simulation must be mappings")
        _check_profiles(data, where)
        try:
            check_scheduler_params(data["learner"], params, where=f"{where} params")
            simulation = SimulationSpec(**data["simulation"])
        except (TypeError, ValueError) as exc:
            raise RunSpecError(f"{where}: {exc}") from None
        return cls(
            data["learner"],
            simulation,
            tuple(data["train_workloads"]),
            tuple(data["train_seeds"]),
            tuple(data.get("eval_workloads", [])),
            tuple(data.get("eval_seeds", [])),
            params,
            data.get("hardware_profile"),
            data.get("model_profile"),
        )

    @classmethod
    def load(cls, text_or_path: str) -> TrainSpec:
        return cls.from_json(*read_spec(text_or_path))


TRAIN_SPEC_FORMAT = "feather-train-spec/1"
_TRAIN_REQUIRED = {"format", "learner", "simulation", "train_workloads", "train_seeds"}
_TRAIN_KEYS = _TRAIN_REQUIRED | {
    "eval_workloads", "eval_seeds", "params", "hardware_profile", "model_profile"
}


def register_profiles(hardware: dict[str, Any] | None, model: dict[str, Any] | None) -> None:
    """Make a job's user profiles (a spec's `hardware_profile`, `model_profile`) known here."""
    from feather.models import register_model_profiles
    from feather.sim.hardware import register_hardware_profiles

    if hardware is not None:
        register_hardware_profiles([json.dumps(hardware)], "spec hardware_profile")
    if model is not None:
        register_model_profiles([json.dumps(model)], "spec model_profile")


def _check_profiles(data: dict[str, Any], where: str) -> None:
    for key in ("hardware_profile", "model_profile"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RunSpecError(f"{where}: {key} must be a mapping of profile fields or null")


def read_spec(text_or_path: str, flag: str = "--spec") -> tuple[Any, str]:
    """(the data, where it came from) of `--spec` (or another flag): JSON text, an object or
    a list, or a file holding it."""
    text, where = text_or_path, flag
    if not text_or_path.lstrip().startswith(("{", "[")):
        path = Path(text_or_path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise RunSpecError(f"{flag} {text_or_path}: unreadable ({exc})") from None
        where = str(path)
    try:
        return json.loads(text), where
    except json.JSONDecodeError as exc:
        raise RunSpecError(f"{where}: not valid JSON ({exc})") from None
