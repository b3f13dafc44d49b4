"""Nsight Compute plumbing shared by the GPU scripts: which metrics, the flags, the output.

`ncu_args` builds the flags before the profiled command (CSV in base units, caches flushed,
clocks as the GPU sets them); `ncu_available_metrics` asks `ncu --query-metrics` which optional
metrics this GPU has; `parse_ncu_csv` reads the launches and metrics out of ncu's output and
`ncu_summary` sets the DRAM bytes against no reuse and perfect reuse. gpu/l2_probe.py and
gpu/kernel_bench.py each build their own child command on top (no torch needed here).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from l2_probe_bookkeeping import NCU_QUERY_TIMEOUT_S, run_bounded

NCU_METRICS_REQUIRED = (
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
)
# Added only when `ncu --query-metrics` lists them (an unknown metric fails the whole ncu run).
NCU_METRICS_OPTIONAL = (
    "lts__t_sector_op_read_hit_rate.pct",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
)
_NCU_UNIT_SCALE = {  # ncu's decimal units, in case --print-units base is ignored
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "sector": 1.0,
    "ksector": 1e3,
    "msector": 1e6,
    "gsector": 1e9,
    "ns": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "nsecond": 1.0,
    "second": 1e9,
}


# ---------------------------------------------------------------------------------------------


def ncu_args(
    ncu: str, metrics: Sequence[str], kernel_regex: str, skip: int, count: int
) -> list[str]:
    """Nsight Compute's flags, before the profiled command (gpu/kernel_bench.py uses them too):
    CSV in base units, `count` launches of matching kernels after `skip`, caches flushed
    between them, clocks left as the GPU sets them."""
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--metrics",
        ",".join(metrics),
        "--kernel-name",
        f"regex:{kernel_regex}",
        "--launch-skip",
        str(skip),
        "--launch-count",
        str(count),
        "--cache-control",
        "all",
        "--clock-control",
        "none",
    ]


def ncu_available_metrics(ncu: str, timeout_s: float = NCU_QUERY_TIMEOUT_S) -> dict[str, Any]:
    """Required metrics plus the optional ones `ncu --query-metrics` lists for this GPU."""
    run = run_bounded([ncu, "--query-metrics"], timeout_s)
    listing = run["stdout"] + run["stderr"]
    found = [m for m in NCU_METRICS_OPTIONAL if m.rsplit(".", 1)[0] in listing]
    if run["rc"] != 0:
        found = []
    return {
        "metrics": [*NCU_METRICS_REQUIRED, *found],
        "query_rc": run["rc"],
        "query_tail": "" if run["rc"] == 0 else listing[-800:],
    }


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Kernel launches and their metrics (base units) from `ncu --csv` output.

    Lines before the CSV header (the program's own output, ==PROF== notes) are skipped; each
    launch ID becomes one dict {"id", "kernel", "metrics": {name: value}, "units": {...}}.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(ln for ln in lines[start:] if ln.startswith('"'))))
    launches: dict[str, dict[str, Any]] = {}
    for row in rows:
        name, raw = row.get("Metric Name"), row.get("Metric Value")
        if not name or raw is None:
            continue
        entry = launches.setdefault(
            row.get("ID", "?"),
            {"id": row.get("ID"), "kernel": row.get("Kernel Name"), "metrics": {}, "units": {}},
        )
        unit = (row.get("Metric Unit") or "").strip()
        value = _ncu_number(raw)
        scale = _NCU_UNIT_SCALE.get(unit.lower(), 1.0)
        entry["metrics"][name] = value * scale if value is not None else None
        entry["units"][name] = unit
    return list(launches.values())


def _ncu_number(raw: str) -> float | None:
    cleaned = raw.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def ncu_summary(metrics: dict[str, float | None], logical: int, unique: int) -> dict[str, Any]:
    """L2 hit rate and DRAM bytes, against what no reuse and perfect reuse would read."""
    dram = metrics.get("dram__bytes_read.sum")
    out: dict[str, Any] = {
        "l2_hit_rate_pct": metrics.get("lts__t_sector_hit_rate.pct"),
        "l2_read_hit_rate_pct": metrics.get("lts__t_sector_op_read_hit_rate.pct"),
        "dram_read_bytes": dram,
        "l2_tex_read_bytes": _sectors_to_bytes(
            metrics.get("lts__t_sectors_srcunit_tex_op_read.sum")
        ),
    }
    if dram is not None:
        out["dram_over_logical"] = dram / logical if logical else None
        out["dram_over_unique"] = dram / unique if unique else None
        # 1: DRAM read only the unique bytes; 0: every logical read went to DRAM.
        out["reuse_captured"] = (logical - dram) / (logical - unique) if logical > unique else None
    return out


def _sectors_to_bytes(sectors: float | None) -> float | None:
    return None if sectors is None else sectors * 32.0  # an L2 sector is 32 bytes
