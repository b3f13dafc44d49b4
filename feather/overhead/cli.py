"""`feather overhead env|run|report`: the scheduling-overhead experiment (C3, C4) by hand;
the pipeline runs the same commands (workflow/rules/overhead.smk)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from feather.atomic import atomic_target, write_json_atomic, write_text_atomic


def _progress(message: str) -> None:
    print(f"[overhead] {message}", file=sys.stderr, flush=True)


def _cmd_env(args: argparse.Namespace) -> int:
    from feather.overhead.envs import build_env

    status = build_env(args.name, Path(args.dest), progress=_progress,
                       lock=Path(args.lock) if args.lock else None,
                       install_feather=args.with_feather, engine=args.engine_env)
    record = {"name": status.name, "status": status.status, "path": str(status.path),
              "version": status.version, "trees": list(status.trees), "reason": status.reason}
    if args.status_out:
        write_json_atomic(args.status_out, record)
    if not status.ok:
        print(f"feather: {args.name} is skipped: {status.reason}", file=sys.stderr)
        return 1 if args.require else 0
    print(status.python)
    return 0


def _cmd_env_ready(args: argparse.Namespace) -> int:
    """Print a built environment's python; where it could not be built, say why, exit 1."""
    record = json.loads(Path(args.status).read_text())
    if record.get("status") != "ok":
        lines = [line.strip() for line in str(record.get("reason", "?")).splitlines()]
        # pip's own error where there is one (not its progress bars), else the reason's head
        errors = [line for line in lines if line.startswith("ERROR:")]
        why = " | ".join(errors[:2] if errors else [line for line in lines if line][:2])
        print(f"feather: environment {record.get('name')} could not be built: {why}",
              file=sys.stderr)
        return 1
    print(Path(record["path"]) / "bin" / "python")
    return 0


def _specs(args: argparse.Namespace, statuses: list[dict[str, Any]]) -> tuple[list, list[str]]:
    from feather.overhead.harness import ImplSpec

    specs = [] if args.no_feather else [ImplSpec("feather")]
    skipped = []
    if not args.no_vllm:
        specs.append(ImplSpec("vllm"))
    for status in statuses:
        if status["status"] != "ok":
            skipped.append(f"{status['name']}: {status['reason']}")
            continue
        python = str(Path(status["path"]) / "bin" / "python")
        for tree in status["trees"]:
            specs.append(ImplSpec("sglang", python=python, tree=tree,
                                  page_size=args.sglang_page_size, env_name=status["name"]))
    return specs, skipped


