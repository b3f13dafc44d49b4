"""`feather train`: train a learned Feather policy on the simulator, then evaluate it frozen."""

from __future__ import annotations

import argparse
import json
from typing import Any

from feather.cli.common import (
    _parse_params,
    add_engine_limits,
    add_spec,
    spec_or_flags,
)
from feather.cli_values import seeds
from feather.engine_limits import ENGINE_MODES
from feather.kernels.plan import KERNELS
from feather.policies.registry import LEARNERS

# what a training job is, given as flags; --spec gives all of it instead
TRAIN_FLAGS = ("learner", "train_workload", "hardware", "model")


def _cmd_train(args: argparse.Namespace) -> int:
    from feather.gc_tuning import collect_less
    from feather.provenance import collect_provenance
    from feather.sim.run import stderr_progress
    from feather.sim.run_spec import TrainSpec
    from feather.sim.training import evaluate, train

    collect_less()
    spec = spec_or_flags(args, TRAIN_FLAGS, TrainSpec.load, _spec_from_flags)
    spec.register_profiles()
    base = spec.simulation
    trained = train(
        spec.learner,
        base,
        spec.train_workloads,
        spec.train_seeds,
        args.out,
        params=spec.params,
        progress=None if args.quiet else stderr_progress,
    )
    report = {
        "hardware": base.hardware,
        "model": base.model,
        "kernel": base.kernel,
        "engine_mode": base.engine_mode,
        "spec": spec.to_json(),
        "training": trained,
    }
    report["provenance"] = collect_provenance(
        config=spec.to_json(), seed=None, extra={"engine": {"name": "sim"}}
    )
    if spec.eval_workloads:
        report["evaluation"] = evaluate(
            args.out, spec.learner, base, spec.eval_workloads, spec.eval_seeds, params=spec.params
        )
    print(json.dumps(report, indent=2))
    return 0


def _spec_from_flags(args: argparse.Namespace) -> Any:
    from feather.sim.run import SimulationSpec
    from feather.sim.run_spec import TrainSpec

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
    return TrainSpec(
        args.learner,
        base,
        tuple(args.train_workload),
        tuple(args.train_seeds),
        tuple(args.eval_workload or ()),
        tuple(args.eval_seeds) if args.eval_workload else (),
        _parse_params(args.param, args.learner),
    )


def register(commands: Any) -> None:
    """Add `train` (its engine limits are the simulator's, as `simulate`'s)."""
    tr = commands.add_parser(
        "train", help="train a learned Feather policy on the simulator, then evaluate it frozen"
    )
    tr.add_argument(
        "--learner",
        choices=LEARNERS,
        help="feather-ucb / feather-qlearn: asked at every group change, a STOP held until the "
        "running groups change, credited over the batch it formed (the paper's reading); "
        "*-kernel-gated: asked only where the kernel reads a batch's common prefix once",
    )
    tr.add_argument(
        "--train-workload",
        action="append",
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
    tr.add_argument("--hardware")
    tr.add_argument("--model")
    tr.add_argument("--kernel", choices=KERNELS, default="paged")
    tr.add_argument("--engine-mode", choices=ENGINE_MODES, default="vllm")
    add_engine_limits(tr)
    add_spec(tr, "the whole training job as the pipeline specifies it (feather/sim/run_spec.py)")
    tr.add_argument("--out", required=True, help="the trained policy's JSON file")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=_cmd_train)
