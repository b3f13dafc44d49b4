"""The claims, one module each, and the one registry the pipeline loops over.

A claim module names its experiment file (experiments/<name>.yaml), declares its figures
(drawn here from the summary table, or by the rule it names), its headline numbers
(figures/ours.md) and, for a claim of the paper, its verdict (figures/verdicts.md). The
verdict page, the table of our numbers, the figure index (figures/README.md) and the HTML
report's labels are loops over `CLAIMS`, which holds every module of this package that
declares a `CLAIM` (or `CLAIMS`), in `rank` order. Adding a claim: an experiment file and a
module here.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from feather.claims.base import Claim, FigureSpec

# the modules the claims share, and rl_engine (the RL claim's real-engine part)
_NOT_CLAIMS = ("base", "data", "plot", "rl_engine")


def _discover() -> tuple[Claim, ...]:
    """Every claim module's `CLAIM` (or `CLAIMS`), in page order (`rank`)."""
    found: list[Claim] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name in _NOT_CLAIMS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        claims = getattr(module, "CLAIMS", None) or (getattr(module, "CLAIM", None),)
        if not all(isinstance(c, Claim) for c in claims):
            raise TypeError(f"feather/claims/{info.name}.py declares no CLAIM (a Claim) "
                            "or CLAIMS (a tuple of them)")
        found += claims
    keys = [c.key for c in found]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two claim modules declare the same key: {sorted(keys)}")
    return tuple(sorted(found, key=lambda c: c.rank))


CLAIMS: tuple[Claim, ...] = _discover()


def figures() -> dict[str, FigureSpec]:
    """Every figure of every claim, by name."""
    out: dict[str, FigureSpec] = {}
    for claim in CLAIMS:
        for spec in claim.figures:
            if spec.name in out:
                raise ValueError(f"figure {spec.name!r} is declared by two claims")
            out[spec.name] = spec
    return out


def for_experiment(name: str) -> Claim | None:
    """The claim that reads an experiment file (None: no module declares it)."""
    return next((c for c in CLAIMS if c.experiment == name), None)


def draw(name: str, table_path: str | Path | None, out: str | Path, meta: dict[str, Any],
         reports: Iterable[str | Path] = ()) -> None:
    """Draw one figure from the summary table (the learners' figures: from their reports)."""
    spec = figures().get(name)
    if spec is None or spec.draw is None:
        raise ValueError(f"figure {name!r} has no drawer in feather/claims "
                         f"({'drawn by ' + spec.drawn_by if spec else 'not declared'})")
    if spec.from_reports:
        spec.draw(list(reports), out, meta)
        return
    spec.draw(pd.read_parquet(table_path), Path(out), meta)


def report_figures() -> list[str]:
    """The figures drawn from the learners' reports (the rule `report_figure` draws them)."""
    return [name for name, spec in figures().items() if spec.from_reports]


def load_reports(paths: Iterable[str | Path]) -> tuple[dict[str, Any], ...]:
    """The learners' reports; a failed training job's record (job_status) is left out."""
    from feather.failure_record import failed

    return tuple(json.loads(Path(p).read_text()) for p in paths if not failed(Path(p)))
