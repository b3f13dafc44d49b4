"""`feather workload build|retime|stats`: build and inspect workload files."""

from __future__ import annotations

import argparse
import json
from typing import Any

from feather.cli_values import fraction, nonnegative_int, positive_int, seed


def _cmd_workload_build(args: argparse.Namespace) -> int:
    from feather.workloads import BuildOptions, build, write_workload
    from feather.workloads.builder import stderr_progress

    options = BuildOptions(
        model=args.model,
        max_context=args.max_context,
        overlength=args.overlength,
        min_prefix_tokens=args.min_prefix_tokens,
        max_prefix_tokens=args.max_prefix_tokens,
        min_per_group=args.min_per_group,
        max_per_group=args.max_per_group,
        max_groups=args.max_groups,
        output=args.output,
        output_cap=args.output_cap,
        arrival=args.arrival,
        order=args.order,
        unshared_fraction=args.unshared_fraction,
        add_bos=not args.no_bos,
        seed=args.seed,
    )
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    workload = build(
        args.source,
        tasks=tasks,
        data_dir=args.data_dir,
        raw_dir=args.raw_dir,
        tokenizer=args.tokenizer,
        options=options,
        chat=args.chat_template,
        progress=None if args.quiet else stderr_progress,
    )
    path = write_workload(workload, args.out)
    stats = workload.statistics
    print(
        f"wrote {path}: {stats['requests']} requests, {stats['groups']} groups "
        f"({stats['groups_with_2plus_requests']} with 2+ requests), sidecar {path}.json"
    )
    return 0


def _cmd_workload_retime(args: argparse.Namespace) -> int:
    from feather.workloads import read_workload, write_workload
    from feather.workloads.retime import retime, retime_at_load

    if (args.arrival is None) == (args.load is None):
        raise SystemExit("feather workload retime: give --arrival or --load (with --capacity)")
    if args.load is not None and not args.capacity:
        raise SystemExit("feather workload retime: --load needs --capacity SUMMARY.json")
    base = read_workload(args.base)
    workload = (
        retime(base, args.arrival, args.seed)
        if args.arrival is not None
        else retime_at_load(base, args.capacity, args.load, args.seed)
    )
    path = write_workload(workload, args.out)
    print(f"wrote {path}: {len(workload)} requests, arrivals "
          f"{workload.provenance['retimed']['arrival']} over "
          f"{workload.statistics['arrival_span_s']:.1f} s")
    return 0


def _cmd_workload_stats(args: argparse.Namespace) -> int:
    from feather.workloads import read_workload

    workload = read_workload(args.file)
    stats = workload.statistics
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    prefix = stats.get("shared_prefix_tokens_per_group", {})
    print(
        f"{args.file}: {stats['requests']} requests in {stats['groups']} groups, "
        f"{stats['groups_with_2plus_requests']} groups with 2+ requests"
    )
    if prefix:
        print(
            f"shared prefix tokens per group: min {prefix['min']}, median {prefix['p50']}, "
            f"max {prefix['max']}; {stats['shared_groups_with_prefix_1k_to_10k']} groups "
            f"between 1K and 10K tokens"
        )
    print(
        f"fraction of prompt tokens in a shared prefix: "
        f"{stats['fraction_prompt_tokens_in_shared_prefix']:.3f}"
    )
    for task, row in stats.get("per_task", {}).items():
        print(
            f"  {task:<28} {row['requests']:>6} requests {row['groups']:>5} groups "
            f"{row['groups_2plus']:>5} with 2+"
        )
    return 0


def register(commands: Any) -> None:
    """Add `workload` and its subcommands."""
    workload = commands.add_parser("workload", help="build and inspect workloads")
    workloads = workload.add_subparsers(dest="workload", required=True)
    for add in (_add_build, _add_retime, _add_stats):
        add(workloads)


def _add_build(workloads: Any) -> None:
    wb = workloads.add_parser(
        "build", help="build a workload file from L-Eval, LongBench or a synthetic spec"
    )
    wb.add_argument(
        "--source",
        required=True,
        help="leval, longbench, or synthetic:key=value,... (see feather.workloads)",
    )
    wb.add_argument("--tasks", help="comma-separated task names (default: all available)")
    wb.add_argument(
        "--data-dir",
        help="local directory of the benchmark's files in the hub's "
        "layout (default: download from the HuggingFace hub)",
    )
    wb.add_argument(
        "--raw-dir",
        default="data/raw",
        help="where downloads and unpacked archives go (default data/raw)",
    )
    wb.add_argument(
        "--tokenizer",
        help="tokenizer.json / tokenizer.model file or directory "
        "(default: the 32,000-token SentencePiece model shipped in mistral-common)",
    )
    wb.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="model whose context the prompts must fit (default llama-3.1-8b)",
    )
    wb.add_argument(
        "--max-context", type=positive_int, help="context length in tokens (overrides --model)"
    )
    wb.add_argument("--overlength", choices=["truncate", "reject"], default="truncate")
    wb.add_argument("--min-prefix-tokens", type=nonnegative_int, default=1_000)
    wb.add_argument("--max-prefix-tokens", type=positive_int, default=10_000)
    wb.add_argument("--min-per-group", type=positive_int, default=1)
    wb.add_argument("--max-per-group", type=positive_int)
    wb.add_argument(
        "--max-groups", type=positive_int, help="keep at most this many groups (seeded)"
    )
    wb.add_argument(
        "--output",
        default="reference",
        help="'reference' (reference answer length) or a fixed token count",
    )
    wb.add_argument("--output-cap", type=positive_int, help="cap on reference-based output lengths")
    wb.add_argument(
        "--arrival", default="all", help="all | poisson:RATE | bursts:SIZE:INTERVAL_S (default all)"
    )
    wb.add_argument("--order", choices=["grouped", "shuffled", "interleaved"], default="grouped")
    wb.add_argument(
        "--unshared-fraction",
        type=fraction,
        default=0.0,
        help="fraction of requests made to share no prefix (claim C6)",
    )
    wb.add_argument(
        "--chat-template",
        choices=["vicuna", "none"],
        default="vicuna",
        help="LongBench only: wrap prompts in a chat template as pred.py does",
    )
    wb.add_argument("--no-bos", action="store_true", help="do not start prompts with BOS")
    wb.add_argument("--seed", type=seed, default=0)
    wb.add_argument("--out", required=True, help="output .parquet file (sidecar: <out>.json)")
    wb.add_argument("--quiet", action="store_true", help="no progress on stderr")
    wb.set_defaults(func=_cmd_workload_build)


def _add_retime(workloads: Any) -> None:
    wr = workloads.add_parser(
        "retime", help="the same requests in the same order, with new arrival times"
    )
    wr.add_argument("base", help="a built workload .parquet")
    wr.add_argument("--arrival", help="all | poisson:RATE | bursts:SIZE:INTERVAL_S")
    wr.add_argument(
        "--load", type=float, help="Poisson arrivals at this fraction of --capacity's requests/s"
    )
    wr.add_argument("--capacity", help="summary.json of an offline run (FCFS: the capacity)")
    wr.add_argument("--seed", type=int, default=0, help="seed of the arrival process")
    wr.add_argument("--out", required=True, help="output .parquet file (sidecar: <out>.json)")
    wr.set_defaults(func=_cmd_workload_retime)


def _add_stats(workloads: Any) -> None:
    ws = workloads.add_parser("stats", help="statistics of a workload file")
    ws.add_argument("file")
    ws.add_argument("--json", action="store_true", help="print JSON")
    ws.set_defaults(func=_cmd_workload_stats)
