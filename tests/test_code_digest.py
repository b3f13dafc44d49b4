"""The code digests that make the workflow rerun results when the code that made them changes."""

from __future__ import annotations

from pathlib import Path

from feather.pipeline.code_digest import run_code_digest, source_digest


def package(tmp: Path) -> Path:
    for name, text in {
        "sim/engine.py": "STEP = 1\n",
        "sim/data/costs.json": "{}",
        "pipeline/figures.py": "TITLE = 'a'\n",
        "sim/__pycache__/engine.cpython-311.pyc": "bytes",
        "README.txt": "not code",
    }.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


def test_the_run_digest_follows_the_code_and_data_runs_execute(tmp_path) -> None:
    root = package(tmp_path)
    before = run_code_digest(root)
    assert run_code_digest(root) == before  # stable
    (root / "pipeline/figures.py").write_text("TITLE = 'b'\n")
    (root / "README.txt").write_text("changed")
    (root / "sim/__pycache__/engine.cpython-311.pyc").write_text("other bytes")
    assert run_code_digest(root) == before  # figure code, docs and caches rerun nothing
    (root / "sim/data/costs.json").write_text('{"a": 1}')
    after_data = run_code_digest(root)
    assert after_data != before
    (root / "sim/engine.py").write_text("STEP = 2\n")
    assert run_code_digest(root) not in (before, after_data)


def test_a_moved_file_changes_the_digest(tmp_path) -> None:
    root = package(tmp_path)
    before = source_digest(["sim"], root=root)
    (root / "sim/engine.py").rename(root / "sim/kernel.py")
    assert source_digest(["sim"], root=root) != before


def test_the_installed_package_has_a_digest() -> None:
    assert len(run_code_digest()) == 16
