"""A workload: requests with token ids, prefix-group structure, output lengths, arrivals.

On disk, one Parquet file (a row per request, in arrival order) and a JSON sidecar
(`<file>.json`) with provenance and statistics. The Parquet file holds no timestamps, so the
same inputs and seed give a byte-identical file; the sidecar records its SHA-256.

Columns:
  request_id        string
  source, task      string
  group_path        list<string>: group ids from the outermost level (the task's shared
                    system prompt) to the innermost (one document / context)
  prefix_lens       list<int32>: per level, the tokens every request of that group shares
                    (measured on the token ids; 0 for a group of one request)
  prompt_token_ids  list<int32>
  prompt_len        int32
  shared_prefix_len int32: prefix_lens of the innermost level
  output_len        int32
  arrival_time_s    float64
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from feather.atomic import atomic_target, write_json_atomic
from feather.workloads.regime import distinct_shared_prefix_tokens

SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("source", pa.string()),
        ("task", pa.string()),
        ("group_path", pa.list_(pa.string())),
        ("prefix_lens", pa.list_(pa.int32())),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("prompt_len", pa.int32()),
        ("shared_prefix_len", pa.int32()),
        ("output_len", pa.int32()),
        ("arrival_time_s", pa.float64()),
    ]
)


class WorkloadError(ValueError):
    """A workload file or specification that cannot be used."""


@dataclass(slots=True)
class WorkloadRequest:
    request_id: str
    source: str
    task: str
    group_path: list[str]
    prefix_lens: list[int]
    prompt_token_ids: np.ndarray  # int32
    output_len: int
    arrival_time_s: float = 0.0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def group_id(self) -> str:
        return self.group_path[-1]

    @property
    def shared_prefix_len(self) -> int:
        return self.prefix_lens[-1]


@dataclass
class Workload:
    requests: list[WorkloadRequest]
    provenance: dict[str, Any] = field(default_factory=dict)
    statistics: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)


def measure_prefix_lens(requests: Sequence[WorkloadRequest]) -> None:
    """Set every request's prefix_lens from its token ids: per level, the longest prefix
    shared by all requests of its group (0 for a group of one)."""
    levels = max((len(r.group_path) for r in requests), default=0)
    for level in range(levels):
        members: dict[str, list[WorkloadRequest]] = {}
        for r in requests:
            members.setdefault(r.group_path[level], []).append(r)
        for group in members.values():
            common = (
                _common_prefix_len([r.prompt_token_ids for r in group]) if len(group) > 1 else 0
            )
            for r in group:
                r.prefix_lens[level] = common


def _common_prefix_len(arrays: list[np.ndarray]) -> int:
    first = arrays[0]
    common = len(first)
    for other in arrays[1:]:
        n = min(common, len(other))
        mismatch = np.flatnonzero(first[:n] != other[:n])
        common = int(mismatch[0]) if len(mismatch) else n
        if common == 0:
            break
    return common


def compute_statistics(requests: Sequence[WorkloadRequest]) -> dict[str, Any]:
    """What a reader checks first: groups, sizes, prefix lengths, share of shared tokens."""
    groups = Counter(r.group_id for r in requests)
    shared_groups = {g for g, n in groups.items() if n >= 2}
    prefix_of: dict[str, int] = {}
    for r in requests:
        if r.group_id in shared_groups:
            prefix_of[r.group_id] = r.shared_prefix_len
    prefixes = sorted(prefix_of.values())
    prompt_tokens = sum(r.prompt_len for r in requests)
    shared_tokens = sum(max(r.prefix_lens, default=0) for r in requests)
    task_of_group = {r.group_id: r.task for r in requests}
    per_task: dict[str, dict[str, int]] = {}
    for r in requests:
        entry = per_task.setdefault(r.task, {"requests": 0, "groups": 0, "groups_2plus": 0})
        entry["requests"] += 1
    for g, n in groups.items():
        entry = per_task[task_of_group[g]]
        entry["groups"] += 1
        entry["groups_2plus"] += n >= 2

    def summary(values: list[int] | list[float]) -> dict[str, float]:
        if not values:
            return {}
        ordered = sorted(values)
        return {
            "min": ordered[0],
            "p50": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1],
            "mean": statistics.fmean(ordered),
        }

    return {
        "requests": len(requests),
        "groups": len(groups),
        "groups_with_2plus_requests": len(shared_groups),
        "requests_in_shared_groups": sum(groups[g] for g in shared_groups),
        "requests_per_group": summary(list(groups.values())),
        "shared_prefix_tokens_per_group": summary(prefixes),
        "shared_groups_with_prefix_1k_to_10k": sum(1000 <= p <= 10_000 for p in prefixes),
        "prompt_tokens": prompt_tokens,
        # what a KV pool must hold to keep every shared prefix at once (see regime.py)
        "distinct_shared_prefix_tokens": distinct_shared_prefix_tokens(requests),
        "prompt_len": summary([r.prompt_len for r in requests]),
        "output_len": summary([r.output_len for r in requests]),
        "fraction_prompt_tokens_in_shared_prefix": (
            shared_tokens / prompt_tokens if prompt_tokens else 0.0
        ),
        "arrival_span_s": (
            max(r.arrival_time_s for r in requests) - min(r.arrival_time_s for r in requests)
            if requests
            else 0.0
        ),
        "per_task": dict(sorted(per_task.items())),
    }


def _to_table(requests: Sequence[WorkloadRequest]) -> pa.Table:
    tokens = [np.asarray(r.prompt_token_ids, dtype=np.int32) for r in requests]
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    offsets = np.zeros(len(tokens) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32)
    token_column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.int32()))
    return pa.table(
        {
            "request_id": [r.request_id for r in requests],
            "source": [r.source for r in requests],
            "task": [r.task for r in requests],
            "group_path": [list(r.group_path) for r in requests],
            "prefix_lens": [list(r.prefix_lens) for r in requests],
            "prompt_token_ids": token_column,
            "prompt_len": lengths.astype(np.int32),
            "shared_prefix_len": [r.shared_prefix_len for r in requests],
            "output_len": [r.output_len for r in requests],
            "arrival_time_s": [float(r.arrival_time_s) for r in requests],
        },
        schema=SCHEMA,
    )


def write_workload(workload: Workload, path: str | os.PathLike[str]) -> Path:
    """Parquet + sidecar, each written whole or not at all."""
    target = Path(path)
    if target.suffix != ".parquet":
        raise WorkloadError(f"workload files end in .parquet: {target}")
    ids = [r.request_id for r in workload.requests]
    if len(set(ids)) != len(ids):
        raise WorkloadError("duplicate request ids in workload")
    table = _to_table(workload.requests)
    with atomic_target(target) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        sidecar = {
            "format": "feather-workload/1",
            "parquet_sha256": hashlib.sha256(tmp.read_bytes()).hexdigest(),
            "statistics": workload.statistics,
            "provenance": workload.provenance,
        }
        write_json_atomic(sidecar_path(target), sidecar)
    return target


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    return Path(str(path) + ".json")


def _read_sidecar(side: Path, target: Path, actual_sha256: str) -> dict[str, Any]:
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"sidecar {side} is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise WorkloadError(f"sidecar {side} is not a JSON object")
    if meta.get("format", "feather-workload/1") != "feather-workload/1":
        raise WorkloadError(
            f"sidecar {side}: format {meta['format']!r} is not 'feather-workload/1'"
        )
    if meta.get("parquet_sha256") not in (None, actual_sha256):
        raise WorkloadError(f"{side} describes a different file than {target} (SHA-256 differs)")
    for key in ("provenance", "statistics"):
        if not isinstance(meta.get(key, {}), dict):
            raise WorkloadError(f"sidecar {side}: {key} is not a JSON object")
    return meta


def _check_table(target: Path, table: pa.Table) -> pa.Table:
    """The workload's columns with the schema's types and the invariants every reader relies
    on; the first violation is an error naming the column and the first bad row."""
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise WorkloadError(f"{target} lacks workload columns {missing}")
    columns = {}
    for spec in SCHEMA:
        column = table.column(spec.name)
        if column.null_count:
            raise WorkloadError(f"{target}: column {spec.name} has {column.null_count} nulls")
        try:
            columns[spec.name] = column.cast(spec.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise WorkloadError(
                f"{target}: column {spec.name} is {column.type}, not {spec.type} ({exc})"
            ) from None
    table = pa.table(columns, schema=SCHEMA)

    def refuse(column: str, rows: Any, expected: str) -> None:
        bad = np.flatnonzero(np.asarray(rows, dtype=bool))
        if len(bad):
            row = int(bad[0])
            value = table.column(column)[row].as_py()
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise WorkloadError(
                f"{target}: column {column}, row {row} = {shown}: expected {expected} "
                f"({len(bad)} of {table.num_rows} rows are not)"
            )

    n = table.num_rows
    arrival = table.column("arrival_time_s").to_numpy()
    refuse("arrival_time_s", ~np.isfinite(arrival) | (arrival < 0), "a finite time >= 0")
    refuse("arrival_time_s", np.r_[False, np.diff(arrival) < 0], "rows in arrival order")
    tokens = table.column("prompt_token_ids").combine_chunks()
    offsets = tokens.offsets.to_numpy()
    lengths = np.diff(offsets)
    prompt_len = table.column("prompt_len").to_numpy()
    refuse("prompt_token_ids", lengths < 1, "at least one token")
    refuse("prompt_len", prompt_len != lengths, "the number of prompt_token_ids")
    negative = np.flatnonzero(tokens.values.to_numpy() < 0)
    if len(negative):
        row = int(np.searchsorted(offsets, negative[0], "right") - 1)
        refuse("prompt_token_ids", np.arange(n) == row, "token ids >= 0")
    refuse("output_len", table.column("output_len").to_numpy() < 1, "an integer >= 1")
    ids = table.column("request_id").to_pylist()
    refuse("request_id", [not i for i in ids], "a non-empty id")
    first_row: dict[str, int] = {}
    repeated = [first_row.setdefault(i, row) != row for row, i in enumerate(ids)]
    refuse("request_id", repeated, "distinct ids")
    paths = table.column("group_path").to_pylist()
    levels = table.column("prefix_lens").to_pylist()
    refuse("group_path", [not p for p in paths], "at least one group")
    refuse(
        "prefix_lens",
        [len(p) != len(q) for p, q in zip(paths, levels, strict=True)],
        "one length per group_path level",
    )
    refuse(
        "prefix_lens",
        [any(not 0 <= v <= m for v in q) for q, m in zip(levels, prompt_len.tolist(), strict=True)],
        "lengths in 0..prompt_len",
    )
    shared = table.column("shared_prefix_len").to_numpy().tolist()
    refuse(
        "shared_prefix_len",
        [q[-1] != v for q, v in zip(levels, shared, strict=True)],
        "the last of prefix_lens",
    )
    return table


def read_workload(path: str | os.PathLike[str]) -> Workload:
    """A workload file written by `write_workload` (the sidecar is checked when present).

    Everything is checked before any request is built: the Parquet file reads, its columns
    have the schema's types and no nulls, arrival times are finite, >= 0 and in order, token
    counts agree, request ids are distinct, group paths and prefix lengths agree; the sidecar
    is a JSON object describing this very file. Any violation is one WorkloadError naming
    the file, the column (or sidecar key) and the first bad row.
    """
    target = Path(path)
    if not target.is_file():
        raise WorkloadError(f"workload file {target} does not exist")
    try:
        raw = target.read_bytes()
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise WorkloadError(f"{target} is not a readable Parquet workload: {reason}") from None
    actual = hashlib.sha256(raw).hexdigest()
    side = sidecar_path(target)
    meta = _read_sidecar(side, target, actual) if side.is_file() else {}
    table = _check_table(target, table)
    tokens = table.column("prompt_token_ids").combine_chunks()
    flat = tokens.values.to_numpy()
    offsets = tokens.offsets.to_numpy()
    columns = {
        name: table.column(name).to_pylist() for name in SCHEMA.names if name != "prompt_token_ids"
    }
    requests = [
        WorkloadRequest(
            request_id=columns["request_id"][i],
            source=columns["source"][i],
            task=columns["task"][i],
            group_path=columns["group_path"][i],
            prefix_lens=columns["prefix_lens"][i],
            prompt_token_ids=flat[offsets[i] : offsets[i + 1]],
            output_len=columns["output_len"][i],
            arrival_time_s=columns["arrival_time_s"][i],
        )
        for i in range(table.num_rows)
    ]
    # runs record which file they ran: the hash of the bytes read, sidecar or not
    provenance = {**meta.get("provenance", {}), "parquet_sha256": actual}
    return Workload(requests, provenance, meta.get("statistics", {}))
