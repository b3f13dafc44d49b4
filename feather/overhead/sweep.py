"""What the overhead experiment sweeps: grids of cases from `experiments/overhead.yaml`.

A sweep is a list of grids; a grid maps each `Case` field to a list of values and stands for
their cross product. Duplicates across grids are run once.
"""

from __future__ import annotations

import itertools
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from feather.overhead.scenario import Case

CASE_FIELDS = {f.name for f in fields(Case)}
SPEC_FIELDS = {"claim", "title", "paper", "figures", "description", "baselines", "repeats",
               "sweep", "sweeps", "model", "output_tokens"}


class SweepError(ValueError):
    """An overhead experiment file that cannot be expanded."""


def load_spec(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict):
        raise SweepError(f"{path}: expected a mapping at the top level")
    unknown = set(spec) - SPEC_FIELDS
    missing = {"sweeps", "sweep", "baselines", "repeats"} - set(spec)
    if unknown or missing:
        raise SweepError(f"{path}: unknown keys {sorted(unknown)}, missing {sorted(missing)}")
    return spec


def cases(spec: dict[str, Any], sweep: str | None = None) -> list[Case]:
    name = sweep or spec["sweep"]
    if name not in spec["sweeps"]:
        raise SweepError(f"unknown sweep {name!r}; sweeps: {', '.join(spec['sweeps'])}")
    out: dict[Case, None] = {}
    for i, grid in enumerate(spec["sweeps"][name]):
        bad = set(grid) - CASE_FIELDS
        if bad:
            raise SweepError(
                f"sweep {name!r}, grid {i}: unknown fields {sorted(bad)}; "
                f"allowed: {sorted(CASE_FIELDS)}"
            )
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        for combo in itertools.product(*values):
            try:
                out[Case(**dict(zip(keys, combo, strict=True)))] = None
            except (TypeError, ValueError) as exc:
                raise SweepError(f"sweep {name!r}, grid {i}: {exc}") from exc
    return list(out)
