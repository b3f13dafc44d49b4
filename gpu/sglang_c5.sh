#!/usr/bin/env bash
# C5 on a GPU box with the real SGLang: its native fcfs, lpm, dfs-weight, and Feather's
# policies inside SGLang as its plugin, on a small L-Eval workload.
#
#   bash gpu/sglang_c5.sh [OUT_DIR]        (repository root; default OUT_DIR: gpu_out/sglang_c5)
#
# UNTESTED: no GPU machine available to the team has SGLang installed or network access.
# Written against sglang 0.5.23, whose scheduling code (SchedulePolicy, PrefillAdder, radix
# cache, plugin loader) the CPU tests drive with the plugin (tests/test_sglang_plugin.py);
# the Engine, its scheduler process and model runner have never run with it.
#
# What it does, all into OUT_DIR:
#  1. a venv `.venv-sglang` from requirements-sglang-cuda.lock (sglang 0.5.23, its own CUDA
#     PyTorch) and feather installed editable, which registers the plugin's entry point
#     (network needed once; the workflow's own SGLang jobs build the same in .envs/);
#  2. a small L-Eval workload (8 documents x 6 questions, 1K-4K-token prefixes, interleaved,
#     64 output tokens), from LEVAL_DIR (hub layout) or downloaded from the hub;
#  3. `feather run --engine sglang` on llama-3.1-8b (dummy weights, config.json only) for
#     fcfs, lpm, dfs-weight (SGLang's own policies, untouched) and feather-static/ucb/qlearn
#     (SGLang with --schedule-policy fcfs and our plugin), 3 repeats each, one engine start
#     per scheduler, the cache flushed before each repeat.
# Each run directory holds trace.parquet (per step), requests.parquet, summary.json with
# provenance (SGLang version, attention backend) and nvml.parquet; OUT_DIR/summary.csv
# tabulates them. Expect 10-30 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_out/sglang_c5}
VENV=${VENV:-.venv-sglang}
MODEL=${MODEL:-llama-3.1-8b}
REPEATS=${REPEATS:-3}
SCHEDULERS=(fcfs lpm dfs-weight feather-static feather-ucb feather-qlearn)
read -r -a SHAPE <<< "${SHAPE:---min-prefix-tokens 1000 --max-prefix-tokens 4000 --min-per-group 6 --max-per-group 6 --max-groups 8 --output 64 --order interleaved}"
# engine limits (feather run flags), e.g. RUN_ARGS="--max-num-seqs 64"
read -r -a RUN_ARGS <<< "${RUN_ARGS:-}"
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"

if [ ! -x "$VENV/bin/feather" ]; then
  python3 -m venv "$VENV"
  # SGLang 0.5.23 for a GPU with every pin (its own torch 2.14.1 among them), then feather and
  # its entry point, without resolving: the lock is complete (--retries 1: see install.sh)
  "$VENV/bin/pip" install --retries 1 --no-deps -r requirements-sglang-cuda.lock
  "$VENV/bin/pip" install --no-deps -e .
fi
"$VENV/bin/python" -P - <<'PY'
import importlib.metadata as m
import torch, sglang
assert torch.cuda.is_available(), "CUDA PyTorch sees no GPU"
plugins = {ep.name: ep.value for ep in m.entry_points(group="sglang.srt.plugins")}
assert "feather" in plugins, f"feather's plugin is not installed beside sglang: {plugins}"
print("sglang", sglang.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))
PY

WORKLOAD="$OUT/leval_small.parquet"
if [ ! -f "$WORKLOAD" ]; then
  data=()
  if [ -n "${LEVAL_DIR:-}" ]; then data=(--data-dir "$LEVAL_DIR"); fi
  "$VENV/bin/feather" workload build --source leval "${data[@]}" --model "$MODEL" "${SHAPE[@]}" \
    --out "$WORKLOAD"
fi

sched_args=()
for s in "${SCHEDULERS[@]}"; do sched_args+=(--scheduler "$s"); done
"$VENV/bin/feather" run --engine sglang --model "$MODEL" --workload "$WORKLOAD" \
  "${sched_args[@]}" --repeats "$REPEATS" "${RUN_ARGS[@]}" --out "$OUT/sglang" \
  2>&1 | tee "$OUT/sglang.log"

"$VENV/bin/python" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
out = Path(sys.argv[1])
rows = []
for path in sorted(out.glob("sglang/*/summary.json")):
    s = json.loads(path.read_text())
    rows.append({"run": path.parent.name, "output_tok_s": s["output_tok_s"],
                 "makespan_s": s.get("makespan_s"),
                 "prefix_cache_hit_rate": s.get("prefix_cache_hit_rate"),
                 "mean_batch_size": s.get("mean_batch_size"),
                 "mean_distinct_groups": s.get("mean_distinct_groups"),
                 "decisions_stop": s.get("decisions_stop"),
                 "sched_cpu_fraction_of_step_time": s.get("sched_cpu_fraction_of_step_time")})
table = pd.DataFrame(rows)
table.to_csv(out / "summary.csv", index=False)
print(table.to_string(index=False))
PY
echo "results: $OUT (summary.csv)"
