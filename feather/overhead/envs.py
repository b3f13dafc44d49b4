"""Build the separate Python environments SGLang's real scheduling code runs in.

SGLang pins a different torch and transformers than vLLM, and pulls CUDA-only packages, so it
cannot share our environment. Each baseline gets its own venv from a lock file in `locks/`
(installed with `--no-deps`: only what its scheduling code imports). The environment is
marked usable only once SGLang's classes import and a radix tree answers a query, by a
status record `feather-env.json` written last (atomically):

    {"status": "ok", "name": ..., "python": ..., "lock_sha256": ..., "sglang": version}
    {"status": "skipped", "name": ..., "reason": "why it could not be built"}

A failed build leaves only the record (never a half-built venv); an interrupted one leaves no
record and is rebuilt; so the pipeline reports a baseline as skipped with the reason and goes
on. A built environment whose lock file is unchanged is reused.

The heaviest pins (torch and Triton, ~1.75 GB of SGLang's 2.5 GB) are usually the very builds
our own environment holds: those are linked from it instead of installed twice
(`SHARED_PACKAGES`; a folder of links on the new environment's path, recorded as `shared`).
A pin our environment does not hold at that exact version is installed as usual.

`install_feather=True` also installs our package into the environment (`install_feather_into`):
a link to it on the environment's path and a small dist-info carrying its SGLang plugin entry
point, which is how SGLang's spawned scheduler process finds the plugin.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import feather
from feather.atomic import write_json_atomic

LOCKS = Path(__file__).with_name("locks")
STATUS_FILE = "feather-env.json"
# Linked from the running environment when it holds the lock's exact version (see above).
SHARED_PACKAGES = ("torch", "triton")
SHARED_DIR = "shared-site"  # inside the env: links to the shared packages' files
SHARED_PTH = "feather-shared.pth"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$")

# Imports SGLang's scheduling code, builds its trees and a request: what the harness needs.
_SELF_TEST = """
from feather.engines.sglang.api import SGLangAPI
api = SGLangAPI()
for kind in api.trees:
    tree = api.make_tree(kind, 1)
    api.cache_prefix(tree, [1, 2, 3, 4])
    req = api.make_request("0", [1, 2, 3, 4, 5])
    api.make_policy("lpm", tree, fcfs_fallback=False).calc_priority([req])
    assert api.matched_tokens(req) == 4, (kind, api.matched_tokens(req))
import json
print(json.dumps({"version": api.version, "trees": api.trees}))
"""


# An engine's GPU environment (SGLang's server, `engine=True`) is checked without a GPU: SGLang
# imports with its CUDA packages, then (once feather is installed) `feather run` starts.
_ENGINE_SELF_TEST = """
import json
import sglang
print(json.dumps({"version": sglang.__version__, "trees": []}))
"""


def known_envs() -> list[str]:
    return sorted(p.stem for p in LOCKS.glob("*.txt"))


def lock_file(name: str) -> Path:
    path = LOCKS / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(known_envs())}")
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class EnvStatus:
    name: str
    status: str  # ok | skipped
    path: Path
    reason: str = ""
    version: str = ""
    trees: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


FEATHER_DIST_INFO = "feather-{version}.dist-info"
FEATHER_PTH = "feather-local.pth"
FEATHER_LINK_DIR = "feather-link"  # inside the env: holds only the link `feather`


def install_feather_into(env: Path) -> Path:
    """Install our package into environment `env` (built by `build_env`) without pip: a link
    to the package, a .pth putting the link's folder on the path, and a dist-info whose
    entry points SGLang's plugin loader discovers. Idempotent; returns the dist-info."""
    from feather.engines.sglang.plugin import (
        ENTRY_POINT_GROUP,
        ENTRY_POINT_NAME,
        ENTRY_POINT_VALUE,
    )

    env = Path(env).absolute()
    site = Path(_purelib(env / "bin" / "python"))
    link_dir = env / FEATHER_LINK_DIR
    package = Path(feather.__file__).resolve().parent
    link = link_dir / "feather"
    if not (link.is_symlink() and link.resolve() == package):
        shutil.rmtree(link_dir, ignore_errors=True)
        link_dir.mkdir(parents=True)
        link.symlink_to(package)
    (site / FEATHER_PTH).write_text(f"{link_dir}\n")
    for old in site.glob(FEATHER_DIST_INFO.format(version="*")):
        shutil.rmtree(old)
    dist_info = site / FEATHER_DIST_INFO.format(version=feather.__version__)
    dist_info.mkdir()
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: feather\nVersion: {feather.__version__}\n",
        "entry_points.txt": f"[{ENTRY_POINT_GROUP}]\n{ENTRY_POINT_NAME} = {ENTRY_POINT_VALUE}\n",
        "INSTALLER": "feather.overhead.envs\n",
    }
    for name, text in files.items():
        (dist_info / name).write_text(text)
    record = [f"{dist_info.name}/{name},," for name in [*files, "RECORD"]]
    (dist_info / "RECORD").write_text("\n".join([*record, f"{FEATHER_PTH},,"]) + "\n")
    return dist_info


