"""Refuse work that cannot fit in memory before allocating it.

These machines have no swap: an input that asks for more memory than there is (a synthetic
spec with a billion groups, a KV pool of 10^12 blocks) would end in numpy's ArrayMemoryError
or in the kernel's OOM killer, not in an error naming the input. Callers estimate the bytes
from the input and call `check_fits` first. The limit is half of the memory available now
(MemAvailable, within the cgroup's limit where there is one): the other half is headroom for
what the estimate leaves out and for the processes sharing the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

FRACTION_OF_AVAILABLE = 0.5


class MemoryLimitError(ValueError):
    """An input whose estimated memory exceeds what this machine can give it."""


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def available_bytes() -> int:
    """Memory this process could allocate now without swapping (none here) or OOM."""
    candidates = [_meminfo_available(), _cgroup_headroom()]
    known = [c for c in candidates if c is not None]
    if not known:
        known = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    return max(0, min(known))


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_fits(what: str, needed_bytes: float) -> None:
    """Raise MemoryLimitError, naming `what`, if it needs more than the limit."""
    available = available_bytes()
    limit = FRACTION_OF_AVAILABLE * available
    if needed_bytes > limit:
        raise MemoryLimitError(
            f"{what} needs about {_gb(needed_bytes)} of memory, more than the "
            f"{FRACTION_OF_AVAILABLE:.0%} of available memory ({_gb(available)}) this machine "
            "can give it; make it smaller"
        )
