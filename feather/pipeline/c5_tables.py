"""The C5 family's numbers as tables: throughput ratios within one regime, where time went,
latency under load. Figures, `figures/ours.md` and `figures/verdicts.md` all read these, so
a ratio means the same thing everywhere.

A *setting* is everything a comparison must hold fixed: hardware, model, engine mode, the
workload's arrival order and order seed, its output regime and the KV pool. Ratios are taken
between schedulers of one setting only; spread is over order seeds.
"""

from __future__ import annotations

import pandas as pd

SETTING = [
    "hardware",
    "model",
    "engine_mode",
    "arrival_order",
    "order_seed",
    "output_regime",
    "kv_pool_tokens",
]
BASELINES = ("fcfs", "lpm", "dfs-weight")
FEATHER_PREFIX = "feather"
TIME_PARTS = ("prefill", "recompute", "decode", "scheduling", "idle")


def offline(table: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """An experiment's offline runs (all requests at time 0), capacity runs excluded."""
    data = table[(table.experiment == experiment) & (table.engine == "sim")].copy()
    data = data[~data.run.astype(str).str.startswith("capacity__")]
    if "arrival" in data:
        data = data[data.arrival.isna() | (data.arrival == "all")]
    for column in SETTING:
        if column not in data:
            data[column] = None
    return data


def with_ratios(data: pd.DataFrame, baselines: tuple[str, ...] = BASELINES) -> pd.DataFrame:
    """Each run with `vs_<baseline>`: its output throughput over the baseline's mean in
    the same setting (NaN where the setting has no such baseline)."""
    out = data.copy()
    keys = [c for c in SETTING if c in out]
    setting = pd.Series(
        ["|".join(map(str, values)) for values in zip(*(out[c] for c in keys), strict=True)],
        index=out.index,
    )
    for baseline in baselines:
        mask = out.scheduler == baseline
        base = out[mask].groupby(setting[mask])["output_tok_s"].mean()
        out[f"vs_{baseline}"] = out["output_tok_s"] / setting.map(base)
    return out


def ratio_summary(data: pd.DataFrame, by: list[str], column: str) -> pd.DataFrame:
    """Mean, min and max of a ratio column over order seeds, per `by`."""
    grouped = data.dropna(subset=[column]).groupby(by, dropna=False)[column]
    return grouped.agg(["mean", "min", "max", "count"]).reset_index()


def feather_rows(data: pd.DataFrame) -> pd.DataFrame:
    return data[data.scheduler.astype(str).str.startswith(FEATHER_PREFIX)]


def best_feather(data: pd.DataFrame, baseline: str, by: list[str]) -> pd.DataFrame:
    """Per `by`: the Feather policy with the highest mean ratio to `baseline`, with its
    mean/min/max over seeds."""
    summary = ratio_summary(feather_rows(data), [*by, "scheduler"], f"vs_{baseline}")
    if summary.empty:
        return summary
    best = summary.loc[summary.groupby(by, dropna=False)["mean"].idxmax()]
    return best.reset_index(drop=True)


def pool_label(row: pd.Series) -> str:
    ratio = row.get("pool_to_prefix_ratio")
    if ratio is None or pd.isna(ratio):
        return "pool n/a"
    text = f"pool {ratio:.2f}x prefixes"
    return text + " (hypothetical)" if bool(row.get("pool_hypothetical")) else text


def order_label(order: object, seeds: int = 1) -> str:
    if order == "grouped":
        return "grouped (control)"
    if order == "shuffled":
        return f"shuffled ({seeds} seed{'s' if seeds != 1 else ''})"
    return str(order)


def output_label(regime: object) -> str:
    return "reference outputs" if regime in (None, "reference") else f"{regime} output tokens"


def time_split(data: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per part of the makespan, per scheduler and setting."""
    parts = [f"time_{p}_s" for p in TIME_PARTS if f"time_{p}_s" in data]
    keys = [c for c in [*SETTING, "scheduler", "pool_to_prefix_ratio"] if c in data]
    return data.groupby(keys, dropna=False)[[*parts, "makespan_s"]].mean().reset_index()


def load_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The load experiment's runs at a load factor (capacity runs excluded)."""
    data = table[(table.experiment == "load") & (table.engine == "sim")].copy()
    if "load_factor" not in data:
        return data.iloc[0:0]
    return data[data.load_factor.notna()]
