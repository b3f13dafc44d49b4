"""A simulated run as one specification, from the experiment file to the job: the label the
figures show, everything the simulation depends on (`SimulationSpec`), and the user-defined
hardware or model profile it runs on, if any. The pipeline writes it once per run, the job
reads it (`feather simulate --spec`) and keeps it beside the summary (`spec.json`), so the
run directory says what produced it and `feather simulate --spec <dir>/spec.json` reruns it."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
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
        from feather.models import register_model_profiles
        from feather.sim.hardware import register_hardware_profiles

        if self.hardware_profile is not None:
            register_hardware_profiles([json.dumps(self.hardware_profile)], "spec hardware_profile")
        if self.model_profile is not None:
            register_model_profiles([json.dumps(self.model_profile)], "spec model_profile")

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
        for key in ("hardware_profile", "model_profile"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise RunSpecError(f"{where}: {key} must be a mapping of profile fields or null")
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
        text, where = text_or_path, "--spec"
        if not text_or_path.lstrip().startswith("{"):
            path = Path(text_or_path)
            try:
                text = path.read_text()
            except OSError as exc:
                raise RunSpecError(f"--spec {text_or_path}: unreadable ({exc})") from None
            where = str(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunSpecError(f"{where}: not valid JSON ({exc})") from None
        return cls.from_json(data, where)