def lock_pins(lock: Path) -> dict[str, str]:
    """`name==version` lines of a lock file, by normalised name (PEP 503)."""
    return dict(pin for line in lock.read_text().splitlines() if (pin := _pin(line)))


def _pin(line: str) -> tuple[str, str] | None:
    """(normalised name, version) of a `name==version` line, else None."""
    match = _PIN.match(line.strip())
    return (_normalise(match.group(1)), match.group(2)) if match else None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shareable(lock: Path) -> dict[str, importlib.metadata.Distribution]:
    """The `SHARED_PACKAGES` this interpreter holds at exactly the version `lock` pins."""
    pins = lock_pins(lock)
    found = {}
    for name in SHARED_PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if pins.get(_normalise(name)) == dist.version and dist.files:
            found[name] = dist
    return found


def _top_level_entries(dist: importlib.metadata.Distribution) -> list[Path]:
    """The files and folders a distribution put directly in its site-packages (scripts
    installed outside it, `../../bin/...`, are left out: nothing we run needs them)."""
    site = Path(str(dist.locate_file("")))
    names = sorted({f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."})
    return [site / name for name in names if (site / name).exists()]


def link_shared(env: Path, dists: dict[str, importlib.metadata.Distribution]) -> dict[str, str]:
    """Link `dists` into `env` (a folder of links and a .pth naming it, after the env's own
    site-packages on the path); returns {name: version} for the status record."""
    site = Path(_purelib(env / "bin" / "python"))
    shared = env / SHARED_DIR
    shared.mkdir(exist_ok=True)
    for dist in dists.values():
        for entry in _top_level_entries(dist):
            (shared / entry.name).symlink_to(entry)
    (site / SHARED_PTH).write_text(f"{shared}\n")
    return {name: dist.version for name, dist in dists.items()}


def _links_intact(env: Path) -> bool:
    shared = env / SHARED_DIR
    return not shared.exists() or all(link.exists() for link in shared.iterdir())


def _without(lock: Path, names: set[str], dest: Path) -> Path:
    """A copy of `lock` at `dest` without the pins of `names`."""
    kept = [line for line in lock.read_text().splitlines()
            if not ((pin := _pin(line)) and pin[0] in names)]
    dest.write_text("\n".join(kept) + "\n")
    return dest


def _purelib(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def read_status(dest: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dest / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


def package_path_for(python_path_dir: Path) -> Path:
    """A directory holding only a link to our package, to put on another env's path."""
    (python_path_dir / "feather").symlink_to(Path(feather.__file__).resolve().parent)
    return python_path_dir


def _run(cmd: list[str], log: Path, **kwargs: Any) -> subprocess.CompletedProcess:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)


def _tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").splitlines()
    useful = [line for line in text if "is ignored: it is neither a file" not in line]
    return "\n".join(useful[-lines:])


def build_env(
    name: str,
    dest: Path,
    *,
    lock: Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
    install_feather: bool = False,
    engine: bool = False,
) -> EnvStatus:
    """Build (or reuse) environment `name` at `dest`; never raises for a failed build.
    `install_feather`: also install our package there (see `install_feather_into`).
    `engine`: an engine's GPU environment (feather installed too), checked by importing
    SGLang and starting `feather run`, not by running its scheduling code on this CPU."""
    self_test = _ENGINE_SELF_TEST if engine else _SELF_TEST
    status = _build_env(name, dest, lock=lock, progress=progress, self_test=self_test)
    if not ((install_feather or engine) and status.ok):
        return status
    try:
        dist_info = install_feather_into(status.path)
    except (OSError, subprocess.CalledProcessError) as exc:
        return EnvStatus(name, "skipped", status.path,
                         reason=f"could not install feather into it: {exc}")
    progress(f"{name}: feather installed ({dist_info.name})")
    if engine:
        log = status.path / "build.log"
        check = _run([str(status.python), "-m", "feather", "run", "--help"], log)
        if check.returncode != 0:
            return _skipped(name, status.path, _sha256(lock or lock_file(name)),
                            f"`feather run` does not start there:\n{_tail(log)}")
    return status


def _build_env(
    name: str,
    dest: Path,
    *,
    lock: Path | None,
    progress: Callable[[str], None],
    self_test: str = _SELF_TEST,
) -> EnvStatus:
    lock = lock if lock is not None else lock_file(name)
    dest = Path(dest).absolute()
    digest = _sha256(lock)
    previous = read_status(dest)
    reusable = previous and previous.get("status") == "ok" and previous.get("lock_sha256") == digest
    if reusable and (dest / "bin" / "python").exists() and _links_intact(dest):
        progress(f"{name}: reusing {dest}")
        return EnvStatus(name, "ok", dest, version=previous.get("sglang", ""),
                         trees=tuple(previous.get("trees", ())))
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    log = dest / "build.log"
    try:
        progress(f"{name}: creating a venv at {dest}")
        venv.EnvBuilder(with_pip=True, symlinks=True).create(dest)
        python = str(dest / "bin" / "python")
        shared_dists = shareable(lock)
        shared = link_shared(dest, shared_dists) if shared_dists else {}
        if shared:
            progress(f"{name}: linking {', '.join(f'{n} {v}' for n, v in shared.items())} "
                     "from this environment")
        to_install = _without(lock, {_normalise(n) for n in shared}, dest / "lock-unshared.txt")
        progress(f"{name}: installing {lock.name} (--no-deps; about a minute)")
        # --no-compile: byte-compiling every file of ~60 packages cost 14 s of CPU per
        # environment here; the modules SGLang's scheduling code imports compile on first use
        # --retries 1: a lock may name an index this machine cannot reach (PyTorch's CPU
        # index); pip's default retries cost ~7.7 s per package there, ~1 s for the pins here
        install = ["-m", "pip", "install", "--no-deps", "--no-input", "--no-cache-dir",
                   "--no-compile", "--retries", "1", "-r", str(to_install)]
        pip = _run([python, *install], log)
        if pip.returncode != 0:
            return _skipped(name, dest, digest, f"pip install failed:\n{_tail(log)}")
        with tempfile.TemporaryDirectory(prefix="feather-pkg-") as link_dir:
            env = {"PYTHONPATH": str(package_path_for(Path(link_dir))), "PATH": "/usr/bin:/bin"}
            check = _run([python, "-c", self_test], log, env=env)
        if check.returncode != 0:
            return _skipped(name, dest, digest, f"SGLang's classes do not work:\n{_tail(log)}")
        facts = json.loads(log.read_text().strip().splitlines()[-1])
        record = {
            "status": "ok", "name": name, "python": python, "lock": str(lock),
            "lock_sha256": digest, "sglang": facts["version"], "trees": facts["trees"],
            "shared": shared,
            "built_with": sys.version.split()[0],
        }
        write_json_atomic(dest / STATUS_FILE, record)
        progress(f"{name}: ready at {dest} (sglang {facts['version']}, trees {facts['trees']})")
        return EnvStatus(name, "ok", dest, version=facts["version"], trees=tuple(facts["trees"]))
    except OSError as exc:
        return _skipped(name, dest, digest, f"{type(exc).__name__}: {exc}")


def _skipped(name: str, dest: Path, digest: str, reason: str) -> EnvStatus:
    log = (dest / "build.log").read_text(errors="replace") if (dest / "build.log").exists() else ""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    (dest / "build.log").write_text(log)
    record = {"status": "skipped", "name": name, "lock_sha256": digest, "reason": reason}
    write_json_atomic(dest / STATUS_FILE, record)
    return EnvStatus(name, "skipped", dest, reason=reason)
