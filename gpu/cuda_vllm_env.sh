# Sourced by the scripts that run CUDA vLLM (vllm_c5.sh, vllm_attention.sh): records the GPU in
# $OUT/gpu.csv, makes the venv $VENV with CUDA vLLM 0.32.0 and feather unless it exists
# (network needed once), and stops unless its PyTorch sees the GPU.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"

if [ ! -x "$VENV/bin/feather" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install "vllm==0.32.0"
  "$VENV/bin/pip" install -e .    # feather's own deps; torch stays vLLM's CUDA build
fi
"$VENV/bin/python" - <<'PY'
import torch, vllm
assert torch.cuda.is_available(), "CUDA PyTorch sees no GPU"
print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))
PY