def _cmd_run(args: argparse.Namespace) -> int:
    import pandas as pd

    from feather.overhead.harness import Harness
    from feather.overhead.scenario import Case
    from feather.overhead.sweep import cases, load_spec
    from feather.provenance import collect_provenance

    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    spec = load_spec(args.spec)
    if args.case:
        fields = ("waiting", "prefix_tokens", "groups", "batch", "page")
        todo = [Case(**dict(zip(fields, map(int, c.split(",")), strict=True))) for c in args.case]
    else:
        todo = cases(spec, args.sweep)
    repeats = args.repeats or int(spec["repeats"])
    statuses = [json.loads(Path(p).read_text()) for p in args.env_status]
    specs, skipped = _specs(args, statuses)
    for reason in skipped:
        _progress(f"baseline skipped: {reason}")
    with Harness(specs, progress=_progress) as harness:
        rows = harness.run(todo, repeats)
    table = pd.DataFrame(rows)
    config = {"cases": [c.to_json() for c in todo], "repeats": repeats,
              "implementations": [s.key for s in specs], "sweep": args.sweep or spec["sweep"]}
    provenance = collect_provenance(
        config=config, seed=None, started_utc=started,
        extra={"engine": {"name": "overhead-harness", "produced_by": "measured on this CPU"},
               "skipped_baselines": skipped},
    )
    out = Path(args.out)
    with atomic_target(out) as tmp:
        table.to_parquet(tmp, index=False)
    write_json_atomic(out.with_suffix(".json"), {"provenance": provenance, "skipped": skipped,
                                                 "rows": rows})
    _progress(f"{len(rows)} rows -> {out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    import pandas as pd

    from feather.models import get_model
    from feather.overhead import report
    from feather.overhead.figures import draw_all
    from feather.overhead.sweep import load_spec
    from feather.sim.hardware import get_hardware

    rows = pd.read_parquet(args.bench)
    model = get_model(args.model or load_spec(args.spec).get("model", "llama-3.1-8b"))
    hardware = [get_hardware(h) for h in args.hardware]
    traces, failed_runs = report.finished_traces(Path(p) for p in args.vllm_trace)
    for run in failed_runs:  # a failed job's run: no trace, a failure record as its summary
        _progress(f"vLLM trace of {run['path']} skipped: {run['job']} failed: {run['reason']}")
    cpu_step = report.measured_cpu_step_s(traces)
    speedups = report.speedups(rows)
    spec = load_spec(args.spec)
    output_tokens = args.output_tokens or int(spec.get("output_tokens", 128))
    fractions = report.fractions(rows, model, hardware, cpu_step, output_tokens,
                                 cpu_step_interval=report.measured_cpu_step_interval(traces))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in (("speedups", speedups), ("fractions", fractions)):
        with atomic_target(out / f"{name}.parquet") as tmp:
            frame.to_parquet(tmp, index=False)
    record = Path(args.bench).with_suffix(".json")  # absent for a table assembled by hand
    skipped = json.loads(record.read_text()).get("skipped", []) if record.exists() else []
    text = report.markdown(rows, speedups, fractions, model.name, cpu_step, skipped, failed_runs)
    write_text_atomic(out / "overhead.md", text)
    draw_all(rows, speedups, fractions, Path(args.figures_dir))
    print(text)
    return 0


def register(commands: Any) -> None:
    overhead = commands.add_parser(
        "overhead", help="scheduling overhead: CHT vs SGLang's and vLLM's real code (C3, C4)"
    )
    sub = overhead.add_subparsers(dest="overhead", required=True)
    env = sub.add_parser("env", help="build (or reuse) a baseline's own environment")
    env.add_argument("--name", required=True, help="e.g. sglang-0.5.23 (feather/overhead/locks)")
    env.add_argument("--dest", required=True, help="the venv's directory")
    env.add_argument("--status-out", help="also write the build's status record here")
    env.add_argument("--require", action="store_true", help="exit 1 if it cannot be built")
    env.add_argument("--lock", help="build from this lock file instead of the name's own "
                     "(e.g. requirements-sglang-cuda.lock: SGLang for a GPU)")
    env.add_argument("--with-feather", action="store_true",
                     help="also install feather there (SGLang's plugin)")
    env.add_argument("--engine-env", action="store_true",
                     help="an engine's GPU environment: feather installed, checked by importing "
                     "SGLang and starting `feather run` (not by its scheduling code on this CPU)")
    env.set_defaults(func=_cmd_env)
    ready = sub.add_parser("env-ready", help="the python of a built environment, or why not")
    ready.add_argument("status", help="its status record (`overhead env --status-out`)")
    ready.set_defaults(func=_cmd_env_ready)

    run = sub.add_parser("run", help="time every implementation on the sweep's cases")
    run.add_argument("--spec", default="experiments/overhead.yaml")
    run.add_argument("--sweep", help="a sweep of the spec (default: the spec's `sweep`)")
    run.add_argument("--case", action="append", default=[],
                     help="W,P,G,B,page instead of a sweep (repeatable)")
    run.add_argument("--env-status", action="append", default=[],
                     help="status record of a baseline environment (`overhead env --status-out`)")
    run.add_argument("--sglang-page-size", type=int, default=1, help="SGLang's page (default 1)")
    run.add_argument("--no-vllm", action="store_true", help="leave vLLM's lookup out")
    run.add_argument("--no-feather", action="store_true",
                     help="leave our CHT out (to run a sweep in pieces, one baseline at a time)")
    run.add_argument("--repeats", type=int, help="default: the spec's")
    run.add_argument("--out", required=True, help="a .parquet file (+ .json with provenance)")
    run.set_defaults(func=_cmd_run)

    rep = sub.add_parser("report", help="speedups, step-time fractions, table and figures")
    rep.add_argument("--bench", required=True, help="the .parquet `overhead run` wrote")
    rep.add_argument("--spec", default="experiments/overhead.yaml")
    rep.add_argument("--model", help="default: the spec's model")
    rep.add_argument("--output-tokens", type=int,
                     help="output tokens per request, for steady-state admissions per step "
                          "(default: the spec's)")
    rep.add_argument("--hardware", action="append", required=True)
    rep.add_argument("--vllm-trace", action="append", default=[],
                     help="trace.parquet of real vLLM runs (their median decode step)")
    rep.add_argument("--out-dir", required=True)
    rep.add_argument("--figures-dir", default="figures")
    rep.set_defaults(func=_cmd_report)
