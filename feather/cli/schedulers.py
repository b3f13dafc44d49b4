"""`feather schedulers`: the registered schedulers, by name."""

from __future__ import annotations

import argparse
import json
from typing import Any


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


def register(commands: Any) -> None:
    """Add `schedulers`."""
    schedulers = commands.add_parser("schedulers", help="list the registered schedulers")
    schedulers.add_argument("--json", action="store_true", help="print JSON")
    schedulers.set_defaults(func=_cmd_schedulers)
