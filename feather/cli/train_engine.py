"""`feather train-engine`: the learners trained inside a real engine (vLLM), frozen, and run
on held-out workloads beside the baselines (feather/engines/vllm/learning.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _cmd_train_engine(args: argparse.Namespace) -> int:
    from feather.engines.vllm.learning import EngineTraining, run_training
    from feather.sim.run_spec import read_spec

    data, where = read_spec(args.spec)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a mapping")
    job = EngineTraining.from_json(data, where)

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[train-engine] {message}", file=sys.stderr, flush=True)

    reports = run_training(job, args.out, say)
    for learner, report in reports.items():
        training = report["training"]
        convergence = training["convergence"]
        line = (f"{job.regime}: {learner}: {training['states']} states, "
                f"{training['history'][-1]['updates']} updates, actions converged "
                f"(K={convergence['k']}) {'yes' if convergence['actions_converged'] else 'no'}")
        for ratios in (report["evaluation"] or {}).get("per_workload", {}).values():
            line += "; held out: " + ", ".join(
                f"{key} {value['median']:.3f}" for key, value in ratios.items())
        print(f"{line} -> {job.report_path(args.out, learner)}")
    return 0


def register(commands: Any) -> None:
    """Add `train-engine`."""
    tr = commands.add_parser(
        "train-engine",
        help="train the learners inside real vLLM from its measured steps, freeze, evaluate",
    )
    tr.add_argument("--spec", required=True, metavar="JSON|FILE",
                    help="the job (feather/engines/vllm/learning.py EngineTraining)")
    tr.add_argument("--out", required=True,
                    help="tables and reports go to <out>/<learner>/<regime>/")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=_cmd_train_engine)
