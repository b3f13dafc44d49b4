"""Online serving runs: `vllm serve` with our scheduler class, driven by `vllm bench serve`.

Per scheduler one server start (`VllmServer`, as users start it); against it, vLLM's own
serving benchmark client sends the requests over HTTP with Poisson arrivals at each rate
and reports client-side TTFT, TPOT, inter-token latency and end-to-end latency percentiles
and throughput. Rates are fractions of a measured capacity: first every request at once
(rate inf, saturation) under FCFS, whose request throughput is the capacity; then each
fraction of it for every scheduler, so "below saturation" means the same load for all.

Datasets: a workload of ours (its prompts, in its order, as text in vLLM's `custom` JSONL
format: the server tokenizes them as it would any client's) or vLLM's own
`prefix_repetition` dataset (which vLLM builds and shuffles itself). Every run starts from
an empty prefix cache (vLLM's /reset_prefix_cache) - or, with `prefix_cache="warm"`, with
each prefix group's prompt already served once (a server that has seen the documents, as
`feather run --prefix-cache warm` starts offline runs): unmeasured warm-up requests, one per
group, the group's first prompt with one output token, after the reset. After each run the
scheduler's state file must show nothing held: a run that leaks fails the job.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feather.atomic import write_text_atomic
from feather.engines.vllm.serve import ServeSetup, VllmServer
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class OnlineDataset:
    """What the client sends: `workload` (a built workload file of ours) or vLLM's
    `prefix-repetition` dataset with its four sizes."""

    kind: str
    workload: str | None = None
    prefix_len: int = 1024
    suffix_len: int = 64
    num_prefixes: int = 4
    output_len: int = 16
    num_prompts: int = 32
    name: str | None = None  # what tables and figures call it (default: from the source)

    def __post_init__(self) -> None:
        if self.kind not in ("workload", "prefix-repetition"):
            raise ValueError(f"dataset kind must be workload or prefix-repetition, got {self.kind}")
        if self.kind == "workload" and not self.workload:
            raise ValueError("a workload dataset needs the workload file")
        for name in ("prefix_len", "suffix_len", "num_prefixes", "output_len", "num_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.kind == "workload":
            return Path(str(self.workload)).stem
        return (
            f"prefix-repetition-{self.num_prefixes}x{self.prefix_len}+{self.suffix_len}"
            f"-out{self.output_len}"
        )

    def client_args(self, workdir: Path) -> tuple[list[str], int, int]:
        """vLLM bench serve's dataset flags, the number of prompts and the longest prompt
        in tokens (for max_model_len); a workload is written as vLLM's custom JSONL."""
        if self.kind == "prefix-repetition":
            args = ["--dataset-name", "prefix_repetition"]
            args += ["--prefix-repetition-prefix-len", str(self.prefix_len)]
            args += ["--prefix-repetition-suffix-len", str(self.suffix_len)]
            args += ["--prefix-repetition-num-prefixes", str(self.num_prefixes)]
            args += ["--prefix-repetition-output-len", str(self.output_len)]
            return args, self.num_prompts, self.prefix_len + self.suffix_len
        path, count, longest = write_custom_jsonl(str(self.workload), workdir / "prompts.jsonl")
        args = ["--dataset-name", "custom", "--dataset-path", str(path)]
        args += ["--disable-shuffle", "--skip-chat-template", "--no-oversample"]
        args += ["--custom-output-len", "-1"]  # each line's output_tokens (default: 256 for all)
        return args, count, longest


def group_prompts(workload_path: str) -> list[str]:
    """The text of each prefix group's first request, in order of first arrival: what a
    warm start serves before a run (`warm_up_requests`, which refuses a workload without
    shared prefixes)."""
    from feather.workloads import load_workload
    from feather.workloads.tokenizer import load_tokenizer
    from feather.workloads.warm_up import warm_up_requests

    tokenizer = load_tokenizer(None)
    return [tokenizer.decode(list(map(int, r.prompt_token_ids)))
            for r in warm_up_requests(load_workload(workload_path).requests)]  # fmt: skip


