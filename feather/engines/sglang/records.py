"""Per-step and per-request records of an SGLang scheduler, as JSON lines.

The scheduler runs in its own process, so it writes what it saw to a file that the runner
reads back: `steps-<pid>.jsonl` in the trace directory, one object per line, `kind` being
`engine` (facts, once), `run` (a new run starts: the cache was flushed), `step` (one
forward batch: what `get_next_batch_to_run` formed and what the batch produced) or
`request` (one finished request). The fields match the vLLM runner's trace where the
engines have the same notion (see `StepRow` there).

Request ids carry the prefix group (`request_id_for`) so the distinct groups of a batch
are known in the scheduler process without a side channel.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from feather.policies.base import Action, StepRecord

_SEP = "|"


def request_id_for(run_tag: str, index: int, group: Any) -> str:
    """SGLang's rid of the index-th request of a run: `<tag>|<index>|<group>`."""
    return f"{run_tag}{_SEP}{index}{_SEP}{group}"


def parse_request_id(rid: str) -> tuple[int, str] | None:
    """(index, group) of a rid made by `request_id_for`, else None."""
    parts = str(rid).split(_SEP, 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2]


def _tokens(ids: Any) -> np.ndarray:
    """A prompt as an int64 array without a copy where SGLang keeps `array('q')`."""
    if isinstance(ids, array) and ids.typecode == "q":
        return np.frombuffer(ids, dtype=np.int64)
    return np.asarray(ids, dtype=np.int64)


def shared_prefix_tokens(prompts: list[np.ndarray]) -> int:
    """Tokens every prompt starts with (the batch's shared prefix depth)."""
    if not prompts:
        return 0
    first = prompts[0]
    depth = len(first)
    for other in prompts[1:]:
        n = min(depth, len(other))
        differ = np.flatnonzero(first[:n] != other[:n])
        depth = int(differ[0]) if differ.size else n
        if depth == 0:
            break
    return depth


