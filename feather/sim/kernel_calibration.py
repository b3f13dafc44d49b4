"""Kernel measurements from a real GPU, fed back into the simulator's L2 model.

`bash gpu/kernels.sh OUT` writes `kernel-calibration-<gpu>.json` (schema
`feather.kernel_calibration/1`): per Triton kernel and batch, the median time, the KV bytes
the kernel requests (logical) and, where Nsight Compute ran, its L2 hit rate. Copied into
`feather/sim/data/calibration/`, it replaces the *assumed* L2 read rate of the matching
hardware profile with the measured one: the fastest logical KV read rate of the plain
`paged` kernel on a homogeneous batch (shared blocks, so L2-resident; where ncu ran, only
batches with at least `MIN_L2_HIT_RATE` L2 hits count). That is exactly the quantity
`HardwareProfile.l2_read_bytes_per_sm_clock` stands for (`feather/sim/hardware.py`, measured
so far on the H200 only); the profile records the file it came from in `source`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

SCHEMA = "feather.kernel_calibration/1"
DIRECTORY = Path(__file__).with_name("data") / "calibration"
MIN_L2_HIT_RATE = 0.8

# GPU names as NVML/torch report them -> our profile names (feather/sim/hardware.py).
_PROFILE_PATTERNS = (
    (r"\bh200\b", "h200"),
    (r"\bh100\b.*\b(sxm|hbm3)\b", "h100-sxm"),
    (r"\ba100\b.*\b80\s*gb\b", "a100-80gb"),
    (r"\brtx\s*6000\s*ada\b", "rtx-6000-ada"),
    (r"\bl40s\b", "l40s"),
)


class CalibrationError(ValueError):
    """A calibration file that cannot be used (wrong schema, no usable measurement)."""


def profile_for_gpu(name: str) -> str | None:
    """Our hardware profile for a GPU name ("NVIDIA H200" -> "h200"), or None."""
    text = name.lower().replace("-", " ")
    for pattern, profile in _PROFILE_PATTERNS:
        if re.search(pattern, text):
            return profile
    return None


def _hit_rate(entry: dict[str, Any]) -> float | None:
    ncu = entry.get("ncu") or {}
    pct = ncu.get("l2_hit_rate_pct")
    return None if pct is None else float(pct) / 100


def measured_l2_read_bytes_per_s(doc: dict[str, Any]) -> float:
    """The paged kernel's fastest logical KV read rate on homogeneous batches."""
    if doc.get("schema") != SCHEMA:
        raise CalibrationError(f"not a kernel calibration ({SCHEMA}): {doc.get('schema')!r}")
    rates = []
    for entry in doc.get("entries", []):
        if entry.get("kernel") != "paged" or not str(entry.get("config", "")).startswith("homog"):
            continue
        hit = _hit_rate(entry)
        if hit is not None and hit < MIN_L2_HIT_RATE:
            continue
        if entry.get("median_s", 0) > 0 and entry.get("logical_kv_bytes", 0) > 0:
            rates.append(entry["logical_kv_bytes"] / entry["median_s"])
    if not rates:
        raise CalibrationError(
            f"{doc.get('hardware')!r}: no paged-kernel measurement on a homogeneous batch"
            + (f" with >= {MIN_L2_HIT_RATE:.0%} L2 hits" if doc.get("ncu_available") else "")
        )
    return max(rates)


def apply(profile: Any, doc: dict[str, Any], source: str) -> Any:
    """`profile` with its L2 read rate taken from the measurement in `doc`."""
    rate = measured_l2_read_bytes_per_s(doc)
    per_sm_clock = rate / (profile.sms * profile.boost_clock_hz)
    return dataclasses.replace(
        profile,
        l2_read_bytes_per_sm_clock=per_sm_clock,
        source=f"{profile.source}; L2 read rate {rate / 1e12:.2f} TB/s measured ({source})",
    )


def load_directory(directory: Path = DIRECTORY) -> dict[str, tuple[dict[str, Any], str]]:
    """Calibration documents found in `directory`, by the profile they are for. A file
    for a GPU we have no profile of, or of another schema, is left alone."""
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for path in sorted(Path(directory).glob("kernel-calibration-*.json")):
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA or doc.get("device") != "cuda":
            continue
        profile = profile_for_gpu(str(doc.get("hardware", "")))
        if profile is not None:
            found[profile] = (doc, path.name)
    return found
