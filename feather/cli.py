"""The `feather` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

import feather


def _positive_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"sizes must be integers, e.g. 1000,10000: {text}"
        ) from exc
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive integers: {text}")
    return sizes


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


def _cmd_schedulers(args: argparse.Namespace) -> int:
    from feather.policies import resolve_scheduler, scheduler_names

    rows = []
    for name in scheduler_names():
        cls = resolve_scheduler(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        rows.append({"name": name, "class": f"{cls.__module__}:{cls.__qualname__}", "doc": doc})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['name']:<16} {row['class']:<48} {row['doc']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feather", description="Feather: prefix-aware batch formation, reproducibly measured."
    )
    parser.add_argument("--version", action="version", version=f"feather {feather.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    schedulers = commands.add_parser("schedulers", help="list the registered schedulers")
    schedulers.add_argument("--json", action="store_true", help="print JSON")
    schedulers.set_defaults(func=_cmd_schedulers)

    bench = commands.add_parser("bench", help="benchmarks that print numbers")
    benches = bench.add_subparsers(dest="bench", required=True)
    cht = benches.add_parser(
        "cht", help="batch formation with the Chunked Hash Tree vs a brute-force scan"
    )
    cht.add_argument(
        "--sizes",
        type=_positive_sizes,
        default=[1_000, 10_000, 100_000],
        help="waiting-queue sizes W, comma-separated (default 1000,10000,100000)",
    )
    cht.add_argument("--groups", type=int, default=50)
    cht.add_argument("--prefix-tokens", type=int, default=3_900)
    cht.add_argument("--suffix-tokens", type=int, default=100)
    cht.add_argument("--chunk-size", type=int, default=16)
    cht.add_argument("--batch-size", type=int, default=100)
    cht.add_argument("--seed", type=int, default=0)
    cht.add_argument(
        "--brute-budget-s",
        type=float,
        default=10.0,
        help="seconds of brute-force scanning per size (default 10)",
    )
    cht.add_argument("--json", action="store_true", help="print one JSON object")
    cht.add_argument("--quiet", action="store_true", help="no progress on stderr")
    cht.set_defaults(func=_cmd_bench_cht)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("groups", "prefix_tokens", "chunk_size", "batch_size"):
        if getattr(args, name, 1) < 1:
            print(f"feather: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if getattr(args, "suffix_tokens", 0) < 0:
        print("feather: --suffix-tokens must be >= 0", file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
