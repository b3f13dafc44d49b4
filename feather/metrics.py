"""Latency and throughput numbers computed the same way for every runner."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-quantile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def latency_summary(
    arrival_s: Sequence[float],
    admitted_s: Sequence[float],
    first_token_s: Sequence[float],
    finish_s: Sequence[float],
    output_len: Sequence[int],
    prompt_len: Sequence[int],
    makespan_s: float | None = None,
) -> dict[str, Any]:
    """Throughput over the makespan, TTFT / TPOT percentiles, waiting time (per request
    columns, seconds on one clock). The makespan defaults to last finish - first arrival."""
    n = len(arrival_s)
    makespan = (
        makespan_s
        if makespan_s is not None
        else max(finish_s, default=0.0) - min(arrival_s, default=0.0)
    )
    output_tokens, prompt_tokens = int(sum(output_len)), int(sum(prompt_len))
    ttft = [f - a for f, a in zip(first_token_s, arrival_s, strict=True)]
    tpot = [
        (e - f) / (o - 1)
        for f, e, o in zip(first_token_s, finish_s, output_len, strict=True)
        if o > 1
    ]
    wait = [d - a for d, a in zip(admitted_s, arrival_s, strict=True)]

    def quantiles(values: list[float]) -> dict[str, float | None]:
        return {f"p{int(q * 100)}": percentile(values, q) for q in (0.5, 0.9, 0.99)}

    return {
        "requests": n,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "makespan_s": makespan,
        "output_tok_s": output_tokens / makespan if makespan > 0 else 0.0,
        "total_tok_s": (output_tokens + prompt_tokens) / makespan if makespan > 0 else 0.0,
        "requests_s": n / makespan if makespan > 0 else 0.0,
        "ttft_s": quantiles(ttft),
        "tpot_s": quantiles(tpot),
        "wait_s": {"mean": statistics.fmean(wait) if wait else 0.0, "max": max(wait, default=0.0)},
        "longest_wait_s": max(wait, default=0.0),
    }
