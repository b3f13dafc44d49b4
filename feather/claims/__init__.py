"""The claims, one module each, and the one registry the pipeline loops over.

A claim module names its experiment file (experiments/<name>.yaml), declares its figures
(drawn here from the summary table, or by the rule it names), its headline numbers
(figures/ours.md) and, for a claim of the paper, its verdict (figures/verdicts.md). The
verdict page, the table of our numbers, the figure index (figures/README.md) and the HTML
report's labels are loops over `CLAIMS`. Adding a claim: an experiment file, a module here,
and its `CLAIM` in the tuple below.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from feather.claims import (
    c1,
    c2,
    c5,
    c6,
    c7,
    fidelity,
    hardware,
    kernels,
    load,
    memory,
    online,
    overhead,
    rl,
    stop,
    vllm,
)
from feather.claims.base import Claim, FigureSpec

# In page order: the verdict page's rows, then the figure index's.
CLAIMS: tuple[Claim, ...] = (
    c1.CLAIM, c2.CLAIM, overhead.C3, overhead.C4, c5.CLAIM, memory.CLAIM, vllm.CLAIM,
    c6.CLAIM, c7.CLAIM, stop.CLAIM, load.CLAIM, online.CLAIM, hardware.CLAIM,
    fidelity.CLAIM, rl.CLAIM, overhead.FIGURES, kernels.CLAIM,
)


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
    """Draw one figure from the summary table (the rl figure: from its training reports)."""
    spec = figures().get(name)
    if spec is None or spec.draw is None:
        raise ValueError(f"figure {name!r} has no drawer in feather/claims "
                         f"({'drawn by ' + spec.drawn_by if spec else 'not declared'})")
    if name == "rl_policies":
        spec.draw(list(reports), out, meta)
        return
    spec.draw(pd.read_parquet(table_path), Path(out), meta)


def load_reports(paths: Iterable[str | Path]) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(Path(p).read_text()) for p in paths)
