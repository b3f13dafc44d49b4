"""The `feather` command line. Each verb lives in its own module with a `register(commands)`
that adds its parser and handler; `build_parser()` gathers them in `feather --help`'s order,
`main()` runs one command (the console script `feather` and `python -m feather`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import feather
from feather.cli import (
    bench,
    calibrate,
    run,
    schedulers,
    simulate,
    train,
    train_engine,
    verdicts,
    vllm,
    workload,
)
from feather.cli.common import _input_errors, _Parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every verb's parser, in the order `feather --help` lists them."""
    from feather.engines.vllm.online_cli import register as register_online
    from feather.overhead.cli import register as register_overhead
    from feather.sim.sched_cost_cli import register as register_sched_cost

    parser = _Parser(
        prog="feather", description="Feather: prefix-aware batch formation, reproducibly measured."
    )
    parser.add_argument("--version", action="version", version=f"feather {feather.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for register in (
        vllm.register,
        schedulers.register,
        bench.register,
        register_overhead,
        register_sched_cost,
        register_online,
        workload.register,
        simulate.register,
        train.register,
        train_engine.register,
        run.register,
        calibrate.register,
        verdicts.register,
    ):
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (2: bad input, said in one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["vllm"]:  # vLLM's own CLI: every argument after `vllm` is vLLM's
        from feather.engines.vllm.cli import run_vllm_cli

        return run_vllm_cli(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (2), or --help / --version (0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except _input_errors() as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"feather {args.command}: {message}", file=sys.stderr)
        return 2
