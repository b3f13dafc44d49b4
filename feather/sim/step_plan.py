"""What one engine step's scheduling decided, handed from an engine's step rule to the shared
execution (feather/sim/engine.py): which requests run how many tokens, and the counts that
the step record and the scheduling-cost model keep."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepPlan:
    scheduled: dict[str, int]  # request id -> tokens computed this step, in scheduling order
    phase: str  # "mixed" (vLLM), "prefill" or "decode" (SGLang)
    waiting_count: int  # requests waiting when the step was formed
    waiting_tokens: int  # their prompt tokens
    admitted: int = 0
    preempted: int = 0
    hits: int = 0  # prefix-cache hit tokens of the admitted requests
    candidates: int = 0  # requests the policy offered
    adds: int = 0  # the policy's unforced ADD decisions
    stops: int = 0  # and STOP decisions
    reason: str = ""  # why admission stopped
