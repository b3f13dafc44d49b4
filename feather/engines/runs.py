"""What a real-engine run is (a workload through one scheduler, repeat k of n), shared by the
vLLM and SGLang runners and the `feather run` command line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# vLLM's disable_cascade_attn as `feather run --cascade-attention` sets it
CASCADE_CHOICES = ("default", "on", "off")
# the attention backend of a vLLM run: vLLM's own, or our prefix-aware subclass of it in one
# of its modes (feather.engines.vllm.attention_plugin.MODES)
ATTENTION_CHOICES = ("vllm", "cascade", "pat")
# what a vLLM run's prefix cache holds when it starts: nothing, or every group's prefix
PREFIX_CACHE_CHOICES = ("cold", "warm")


# a real-engine job as the pipeline specifies it (`feather run --spec`): engine, workload,
# model, schedulers ({label, class, params}), repeats, seed, run_prefix, the engine's options
# (each a `feather run` flag by its name: max_num_seqs, attention, ...) and a user model profile
ENGINE_JOB_FORMAT = "feather-engine-job/1"
ENGINE_JOB_KEYS = {"engine", "workload", "model", "repeats", "seed", "run_prefix"}


def is_our_backend(backend_class: str) -> bool:
    """Whether an engine's attention backend class is our prefix-aware one, not vLLM's."""
    return str(backend_class).startswith("feather.")


def run_attention(summary: dict[str, Any]) -> str | None:
    """A real engine run's attention as the engine loaded it: `vllm` (vLLM's own backend) or
    our prefix-aware backend's mode; None for the simulator (its `kernel` says) and for runs
    recorded before the backend was recorded."""
    record = summary.get("attention")
    if not isinstance(record, dict):
        return None
    return record.get("requested") if is_our_backend(record.get("backend_class", "")) else "vllm"


@dataclass(frozen=True)
class EngineRun:
    """One run: a workload through one scheduler (repeat k of n)."""

    workload: str
    scheduler: str  # the label figures show
    scheduler_class: str = ""  # registry name or package.module:Class ("" = the label)
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    repeat: int = 0


def engine_runs(items: list[str | dict[str, Any]], seed: int, repeats: int) -> list[EngineRun]:
    """`--scheduler` values (a name, or a JSON object with label/class/params; a spec's
    `schedulers` give the objects themselves) x repeats, interleaved: repeat 0 of every
    scheduler, then repeat 1, ... (drift hits all alike)."""
    from feather.policies import check_scheduler_params

    specs = []
    for item in items:
        if isinstance(item, dict) or item.lstrip().startswith("{"):
            try:
                raw = item if isinstance(item, dict) else json.loads(item)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--scheduler {item!r}: not valid JSON ({exc})") from None
            unknown = set(raw) - {"label", "class", "params"}
            if unknown or "label" not in raw:
                raise ValueError(
                    f"--scheduler {item!r}: a JSON scheduler needs 'label' and may have "
                    f"'class' and 'params' (unknown: {sorted(unknown)})"
                )
            label, cls = raw["label"], raw.get("class", raw["label"])
            if not (isinstance(label, str) and label and isinstance(cls, str) and cls):
                raise ValueError(f"--scheduler {item!r}: label and class must be names (text)")
            specs.append((label, cls, raw.get("params", {})))
        else:
            specs.append((item, item, {}))
    for label, cls, params in specs:  # an unknown name or parameter fails before the engine
        check_scheduler_params(cls, params, where=f"--scheduler {label}")
    labels = [label for label, _, _ in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--scheduler labels must be distinct, got {labels}")
    return [
        EngineRun("", label, cls, params, seed, repeat)
        for repeat in range(repeats)
        for label, cls, params in specs
    ]
