"""`feather simulate`: one scheduler on one workload, on a simulated GPU (or the cpu profile)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from feather.cli.common import (
    _parse_params,
    add_engine_limits,
    add_spec,
    refuse_flags_beside_spec,
    spec_or_flags,
)
from feather.cli_values import seed
from feather.engine_limits import ENGINE_MODES
from feather.engines.runs import PREFIX_CACHE_CHOICES
from feather.kernels.plan import KERNELS
from feather.sim.sched_measured import COST_MODELS, DEFAULT_COST_MODEL, DEFAULT_REASON

# what a run is, given as flags; --spec gives all of it instead
RUN_FLAGS = ("workload", "scheduler", "hardware", "model")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from feather.gc_tuning import collect_less
    from feather.sim.run_spec import RunSpec

    collect_less()
    if args.runs is not None:
        return _simulate_runs(args)
    if args.out is None:
        raise ValueError("give --out (the run directory), or --runs")
    run_spec = spec_or_flags(args, RUN_FLAGS, RunSpec.load, _spec_from_flags)
    _simulate_one(run_spec, args.out, args)
    return 0


def _simulate_one(run_spec: Any, out_dir: str, args: argparse.Namespace,
                  workloads: dict[str, Any] | None = None) -> None:
    """Simulate one run and write its directory; `workloads` keeps each workload file loaded
    once across the runs of one process."""
    from feather.sim.run import simulate, stderr_progress, write_run
    from feather.sim.run_spec import RUN_SPEC_FILE
    from feather.workloads import load_workload

    run_spec.register_profiles()
    spec = run_spec.simulation
    workload = None
    if workloads is not None:
        if spec.workload not in workloads:
            workloads[spec.workload] = load_workload(spec.workload)
        workload = workloads[spec.workload]
    result = simulate(spec, workload, progress=None if args.quiet else stderr_progress)
    out = write_run(result, out_dir, {RUN_SPEC_FILE: run_spec.to_json()})
    summary = result.summary
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=2))
    else:
        print(
            f"{spec.scheduler} on simulated {spec.hardware} / {spec.model} ({spec.kernel}, "
            f"{spec.engine_mode}): {summary['output_tok_s']:,.0f} output tok/s, makespan "
            f"{summary['makespan_s']:.2f} s, mean batch {summary['mean_batch_size']:.1f}, "
            f"L2 hit {summary['l2_hit_rate']:.2f}, {summary['fraction_of_oracle']:.2f} of the "
            f"roofline oracle -> {out}", flush=True,
        )


def _simulate_runs(args: argparse.Namespace) -> int:
    """`--runs`: several runs in one process, one after another (the pipeline's simulation
    jobs: one interpreter start-up and one load of each workload for a scheduler's runs of
    an experiment, where one process per run spent about a third of each run starting)."""
    from feather.sim.run_spec import RunSpec, read_spec

    refuse_flags_beside_spec(args)
    if args.spec is not None or args.out is not None:
        raise ValueError("--runs holds every run and its directory; drop --spec and --out")
    runs, where = read_spec(args.runs, "--runs")
    if not isinstance(runs, list) or not runs or not all(
            isinstance(item, dict) and set(item) == {"out", "spec"} for item in runs):
        raise ValueError(f"{where}: --runs takes a non-empty JSON list of "
                         '{"out": run directory, "spec": the run\'s spec}')
    outs = [str(item["out"]) for item in runs]
    if len(set(outs)) != len(outs):
        raise ValueError(f"{where}: two runs write the same directory")
    specs = [RunSpec.load(json.dumps(item["spec"])) for item in runs]  # all checked first
    workloads: dict[str, Any] = {}
    for k, (run_spec, out) in enumerate(zip(specs, outs, strict=True), 1):
        if not args.quiet:
            print(f"[simulate] run {k} of {len(specs)}: {out}", file=sys.stderr, flush=True)
        _simulate_one(run_spec, out, args, workloads)
    return 0


def _spec_from_flags(args: argparse.Namespace) -> Any:
    """The run the flags describe, as the pipeline's specification of it (label: the
    scheduler's name; user profiles: the ones this run names)."""
    from feather.models import register_model_profiles
    from feather.sim.hardware import register_hardware_profiles
    from feather.sim.run import SimulationSpec
    from feather.sim.run_spec import RunSpec

    register_hardware_profiles(args.hardware_profile)
    register_model_profiles(args.model_profile)
    spec = SimulationSpec(
        workload=args.workload,
        scheduler=args.scheduler,
        hardware=args.hardware,
        model=args.model,
        kernel=args.kernel,
        engine_mode=args.engine_mode,
        seed=args.seed,
        scheduler_params=_parse_params(args.param, args.scheduler),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_pool_fraction=args.kv_pool_fraction,
        sched_time=args.sched_time,
        sched_cost_model=args.sched_cost_model,
        overlap_scheduling=args.overlap_scheduling,
        prefix_cache=args.prefix_cache,
    )
    return RunSpec(args.scheduler, spec)


