"""Workloads: prefix-grouped request sets from L-Eval, LongBench or a synthetic spec."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from feather.provenance import collect_provenance
from feather.workloads.builder import BuildOptions, build_workload
from feather.workloads.schema import (
    Workload,
    WorkloadError,
    WorkloadRequest,
    compute_statistics,
    read_workload,
    write_workload,
)
from feather.workloads.synthetic import build_synthetic, is_synthetic, parse_spec
from feather.workloads.tokenizer import load_tokenizer

SOURCES = ("leval", "longbench", "synthetic:...")

__all__ = [
    "SOURCES",
    "BuildOptions",
    "Workload",
    "WorkloadError",
    "WorkloadRequest",
    "build",
    "load_workload",
    "read_workload",
    "write_workload",
]


def build(
    source: str,
    *,
    tasks: list[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    raw_dir: str | os.PathLike[str] = "data/raw",
    tokenizer: str | os.PathLike[str] | None = None,
    options: BuildOptions | None = None,
    chat: str = "vicuna",
    progress: Callable[[str], None] | None = None,
) -> Workload:
    """A workload from a benchmark source or a synthetic spec, with provenance and statistics."""
    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    options = options or BuildOptions()
    config: dict = {"source": source, "tasks": tasks, "options": options.to_json()}
    if is_synthetic(source):
        spec = parse_spec(source)
        requests = build_synthetic(spec)
        config["source"] = spec.canonical()
        extra = {"workload": {"source": "synthetic", "spec": spec.canonical()}}
        return Workload(
            requests, _provenance(config, spec.seed, started, extra), compute_statistics(requests)
        )
    from feather.workloads.sources.leval import load_leval
    from feather.workloads.sources.longbench import load_longbench

    loaders = {"leval": load_leval, "longbench": load_longbench}
    if source not in loaders:
        raise WorkloadError(f"unknown workload source {source!r}; sources: {', '.join(SOURCES)}")
    raw = Path(raw_dir)
    local = Path(data_dir) if data_dir is not None else None
    if local is not None and not local.is_dir():
        raise WorkloadError(f"data directory {local} does not exist")
    kwargs = {"chat": chat} if source == "longbench" else {}
    if progress:
        progress(f"loading {source} from {local or 'the HuggingFace hub'}")
    data = loaders[source](tasks, local, raw, **kwargs)
    tok = load_tokenizer(tokenizer)
    requests, outcome = build_workload(data, tok, options, progress=progress)
    config.update({"data_dir": str(local) if local else None, "chat": chat if kwargs else None})
    extra = {
        "workload": {
            "source": source,
            "tokenizer": tok.identity.to_json(),
            "context_tokens": options.context_tokens,
            "files": data.files,
            "source_summary": data.summary(),
            **outcome,
        }
    }
    return Workload(
        requests, _provenance(config, options.seed, started, extra), compute_statistics(requests)
    )


def _provenance(config: dict, seed: int, started: str, extra: dict) -> dict:
    return collect_provenance(config=config, seed=seed, started_utc=started, extra=extra)


def load_workload(spec: str | os.PathLike[str]) -> Workload:
    """A workload file (.parquet) or an inline synthetic spec - wherever a workload is asked for."""
    if isinstance(spec, str) and is_synthetic(spec):
        return build(spec)
    return read_workload(spec)