def write_custom_jsonl(workload_path: str, out: Path) -> tuple[Path, int, int]:
    """The workload's prompts as text (decoded with the tokenizer they were built with) and
    output lengths, one JSON object per line in arrival order: vLLM's `custom` dataset."""
    from feather.workloads import load_workload
    from feather.workloads.tokenizer import load_tokenizer

    workload = load_workload(workload_path)
    tokenizer = load_tokenizer(None)
    built_with = (workload.provenance.get("tokenizer") or {}).get("sha256")
    if built_with and built_with != tokenizer.identity.sha256:
        raise ValueError(
            f"workload {workload_path} was tokenized with another tokenizer than the served "
            f"model's ({tokenizer.identity.name}): its prompts would not be the same tokens"
        )
    lines = [
        json.dumps(
            {
                "prompt": tokenizer.decode(list(map(int, r.prompt_token_ids))),
                "output_tokens": int(r.output_len),
            }
        )
        for r in workload.requests
    ]
    write_text_atomic(out, "\n".join(lines) + "\n")
    longest = max((r.prompt_len for r in workload.requests), default=0)
    return out, len(lines), longest


@dataclass(frozen=True)
class OnlineSweep:
    """Schedulers (label, class, params) x load fractions of FCFS's saturated throughput."""

    schedulers: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]
    dataset: OnlineDataset
    load_fractions: tuple[float, ...] = (0.3, 0.6, 0.9)
    model: str = "tiny-llama"
    max_num_seqs: int = 8
    num_blocks: int | None = None
    max_num_batched_tokens: int | None = None
    threads: int = 1
    seed: int = 0
    repeats: int = 3
    model_root: str = "data/models"
    attention: str = "vllm"  # vLLM's backend, or ours in a mode (ServeSetup.attention)
    prefix_cache: str = "cold"  # "warm": each run starts with every group's prompt served
    # every scheduler's server up at once, so they interleave within each repeat (a CPU);
    # false where one server takes the device's memory (a GPU): one after another
    servers_at_once: bool = True

    def __post_init__(self) -> None:
        from feather.engines.runs import PREFIX_CACHE_CHOICES

        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.prefix_cache not in PREFIX_CACHE_CHOICES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHE_CHOICES)}, "
                f"got {self.prefix_cache!r}"
            )
        if self.prefix_cache == "warm" and self.dataset.kind != "workload":
            raise ValueError(
                "prefix_cache 'warm' needs a workload of ours (its prefix groups are known); "
                "vLLM builds prefix_repetition's prompts itself"
            )
        labels = [label for label, _, _ in self.schedulers]
        if "fcfs" not in labels:
            raise ValueError("the online sweep measures capacity under fcfs: include fcfs")
        if len(set(labels)) != len(labels):
            raise ValueError(f"scheduler labels must be distinct, got {labels}")
        if not self.load_fractions or any(not 0 < f < 10 for f in self.load_fractions):
            raise ValueError(f"load fractions must be in (0, 10), got {self.load_fractions}")


def bench_serve_args(
    server: VllmServer,
    dataset_args: Sequence[str],
    num_prompts: int,
    rate: float,
    seed: int,
    result: Path,
) -> list[str]:
    """The flags of one `vllm bench serve` against the server (what follows
    `feather vllm bench serve` on a command line)."""
    args = ["--backend", "vllm", "--base-url", server.url, "--model", server.setup.model]
    args += ["--tokenizer", str(server.model_dir), *dataset_args]
    args += ["--num-prompts", str(num_prompts), "--seed", str(seed)]
    args += ["--request-rate", "inf" if math.isinf(rate) else f"{rate:.6g}"]
    args += ["--ignore-eos", "--disable-tqdm", "--save-result", "--save-detailed"]
    args += ["--result-dir", str(result.parent), "--result-filename", result.name]
    args += ["--percentile-metrics", ",".join(METRICS)]
    args += ["--metric-percentiles", ",".join(map(str, PERCENTILES))]
    return args


def bench_serve(args: Sequence[str], result: Path) -> dict[str, Any]:
    """vLLM's serving benchmark client, unchanged (`vllm.benchmarks.serve.main`, what
    `vllm bench serve` calls), run in this process: a client process per rate would pay
    vLLM's ~20 s of imports each time. Its printout goes to `<result>.log`."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    parsed = parser.parse_args(list(args))
    log = result.with_suffix(".log")
    result.unlink(missing_ok=True)
    with log.open("w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(parsed)
            failure = None
        except Exception as exc:  # vLLM's client raising: reported with its printout
            failure = exc
    if failure is not None or not result.is_file():
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-12:])
        raise RuntimeError(f"vllm bench serve failed ({failure!r}): {tail}")
    return json.loads(result.read_text())


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """The numbers a row keeps from vLLM's result (its own field names, in ms and /s)."""
    row = {
        key: raw.get(key)
        for key in (
            "duration",
            "completed",
            "failed",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
        )
    }
    for metric in METRICS:
        row[f"mean_{metric}_ms"] = raw.get(f"mean_{metric}_ms")
        for p in PERCENTILES:
            row[f"p{p}_{metric}_ms"] = raw.get(f"p{p}_{metric}_ms")
    row["warm_up"] = raw.get("warm_up")  # requests and prompt tokens served before the run
    errors = [e for e in raw.get("errors") or [] if e]
    row["errors"] = len(errors)
    row["first_error"] = errors[0][:300] if errors else None
    return row