def register(commands: Any) -> None:
    """Add `simulate`."""
    sim = commands.add_parser(
        "simulate", help="simulate a scheduler on a workload for a GPU hardware profile"
    )
    sim.add_argument("--workload", help="workload .parquet or synthetic:...")
    sim.add_argument(
        "--scheduler",
        help="registered name (feather schedulers) or package.module:Class",
    )
    sim.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="scheduler parameter (repeatable), e.g. min_batch=16",
    )
    sim.add_argument("--hardware", help="hardware profile, e.g. a100-80gb")
    sim.add_argument("--model", help="model profile, e.g. llama-3.1-8b")
    sim.add_argument("--kernel", choices=KERNELS, default="paged")
    sim.add_argument("--engine-mode", choices=ENGINE_MODES, default="vllm")
    sim.add_argument("--seed", type=seed, default=0)
    add_engine_limits(sim)
    sim.add_argument(
        "--kv-pool-fraction",
        type=float,
        help="KV pool as this fraction of the workload's distinct shared-prefix tokens "
        "(memory-regime sweeps; instead of --num-blocks)",
    )
    sim.add_argument(
        "--sched-time",
        choices=["model", "zero"],
        default="model",
        help="scheduling time in simulated time: calibrated model or none",
    )
    sim.add_argument(
        "--sched-cost-model",
        default=DEFAULT_COST_MODEL,
        metavar="NAME",
        help=f"what scheduling costs: {', '.join(COST_MODELS)} (default {DEFAULT_COST_MODEL}: "
        f"{DEFAULT_REASON})",
    )
    sim.add_argument(
        "--overlap-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a step takes max(GPU, scheduling) instead of their sum (default: on in sglang "
        "mode, as SGLang's overlap scheduler; off in vllm mode)",
    )
    sim.add_argument(
        "--prefix-cache",
        choices=PREFIX_CACHE_CHOICES,
        default="cold",
        help="warm: every prefix group's shared prefix is cached before the first request "
        "(a server that has served the documents; the real engine's option of that name)",
    )
    sim.add_argument(
        "--hardware-profile",
        action="append",
        metavar="JSON",
        help="register a hardware profile (HardwareProfile fields as JSON)",
    )
    sim.add_argument(
        "--model-profile",
        action="append",
        metavar="JSON",
        help="register a model profile (ModelProfile fields as JSON)",
    )
    add_spec(
        sim,
        "the whole run as the pipeline specifies it (feather/sim/run_spec.py; a run "
        "directory's spec.json reruns it)",
    )
    sim.add_argument("--out", help="run directory")
    sim.add_argument(
        "--runs",
        metavar="JSON|FILE",
        help='several runs in one process: a JSON list of {"out": run directory, "spec": the '
        "run's spec}, instead of --spec and --out (the pipeline's simulation jobs)",
    )
    sim.add_argument("--json", action="store_true", help="print the summary as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim.set_defaults(func=_cmd_simulate)
