"""Shared fixtures: where the real L-Eval copy lives (tests fail, never skip, without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def find_leval_dir() -> Path | None:
    candidates = [
        os.environ.get("FEATHER_LEVAL_DIR"),
        REPO.parent / "shared" / "datasets" / "leval",
        "/work/shared/datasets/leval",
    ]
    for candidate in candidates:
        if candidate and Path(candidate, "quality.jsonl").is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def leval_dir() -> Path:
    found = find_leval_dir()
    if found is None:
        pytest.fail(
            "the real L-Eval data is needed: set FEATHER_LEVAL_DIR to a directory holding "
            "L-Eval's <task>.jsonl files (in CI: ../shared/datasets/leval beside the checkout)"
        )
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `cluster` (a SLURM cluster's daemons on this machine) run last, so they
    never share the machine with the tests that measure time."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
