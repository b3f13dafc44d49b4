"""What keeps a GPU script's run inside its time and its results on disk.

The time budget (deadlines counted from when this module is first imported, at the script's
start), subprocesses bounded in time (`run_bounded`), the watchdog that ends the run and the
children it waits on if a step hangs, the results document rewritten after every step, and
the summaries and table the probe prints. gpu/l2_probe.py and gpu/kernel_bench.py both use
them; pure Python, no torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCRIPT_START_S = time.monotonic()

# Time budget (seconds since the script started); the whole run must end within 300 s.
TOTAL_BUDGET_S = 285.0
TIMING_DEADLINE_S = 150.0  # no new timing config starts after this
NCU_DEADLINE_S = 240.0  # no new ncu run starts after this
NCU_CALL_TIMEOUT_S = 75.0
NCU_QUERY_TIMEOUT_S = 30.0
SAFETY_MARGIN_S = 5.0
WATCHDOG_S = 292.0  # a hung step: write what there is, end our ncu child, exit 124


class Budget:
    """Seconds since the script started, against the deadlines above."""

    def __init__(self, start_s: float = SCRIPT_START_S, total_s: float = TOTAL_BUDGET_S) -> None:
        self.start_s = start_s
        self.total_s = total_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start_s

    def remaining(self) -> float:
        return self.total_s - self.elapsed()

    def before(self, deadline_s: float) -> bool:
        return self.elapsed() < deadline_s


class Results:
    """The JSON document, rewritten atomically after every step."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def write(self) -> None:
        self.data["elapsed_s"] = time.monotonic() - SCRIPT_START_S
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def start_watchdog(results: Results, deadline_s: float = WATCHDOG_S) -> threading.Thread:
    """If the run is still going at `deadline_s`, save the results, end the ncu child we are
    waiting on (its process group, by id) and exit 124: the 5-minute limit holds even if a
    launch hangs."""

    def fire() -> None:
        time.sleep(max(0.0, deadline_s - (time.monotonic() - SCRIPT_START_S)))
        for pid in list(_ACTIVE_CHILD_PIDS):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            results.data["errors"].append(
                {"stage": "watchdog", "error": f"still running at {deadline_s:.0f} s; stopped"}
            )
            results.data["watchdog_fired"] = True
            results.write()
        print(f"watchdog: stopped at {deadline_s:.0f} s; partial results written", flush=True)
        os._exit(124)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


def error_record(exc: BaseException) -> dict[str, str]:
    """An exception as JSON: type, message and the traceback's end."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}", "traceback_tail": tb[-2000:]}


_ACTIVE_CHILD_PIDS: set[int] = set()  # process groups run_bounded started and still waits on


def run_bounded(cmd: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run a command in its own process group; on timeout kill that group (ours alone)."""
    began = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return {
            "rc": None,
            "error": f"could not start: {exc}",
            "wall_s": 0.0,
            "stdout": "",
            "stderr": "",
        }
    _ACTIVE_CHILD_PIDS.add(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, timeout_s))
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    finally:
        _ACTIVE_CHILD_PIDS.discard(proc.pid)
    return {
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": time.monotonic() - began,
        "stdout": stdout or "",
        "stderr": stderr or "",
    }


# ---------------------------------------------------------------------------------------------
# Summaries and the stdout table
# ---------------------------------------------------------------------------------------------


def summarise_times(times_ms: Sequence[float]) -> dict[str, float | int]:
    """Median and spread of repeated launch times."""
    ordered = sorted(times_ms)
    n = len(ordered)
    return {
        "n": n,
        "median_ms": statistics.median(ordered),
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[math.ceil(0.9 * (n - 1))],
    }


def bandwidth_summary(
    logical_bytes: int, unique_bytes: int, median_ms: float, copy_bytes_per_s: float | None
) -> dict[str, float | None]:
    """Effective bandwidths of one config and their ratio to the measured copy bandwidth."""
    seconds = median_ms / 1e3
    effective = logical_bytes / seconds
    return {
        "effective_bytes_per_s": effective,
        "unique_bytes_per_s": unique_bytes / seconds,
        "ratio_to_copy": effective / copy_bytes_per_s if copy_bytes_per_s else None,
        "unique_ratio_to_copy": (unique_bytes / seconds) / copy_bytes_per_s
        if copy_bytes_per_s
        else None,
    }


def format_table(data: dict[str, Any]) -> str:
    """The compact stdout table: one line per config."""
    head = (
        f"{'config':<18} {'seqs':>5} {'logicalGB':>9} {'uniqMB':>8} {'med_ms':>8} "
        f"{'effTB/s':>8} {'xcopy':>6} {'L2hit%':>7} {'dramGB':>7} {'dram/log':>8} {'check':>6}"
    )
    lines = [head]
    ncu_runs = data.get("ncu", {}).get("runs", {})
    for name, rec in data.get("configs", {}).items():
        struct = rec.get("structure", {})
        timing = rec.get("timing") or {}
        bw = rec.get("bandwidth") or {}
        ncu = (ncu_runs.get(name) or {}).get("summary") or {}
        check = rec.get("correctness") or {}
        ok = check.get("ok")
        lines.append(
            f"{name:<18} {struct.get('num_seqs', 0):>5} "
            f"{_fmt(struct.get('logical_kv_bytes'), 1e9, 9, 3)} "
            f"{_fmt(struct.get('unique_kv_bytes'), 1e6, 8, 1)} "
            f"{_fmt(timing.get('median_ms'), 1, 8, 3)} "
            f"{_fmt(bw.get('effective_bytes_per_s'), 1e12, 8, 2)} "
            f"{_fmt(bw.get('ratio_to_copy'), 1, 6, 2)} "
            f"{_fmt(ncu.get('l2_hit_rate_pct'), 1, 7, 1)} "
            f"{_fmt(ncu.get('dram_read_bytes'), 1e9, 7, 3)} "
            f"{_fmt(ncu.get('dram_over_logical'), 1, 8, 3)} "
            f"{'-' if ok is None else ('ok' if ok else 'FAIL'):>6}"
            + (f"  ERROR {rec['error']}" if rec.get("error") else "")
        )
    return "\n".join(lines)


def _fmt(value: float | None, divisor: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value / divisor:>{width}.{digits}f}"
