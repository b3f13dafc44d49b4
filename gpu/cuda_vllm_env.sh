# Sourced by the scripts that run CUDA vLLM (vllm_c5.sh, vllm_attention.sh): records the GPU in
# $OUT/gpu.csv, makes the venv $VENV from requirements-cuda.lock (CUDA vLLM 0.32.0, its torch,
# feather; install.sh, network needed once) unless it holds that lock already, and stops
# unless its PyTorch sees the GPU.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"

if [ "$(cut -d' ' -f1 "$VENV/feather-lock.txt" 2>/dev/null)" != requirements-cuda.lock ] \
    || [ ! -x "$VENV/bin/feather" ]; then
  FEATHER_LOCK=cuda bash install.sh "$VENV"
fi
"$VENV/bin/python" - <<'PY'
import torch, vllm
assert torch.cuda.is_available(), "CUDA PyTorch sees no GPU"
print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))
PY
