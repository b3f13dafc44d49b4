"""What every timed implementation offers the worker: prepare a case, form batches, release.

Standard library only (imported inside SGLang's environment too).

`prepare` builds the implementation's own state for a case (requests, trees, caches) and
returns what it computed for every waiting request - the shared prefix it found, in tokens -
so the harness can check all implementations agree before any of them is timed. `measure`
forms one batch of at most `case.batch` requests from the `case.waiting` waiting ones and
leaves the state as it found it, so repeats time the same work.
"""

from __future__ import annotations

import gc
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from feather.overhead.scenario import Case


@dataclass
class Prepared:
    matches: list[int]
    arrival_s_per_request: float  # what the implementation pays once per arriving request
    arrival_cpu_s_per_request: float | None = None  # the same in thread CPU time, where timed
    # Feather only: the CHT insertion from precomputed chunk hashes (vLLM hands its own block
    # hashes to the CHT, so inside vLLM the policy never hashes a prompt), thread CPU time
    arrival_hashes_cpu_s_per_request: float | None = None


@dataclass
class Measured:
    seconds: float  # thread CPU time to form the batch
    decisions: int  # candidates considered; a pass over the queue counts `batch` decisions
    admitted: int


class Implementation(ABC):
    """One prefix-detection implementation (one package, one data structure), one process."""

    family: str = ""

    @abstractmethod
    def facts(self) -> dict[str, Any]:
        """Name, versions and settings, for every row this implementation produces."""

    @abstractmethod
    def variants(self) -> list[str]:
        """The batch-formation procedures timed on the same prepared state."""

    @abstractmethod
    def prepare(self, case: Case) -> Prepared: ...

    @abstractmethod
    def measure(self, variant: str) -> Measured: ...

    @abstractmethod
    def release(self) -> None: ...


def cpu_time(work: Callable[[], Any]) -> tuple[float, Any]:
    """Thread CPU time of `work()`, with the garbage collector held off meanwhile (a
    collection triggered by earlier allocations would be charged to whoever runs next)."""
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        result = work()
        return time.thread_time() - start, result
    finally:
        gc.enable()
