"""Compare the simulator's L2 model with the H200 measurements stored in the repository.

For each configuration the probe (`gpu/l2_probe.py`) measured under Nsight Compute, rebuild
the same block tables and predict the fraction of requested KV bytes that come from DRAM
with `feather.sim.l2` (a thread block per (sequence, KV head), sequence index fastest, 132
SMs x 4 resident programs - the probe kernel's occupancy -, L2 of 60 MiB or half of it).

    python gpu/validate_l2_model.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from feather.sim.l2 import SEQUENCE_FASTEST, KernelGrid, fast_l2  # noqa: E402

CALIBRATION = ROOT / "feather" / "sim" / "data" / "calibration"
ITEM_BYTES = 16 * 128 * 2 * 2  # one (block, KV head): 16 tokens x head_dim 128 x K,V x bf16
H200_L2_BYTES = 60 * 2**20
H200_WINDOW = 132 * 4


def _probe_module():
    spec = importlib.util.spec_from_file_location("l2_probe", ROOT / "gpu" / "l2_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["l2_probe"] = module
    spec.loader.exec_module(module)
    return module


def rows() -> list[dict]:
    probe = _probe_module()
    out = []
    for path in sorted(CALIBRATION.glob("h200-l2-probe-*.json")):
        data = json.loads(path.read_text())
        for name, run in data["ncu"]["runs"].items():
            if not run.get("metrics"):
                continue
            logical = data["configs"][name]["structure"]["logical_kv_bytes"]
            config = probe.build_config(name)
            tables = [
                tuple(t[: -(-n // 16)])
                for t, n in zip(config.block_tables, config.seq_lens, strict=True)
            ]
            predicted = {}
            for label, capacity in (("full", H200_L2_BYTES), ("half", H200_L2_BYTES // 2)):
                grid = KernelGrid(
                    heads=8,
                    window=H200_WINDOW,
                    capacity_items=capacity // ITEM_BYTES,
                    order=SEQUENCE_FASTEST,
                )
                predicted[label] = 1 - fast_l2(tables, grid).hit_rate
            unique = data["configs"][name]["structure"]["unique_kv_bytes"]
            out.append(
                {
                    "config": name,
                    "per_head_working_set_bytes": unique // 8,
                    "fits_l2": unique // 8 <= H200_L2_BYTES,
                    "measured_dram_fraction": run["metrics"]["dram__bytes_read.sum"] / logical,
                    "predicted_full_l2": predicted["full"],
                    "predicted_half_l2": predicted["half"],
                    "kernel_ms": data["configs"][name]["timing"]["median_ms"],
                }
            )
    return out


if __name__ == "__main__":
    print(
        f"{'config':24} {'measured':>9} {'model 60MiB':>12} {'model 30MiB':>12} {'kernel ms':>10}"
    )
    for r in rows():
        print(
            f"{r['config']:24} {r['measured_dram_fraction']:9.3f} {r['predicted_full_l2']:12.3f} "
            f"{r['predicted_half_l2']:12.3f} {r['kernel_ms']:10.3f}"
        )
