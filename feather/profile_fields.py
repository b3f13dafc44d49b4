"""The fields of user-described hardware and model profiles, given as JSON objects.

The CLI (`--hardware-profile`, `--model-profile`), the engine runners and the workflow's
config (`hardware_profiles`, `model_profiles`) all register user profiles through here
(`feather.models.register_model_profiles`, `feather.sim.hardware.register_hardware_profiles`),
so the fields are checked one way everywhere: every field named, typed and in range, or one
line saying which is not. A profile may not redefine a name already registered (built in or
given before) with other values: it would silently change what every run under that name
means; an identical redefinition (the workflow registers its config's profiles in every
process) is a no-op.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

# Numeric fields that may be 0 ("not given" in ModelProfile; a time offset in the cost model);
# every other number must be > 0, and fractions of a peak or of memory at most 1.
_ZERO_ALLOWED = {"vocab_size", "intermediate_size", "launch_overhead_s", "gemm_fixed_s"}
_FRACTIONS = {
    "achievable_bandwidth_fraction",
    "achievable_flops_fraction",
    "gpu_memory_utilization",
    "gemm_bandwidth_fraction",
    "gemm_flops_fraction",
}
_MAX_INT = 2**62  # larger counts are nonsense for a GPU or a model and overflow numpy


def _convert(label: str, key: str, value: Any, kind: str) -> Any:
    """One field converted to its declared kind; YAML may give numbers as text (`3.0e12`)."""

    def bad(expected: str) -> ValueError:
        return ValueError(f"{label}: field {key} = {value!r} is not {expected}")

    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise bad("a non-empty string")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad("true or false")
    noun = "an integer" if kind == "int" else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise bad(noun)
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise bad(noun) from None
    if not math.isfinite(number):
        raise bad(f"{noun} (it must be finite)")
    if kind == "int":
        if not isinstance(value, int) and number != int(number):
            raise bad("a whole number")
        number = value if isinstance(value, int) else int(number)
        if number > _MAX_INT:
            raise bad(f"an integer up to {_MAX_INT}")
    if key in _ZERO_ALLOWED:
        if number < 0:
            raise bad(f"{noun} >= 0")
    elif number <= 0:
        raise bad(f"{noun} > 0")
    if key in _FRACTIONS and number > 1:
        raise bad("a fraction in (0, 1]")
    return number


def typed_fields(cls: type, fields: dict) -> dict:
    """Profile fields converted to the dataclass's declared types and checked (present,
    known, finite, in range); a value that does not fit is a one-line error naming it."""
    label = f"{cls.__name__} {fields.get('name')!r}"
    declared = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(declared))
    if unknown:
        raise ValueError(f"{label}: unknown fields {unknown}; fields: {', '.join(declared)}")
    required = [
        name
        for name, f in declared.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in fields]
    if missing:
        raise ValueError(f"{label}: missing fields {missing} (required: {', '.join(required)})")
    return {key: _convert(label, key, v, str(declared[key].type)) for key, v in fields.items()}


def _fields(text: str) -> dict:
    shown = text if len(text) <= 60 else text[:57] + "..."
    try:
        fields = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{shown!r} is not valid JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise ValueError(
            f"{shown!r} is not a JSON object of profile fields (it is a {type(fields).__name__})"
        )
    if not isinstance(fields.get("name"), str) or not fields["name"].strip():
        raise ValueError(f"{shown!r}: field name must be a non-empty string")
    return fields


def register_from_json(texts: list[str] | None, cls: type, register: Callable[[Any], Any],
                       where: str) -> None:
    """Register each JSON object of `texts` as a `cls` profile; `where` names the input in
    the errors (a CLI flag, or the config's key)."""
    for text in texts or []:
        try:
            register(cls(**typed_fields(cls, _fields(text))))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
