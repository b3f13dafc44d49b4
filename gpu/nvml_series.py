"""Record a real NVML time series around decode-attention load, through feather's sampler.

Runs `feather.telemetry.NvmlSampler` (the sampler every runner uses) every ~20 ms through four
phases - idle, back-to-back launches of the paged decode kernel over 800 unshared sequences
(DRAM-bound), over 800 sequences sharing one prefix (L2-bound), idle again - and labels each
sample with its phase. Writes `$OUT/nvml_series.json` (the schema of
tests/fixtures/h200_nvml_series.json: copy it there to refresh the fixture), `$OUT/nvml.parquet`
and prints per-phase means, so one look shows whether the counters move: memory-controller
utilisation and GPM DRAM bandwidth should rise in the unshared phase and stay low when shared.

    python gpu/nvml_series.py       # ~20 s on an H200
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from bisect import bisect_right
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PERIOD_MS = 20.0
PHASE_S = {
    "idle_before": 2.0,
    "decode_unshared_800": 4.0,
    "decode_homog_800": 4.0,
    "idle_after": 2.0,
}
SHOWN = ("sm_util_pct", "mem_util_pct", "power_w", "gpm_dram_bw_util_pct")


def main() -> int:
    import torch

    from feather.kernels.paged_decode import paged_decode_triton
    from feather.telemetry import NvmlSampler
    from feather.telemetry.devices import gpu_facts

    out = Path(os.environ.get("OUT", "gpu_out"))
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    block, seqs, tokens, heads, kv_heads, dim = 16, 800, 4000, 32, 8, 128
    blocks_per_seq = tokens // block
    inputs = {}
    for name, shared in (("decode_unshared_800", False), ("decode_homog_800", True)):
        num_blocks = blocks_per_seq if shared else seqs * blocks_per_seq
        tables = torch.arange(blocks_per_seq, dtype=torch.int32, device=device).repeat(seqs, 1)
        if not shared:
            tables = (
                tables
                + blocks_per_seq * torch.arange(seqs, dtype=torch.int32, device=device)[:, None]
            )
        k = torch.randn(num_blocks, block, kv_heads, dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(seqs, heads, dim, device=device, dtype=torch.bfloat16)
        lens = torch.full((seqs,), tokens, dtype=torch.int32, device=device)
        inputs[name] = (q, k, v, tables, lens)
        paged_decode_triton(q, k, v, tables, lens, dim**-0.5)  # compile outside the series
    torch.cuda.synchronize()
    launches = {}
    marks: list[tuple[float, str]] = []  # (seconds since the sampler's start, phase)
    with NvmlSampler(out / "nvml.parquet", interval_ms=PERIOD_MS) as sampler:
        if sampler.started_monotonic is None:
            print("NVML unavailable:", sampler.record["reason"], flush=True)
            return 1
        for name, seconds in PHASE_S.items():
            marks.append((time.monotonic() - sampler.started_monotonic, name))
            end = time.monotonic() + seconds
            count = 0
            while time.monotonic() < end:
                if name in inputs:
                    for _ in range(8):
                        paged_decode_triton(*inputs[name], dim**-0.5)
                    torch.cuda.synchronize()
                    count += 8
                else:
                    time.sleep(0.05)
            launches[name] = count
    record = sampler.record
    starts = [t for t, _ in marks]
    samples = []
    for row in sampler.table().to_pylist():
        phase = marks[max(0, bisect_right(starts, row["t_s"]) - 1)][1]
        samples.append({"t_s": row.pop("t_s"), "phase": phase, **row})
    facts = gpu_facts()["nvml"]
    gpu = record["gpus"][0]
    result = {
        "schema": "feather.nvml_series/1",
        "sampler": "feather.telemetry.NvmlSampler",
        "gpu": gpu["name"],
        "driver": facts.get("driver_version"),
        "nvml_version": facts.get("nvml_version"),
        "period_s": PERIOD_MS / 1000.0,
        "phases_s": PHASE_S,
        "launches": launches,
        "field_errors": gpu["field_errors"],
        "record": record,
        "samples": samples,
    }
    (out / "nvml_series.json").write_text(json.dumps(result, indent=1, default=str))
    for name in PHASE_S:
        rows = [s for s in samples if s["phase"] == name and s["gpu"] == 0]
        means = {}
        for key in SHOWN:
            values = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            means[key] = round(sum(values) / len(values), 1) if values else None
        print(name, len(rows), "samples", means, flush=True)
    print("field errors:", gpu["field_errors"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
