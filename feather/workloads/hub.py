"""Downloads from the HuggingFace hub, failing fast and clearly where it is unreachable, and
never trusting a file the hub did not send whole.

`datasets.load_dataset(repo)` no longer works for L-Eval or LongBench (their loading
scripts are refused by datasets >= 4), so the raw files are downloaded with
`huggingface_hub.hf_hub_download` and then read as JSON lines (`sources.base.read_jsonl`).

Every downloaded file gets a record, written after the client has moved the complete file
into place (the client downloads into a temporary file, checks its size against the hub's,
and resumes a cut-off transfer with a Range request): `<dest>/.cache/feather/<filename>.json`
holds the repository, revision, commit, the hub's ETag, the URL, the size and the SHA-256 of
the bytes received. Each later build asks the hub for the file's ETag (one HEAD request):
- the same ETag as recorded: the local file must still hash to the recorded SHA-256, else the
  build stops (the copy was altered after download; delete it to download it again);
- another ETag (the file changed on the hub), or no record (a file from elsewhere): the file
  is downloaded again, whole, and recorded anew.
Where the ETag is a SHA-256 (the hub's large-file storage), the bytes must hash to it. The
record's SHA-256 is what the workload's provenance lists for the file (`file_provenance`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from feather.atomic import write_json_atomic
from feather.workloads.sources.base import DataUnavailableError, file_record

_SHA256 = re.compile(r"[0-9a-f]{64}")


def hub_unreachable_reason(timeout_s: float = 3.0) -> str | None:
    """None if the hub answers a TCP connect, else why not (seconds at most, never a hang)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set"
    parsed = urlparse(_endpoint())
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"


def _endpoint() -> str:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def record_path(dest: Path, filename: str) -> Path:
    return dest / ".cache" / "feather" / f"{filename}.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and "sha256" in record else None


def download(repo_id: str, filename: str, dest: Path, *, what: str, revision: str = "main") -> Path:
    """One file of a dataset repository into `dest` (kept there, with its record, for later
    runs), checked as the module docstring says."""
    reason = hub_unreachable_reason()
    if reason is not None:
        raise DataUnavailableError(
            f"cannot download {what}: the HuggingFace hub is unreachable ({reason}) and no "
            f"local copy was given. Pass --data-dir DIR (the pipeline: config.yaml "
            f"data.leval_dir, or data.hub: false to skip what needs it): a directory holding "
            f"the benchmark's files in the hub's layout."
        )
    endpoint = _endpoint()
    client_log = logging.getLogger("huggingface_hub")  # its retry warnings: we say what failed
    level = client_log.level
    client_log.setLevel(logging.ERROR)
    try:
        with _locked(record_path(dest, filename)):
            return _download(repo_id, filename, dest, what, revision, endpoint)
    finally:
        client_log.setLevel(level)


@contextlib.contextmanager
def _locked(record: Path) -> Iterator[None]:
    """One process at a time checks and fetches a file (the workflow builds several
    workloads at once from the same downloads): a second waits, then finds the first's
    record instead of fetching the file again under a reader's feet."""
    record.parent.mkdir(parents=True, exist_ok=True)
    with open(record.with_name(record.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(
    repo_id: str, filename: str, dest: Path, what: str, revision: str, endpoint: str
) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import tqdm

    class NoProgressBar(tqdm):
        """The client's byte counter, not drawn (the build reports its own progress)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    url = hf_hub_url(repo_id, filename, repo_type="dataset", revision=revision, endpoint=endpoint)
    local = dest / filename
    record_file = record_path(dest, filename)
    try:
        metadata = get_hf_file_metadata(url, endpoint=endpoint)
        etag = metadata.etag
        record = _read_record(record_file)
        if record is not None and record.get("etag") == etag and local.is_file():
            actual = _sha256(local)
            if actual != record["sha256"]:
                raise DataUnavailableError(
                    f"{what}: the local copy {local} was altered after download (SHA-256 "
                    f"{actual}, recorded {record['sha256']} when the hub sent it); delete it "
                    f"to download it again"
                )
            return local
        record_file.unlink(missing_ok=True)  # the file is replaced: its record no longer holds
        dest.mkdir(parents=True, exist_ok=True)
        path = Path(
            hf_hub_download(
                repo_id=repo_id,
                filename=filename,
                repo_type="dataset",
                revision=revision,
                local_dir=dest,
                endpoint=endpoint,
                force_download=True,  # fresh bytes from the hub, never an unrecorded leftover
                tqdm_class=NoProgressBar,
            )
        )
    except DataUnavailableError:
        raise
    except Exception as exc:  # huggingface_hub raises many types; all mean "not downloaded"
        message = " ".join(str(exc).split())[:400]
        raise DataUnavailableError(
            f"cannot download {what} ({repo_id}/{filename}): {type(exc).__name__}: {message}"
        ) from None
    sha256 = _sha256(path)
    if etag and _SHA256.fullmatch(etag) and sha256 != etag:
        path.unlink(missing_ok=True)
        raise DataUnavailableError(
            f"cannot download {what}: the hub's file hashes to {sha256}, not to its ETag {etag}"
        )
    write_json_atomic(
        record_file,
        {
            "repo_id": repo_id,
            "repo_type": "dataset",
            "filename": filename,
            "revision": revision,
            "commit": metadata.commit_hash,
            "etag": etag,
            "url": url,
            "bytes": path.stat().st_size,
            "sha256": sha256,
            "downloaded_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )
    return path


def file_provenance(path: Path) -> dict[str, Any]:
    """A file's provenance entry (path, SHA-256, bytes), with where it was downloaded from
    when it was (its record: repository, commit, ETag, URL)."""
    entry = file_record(path)
    for parent in path.parents:
        record = _read_record(record_path(parent, str(path.relative_to(parent))))
        if record is not None:
            entry["download"] = {
                k: record.get(k) for k in ("repo_id", "revision", "commit", "etag", "url")
            }
            break
    return entry
