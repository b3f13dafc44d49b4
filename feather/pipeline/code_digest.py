"""A digest of the code that produces results, so the workflow reruns what a code change
invalidates (Snakemake reruns a job when its params change, not when a package it imports does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".json")


def source_digest(include: Iterable[str], exclude: Iterable[str] = (), root: Path = PACKAGE) -> str:
    """SHA-256 (16 hex digits) over the paths and contents of the package's .py and .json
    files under `include` (paths relative to the package), skipping those under `exclude`."""
    skipped = tuple(exclude)
    files = sorted(
        path
        for part in include
        for path in ((root / part).rglob("*") if (root / part).is_dir() else [root / part])
        if path.is_file()
        and path.suffix in SUFFIXES
        and "__pycache__" not in path.parts
        and not str(path.relative_to(root)).startswith(skipped)
    )
    digest = hashlib.sha256()
    for path in dict.fromkeys(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def run_code_digest(root: Path = PACKAGE) -> str:
    """What simulated and real-engine runs and training execute: the package, less the
    workflow's own expansion and aggregation, the claims' figure and verdict code, and the
    overhead experiment's (a new figure or grading rule reruns no simulation)."""
    return source_digest(["."], exclude=("pipeline", "claims", "overhead"), root=root)


def overhead_code_digest(root: Path = PACKAGE) -> str:
    """What the overhead experiment times: its harness and the structures it measures."""
    return source_digest(
        ["overhead", "cht.py", "chunk_hash.py", "arrival.py", "policies",
         "engines/sglang/api.py"],
        root=root,
    )


def workload_code_digest(root: Path = PACKAGE) -> str:
    """What builds workloads."""
    return source_digest(["workloads", "chunk_hash.py", "models.py", "cli"], root=root)
