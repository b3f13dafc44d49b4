"""What Snakemake's HTML report (`snakemake --report report.html`) says beside each figure.

Each figure's labels, read when the report is built (never stored as job parameters, so a
new result never makes Snakemake redraw a figure): the claim it tests and the paper's number
(its claim module's FigureSpec, feather/claims), and ours from this run - the line its claim
module computes from the measured results (the overhead, kernel and fidelity figures), else
the figure's row of `figures/ours.md`.
"""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

from feather.atomic import write_text_atomic
from feather.claims.base import RunOutputs

_ROW = re.compile(r"^\| (\w+(?:\.png)?(?:, \w+(?:\.png)?)*) \| (.*) \|\s*$")


def _table_rows(markdown: str) -> dict[str, list[str]]:
    """`| name | a | b | ... |` rows of a markdown table, by their first cell (each name of a
    cell listing several, `| a, b | ... |`: an experiment drawing two figures)."""
    rows = {}
    for line in markdown.splitlines():
        match = _ROW.match(line)
        if match:
            cells = [cell.strip() for cell in match.group(2).split(" | ")]
            for name in match.group(1).split(", "):
                rows[name.removesuffix(".png")] = cells
    return rows


def ours_from_table(ours_md: str | Path, figure: str) -> str | None:
    """The figure's "ours (this run)" cell of figures/ours.md, or None if it has no row."""
    path = Path(ours_md)
    if not path.is_file():
        return None
    cells = _table_rows(path.read_text()).get(figure)
    return cells[-1].replace("<br>", "; ") if cells else None


def figure_ours(figure: str, outputs: RunOutputs) -> str | None:
    """This run's numbers for one figure: its claim module's own line where it declares one
    (figures drawn by their own rules, from their own tables), else its row of ours.md."""
    from feather.claims import figures

    spec = figures().get(figure)
    if spec is not None and spec.ours is not None:
        return spec.ours(figure, outputs)
    return ours_from_table(outputs.ours_md, figure)


def figure_labels(figure: str, ours: str | None) -> dict[str, str]:
    """The report's labels of one figure: its name, claim, the paper's number and ours."""
    from feather.claims import figures

    spec = figures().get(figure)
    if spec is None:
        raise ValueError(f"figure {figure!r} is declared by no claim module in feather/claims")
    return {"figure": figure, "claim": spec.shows, "paper": spec.paper,
            "ours": ours or "not computed in this run"}


def markdown_page(source: str | Path, out: str | Path) -> None:
    """A markdown page (figures/ours.md, figures/verdicts.md) as HTML, for the report."""
    body = MarkdownIt("commonmark").enable("table").render(Path(source).read_text())
    style = ("body{font-family:sans-serif;max-width:70em;margin:1em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px}")
    write_text_atomic(out, f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
                           f"<style>{style}</style></head><body>{body}</body></html>\n")