class StepRecorder:
    """Collects one scheduler's records and appends them to its JSON-lines file."""

    def __init__(self, trace_dir: str | Path, facts: dict[str, Any]) -> None:
        path = Path(trace_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"steps-{os.getpid()}.jsonl"
        self._file = self.path.open("a", buffering=1)
        self.run = 0
        self._clock0 = time.perf_counter()
        self._step = 0
        self._in_flight: deque[dict[str, Any] | None] = deque()  # launched, result not yet seen
        self._requests: dict[str, dict[str, Any]] = {}
        self._last_result: float | None = None
        self._depth_cache: tuple[tuple[str, ...], int] = ((), 0)
        self._write({"kind": "engine", **facts})
        self._write({"kind": "run", "run": self.run})

    def _write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, default=str) + "\n")

    def now(self) -> float:
        return time.perf_counter() - self._clock0

    def new_run(self) -> None:
        """The cache was flushed with nothing in the engine: the next run starts."""
        self.run += 1
        self._step = 0
        self._in_flight.clear()
        self._requests.clear()
        self._last_result = None
        self._clock0 = time.perf_counter()
        self._write({"kind": "run", "run": self.run})

    # ---- scheduling ------------------------------------------------------------------------
    def on_schedule(
        self,
        batch: Any,
        *,
        start_s: float,
        cpu_s: float,
        wall_s: float,
        policy_cpu_s: float,
        waiting: int,
        record: StepRecord | None,
    ) -> None:
        """`get_next_batch_to_run` returned `batch` (None: idle, nothing is recorded)."""
        if batch is None:
            return
        if not batch.reqs:  # an empty batch still gets a result: keep the queue in step
            self._in_flight.append(None)
            return
        reqs = list(batch.reqs)
        is_extend = batch.forward_mode.is_extend()
        admitted = [r for r in reqs if is_extend and r.rid not in self._requests]
        for req in admitted:
            self._requests[req.rid] = {
                "rid": req.rid,
                "prompt_tokens": len(req.origin_input_ids),
                "admitted_s": start_s,
                "cached_tokens": int(req.prefix_len),
                "first_token_s": None,
                "output_tokens": 0,
            }
        decisions = record.decisions if record is not None else []
        decoding = getattr(batch, "decoding_reqs", None) or []
        rids = tuple(r.rid for r in reqs)
        groups = [parse_request_id(rid) for rid in rids]
        row = {
            "kind": "step",
            "run": self.run,
            "step": self._step,
            "start_s": start_s,
            "sched_cpu_s": cpu_s,
            "sched_wall_s": wall_s,
            "policy_cpu_s": policy_cpu_s,
            "forward_mode": batch.forward_mode.name.lower(),
            "batch_size": len(reqs),
            "decode_seqs": len(decoding) if is_extend else len(reqs),
            "prefill_tokens": int(sum(getattr(r, "extend_input_len", 0) for r in reqs))
            if is_extend
            else 0,
            "shared_prefix_tokens": self._shared_depth(rids, reqs),
            "distinct_groups": len({g[1] for g in groups})
            if all(g is not None for g in groups)
            else None,
            "admitted": len(admitted),
            "cache_hit_tokens": int(sum(r.prefix_len for r in admitted)),
            "waiting": waiting,
            "candidates": len(record.admitted) + (record.refused is not None) if record else 0,
            "decisions_add": sum(d.action is Action.ADD for d in decisions),
            "decisions_stop": sum(d.action is Action.STOP for d in decisions),
            "stop_reason": str(record.stop_reason) if record and record.stop_reason else None,
            "step_time_s": None,
            "sampled_tokens": 0,
            "finished": 0,
        }
        self._step += 1
        self._in_flight.append({"row": row, "reqs": reqs})

    def _shared_depth(self, rids: tuple[str, ...], reqs: list[Any]) -> int:
        cached_rids, depth = self._depth_cache
        if rids != cached_rids:  # decode steps repeat the batch: compute on change only
            depth = shared_prefix_tokens([_tokens(r.origin_input_ids) for r in reqs])
            self._depth_cache = (rids, depth)
        return depth

    # ---- results ---------------------------------------------------------------------------
    def on_result(self) -> dict[str, Any] | None:
        """The oldest launched batch's result was processed: complete and write its row."""
        if not self._in_flight:
            return None
        item = self._in_flight.popleft()
        if item is None:
            return None
        row, reqs = item["row"], item["reqs"]
        now = self.now()
        started = self._last_result if self._last_result is not None else row["start_s"]
        row["step_time_s"] = now - started
        self._last_result = now
        sampled = finished = 0
        for req in reqs:
            times = self._requests.get(req.rid)
            if times is None:
                continue
            produced = len(req.output_ids) - times.get("output_tokens", 0)
            if produced > 0:  # a chunk of an unfinished prefill samples nothing
                sampled += produced
                times["output_tokens"] = len(req.output_ids)
                if times["first_token_s"] is None:
                    times["first_token_s"] = now
            if req.finished():
                finished += 1
                del self._requests[req.rid]
                self._write({"kind": "request", "run": self.run, **times, "finish_s": now})
        row["sampled_tokens"], row["finished"] = sampled, finished
        self._write(row)
        return row

    def close(self) -> None:
        self._file.close()


def read_records(path: str | Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """run -> {"steps": [...], "requests": [...]}, plus run -1 -> {"engine": [facts]}."""
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {-1: {"engine": []}}
    for line in Path(path).read_text().splitlines():
        obj = json.loads(line)
        kind = obj.pop("kind")
        if kind == "engine":
            runs[-1]["engine"].append(obj)
        elif kind == "run":
            runs[obj["run"]] = {"steps": [], "requests": []}
        else:
            runs[obj.pop("run")][f"{kind}s"].append(obj)
    return runs
