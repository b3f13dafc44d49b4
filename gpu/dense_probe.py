"""Time a decode step's dense kernels on a GPU: Llama-3.1-8B's GEMMs over batch sizes.

The simulator prices the dense part of a step as max(weight bytes / DRAM rate, GEMM FLOPs /
peak). This measures what that part really costs: each of one layer's GEMMs (QKV, O,
gate+up, down) and the LM head, bf16, for token counts from 1 to 8,192, with CUDA-event
timing (warm-up, then the median of repeats), and writes `$OUT/dense_probe.json`.

    python gpu/dense_probe.py          # needs only PyTorch with CUDA; ~1 minute on an H200
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

HIDDEN = 4096
GEMMS = {  # (in features, out features) of Llama-3.1-8B's linear layers (config.json)
    "qkv": (4096, 4096 + 2 * 1024),
    "o": (4096, 4096),
    "gate_up": (4096, 2 * 14336),
    "down": (14336, 4096),
}
LM_HEAD = (4096, 128256)
LAYERS = 32
TOKENS = (1, 8, 32, 64, 100, 128, 256, 512, 800, 1024, 2048, 4096, 8192)
WARMUP, REPEATS = 5, 20
BUDGET_S = 150.0


def main() -> int:
    import torch

    start = time.monotonic()
    out_dir = Path(os.environ.get("OUT", "gpu_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    result: dict = {
        "schema": "feather.dense_probe/1",
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tokens": list(TOKENS),
        "gemms": {},
    }
    shapes = {**GEMMS, "lm_head": LM_HEAD}
    weights = {
        name: torch.randn(n_out, n_in, device=device, dtype=torch.bfloat16) * 0.02
        for name, (n_in, n_out) in shapes.items()
    }
    for name, (n_in, n_out) in shapes.items():
        rows = []
        for tokens in TOKENS:
            if time.monotonic() - start > BUDGET_S:
                break
            x = torch.randn(tokens, n_in, device=device, dtype=torch.bfloat16)
            for _ in range(WARMUP):
                torch.nn.functional.linear(x, weights[name])
            times = []
            for _ in range(REPEATS):
                begin, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                begin.record()
                torch.nn.functional.linear(x, weights[name])
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end) / 1e3)
            median = statistics.median(times)
            rows.append(
                {
                    "tokens": tokens,
                    "median_s": median,
                    "weight_bytes": n_in * n_out * 2,
                    "flops": 2 * tokens * n_in * n_out,
                    "weight_bytes_per_s": n_in * n_out * 2 / median,
                    "flops_per_s": 2 * tokens * n_in * n_out / median,
                }
            )
        result["gemms"][name] = rows
        print(
            f"{name}: " + ", ".join(f"{r['tokens']}:{r['median_s'] * 1e6:.0f}us" for r in rows),
            flush=True,
        )
    per_layer = {}
    for i, tokens in enumerate(TOKENS):
        try:
            layer = sum(result["gemms"][g][i]["median_s"] for g in GEMMS)
            per_layer[tokens] = {
                "layer_dense_s": layer,
                "step_dense_s": LAYERS * layer + result["gemms"]["lm_head"][i]["median_s"],
            }
        except (IndexError, KeyError):
            break
    result["per_step"] = per_layer
    result["elapsed_s"] = time.monotonic() - start
    (out_dir / "dense_probe.json").write_text(json.dumps(result, indent=2))
    for tokens, row in per_layer.items():
        print(f"{tokens:>5} tokens: dense part of a step {row['step_dense_s'] * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
