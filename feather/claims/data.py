"""Columns the claims derive from the summary table: a run's scheduler parameters, its
attention kernel, the throughput a claim compares, a synthetic spec's shape."""

from __future__ import annotations

import json
import re

import pandas as pd


def with_params(frame: pd.DataFrame) -> pd.DataFrame:
    expanded = frame["params"].map(json.loads).apply(pd.Series)
    return pd.concat([frame.reset_index(drop=True), expanded.reset_index(drop=True)], axis=1)


ATTENTION_LABELS = {"vllm": "vLLM CPU_ATTN", "cascade": "cascade (ours, in vLLM)",
                    "pat": "pat (ours, in vLLM)"}


def kernel_labels(data: pd.DataFrame) -> pd.Series:
    """What attended each run: the simulator's kernel, or a real engine's backend as the
    engine loaded it (the `attention` column)."""
    attention = data["attention"] if "attention" in data else pd.Series(None, index=data.index)
    return pd.Series(
        [ATTENTION_LABELS.get(a, a) if engine != "sim" and isinstance(a, str) else kernel
         for engine, kernel, a in zip(data.engine, data.kernel, attention, strict=True)],
        index=data.index,
    )


def compared_throughput(data: pd.DataFrame) -> pd.Series:
    """The throughput C2 compares: of the decode-only steps on a real engine and on the cpu
    profile (which prices the real engine's batches), of the whole run on the GPU profiles."""
    decode = (data.engine != "sim") | (data.hardware == "cpu")
    if "decode_only_tok_s" not in data:  # a table of GPU profiles' runs only
        return data.output_tok_s.where(~decode)
    return data.decode_only_tok_s.where(decode, data.output_tok_s)


def batch_requests(spec: str) -> int:
    """The requests of a synthetic spec (its groups x per_group)."""
    per_group = re.search(r"per_group=(\d+)", spec)
    groups = re.search(r"groups=(\d+)", spec)
    return int(per_group.group(1) if per_group else 100) * int(groups.group(1) if groups else 8)


def group_size(spec: str) -> int:
    """The requests per prefix group of a synthetic spec (100 where it names none)."""
    per_group = re.search(r"per_group=(\d+)", str(spec))
    return int(per_group.group(1)) if per_group else 100


def divergent_requests(spec: str) -> int:
    """How many requests of a synthetic spec's groups are made unshared."""
    fraction = re.search(r"unshared=([0-9.]+)", spec)
    if not fraction:
        return 0
    per_group = re.search(r"per_group=(\d+)", spec)
    groups = re.search(r"groups=(\d+)", spec)
    total = int(per_group.group(1) if per_group else 100) * int(groups.group(1) if groups else 8)
    return round(float(fraction.group(1)) * total)


def ratio_to(data: pd.DataFrame, baseline: str, keys: list[str]) -> pd.Series:
    base = data[data.scheduler == baseline].groupby(keys)["output_tok_s"].mean()
    return pd.Series(
        [
            r.output_tok_s / base[tuple(getattr(r, k) for k in keys)]
            if len(keys) > 1
            else r.output_tok_s / base[getattr(r, keys[0])]
            for r in data.itertuples()
        ],
        index=data.index,
    )


def regime_of(run: str) -> str:
    """The experiment's workload name a run directory starts with (`cascade_16k@cascade__fcfs
    __r0`, `cascade_16k__fcfs__kv-llama__s0`): what pairs a real run with its simulation."""
    return str(run).split("__")[0].split("@")[0]
