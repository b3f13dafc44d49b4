"""User-described hardware and model profiles, given as JSON objects.

The CLI (`--hardware-profile`, `--model-profile`), the engine runners and the workflow's
config (`hardware_profiles`, `model_profiles`) all register user profiles through here, so
the fields are checked one way everywhere.
"""

from __future__ import annotations

import dataclasses
import json


def typed_fields(cls: type, fields: dict) -> dict:
    """Profile fields converted to the dataclass's declared types (YAML reads `3.0e12` as
    text); a value that does not convert is a clear error naming the field."""
    casts = {"int": int, "float": float, "str": str, "bool": bool}
    known = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ValueError(f"{cls.__name__} {fields.get('name')!r}: unknown fields {unknown}")
    out = {}
    for key, value in fields.items():
        cast = casts.get(str(known[key]))
        try:
            out[key] = cast(float(value)) if cast is int else cast(value) if cast else value
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{cls.__name__} {fields.get('name')!r}: field {key} = {value!r} is not "
                f"{known[key]}"
            ) from exc
    return out


def register_profiles(hardware: list[str] | None, models: list[str] | None) -> None:
    """User profiles given as JSON objects (fields of HardwareProfile / ModelProfile)."""
    from feather.models import ModelProfile, model_names, register_model
    from feather.sim.hardware import HardwareProfile, hardware_names, register_hardware

    for text in hardware or []:
        fields = json.loads(text)
        if fields.get("name") not in hardware_names():
            register_hardware(HardwareProfile(**typed_fields(HardwareProfile, fields)))
    for text in models or []:
        fields = json.loads(text)
        if fields.get("name") not in model_names():
            register_model(ModelProfile(**typed_fields(ModelProfile, fields)))
