"""The hooks the plugin puts on SGLang's scheduler (imported only inside SGLang's env).

Which methods, and why these:

- `SchedulePolicy.calc_priority` (AROUND): SGLang's own ordering runs first (`fcfs`: arrival
  order, plus the cache matching it does for its load reports); then our policy puts its
  first candidate at the head. The one place every prefill pass orders its queue.
- `PrefillAdder.add_one_req` (AROUND): the one place a waiting request is committed to a
  prefill batch, after SGLang's own token and memory checks. Our policy learns what was
  committed, picks the next candidate, or ends the walk at STOP by answering OTHER before
  SGLang commits anything.
- `Scheduler.init_schedule_policy` (AFTER): where the scheduler builds its SchedulePolicy
  and knows its tree, limits and options: the policy is attached there (or refused, with
  the reason, for options it cannot serve).
- `Scheduler.get_next_batch_to_run` (AROUND), `process_batch_result` (AFTER): a step's
  scheduling CPU time and batch, then its step time and tokens (records; learning rewards).
- `Scheduler.flush_cache` (AFTER): between runs the runner flushes the cache; a fresh policy
  and a new run in the records start there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from feather.engines.sglang.driver import DRIVER_ATTR, AdmissionDriver
from feather.engines.sglang.records import StepRecorder
from feather.engines.sglang.settings import PluginSettings
from feather.policies import StepOutcome, create_engine_policy

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
PREFILL_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
RECORDER_ATTR = "_feather_recorder"
FACTORY_ATTR = "_feather_new_driver"
DEFAULT_CHUNK_TOKENS = 16


def new_driver(
    settings: PluginSettings, tree_cache: Any, *, max_running: int, page_size: int = 1
) -> AdmissionDriver:
    """Our policy for one SGLang scheduler (chunks of `chunk_size` tokens, default 16: the
    CHT hashes prompts itself; SGLang's radix tree has no block hashes to reuse)."""
    assert settings.scheduler is not None
    policy = create_engine_policy(
        settings.scheduler,
        settings.params,
        block_size=int(settings.params.get("chunk_size", DEFAULT_CHUNK_TOKENS)),
        seed=settings.seed,
        page_size=page_size,
    )
    return AdmissionDriver(policy, tree_cache, max_running)


def attach(schedule_policy: Any, driver: AdmissionDriver) -> None:
    setattr(schedule_policy, DRIVER_ATTR, driver)


def unsupported_options(scheduler: Any) -> list[str]:
    """Scheduler options under which SGLang's walk may skip a waiting request or never walk
    it (our policy would lose track of its candidate)."""
    found = []
    if getattr(scheduler, "schedule_policy", "fcfs") != "fcfs":
        found.append(
            f"--schedule-policy {scheduler.schedule_policy} (run Feather with fcfs: SGLang's "
            "own matching and sorting would reorder the queue before ours)"
        )
    for attr, flag in (
        ("enable_lora", "--enable-lora"),
        ("enable_hicache_storage", "hierarchical cache storage"),
        ("enable_lmcache", "LMCache"),
        ("enable_priority_preemption", "priority preemption"),
    ):
        if getattr(scheduler, attr, False):
            found.append(flag)
    if getattr(scheduler, "dllm_config", None) is not None:
        found.append("diffusion LLM scheduling")
    mode = getattr(scheduler, "disaggregation_mode", None)
    if mode is not None and str(getattr(mode, "value", mode)).lower() != "null":
        found.append(f"disaggregation mode {mode}")
    return found


# ---- the hooks ---------------------------------------------------------------------------------
def after_init_schedule_policy(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    settings = PluginSettings.from_env()
    if settings.scheduler is not None:
        bad = unsupported_options(scheduler)
        if bad:
            raise ValueError(
                f"Feather scheduler {settings.scheduler!r} cannot run with: {'; '.join(bad)}"
            )

        def factory() -> AdmissionDriver:
            return new_driver(
                settings,
                scheduler.tree_cache,
                max_running=scheduler.max_running_requests,
                page_size=scheduler.page_size,
            )

        setattr(scheduler, FACTORY_ATTR, factory)
        attach(scheduler.policy, factory())
    if settings.trace_dir is not None:
        setattr(scheduler, RECORDER_ATTR, StepRecorder(settings.trace_dir, _facts(scheduler)))
    return None


def around_calc_priority(original: Callable, schedule_policy: Any, waiting_queue, *a, **kw):
    result = original(schedule_policy, waiting_queue, *a, **kw)
    driver: AdmissionDriver | None = getattr(schedule_policy, DRIVER_ATTR, None)
    if driver is not None:
        driver.open_pass(waiting_queue)
    return result


def around_add_one_req(original: Callable, adder: Any, req: Any, *a: Any, **kw: Any):
    driver = AdmissionDriver.for_tree(adder.tree_cache)
    if driver is None:
        return original(adder, req, *a, **kw)
    from sglang.srt.managers.schedule_policy import AddReqResult

    if not driver.candidate(req):
        return AddReqResult.OTHER  # STOP: nothing committed, the walk ends
    result = original(adder, req, *a, **kw)
    committed = bool(adder.can_run_list) and adder.can_run_list[-1] is req
    driver.outcome(req, committed, result == AddReqResult.CONTINUE)
    return result


def around_get_next_batch_to_run(original: Callable, scheduler: Any, *a: Any, **kw: Any):
    recorder: StepRecorder | None = getattr(scheduler, RECORDER_ATTR, None)
    driver: AdmissionDriver | None = getattr(scheduler.policy, DRIVER_ATTR, None)
    start = recorder.now() if recorder is not None else 0.0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    plan = original(scheduler, *a, **kw)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    record = None
    if driver is not None and driver.in_pass:
        driver.close_pass()
        record = driver.last_record
    if recorder is not None:
        recorder.on_schedule(
            plan.batch_to_run,
            start_s=start,
            cpu_s=cpu,
            wall_s=wall,
            policy_cpu_s=driver.take_policy_cpu_s() if driver is not None else 0.0,
            waiting=len(scheduler.waiting_queue),
            record=record,
        )
    return plan


def after_process_batch_result(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    recorder: StepRecorder | None = getattr(scheduler, RECORDER_ATTR, None)
    row = recorder.on_result() if recorder is not None else None
    driver: AdmissionDriver | None = getattr(scheduler.policy, DRIVER_ATTR, None)
    if row is not None and driver is not None:
        driver.policy.report_step(
            StepOutcome(
                row["batch_size"],
                row["sampled_tokens"],
                row["step_time_s"],
                row["prefill_tokens"],
            )
        )
    return None


def after_flush_cache(flushed: bool, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    if not flushed:
        return None
    factory = getattr(scheduler, FACTORY_ATTR, None)
    if factory is not None:
        attach(scheduler.policy, factory())
    recorder: StepRecorder | None = getattr(scheduler, RECORDER_ATTR, None)
    if recorder is not None:
        recorder.new_run()
    return None


def _sglang_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "unknown (no sglang distribution installed)"


def _facts(scheduler: Any) -> dict[str, Any]:
    """What the started scheduler uses: version, attention backend, limits, policy."""
    settings = PluginSettings.from_env()
    try:
        backend = type(scheduler.tp_worker.model_runner.attn_backend).__name__
    except AttributeError:
        backend = "unknown (not reachable in this SGLang build)"
    return {
        "name": "sglang",
        "version": _sglang_version(),
        "attention_backend": backend,
        "schedule_policy": getattr(scheduler, "schedule_policy", None),
        "feather_scheduler": settings.scheduler,
        "feather_params": settings.params,
        "page_size": getattr(scheduler, "page_size", None),
        "max_running_requests": getattr(scheduler, "max_running_requests", None),
        "max_total_num_tokens": getattr(scheduler, "max_total_num_tokens", None),
        "chunked_prefill_size": getattr(scheduler, "chunked_prefill_size", None),
        "tree_cache": type(scheduler.tree_cache).__name__,
        "radix_cache_disabled": bool(getattr(scheduler.tree_cache, "disable", False)),
        "overlap_schedule": bool(getattr(scheduler, "enable_overlap", False)),
    }


HOOKS: tuple[tuple[str, Callable, str], ...] = (
    (f"{SCHEDULER}.init_schedule_policy", after_init_schedule_policy, "AFTER"),
    (f"{SCHEDULE_POLICY}.calc_priority", around_calc_priority, "AROUND"),
    (f"{PREFILL_ADDER}.add_one_req", around_add_one_req, "AROUND"),
    (f"{SCHEDULER}.get_next_batch_to_run", around_get_next_batch_to_run, "AROUND"),
    (f"{SCHEDULER}.process_batch_result", after_process_batch_result, "AFTER"),
    (f"{SCHEDULER}.flush_cache", after_flush_cache, "AFTER"),
)
