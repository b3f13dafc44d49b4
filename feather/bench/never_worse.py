"""`feather bench never-worse`: every Feather policy against FCFS, case by case.

The promise (claim C6 and the paper's "no worse than the status quo", read for every
workload): each Feather policy - feather-static, feather-ucb and feather-qlearn learning
online (exploration included), their conservative variants learning online
(`feather-ucb-conservative`, `feather-qlearn-conservative`: exploring within a budget) and
both learners frozen with a trained table - reaches at
least `THROUGHPUT_FLOOR` x FCFS's output throughput, and below saturation its TTFT p99 and
longest wait stay within `LATENCY_CEILING` x FCFS's.

A case is one simulated setting (workload, hardware, kernel, engine mode, KV pool). The
property test (tests/test_never_worse.py) draws small cases from a family; `LARGE_CASES` are
the pipeline-scale shapes where Feather used to lose (C1's shape, nested prefixes) and the
cascade regime where its rule is consulted. `from_summary` adds every workload the pipeline
ran anyway (results/summary.parquet): the minimum Feather / FCFS per setting that ran both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feather.engine_limits import DEFAULT_MAX_NUM_SEQS
from feather.sim.run import SimulationSpec, simulate
from feather.workloads import Workload, load_workload

THROUGHPUT_FLOOR = 0.99
LATENCY_CEILING = 1.1
LEARNERS = ("feather-ucb", "feather-qlearn")
# the learners exploring within a budget (feather/policies/conservative.py), run online
CONSERVATIVE_LEARNERS = ("feather-ucb-conservative", "feather-qlearn-conservative")


@dataclass(frozen=True)
class Case:
    """One setting; `below_saturation` marks arrivals slower than FCFS's capacity (latency
    is then compared as well)."""

    name: str
    workload: str
    hardware: str = "a100-80gb"
    model: str = "llama-3.1-8b"
    kernel: str = "paged"
    engine_mode: str = "vllm"
    kv_pool_fraction: float | None = None
    num_blocks: int | None = None
    below_saturation: bool = False
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    block_size: int = 16
    max_num_batched_tokens: int = 8192

    def spec(self, scheduler: str, params: dict[str, Any] | None = None) -> SimulationSpec:
        return SimulationSpec(
            workload=self.workload,
            scheduler=scheduler,
            hardware=self.hardware,
            model=self.model,
            kernel=self.kernel,
            engine_mode=self.engine_mode,
            kv_pool_fraction=self.kv_pool_fraction,
            num_blocks=self.num_blocks,
            max_num_seqs=self.max_num_seqs,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            scheduler_params=params or {},
        )


C1 = "synthetic:groups=8,per_group=100,prefix=4000,suffix=100,output=128,order=shuffled,seed=0"
NESTED = (
    "synthetic:groups=40,per_group=12,prefix=4000,system=2000,suffix=60,output=128,"
    "order=shuffled,seed=0"
)
TINY = "synthetic:groups=60,per_group=8,prefix=4000,suffix=60,output=128,order=shuffled,seed=0"
# C1's shape arriving at 0.9x FCFS's offline capacity on the A100 with cascade attention (25
# requests/s: 3,198 output tokens/s / 128 tokens), where the A100 tables STOP when offline
C1_POISSON = (
    "synthetic:groups=8,per_group=100,prefix=4000,suffix=100,output=128,order=shuffled,"
    "arrival=poisson:22.5,seed=3"
)
LARGE_CASES = (
    Case("c1-shape", C1),
    Case("c1-shape", C1, hardware="rtx-6000-ada"),
    Case("nested-prefixes", NESTED, hardware="rtx-6000-ada"),
    Case("c1-shape-cascade", C1, kernel="cascade"),
    Case("c1-shape-cascade", C1, hardware="rtx-6000-ada", kernel="cascade"),
    Case("tiny-groups-cascade", TINY, kernel="cascade"),
    Case("c1-shape-cascade-poisson-0.9", C1_POISSON, kernel="cascade", below_saturation=True),
)


@dataclass
class Variant:
    """A Feather policy as the bench runs it."""

    label: str
    scheduler: str
    params: dict[str, Any] = field(default_factory=dict)


def variants(
    policy_files: dict[str, str | Path] | None = None, hardware: str | None = None
) -> list[Variant]:
    """feather-static, both learners and both conservative learners learning online from
    scratch, and both learners frozen where a trained table is given. Keys are a learner
    (`feather-ucb`) or a learner for one device (`feather-ucb@rtx-6000-ada`): a case on
    `hardware` deploys that device's table, or an unscoped one; a table trained for another
    device only is not deployed (the boundary of the regime where stopping pays is the
    device's: docs/stop.md)."""
    out = [Variant("feather-static", "feather-static")]
    out += [Variant(f"{name} (online)", name) for name in LEARNERS + CONSERVATIVE_LEARNERS]
    files = dict(policy_files or {})
    for name in LEARNERS:
        path = files.get(f"{name}@{hardware}") if hardware else None
        path = path or files.get(name)
        if path is not None:
            frozen = {"policy_file": str(path), "frozen": True}
            out.append(Variant(f"{name} (frozen)", name, frozen))
    return out


def _metrics(summary: dict[str, Any], trace: Any) -> dict[str, Any]:
    return {
        "output_tok_s": summary["output_tok_s"],
        "ttft_p99_s": summary["ttft_s"]["p99"],
        "longest_wait_s": summary["longest_wait_s"],
        "mean_batch_size": summary["mean_batch_size"],
        "stop_decisions": int(sum(trace.column("decisions_stop").to_pylist())),
        "delegated_decisions": int(
            sum(trace.column("decisions_stop").to_pylist())
            + sum(trace.column("decisions_add").to_pylist())
        ),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else math.inf)


def compare(
    case: Case,
    policies: Sequence[Variant],
    workload: Workload | None = None,
) -> dict[str, Any]:
    """FCFS and every variant on one case: throughput ratios and, below saturation, latency."""
    workload = workload or load_workload(case.workload)
    fcfs_run = simulate(case.spec("fcfs"), workload=workload)
    fcfs = _metrics(fcfs_run.summary, fcfs_run.trace)
    rows = {}
    for variant in policies:
        run = simulate(case.spec(variant.scheduler, variant.params), workload=workload)
        mine = _metrics(run.summary, run.trace)
        mine["throughput_ratio"] = _ratio(mine["output_tok_s"], fcfs["output_tok_s"])
        if case.below_saturation:
            mine["ttft_p99_ratio"] = _ratio(mine["ttft_p99_s"], fcfs["ttft_p99_s"])
            mine["longest_wait_ratio"] = _ratio(mine["longest_wait_s"], fcfs["longest_wait_s"])
        rows[variant.label] = mine
    return {"case": asdict(case), "fcfs": fcfs, "feather": rows}


def violations(result: dict[str, Any]) -> list[str]:
    """What a result breaks of the promise, in words (empty: it holds)."""
    out = []
    for label, row in result["feather"].items():
        if "median_at_or_above_fcfs_min" in row:  # a real engine: its spread is the measure
            if not row["median_at_or_above_fcfs_min"]:
                out.append(f"{label}: median below FCFS's slowest repeat")
        elif row["throughput_ratio"] < THROUGHPUT_FLOOR:
            out.append(f"{label}: {row['throughput_ratio']:.3f}x FCFS throughput")
        for key in ("ttft_p99_ratio", "longest_wait_ratio"):
            if row.get(key, 0.0) > LATENCY_CEILING:
                out.append(f"{label}: {key} {row[key]:.3f}")
    return out


def run(
    cases: Iterable[Case] = LARGE_CASES,
    policy_files: dict[str, str | Path] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    results = []
    for case in cases:
        result = compare(case, variants(policy_files, case.hardware))
        results.append(result)
        if progress is not None:
            worst = min(r["throughput_ratio"] for r in result["feather"].values())
            progress(f"{case.name} ({case.hardware}, {case.kernel}): min Feather/FCFS {worst:.3f}")
    return results


# ---- the pipeline's own runs -------------------------------------------------------------------
_SETTING = (
    "experiment",
    "hardware",
    "engine",
    "model",
    "workload",
    "kernel",
    "engine_mode",
    "kv_pool_tokens",
)


def label_of(scheduler: str, params: dict[str, Any] | None = None) -> str:
    """The bench's label for a pipeline run's Feather scheduler."""
    if scheduler in LEARNERS:
        return f"{scheduler} (frozen)" if (params or {}).get("frozen") else f"{scheduler} (online)"
    return scheduler


def from_summary(table: Any) -> list[dict[str, Any]]:
    """Feather / FCFS for every setting of results/summary.parquet that ran FCFS and a Feather
    policy (same experiment, hardware, engine, model, workload, kernel, mode and KV pool);
    below saturation (load_factor < 1) the latency ratios too."""
    frame = table.copy()
    keys = [k for k in _SETTING if k in frame.columns]
    for key in keys:
        frame[key] = frame[key].astype(str)
    out = []
    for setting, rows in frame.groupby(keys, dropna=False):
        schedulers = rows["scheduler"].astype(str)
        fcfs = rows[schedulers == "fcfs"]
        feather = rows[schedulers.str.startswith("feather")]
        if fcfs.empty or feather.empty:
            continue
        entry: dict[str, Any] = dict(zip(keys, setting, strict=True))
        load = rows["load_factor"].iloc[0] if "load_factor" in rows.columns else None
        below = load is not None and not _missing(load) and float(load) < 1.0
        entry["load_factor"] = None if load is None or _missing(load) else float(load)
        entry["fcfs_tok_s"] = statistics.fmean(fcfs["output_tok_s"])
        entry["feather"] = {}
        for scheduler, mine in feather.groupby(feather["scheduler"].astype(str)):
            row = {
                "throughput_ratio": statistics.fmean(mine["output_tok_s"]) / entry["fcfs_tok_s"]
            }
            if len(mine) > 1 and len(fcfs) > 1:  # a real engine's repeats: median vs worst
                row["median_tok_s"] = statistics.median(mine["output_tok_s"])
                row["fcfs_min_tok_s"] = min(fcfs["output_tok_s"])
                row["median_at_or_above_fcfs_min"] = bool(
                    row["median_tok_s"] >= row["fcfs_min_tok_s"]
                )
            if below:
                for column in ("ttft_p99_s", "longest_wait_s"):
                    key = column.replace("_s", "_ratio")
                    row[key] = _ratio(
                        statistics.fmean(mine[column]), statistics.fmean(fcfs[column])
                    )
            entry["feather"][label_of(scheduler)] = row
        out.append(entry)
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def minimum_by_policy(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per Feather policy: the smallest throughput ratio and where, the largest latency ratios
    (below saturation), and how many settings it ran."""
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        case = result.get("case") or {}
        where = " / ".join(
            str(x)
            for x in (
                case.get("name") or result.get("experiment"),
                case.get("workload") or result.get("workload"),
                case.get("hardware") or result.get("hardware"),
                case.get("kernel") or result.get("kernel"),
                case.get("engine_mode") or result.get("engine_mode"),
            )
            if x
        )
        for label, row in result["feather"].items():
            mine = out.setdefault(label, {"min_throughput_ratio": math.inf, "settings": 0})
            if "median_at_or_above_fcfs_min" in row:  # a real engine's repeats: their own test
                real = mine.setdefault("real_engine", [])
                real.append(
                    {
                        "where": where,
                        "median_over_fcfs_min": row["median_tok_s"] / row["fcfs_min_tok_s"],
                        "median_at_or_above_fcfs_min": row["median_at_or_above_fcfs_min"],
                    }
                )
                continue
            mine["settings"] += 1
            if row["throughput_ratio"] < mine["min_throughput_ratio"]:
                mine["min_throughput_ratio"] = row["throughput_ratio"]
                mine["where"] = where
            for key in ("ttft_p99_ratio", "longest_wait_ratio"):
                if key in row and row[key] > mine.get(f"max_{key}", -math.inf):
                    mine[f"max_{key}"] = row[key]
                    mine[f"max_{key}_where"] = where
    return out


def format_table(results: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'case':<24} {'hardware':<14} {'kernel':<8} {'policy':<24} {'x FCFS':>7}"]
    for result in results:
        case = result["case"]
        for label, row in result["feather"].items():
            lines.append(
                f"{case['name']:<24} {case['hardware']:<14} {case['kernel']:<8} {label:<24} "
                f"{row['throughput_ratio']:7.3f}"
            )
    return "\n".join(lines)
