#!/usr/bin/env bash
# Decode kernels on a bare GPU machine: paged vs cascade vs pat (PyTorch and Triton), NVML
# counters, and Nsight Compute's L2 hit rate / DRAM bytes where ncu works.
#
#   bash gpu/kernels.sh OUTDIR            # at most ~5 minutes; everything goes to OUTDIR
#   bash gpu/kernels.sh OUTDIR --no-ncu   # extra arguments go to gpu/kernel_bench.py
#
# Needs PyTorch (CUDA), Triton and nvidia-ml-py; installs nothing, needs no network.
# A dry run on a CPU: bash gpu/kernels.sh OUTDIR --device cpu --quick
set -u
if [ $# -lt 1 ]; then
    echo "usage: bash gpu/kernels.sh OUTDIR [kernel_bench.py options]" >&2
    exit 2
fi
out=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
py=${PYTHON:-$(command -v python3 || command -v python)}
# the script's own watchdog ends it at ~288 s; timeout is the backstop
timeout -k 5 295 "$py" "$here/kernel_bench.py" --out "$out" "$@" 2>&1 | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
