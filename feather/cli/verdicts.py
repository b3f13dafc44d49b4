"""`feather verdicts diff RUN_A RUN_B`: what changed between two runs' verdicts - verdicts and
grades, measures beyond the other run's interval, flags (feather/pipeline/verdicts_diff.py).
Exit status like diff(1): 0 the same, 1 different, 2 bad input."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _cmd_diff(args: argparse.Namespace) -> int:
    from feather.pipeline.verdicts_diff import diff_documents, diff_json, format_text, load

    # both read and checked before anything is printed: a bad one is its one-line error alone
    file_a, doc_a = load(args.run_a)
    file_b, doc_b = load(args.run_b)
    diff = diff_documents(doc_a, doc_b)
    if args.json:
        print(json.dumps(diff_json(diff, str(file_a), str(file_b)), indent=2))
    else:
        print(format_text(diff, str(file_a), str(file_b)), end="")
    return 1 if diff.differs else 0


def register(commands: Any) -> None:
    """Add `verdicts` and its subcommand `diff`."""
    verdicts = commands.add_parser(
        "verdicts", help="compare runs' verdicts (results/verdicts.json)")
    subs = verdicts.add_subparsers(dest="verdicts", required=True)
    diff = subs.add_parser(
        "diff",
        help="list the verdicts, grades, measures and flags that differ between two runs "
        "(exit 0: none, 1: some, 2: bad input)",
    )
    for name in ("RUN_A", "RUN_B"):
        diff.add_argument(name.lower(), metavar=name,
                          help="a run's results directory (holding verdicts.json) or the file")
    diff.add_argument("--json", action="store_true", help="print the findings as JSON")
    diff.set_defaults(func=_cmd_diff)
