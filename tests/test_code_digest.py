"""The code digests that make the workflow rerun results when the code that made them changes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import feather
from feather.pipeline.code_digest import PACKAGE, run_code_digest, source_digest


def package(tmp: Path) -> Path:
    for name, text in {
        "sim/engine.py": "STEP = 1\n",
        "sim/data/costs.json": "{}",
        "pipeline/verdicts.py": "RULE = 'a'\n",
        "claims/c1.py": "TITLE = 'a'\n",
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
    (root / "pipeline/verdicts.py").write_text("RULE = 'b'\n")
    (root / "claims/c1.py").write_text("TITLE = 'b'\n")
    (root / "README.txt").write_text("changed")
    (root / "sim/__pycache__/engine.cpython-311.pyc").write_text("other bytes")
    # the claims' figure and verdict code, the workflow's own, docs and caches rerun nothing
    assert run_code_digest(root) == before
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


def recomputed_run_digest(root: Path) -> str:
    """The run digest computed here, independently: SHA-256 over each .py and .json file's
    path relative to the package and its bytes, in path order, outside pipeline/, overhead/
    and __pycache__."""
    files = sorted(
        (path.relative_to(root).as_posix(), path)
        for path in root.rglob("*")
        if path.is_file()
        and path.suffix in (".py", ".json")
        and "__pycache__" not in path.parts
        and path.relative_to(root).parts[0] not in ("pipeline", "claims", "overhead")
    )
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def test_the_installed_package_digest_is_the_digest_of_its_code(tmp_path) -> None:
    root = Path(feather.__file__).resolve().parent
    assert root == PACKAGE  # the digest reads the package that is imported
    digest = run_code_digest()
    assert digest == recomputed_run_digest(root)
    assert (root / "sim" / "engine.py").is_file() and (root / "pipeline").is_dir()

    copy = Path(shutil.copytree(root, tmp_path / "feather", ignore=shutil.ignore_patterns(
        "__pycache__")))  # fmt: skip
    assert run_code_digest(copy) == digest  # the files, not their location, make the digest
    (copy / "claims" / "c1.py").write_text("# figures and a verdict only\n")
    assert run_code_digest(copy) == digest  # a claim's figure and verdict rerun no simulation
    engine = copy / "sim" / "engine.py"
    engine.write_bytes(engine.read_bytes() + b"\n")
    assert run_code_digest(copy) not in (digest, recomputed_run_digest(root))
    assert run_code_digest(copy) == recomputed_run_digest(copy)
