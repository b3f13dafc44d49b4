"""New arrival times for a built workload: the same requests in the same order, arriving by
another process - in particular a Poisson process at a fraction of a measured capacity.

Latency experiments need rates that mean something for the engine at hand: below its
capacity every scheduler's throughput equals the arrival rate, above it queues grow. The
capacity is FCFS's offline throughput on the same model x GPU x workload, read from that
run's summary.json; the load factor scales it. The retimed workload's provenance keeps its
base's (order, outputs, source files) and records the capacity run it was derived from.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from feather.failure_record import describe, failure
from feather.provenance import collect_provenance
from feather.workloads.builder import arrival_times
from feather.workloads.schema import Workload, WorkloadError, WorkloadRequest, compute_statistics


def capacity_of(summary_path: str | Path) -> dict[str, Any]:
    """Requests/s of an offline run (all requests at time 0), with where it came from."""
    path = Path(summary_path)
    record = failure(path)
    if record is not None:  # a failed job's record (feather/pipeline/job_status.py): no run
        raise WorkloadError(f"capacity run {path} did not finish: {describe(record)}")
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"capacity run {path}: unreadable summary ({exc})") from exc
    rate = summary.get("requests_s")
    if not isinstance(rate, int | float) or rate <= 0:
        raise WorkloadError(f"capacity run {path}: no positive requests_s in its summary")
    if summary.get("arrival") not in (None, "all"):
        raise WorkloadError(
            f"capacity run {path} was not offline (arrival {summary.get('arrival')!r})"
        )
    config = (summary.get("provenance") or {}).get("config") or {}
    return {
        "requests_s": float(rate),
        "summary": str(path),
        "summary_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "scheduler": config.get("scheduler"),
        "hardware": config.get("hardware"),
        "model": config.get("model"),
    }


def retime(
    base: Workload,
    arrival: str,
    seed: int = 0,
    *,
    load_factor: float | None = None,
    capacity: dict[str, Any] | None = None,
) -> Workload:
    """`base` with arrival times drawn from `arrival` (all | poisson:RATE | bursts:...)."""
    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    times = arrival_times(arrival, len(base.requests), random.Random(f"{seed}:arrival"))
    requests = [
        WorkloadRequest(
            r.request_id, r.source, r.task, list(r.group_path), list(r.prefix_lens),
            r.prompt_token_ids, r.output_len, t,
        )
        for r, t in zip(base.requests, times, strict=True)
    ]
    config = {"retime": {"arrival": arrival, "seed": seed, "load_factor": load_factor,
                         "base_sha256": base.provenance.get("parquet_sha256")}}
    extra = {"retimed": {"base": base.provenance, "arrival": arrival,
                         "load_factor": load_factor, "capacity": capacity}}
    provenance = collect_provenance(config=config, seed=seed, started_utc=started, extra=extra)
    return Workload(requests, provenance, compute_statistics(requests))


def retime_at_load(base: Workload, capacity_summary: str | Path, load_factor: float,
                   seed: int = 0) -> Workload:
    """Poisson arrivals at load_factor x the capacity measured in `capacity_summary`."""
    if not load_factor > 0:
        raise WorkloadError(f"load factor must be > 0, got {load_factor}")
    capacity = capacity_of(capacity_summary)
    rate = load_factor * capacity["requests_s"]
    return retime(base, f"poisson:{rate:.6g}", seed, load_factor=load_factor, capacity=capacity)
