"""Write files so that a reader never sees half of one: temp file, then rename.

The temporary file lives beside the target (same filesystem, so the rename is atomic) and
gets the permissions a plain `open()` would give (mkstemp's private 0600 would hide results
from other users and cluster jobs).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _remove_stale_temps(target: Path) -> None:
    """Temp files of `target` that a killed writer left (SIGKILL, a lost node: no cleanup ran).

    One writer per target at a time is assumed (Snakemake gives every output one job)."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        stale.unlink(missing_ok=True)


@contextmanager
def atomic_target(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _default_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Replace `path` with `text` in one step (the directory is created if missing)."""
    with atomic_target(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return Path(path)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """`obj` as indented, key-sorted JSON, written atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
