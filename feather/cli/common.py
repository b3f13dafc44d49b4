"""What the verbs share: the parser class whose errors are one line, flag value types, the
engine-limit flags (declared once so `simulate`, `train` and `run` cannot drift apart), and
what bad input raises."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import NoReturn, TypeVar

from feather.cli_values import positive_int
from feather.engine_limits import DEFAULT_MAX_NUM_SEQS

T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    """Argument errors in one line (no usage block): the flag, what was wrong, where to look."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # a value's line breaks stay out of the line
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _positive_sizes(text: str) -> list[int]:
    """Comma-separated positive sizes (e.g. 1000,10000): checked while argparse reads them."""
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"sizes must be integers, e.g. 1000,10000: {text!r}"
        ) from exc
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive integers: {text!r}")
    return sizes


def _parse_params(items: list[str] | None, scheduler: str) -> dict:
    """`key=value` pairs; values are JSON where they parse as JSON, else strings. Checked
    against the scheduler's class here, before any workload is read."""
    from feather.policies import check_scheduler_params

    params: dict = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param expects key=value, got {item!r}")
        if key in params:
            raise ValueError(f"--param {key} is given twice")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    check_scheduler_params(scheduler, params, where="--param")
    return params


def add_engine_limits(
    parser: argparse.ArgumentParser,
    *,
    max_num_batched_tokens: int | None = 8192,
    block_size: int | None = 16,
    num_blocks_help: str = "KV pool size (default: from memory)",
    block_size_help: str | None = None,
) -> None:
    """`--max-num-seqs`, `--max-num-batched-tokens`, `--num-blocks`, `--block-size`: one type
    (positive_int) and one max_num_seqs default for every command that sizes an engine. The
    defaults are the simulator's; a real engine passes None for its own."""
    parser.add_argument("--max-num-seqs", type=positive_int, default=DEFAULT_MAX_NUM_SEQS)
    parser.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=max_num_batched_tokens
    )
    parser.add_argument("--num-blocks", type=positive_int, help=num_blocks_help)
    parser.add_argument("--block-size", type=positive_int, default=block_size,
                        help=block_size_help)


def add_spec(parser: argparse.ArgumentParser, what: str) -> None:
    """`--spec`: the whole job as the pipeline specifies it, instead of the flags that describe
    it. Call after those flags: their defaults are what `refuse_flags_beside_spec` checks."""
    parser.add_argument(
        "--spec", metavar="JSON|FILE", help=f"{what}, instead of the flags above"
    )
    parser.set_defaults(
        spec_replaces={
            action.dest: action.default
            for action in parser._actions
            if action.dest not in ("help", "spec", "out", "json", "quiet")
        }
    )


def refuse_flags_beside_spec(args: argparse.Namespace) -> None:
    """A spec holds the whole job: a flag that describes it too is a contradiction."""
    given = [f"--{name.replace('_', '-')}" for name, default in args.spec_replaces.items()
             if getattr(args, name) != default]
    if given:
        raise ValueError(f"--spec holds the whole job; drop {', '.join(given)}")


def lacking_flags(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Without --spec, the flags that say what the job is are required."""
    lacking = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is None]
    if lacking:
        raise ValueError(f"give --spec, or {', '.join(lacking)}")


def spec_or_flags(
    args: argparse.Namespace,
    required: tuple[str, ...],
    load: Callable[[str], T],
    from_flags: Callable[[argparse.Namespace], T],
) -> T:
    """The job `--spec` gives (alone: no flag that describes the job beside it), else the one
    the flags describe (the `required` ones given)."""
    if args.spec is not None:
        refuse_flags_beside_spec(args)
        return load(args.spec)
    lacking_flags(args, required)
    return from_flags(args)


def _input_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises: a one-line message and exit code 2, never a traceback.
    (ValueError covers the package's own: WorkloadError, UnknownSchedulerError, ...;
    OSError an output path that cannot be written.)"""
    from feather.engines.vllm.runner import EngineUnavailable
    from feather.workloads.sources.base import DataUnavailableError

    return (ValueError, OSError, DataUnavailableError, EngineUnavailable)