# vLLM's /metrics counters a run's mechanism is read from (the _total suffix as Prometheus
# exposes counters)
COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
}


def engine_counters(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine counted during one run: prefix-cache queries and hits (tokens),
    preemptions and prompt tokens, and the hit rate."""
    delta = {key: after.get(name, 0.0) - before.get(name, 0.0) for key, name in COUNTERS.items()}
    queries = delta["prefix_cache_queries"]
    delta["prefix_cache_hit_rate"] = delta["prefix_cache_hits"] / queries if queries else None
    return delta


def pooled(raws: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One rate's repeats together: latency percentiles over every successful request of
    every repeat (24 requests give a p99 that is one request's; pooled over repeats it is
    steadier), throughput as the median over repeats with its range. Per request as vLLM's
    client computes them: TPOT = (latency - TTFT) / (output tokens - 1)."""
    ttft, tpot, itl, e2el = [], [], [], []
    for raw in raws:
        for k, error in enumerate(raw.get("errors") or []):
            if error:
                continue
            first, latency = raw["ttfts"][k], raw["latencies"][k]
            ttft.append(first * 1000)
            e2el.append(latency * 1000)
            itl.extend(1000 * gap for gap in raw["itls"][k])
            if raw["output_lens"][k] > 1:
                tpot.append(1000 * (latency - first) / (raw["output_lens"][k] - 1))
    row: dict[str, Any] = {}
    for metric, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        row[f"mean_{metric}_ms"] = float(np.mean(values)) if values else None
        for q in PERCENTILES:
            row[f"p{q}_{metric}_ms"] = float(np.percentile(values, q)) if values else None
    for key in ("request_throughput", "output_throughput"):
        values = [raw[key] for raw in raws]
        row[key] = float(np.median(values))
        row[f"{key}_min"], row[f"{key}_max"] = float(min(values)), float(max(values))
    counters = [raw.get("engine_counters") or {} for raw in raws]
    queries = sum(c.get("prefix_cache_queries", 0.0) for c in counters)
    hits = sum(c.get("prefix_cache_hits", 0.0) for c in counters)
    row["prefix_cache_hit_rate"] = hits / queries if queries else None
    row["preemptions"] = sum(c.get("preemptions", 0.0) for c in counters)
    for key in ("steps", "add", "stop", "policy_stops"):
        row[f"policy_{key}"] = sum((raw.get("policy_decisions") or {}).get(key, 0) for raw in raws)
    row["completed"] = int(sum(raw["completed"] for raw in raws))
    row["errors"] = int(sum(1 for raw in raws for e in raw.get("errors") or [] if e))
    row["repeats"] = len(raws)
    row["duration"] = float(sum(raw["duration"] for raw in raws))
    return row


def run_online_sweep(
    sweep: OnlineSweep, out_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Every scheduler at saturation, then at each fraction of FCFS's capacity, under the
    measurement protocol (feather/measuring): `repeats` repeats with arrival seeds seed,
    seed+1, ...; within a repeat every scheduler at the same rate and seed, the order rotated
    from repeat to repeat, a disturbed repeat taken again. On a CPU every scheduler's server
    is up at once (idle ones wait without work), so the schedulers interleave; on a GPU
    (`servers_at_once` false: one server fills the device's memory) they run one server after
    another and are not interleaved, which the records say. A row per scheduler x rate
    (`pooled`), each repeat's own numbers and measurement record under `repeats_detail`."""
    say = progress or (lambda message: None)
    out = Path(out_dir)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    dataset_args, num_prompts, longest = sweep.dataset.client_args(work)
    warm_up = group_prompts(str(sweep.dataset.workload)) if sweep.prefix_cache == "warm" else []
    max_model_len = max(1024, math.ceil((longest + 64 + sweep.dataset.output_len) / 1024) * 1024)
    ordered = sorted(sweep.schedulers, key=lambda s: s[0] != "fcfs")  # fcfs first: capacity
    labels = [label for label, _, _ in ordered]
    servers: dict[str, Any] = {}
    runs: dict[tuple[str, float], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    capacity: float | None = None

    def serve(label: str, rate: float, repeat: int, server: VllmServer) -> dict[str, Any]:
        return _one_rate(server, label, rate, repeat, dataset_args, num_prompts,
                         sweep.seed + repeat, work, say, warm_up)

    def keep_into(label_of: Callable[[Any], str],
                  rate_of: Callable[[Any], float]) -> Callable[[RepeatOutcome], None]:
        def keep(outcome: RepeatOutcome) -> None:
            for arm, raw, record in zip(outcome.order, outcome.values, outcome.records,
                                        strict=True):
                runs.setdefault((label_of(arm), rate_of(arm)), []).append((raw, record))
        return keep

    def protocol(job: str) -> MeasuringProtocol:
        return MeasuringProtocol(f"{out}/{job}", label=_arm_label, describe=summarise, say=say)

    def capacity_of(raws: list[tuple[dict[str, Any], dict[str, Any]]]) -> float:
        """FCFS's saturated request throughput: the median of its quiet repeats (of all,
        where none stayed quiet - the loads' own repeats are then flagged too)."""
        quiet = [raw for raw, record in raws if not record.get("disturbed")] or [
            raw for raw, _ in raws]
        value = float(np.median([raw["request_throughput"] for raw in quiet]))
        if value <= 0:
            raise RuntimeError("fcfs completed nothing at saturation: no capacity")
        say(f"capacity (fcfs, saturated, median of {len(quiet)} quiet of {len(raws)}): "
            f"{value:.3f}/s")
        return value

    def started(label: str, cls: str, params: tuple) -> VllmServer:
        setup = _serve_setup(sweep, label, cls, params, max_model_len, work)
        say(f"{label}: starting vllm serve")
        server = VllmServer(setup, work / label)
        servers[label] = {"command": ["vllm", *setup.command(server.model_dir, server.port,
                                                             None)],
                          "interleaved": sweep.servers_at_once}
        return server

    def healthy(label: str, server: VllmServer) -> VllmServer:
        servers[label]["startup_s"] = server.startup_s
        say(f"{label}: healthy after {server.startup_s:.0f} s on {server.url}")
        return server

    if sweep.servers_at_once:
        with contextlib.ExitStack() as stack:
            launched = {}
            for label, cls, params in ordered:  # launched side by side, then each waited for
                server = launched[label] = started(label, cls, params)
                stack.callback(server.stop)
                server.launch()
            for server in launched.values():
                server.wait_until_healthy()
            up = {label: healthy(label, server) for label, server in launched.items()}
            protocol("saturated").run(
                labels, sweep.repeats, lambda label, r: serve(label, math.inf, r, up[label]),
                keep_into(lambda arm: arm, lambda arm: math.inf))
            capacity = capacity_of(runs[("fcfs", math.inf)])
            loads = [(label, f * capacity) for f in sweep.load_fractions for label in labels]
            protocol("loads").run(
                loads, sweep.repeats, lambda arm, r: serve(arm[0], arm[1], r, up[arm[0]]),
                keep_into(lambda arm: arm[0], lambda arm: arm[1]))
    else:
        for label, cls, params in ordered:  # one server at a time, each its own protocol
            with started(label, cls, params) as server:
                healthy(label, server)
                rates = [math.inf] + ([f * capacity for f in sweep.load_fractions]
                                      if capacity is not None else [])
                def measure(rate: float, r: int, label: str = label,
                            server: VllmServer = server) -> dict[str, Any]:
                    return serve(label, rate, r, server)

                keep = keep_into(lambda rate, label=label: label, lambda rate: rate)
                protocol(label).run(rates, sweep.repeats, measure, keep)
                if capacity is None:  # fcfs: its saturated throughput, then its loads
                    capacity = capacity_of(runs[("fcfs", math.inf)])
                    protocol(f"{label}-loads").run(
                        [f * capacity for f in sweep.load_fractions], sweep.repeats, measure,
                        keep)
    assert capacity is not None
    rows: list[dict[str, Any]] = []
    for (label, rate), kept in runs.items():
        saturated = math.isinf(rate)
        raws = [raw for raw, _ in kept]
        rows.append({
            "scheduler": label,
            "rate_rps": None if saturated else rate,
            "load_fraction": None if saturated else rate / capacity,
            "saturated": saturated,
            **pooled(raws),
            "repeats_detail": [{**summarise(raw), "repeat": record["repeat"],
                                "measurement": record} for raw, record in kept],
        })  # fmt: skip
    learned = {label: learned_table(work / label / "policy.json") for label in labels
               if (work / label / "policy.json").is_file()}
    return {
        "capacity_rps": capacity,
        "rows": rows,
        "servers": servers,
        "num_prompts": num_prompts,
        "repeats": sweep.repeats,
        "max_model_len": max_model_len,
        "attention": sweep.attention,
        "prefix_cache": sweep.prefix_cache,
        "learned": learned,
    }


def _arm_label(arm: Any) -> str:
    """A scheduler label, or (label, rate) as `label@rate`, or a rate."""
    if isinstance(arm, str):
        return arm
    if isinstance(arm, tuple):
        return f"{arm[0]}@{arm[1]:.4g}/s"
    return "inf" if math.isinf(arm) else f"{arm:.4g}/s"


def _serve_setup(sweep: OnlineSweep, label: str, cls: str, params: tuple, max_model_len: int,
                 work: Path) -> ServeSetup:
    """One scheduler's server. A learner learns while it serves: its table, saved as it
    changes, outlives the server (a later sweep goes on from it with params
    policy_file=<this file>)."""
    policy_out = work / label / "policy.json"
    if Path(dict(params).get("policy_file") or "").resolve() != policy_out.resolve():
        policy_out.unlink(missing_ok=True)  # an earlier sweep's table is not this one's
    return ServeSetup(
        model=sweep.model,
        scheduler=cls,
        params=dict(params),
        seed=sweep.seed,
        max_num_seqs=sweep.max_num_seqs,
        num_blocks=sweep.num_blocks,
        max_num_batched_tokens=sweep.max_num_batched_tokens,
        max_model_len=max_model_len,
        threads=sweep.threads,
        model_root=sweep.model_root,
        dev_endpoints=True,  # /reset_prefix_cache before every run
        attention=sweep.attention,
        policy_out=str(policy_out),
    )


def learned_table(path: Path) -> dict[str, Any]:
    """What a learner served with learned: its saved table's file, updates and states with
    their greedy action (and visits), as `feather train` reports a table."""
    from feather.policies import create_scheduler

    name = json.loads(path.read_text())["policy"]
    policy = create_scheduler(name, policy_file=str(path), frozen=True)
    states = policy.greedy_policy()  # type: ignore[attr-defined]
    return {"policy_file": str(path), "learner": name,
            "updates": policy.updates,  # type: ignore[attr-defined]
            "states": len(states), "policy": states}


def _one_rate(
    server: VllmServer,
    label: str,
    rate: float,
    repeat: int,
    dataset_args: Sequence[str],
    num_prompts: int,
    seed: int,
    work: Path,
    say: Callable[[str], None],
    warm_up: Sequence[str] = (),
) -> dict[str, Any]:
    """One rate, one repeat: vLLM's raw result; the scheduler must then hold nothing. The
    run starts from an empty prefix cache, filled first by the `warm_up` prompts if any."""
    name = "inf" if math.isinf(rate) else f"{rate:.4f}"
    server.reset_prefix_cache()  # every run starts from the same cache
    warm_before = server.metrics()
    for prompt in warm_up:  # one at a time, unmeasured: the cache a served document leaves
        server.complete(prompt, max_tokens=1)
    if warm_up:
        server.wait_drained()
    before, decided_before = server.metrics(), server.state().get("decisions") or {}
    started = time.perf_counter()
    result = work / label / f"rate_{name}__r{repeat}.json"
    raw = bench_serve(
        bench_serve_args(server, dataset_args, num_prompts, rate, seed, result), result
    )
    state = server.wait_drained()
    held = state.get("policy") or {}
    leaked = state.get("requests", 1) != 0 or any(
        held.get(k, 0) for k in ("requests", "running", "cht_requests", "cht_nodes")
    )
    if leaked or state.get("freed_twice"):
        raise RuntimeError(f"{label} at rate {name}: the scheduler still holds {state}")
    raw["scheduler_state_after"] = state
    raw["engine_counters"] = engine_counters(before, server.metrics())
    raw["warm_up"] = {"requests": len(warm_up),
                      "prompt_tokens": before.get(COUNTERS["prompt_tokens"], 0.0)
                      - warm_before.get(COUNTERS["prompt_tokens"], 0.0)}  # fmt: skip
    raw["policy_decisions"] = {
        key: value - decided_before.get(key, 0)
        for key, value in (state.get("decisions") or {}).items()
    }
    say(
        f"{label} rate {name} repeat {repeat}: {raw['completed']} done, "
        f"{raw['request_throughput']:.3f} req/s, TTFT p99 {raw['p99_ttft_ms']:.0f} ms "
        f"({time.perf_counter() - started:.0f} s)"
    )
    return raw
