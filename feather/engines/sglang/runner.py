"""Offline throughput runs of the real SGLang engine: `feather run --engine sglang` (GPU only).

One `sglang.Engine` start per scheduler: SGLang's native `fcfs`, `lpm`, `dfs-weight` are its
own `--schedule-policy` (untouched); any other registry policy runs with `--schedule-policy
fcfs` and our plugin enabled by `FEATHER_SGLANG_*` variables, which the spawned scheduler
inherits. Weights are dummy, from a config-only model directory (`model_dir.py`); prompts
are the workload's token ids (`skip_tokenizer_init`). Repeats share the engine; the cache is
flushed before each, which also starts a fresh policy and a new run in the scheduler's records
(`records.py`), read back into the same run directory layout as the vLLM runner's.

Untested: no GPU machine available to us has SGLang installed or network access.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from feather.engine_limits import DEFAULT_MAX_NUM_SEQS
from feather.engines.sglang.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME
from feather.engines.sglang.records import read_records, request_id_for
from feather.engines.sglang.settings import ALL_VARS, PluginSettings

NATIVE = ("fcfs", "lpm", "dfs-weight")  # SGLang's own policies: the baselines


class SGLangUnavailable(RuntimeError):
    """No GPU, no SGLang, or our plugin is not installed where SGLang is."""


def check_can_run() -> tuple[str, list[str]]:
    """(SGLang's version, the GPUs) - or a clear error before anything starts."""
    from feather.engines.gpu import attached_gpus

    gpus = attached_gpus()
    if not gpus:
        raise SGLangUnavailable(
            "the sglang engine needs a CUDA GPU and none is attached here (SGLang's model "
            "runner does not run on CPU); use --engine vllm, or the simulator's sglang mode"
        )
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError as exc:
        raise SGLangUnavailable(
            "sglang is not installed in this environment: see gpu/sglang_c5.sh"
        ) from exc
    names = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if ENTRY_POINT_NAME not in names:
        raise SGLangUnavailable(
            f"feather's SGLang plugin is not installed beside sglang (entry point "
            f"{ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME}): `pip install --no-deps -e .` here"
        )
    return version, gpus


@dataclass(frozen=True)
class SGLangSetup:
    """How each engine is started. `max_total_tokens` None: SGLang sizes its KV pool."""

    model: str
    max_running_requests: int = DEFAULT_MAX_NUM_SEQS  # `feather run --max-num-seqs`'s
    chunked_prefill_size: int | None = None
    max_total_tokens: int | None = None
    page_size: int | None = None
    context_length: int | None = None
    dtype: str = "auto"
    engine_seed: int = 0
    model_root: str = "data/models"


def engine_kwargs(setup: SGLangSetup, model_path: str, scheduler: str, params: dict) -> dict:
    """sglang.Engine's arguments for one scheduler; native names without parameters are
    SGLang's own policy, anything else is ours behind `--schedule-policy fcfs`."""
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "schedule_policy": scheduler if is_native(scheduler, params) else "fcfs",
        "max_running_requests": setup.max_running_requests,
        "random_seed": setup.engine_seed,
        "dtype": setup.dtype,
        "log_level": "error",
    }
    optional = {
        "chunked_prefill_size": setup.chunked_prefill_size,
        "max_total_tokens": setup.max_total_tokens,
        "page_size": setup.page_size,
        "context_length": setup.context_length,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return kwargs


def is_native(scheduler: str, params: dict) -> bool:
    return scheduler in NATIVE and not params


class SGLangSession:
    """One started engine for one scheduler; `run()` per repeat, `close()` at the end."""

    def __init__(self, setup: SGLangSetup, scheduler: str, params: dict, seed: int,
                 context_length: int, trace_dir: Path) -> None:
        from feather.engines.model_dir import model_directory
        from feather.models import get_model

        self.version, self.gpus = check_can_run()
        self.setup, self.scheduler, self.params = setup, scheduler, params
        self.trace_dir = trace_dir
        settings = PluginSettings(
            scheduler=None if is_native(scheduler, params) else scheduler,
            params=params, seed=seed, trace_dir=str(trace_dir),
        )
        for var in ALL_VARS:
            os.environ.pop(var, None)
        os.environ.update(settings.to_env())  # the scheduler process inherits them
        model = get_model(setup.model)
        path = str(model_directory(model, setup.model_root))
        self.kwargs = engine_kwargs(
            setup if setup.context_length else _with(setup, context_length=context_length),
            path, scheduler, params,
        )
        import sglang

        started = time.perf_counter()
        self.engine = sglang.Engine(**self.kwargs)
        self.startup_s = time.perf_counter() - started
        try:
            self.facts = self._engine_facts(settings)
        except Exception:
            self.close()
            raise

    def _engine_facts(self, settings: PluginSettings) -> dict[str, Any]:
        files = sorted(self.trace_dir.glob("steps-*.jsonl"))
        if len(files) != 1:
            raise SGLangUnavailable(
                f"expected one scheduler record in {self.trace_dir}, found {len(files)}: the "
                "plugin did not load in SGLang's scheduler (is feather installed there?)"
            )
        self.trace_file = files[0]
        facts = read_records(self.trace_file)[-1]["engine"][0]
        if facts.get("feather_scheduler") != settings.scheduler:
            raise SGLangUnavailable(
                f"the scheduler runs {facts.get('feather_scheduler')!r}, asked for "
                f"{settings.scheduler!r}"
            )
        return {**facts, "distribution": "sglang", "gpus": self.gpus,
                "startup_s": self.startup_s, "engine_kwargs": self.kwargs}

    def run(self, workload: Any, repeat: int, run_tag: str) -> tuple[list, list]:
        """All requests at t=0 to completion; (step rows, request rows) of this run."""
        flushed = self.engine.flush_cache()  # FlushCacheReqOutput in 0.5.2x, a bool before
        if not getattr(flushed, "success", flushed):
            raise RuntimeError(f"SGLang did not flush its cache between runs: {flushed!r}")
        requests = workload.requests
        rids = [request_id_for(f"{run_tag}r{repeat}", i, r.group_id)
                for i, r in enumerate(requests)]
        outputs = self.engine.generate(
            input_ids=[r.prompt_token_ids.tolist() for r in requests],
            sampling_params=[{"max_new_tokens": int(r.output_len), "ignore_eos": True}
                             for r in requests],
            rid=rids,
        )
        short = [rid for rid, out, r in zip(rids, outputs, requests, strict=True)
                 if out["meta_info"].get("completion_tokens") != r.output_len]
        if short:
            raise RuntimeError(f"{len(short)} request(s) ended early, e.g. {short[0]!r}")
        deadline = time.monotonic() + 30  # the scheduler writes the last rows after replying
        while True:
            runs = read_records(self.trace_file)
            last = runs[max(runs)]
            if len(last["requests"]) >= len(requests) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if len(last["requests"]) != len(requests):
            raise RuntimeError(
                f"the scheduler recorded {len(last['requests'])} of {len(requests)} requests"
            )
        return last["steps"], last["requests"]

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()


def _with(setup: SGLangSetup, **changes: Any) -> SGLangSetup:
    return SGLangSetup(**{**asdict(setup), **changes})


def required_context(workload: Any) -> int:
    longest = max(r.prompt_len + r.output_len for r in workload.requests)
    return int(math.ceil(longest / 1024) * 1024)


def build_result(session: SGLangSession, workload: Any, workload_spec: str, label: str,
                 params: dict, seed: int, repeat: int, steps: list, reqs: list,
                 started_utc: str, wall_s: float, nvml: Any) -> dict[str, Any]:
    """Trace and request tables, and the run's summary (a `RunSummary`, with provenance), as
    the vLLM runner writes them."""
    import pyarrow as pa

    from feather.engines.sglang.records import parse_request_id
    from feather.metrics import latency_summary
    from feather.models import get_model
    from feather.provenance import collect_provenance
    from feather.run_summary import RunSummary
    from feather.telemetry import NVML_FILE

    by_index = {parse_request_id(r["rid"])[0]: r for r in reqs}
    rows = [by_index[i] for i in range(len(workload.requests))]
    requests = workload.requests
    request_table = pa.table({
        "request_id": [r.request_id for r in requests],
        "group_id": [r.group_id for r in requests],
        "prompt_len": [r.prompt_len for r in requests],
        "output_len": [r.output_len for r in requests],
        "arrival_s": [0.0] * len(requests),
        "admitted_s": [t["admitted_s"] for t in rows],
        "first_token_s": [t["first_token_s"] for t in rows],
        "finish_s": [t["finish_s"] for t in rows],
        "cached_tokens": [t["cached_tokens"] for t in rows],
    })
    trace = pa.Table.from_pylist(steps)
    cols = request_table.to_pydict()
    latency = latency_summary(cols["arrival_s"], cols["admitted_s"], cols["first_token_s"],
                              cols["finish_s"], cols["output_len"], cols["prompt_len"])
    step_times = [s["step_time_s"] or 0.0 for s in steps]
    busy = sum(step_times) or 1.0

    def weighted(column: str) -> float | None:
        values = [s[column] for s in steps]
        if not values or any(v is None for v in values):
            return None
        return sum(v * t for v, t in zip(values, step_times, strict=True)) / busy

    decode = [s["batch_size"] for s in steps if s["forward_mode"] == "decode"]
    hits = sum(cols["cached_tokens"])
    sched_cpu = sum(s["sched_cpu_s"] for s in steps)
    series = nvml.table() if nvml.record["available"] else None
    native = is_native(session.scheduler, params)
    provenance = collect_provenance(
        config={"engine": "sglang", "workload": workload_spec, "scheduler": session.scheduler,
                "scheduler_label": label, "scheduler_params": params, "model": session.setup.model,
                "seed": seed, "repeat": repeat, "setup": asdict(session.setup)},
        seed=seed,
        started_utc=started_utc,
        extra={
            "engine": session.facts,
            "model": asdict(get_model(session.setup.model)),
            "policy": {"name": label, "params": params,
                       "class": f"sglang SchedulePolicy {session.scheduler!r} (native)" if native
                       else session.scheduler},
            "workload": {"spec": workload_spec,
                         "sha256": workload.provenance.get("parquet_sha256"),
                         "statistics": workload.statistics},
            "device": "cuda",
            "produced_by": f"real sglang {session.version} on {', '.join(session.gpus)}",
        },
    )
    summary = RunSummary(
        **latency,
        steps=len(steps),
        decode_steps=len(decode),
        mean_batch_size=weighted("batch_size"),
        mean_decode_batch_size=sum(decode) / len(decode) if decode else 0.0,
        mean_shared_prefix_tokens=weighted("shared_prefix_tokens"),
        mean_distinct_groups=weighted("distinct_groups"),
        prefix_cache_hit_tokens=hits,
        prefix_cache_hit_rate=hits / latency["prompt_tokens"] if latency["prompt_tokens"]
        else 0.0,
        sched_cpu_s_measured=sched_cpu,
        policy_cpu_s=sum(s["policy_cpu_s"] for s in steps),
        sched_cpu_fraction_of_step_time=sched_cpu / busy,
        decisions_stop=sum(s["decisions_stop"] for s in steps),
        engine_startup_s=session.startup_s,
        wall_s=wall_s,
        nvml={**nvml.record, "file": NVML_FILE if series is not None else None},
        provenance=provenance,
    )
    return {"summary": summary.to_json(), "trace": trace, "requests": request_table,
            "nvml": series}


def setup_from_args(args: Any) -> SGLangSetup:
    """`feather run`'s options as SGLang's: `--max-num-seqs` = max_running_requests,
    `--max-num-batched-tokens` = chunked prefill size, `--num-blocks` x `--block-size` = KV
    pool tokens, `--block-size` = page size."""
    page = args.block_size
    return SGLangSetup(
        model=args.model, max_running_requests=args.max_num_seqs,
        chunked_prefill_size=args.max_num_batched_tokens,
        max_total_tokens=args.num_blocks * (page or 1) if args.num_blocks else None,
        page_size=page, context_length=args.max_model_len, dtype=args.dtype,
        model_root=args.model_root,
    )


def check_runs(runs: list, workload: Any, workload_spec: str) -> None:
    """Before any engine starts: every scheduler SGLang does not own resolves, and the
    workload is offline (SGLang's runs submit every request at t = 0)."""
    from feather.policies import resolve_scheduler

    for run in runs:
        if not is_native(run.scheduler_class, run.params):
            resolve_scheduler(run.scheduler_class)
    if workload.statistics.get("arrival_span_s", 0.0) > 0:
        raise ValueError(f"{workload_spec}: build the workload with --arrival all")


@dataclass
class SGLangRunOutput:
    """One repeat's tables and summary (`build_result`), written as the vLLM runner's."""

    result: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return self.result["summary"]

    def write(self, out_dir: str | Path) -> Path:
        from feather.rundir import write_run_dir
        from feather.telemetry import NVML_FILE

        r = self.result
        return write_run_dir(out_dir, r["trace"], r["requests"], r["summary"],
                             {NVML_FILE: r["nvml"]})


class SGLangRunSession:
    """The run interface (`feather.engines.session`) over one scheduler's engine and the
    temporary directory its scheduler records into."""

    def __init__(self, session: SGLangSession, trace_dir: tempfile.TemporaryDirectory) -> None:
        self.session, self._trace_dir = session, trace_dir

    def run(self, run: Any, workload: Any) -> SGLangRunOutput:
        from feather.telemetry import NvmlSampler

        started_utc = datetime.now(UTC).isoformat(timespec="milliseconds")
        wall0 = time.perf_counter()
        with NvmlSampler() as nvml:
            steps, reqs = self.session.run(workload, run.repeat, f"{run.scheduler}:")
        return SGLangRunOutput(build_result(
            self.session, workload, run.workload, run.scheduler, run.params, run.seed,
            run.repeat, steps, reqs, started_utc, time.perf_counter() - wall0, nvml,
        ))

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self._trace_dir.cleanup()


def sessions(setup: SGLangSetup, runs: list, workload: Any, say: Any) -> Iterator[tuple]:
    """One engine start per scheduler label, in the order the labels first appear, serving
    that label's repeats; the next starts only once the caller has closed this one."""
    for label in dict.fromkeys(run.scheduler for run in runs):
        mine = [run for run in runs if run.scheduler == label]
        first = mine[0]
        trace_dir = tempfile.TemporaryDirectory(prefix="feather-sglang-")
        say(f"starting sglang for {label}")
        try:
            session = SGLangSession(setup, first.scheduler_class, first.params, first.seed,
                                    required_context(workload), Path(trace_dir.name))
        except BaseException:
            trace_dir.cleanup()
            raise
        yield SGLangRunSession(session, trace_dir), mine
