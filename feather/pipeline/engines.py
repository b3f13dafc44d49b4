"""The engines a run can use, and which of those configured can run on this machine.

An engine that needs a GPU is skipped with a logged reason where none is attached (the rest
of the workflow still runs), unless the config sets `require_gpu`, which turns that skip into
a parse-time error. Engine issues add their entries here (vllm, sglang: GPU; vllm-cpu: CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    name: str
    needs_gpu: bool
    description: str


ENGINES: dict[str, EngineSpec] = {
    "sim": EngineSpec("sim", needs_gpu=False, description="the calibrated simulator"),
}


class EngineUnavailableError(ValueError):
    """A configured engine cannot run here and the config demands it."""


def select_engines(
    requested: Sequence[str],
    gpus: Sequence[str],
    require_gpu: bool = False,
    engines: Mapping[str, EngineSpec] = ENGINES,
) -> tuple[list[str], list[str]]:
    """The requested engines that run here, and a reason for each one skipped."""
    unknown = [name for name in requested if name not in engines]
    if unknown:
        raise EngineUnavailableError(
            f"unknown engine(s) {', '.join(unknown)}; engines: {', '.join(engines)}"
        )
    runnable, skipped = [], []
    for name in requested:
        spec = engines[name]
        if spec.needs_gpu and not gpus:
            reason = f"engine {name} ({spec.description}) needs a GPU and none is attached"
            if require_gpu:
                raise EngineUnavailableError(f"{reason} (require_gpu: true)")
            skipped.append(reason)
        else:
            runnable.append(name)
    return runnable, skipped
