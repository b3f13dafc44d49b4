"""`feather train`: train a learned Feather policy on the simulator, then evaluate it frozen."""

from __future__ import annotations

import argparse
import json
from typing import Any

from feather.cli.common import _parse_params, add_engine_limits
from feather.cli_values import seeds
from feather.engine_limits import ENGINE_MODES
from feather.kernels.plan import KERNELS


def _cmd_train(args: argparse.Namespace) -> int:
    from feather.sim.run import SimulationSpec, stderr_progress
    from feather.sim.training import evaluate, train

    base = SimulationSpec(
        workload=args.train_workload[0],
        scheduler=args.learner,
        hardware=args.hardware,
        model=args.model,
        kernel=args.kernel,
        engine_mode=args.engine_mode,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
    )
    params = _parse_params(args.param, args.learner)
    trained = train(
        args.learner,
        base,
        args.train_workload,
        args.train_seeds,
        args.out,
        params=params,
        progress=None if args.quiet else stderr_progress,
    )
    from feather.provenance import collect_provenance

    report = {
        "hardware": args.hardware,
        "model": args.model,
        "kernel": args.kernel,
        "engine_mode": args.engine_mode,
        "training": trained,
    }
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    report["provenance"] = collect_provenance(
        config=settings, seed=None, extra={"engine": {"name": "sim"}}
    )
    if args.eval_workload:
        report["evaluation"] = evaluate(
            args.out,
            args.learner,
            base,
            args.eval_workload,
            args.eval_seeds,
            params=params,
        )
    print(json.dumps(report, indent=2))
    return 0


def register(commands: Any) -> None:
    """Add `train` (its engine limits are the simulator's, as `simulate`'s)."""
    tr = commands.add_parser(
        "train", help="train a learned Feather policy on the simulator, then evaluate it frozen"
    )
    tr.add_argument("--learner", choices=["feather-ucb", "feather-qlearn"], required=True)
    tr.add_argument(
        "--train-workload",
        action="append",
        required=True,
        help="training workload (.parquet or synthetic:...), repeatable",
    )
    tr.add_argument("--train-seeds", type=seeds, default=[0, 1, 2])
    tr.add_argument(
        "--eval-workload",
        action="append",
        help="held-out workload for the frozen-policy evaluation, repeatable",
    )
    tr.add_argument("--eval-seeds", type=seeds, default=[100, 101, 102])
    tr.add_argument("--param", action="append", metavar="KEY=VALUE", help="learner parameter")
    tr.add_argument("--hardware", required=True)
    tr.add_argument("--model", required=True)
    tr.add_argument("--kernel", choices=KERNELS, default="paged")
    tr.add_argument("--engine-mode", choices=ENGINE_MODES, default="vllm")
    add_engine_limits(tr)
    tr.add_argument("--out", required=True, help="the trained policy's JSON file")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=_cmd_train)
