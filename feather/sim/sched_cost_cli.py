"""`feather sched-cost fit|refit|table`: the measured scheduling-cost models from the
overhead bench; the pipeline runs `refit` after every overhead run (workflow/rules/
overhead.smk), which never changes the committed default."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from feather.atomic import write_json_atomic, write_text_atomic


def _fit(args: argparse.Namespace) -> int:
    from feather.sim import sched_fit

    rows, records = sched_fit.read_bench([Path(p) for p in args.bench])
    rows_file = Path(args.rows_out).name if args.rows_out else None
    # fitted from the compact text it keeps, so refitting the committed rows reproduces it
    rows = sched_fit.rows_from_csv(sched_fit.bench_csv(rows))
    if args.extend:
        import json

        if not args.only:
            raise ValueError("--extend needs --only COMPONENT (what to fit from this bench)")
        base = json.loads(Path(args.extend).read_text())
        data = sched_fit.extend_data(base, rows, records, args.only, rows_file)
    else:
        data = sched_fit.measured_data(rows, records, rows_file)
    if args.rows_out:
        write_text_atomic(args.rows_out, sched_fit.bench_csv(rows))
    write_json_atomic(args.out, data)
    print(quality_table(data))
    return 0


def _refit(args: argparse.Namespace) -> int:
    """Refit into `out_dir`; without what a model needs, say so in the report and go on."""
    from feather.sim import sched_fit
    from feather.sim.sched_measured import MEASURED_DATA, load_measured

    out = Path(args.out_dir)
    rows, records = sched_fit.read_bench([Path(p) for p in args.bench])
    committed = load_measured(Path(args.committed) if args.committed else MEASURED_DATA)
    try:
        refit = sched_fit.measured_data(rows, records, None)
    except ValueError as exc:
        write_json_atomic(out / "sched_costs_refit.json", {"status": "skipped", "reason": str(exc)})
        write_text_atomic(out / "sched_cost_drift.md",
                          f"# Scheduling-cost models: no refit\n\n{exc}\n\nThe simulator uses "
                          "the committed default (feather/sim/data/sched_costs_measured.json).\n")
        print(f"feather: no refit: {exc}", file=sys.stderr)
        return 0
    write_json_atomic(out / "sched_costs_refit.json", refit)
    text = sched_fit.drift_report(committed, refit)
    write_text_atomic(out / "sched_cost_drift.md", text)
    print(text)
    return 0


def quality_table(data: dict[str, Any]) -> str:
    lines = ["component                          rows   R^2   median  held-out median  p90   max"]
    for name, part in sorted(data["components"].items()):
        q = part["quality"]
        lines.append(
            f"{name:<34} {q['rows']:>4} {q['r2']:>6.3f} {100 * q['median_rel_error']:>6.1f}% "
            f"{100 * q['held_out_median_rel_error']:>12.1f}% "
            f"{100 * q['held_out_p90_rel_error']:>5.1f}% {100 * q['held_out_max_rel_error']:>5.1f}%"
        )
    return "\n".join(lines)


def _table(args: argparse.Namespace) -> int:
    from feather.sim import sched_fit
    from feather.sim.sched_measured import MEASURED_DATA, load_measured

    data = load_measured(Path(args.data) if args.data else MEASURED_DATA)
    costs = sched_fit.reference_costs(data)
    if args.json:
        print(json.dumps(costs, indent=2))
        return 0
    print(f"{sched_fit.HOST_NOTE}\nms per pass (lpm, dfs-weight, lpm-fallback) or per 64 "
          "lookups / matches / decisions; 8 cached groups, 64 own tokens, page 16")
    points = sched_fit.REFERENCE_POINTS
    print(f"{'component':<34}" + "".join(f"{f'W={w} P={p}':>18}" for w, p in points))
    by = {}
    for row in costs:
        by.setdefault(row["component"], {})[(row["waiting"], row["prefix_tokens"])] = row
    for name, cells in by.items():
        print(f"{name:<34}" + "".join(f"{cells[pt]['seconds'] * 1e3:>18.3f}" for pt in points))
    print(quality_table(data))
    return 0


def register(commands: Any) -> None:
    top = commands.add_parser(
        "sched-cost", help="the simulator's scheduling-cost models, fitted to the overhead bench"
    )
    sub = top.add_subparsers(dest="sched_cost", required=True)
    fit = sub.add_parser("fit", help="fit the measured models to bench tables")
    fit.add_argument("--bench", action="append", required=True,
                     help="bench .parquet (repeatable: a sweep run in pieces; .json beside it)")
    fit.add_argument("--out", required=True, help="the models' data file (.json)")
    fit.add_argument("--rows-out", help="also write the rows fitted, as compact CSV")
    fit.add_argument("--extend", metavar="DATA",
                     help="keep this data file's components, adding those --only names")
    fit.add_argument("--only", action="append", metavar="COMPONENT",
                     help="with --extend: a component to fit from --bench (repeatable)")
    fit.set_defaults(func=_fit)
    refit = sub.add_parser("refit", help="refit into a results folder, with a drift report "
                                         "against the committed default (which stays)")
    refit.add_argument("--bench", action="append", required=True)
    refit.add_argument("--out-dir", required=True)
    refit.add_argument("--committed", help="default: feather/sim/data/sched_costs_measured.json")
    refit.set_defaults(func=_refit)
    table = sub.add_parser("table", help="prices at reference points, and the fit quality")
    table.add_argument("--data", help="default: the committed data")
    table.add_argument("--json", action="store_true")
    table.set_defaults(func=_table)
