"""Downloads from the HuggingFace hub, failing fast and clearly where it is unreachable.

`datasets.load_dataset(repo)` no longer works for L-Eval or LongBench (their loading
scripts are refused by datasets >= 4), so the raw files are downloaded with
`huggingface_hub.hf_hub_download` and then read with the `json` builder.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from feather.workloads.sources.base import DataUnavailableError


def hub_unreachable_reason(timeout_s: float = 3.0) -> str | None:
    """None if the hub answers a TCP connect, else why not (seconds at most, never a hang)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"


def download(repo_id: str, filename: str, dest: Path, *, what: str) -> Path:
    """One file of a dataset repository into `dest` (kept there for later runs)."""
    reason = hub_unreachable_reason()
    if reason is not None:
        raise DataUnavailableError(
            f"cannot download {what}: the HuggingFace hub is unreachable ({reason}) and no "
            f"local copy was given. Pass --data-dir DIR (or data.local_dir in the config): a "
            f"directory holding the benchmark's files in the hub's layout."
        )
    from huggingface_hub import hf_hub_download

    dest.mkdir(parents=True, exist_ok=True)
    try:
        return Path(
            hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=dest)
        )
    except Exception as exc:  # huggingface_hub raises many types; all mean "not downloaded"
        raise DataUnavailableError(f"cannot download {what} ({repo_id}/{filename}): {exc}") from exc
