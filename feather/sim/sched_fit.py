"""Fit the measured scheduling-cost models (`sched_measured`) to the overhead bench's rows,
and compare two fits (the committed default against a refit: the drift report).

Each bench row is one implementation forming one batch on one case (W waiting requests in
G groups, each a P-token group prefix plus S tokens of its own; the first G - U groups'
prefixes cached); it maps to one component's features (`row_features`) and its measured CPU
seconds. Every component is a non-negative linear form, fitted by least squares on relative
error (costs span four orders of magnitude; weights 1 / predicted, see `_fit_relative`). Fit
quality: R^2, and the relative error on the bench's own rows and on each row held out (the
fit redone without that case: leave-one-case-out).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from feather.provenance import collect_provenance
from feather.sim.linear_fit import nnls, r_squared
from feather.sim.sched_measured import FORMAT, FORMS, RELEASES, form_of

CASE_FIELDS = ("waiting", "prefix_tokens", "groups", "batch", "page", "suffix_tokens", "seed",
               "uncached_groups")
ROW_COLUMNS = (*CASE_FIELDS, "engine", "engine_version", "structure", "variant", "batch_s",
               "batch_s_min", "batch_s_max", "repeats", "decisions", "admitted",
               "arrival_s_per_request", "arrival_cpu_s_per_request",
               "arrival_hashes_cpu_s_per_request")
HOST_NOTE = (
    "CPU times measured on a 2-core VM (2 vCPUs, shared with other sessions while the bench "
    "ran); a server CPU pays less: scale with care."
)
# Reference points of the drift report and of `feather sched-cost table`: W waiting,
# P-token prefixes in 8 groups (all cached), 64 own tokens each, batches of 64, page 16.
REFERENCE_POINTS = ((128, 4096), (1000, 4096), (1000, 16384), (3000, 16384), (10000, 4096))


def release_of(row: pd.Series | dict) -> str:
    """SGLang's release/tree as the model names it (sglang-0.5.23-rust, sglang-0.5.10...)."""
    tree = "rust" if "Rust" in str(row["structure"]) else "python"
    name = f"sglang-{row['engine_version']}-{tree}"
    if name not in RELEASES and f"sglang-{row['engine_version']}" in RELEASES:
        name = f"sglang-{row['engine_version']}"
    return name


def _hit_tokens(row: pd.Series | dict) -> int:
    """Cached tokens of the first `batch` requests in arrival order (scenario.head_hit_tokens)."""
    cached = int(row["groups"]) - int(row.get("uncached_groups", 0) or 0)
    head = min(int(row["batch"]), int(row["waiting"]))
    return sum(int(row["prefix_tokens"]) for i in range(head) if i % int(row["groups"]) < cached)


def components_of(row: pd.Series | dict) -> list[str]:
    """The components a bench row measures (none for variants no model uses)."""
    engine, variant = row["engine"], row["variant"]
    if engine == "vllm" and variant == "fcfs":
        return ["vllm:lookup"]
    if engine == "feather":
        if variant == "cht":
            hashed = row.get("arrival_hashes_cpu_s_per_request")
            timed = hashed is not None and not (isinstance(hashed, float) and math.isnan(hashed))
            return ["feather:arrival", *(["feather:arrival-hashes"] if timed else [])]
        return ["feather:decision"] if variant == "feather-static" else []
    if engine != "sglang":
        return []
    release = release_of(row)
    if variant == "match":
        return [f"{release}:match"]
    if variant == "dfs-weight":
        return [f"{release}:dfs-weight"]
    if variant == "lpm-nofallback":
        return [f"{release}:lpm"]
    if variant == "lpm":  # as shipped: matching up to 128 waiting, FCFS above
        fallback = int(row["waiting"]) > 128
        return [f"{release}:lpm-fallback" if fallback else f"{release}:lpm"]
    return []


def row_features(component: str, row: pd.Series | dict) -> tuple[dict[str, float], float]:
    """(feature values, measured seconds) of one bench row for one component."""
    w, page = int(row["waiting"]), int(row["page"])
    length = int(row["prefix_tokens"]) + int(row["suffix_tokens"])
    cached_groups = int(row["groups"]) - int(row.get("uncached_groups", 0) or 0)
    n = float(row["decisions"])
    form = form_of(component)
    if component == "feather:arrival-hashes":
        seconds = float(row["arrival_hashes_cpu_s_per_request"])
        return {"per_arrival_s": 1.0, "per_arrival_chunk_s": length / page}, seconds
    if form == "arrival":
        seconds = row.get("arrival_cpu_s_per_request")
        if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
            seconds = row["arrival_s_per_request"]
        return {"per_arrival_s": 1.0, "per_arrival_chunk_s": length / page}, float(seconds)
    y = float(row["batch_s"])
    if form == "lookup":
        return {"per_lookup_s": n, "per_hit_block_s": _hit_tokens(row) / page,
                "per_block_s": n * length / page}, y
    if form == "match":
        return {"per_request_s": n, "per_request_token_s": n * length,
                "per_hit_token_s": float(_hit_tokens(row))}, y
    if form == "pass":
        return {"per_pass_s": 1.0, "per_waiting_s": w, "per_waiting_token_s": w * length,
                "per_tree_node_s": cached_groups}, y
    if form == "fallback":
        return {"per_pass_s": 1.0, "per_waiting_s": w}, y
    if form == "decision":
        admitted = float(row["admitted"])
        return {"per_decision_s": n, "per_decision_log2_waiting_s": n * math.log2(1 + w),
                "per_candidate_chunk_s": admitted * length / page}, y
    raise ValueError(f"no bench mapping for component {component!r}")


def _matrix(component: str, rows: Sequence[pd.Series]) -> tuple[np.ndarray, np.ndarray]:
    names = FORMS[form_of(component)]
    pairs = [row_features(component, r) for r in rows]
    x = np.array([[f[name] for name in names] for f, _ in pairs], dtype=float)
    y = np.array([s for _, s in pairs], dtype=float)
    return x, y


def _fit_relative(x: np.ndarray, y: np.ndarray, rounds: int = 20) -> np.ndarray:
    """Least squares on error relative to the *prediction* (a gamma-family fit by reweighting,
    starting from weights 1 / measured): relative to the measurement alone, it would lean
    low under this bench's multiplicative noise."""
    scale = 1.0 / y
    beta = nnls(x * scale[:, None], y * scale)
    for _ in range(rounds):
        predicted = x @ beta
        if (predicted <= 0).any():
            break
        scale = 1.0 / predicted
        beta = nnls(x * scale[:, None], y * scale)
    return beta


def fit_component(component: str, rows: Sequence[pd.Series]) -> dict[str, Any]:
    """Coefficients and fit quality of one component."""
    x, y = _matrix(component, rows)
    if (y <= 0).any():
        raise ValueError(f"{component}: a bench row measured no time")
    beta = _fit_relative(x, y)
    predicted = x @ beta
    held_out = np.empty_like(y)
    cases = [tuple(int(r[c]) for c in CASE_FIELDS if c in r) for r in rows]
    for i in range(len(y)):
        keep = np.array([cases[j] != cases[i] for j in range(len(y))])
        held_out[i] = x[i] @ _fit_relative(x[keep], y[keep]) if keep.sum() >= 2 else np.nan
    rel = np.abs(predicted - y) / y
    rel_held = np.abs(held_out - y) / y
    names = FORMS[form_of(component)]
    return {
        "form": form_of(component),
        "coefficients": dict(zip(names, beta.tolist(), strict=True)),
        "quality": {
            "rows": len(y),
            "r2": r_squared(y, predicted),
            "median_rel_error": float(np.median(rel)),
            "max_rel_error": float(rel.max()),
            "held_out_median_rel_error": float(np.nanmedian(rel_held)),
            "held_out_p90_rel_error": float(np.nanpercentile(rel_held, 90)),
            "held_out_max_rel_error": float(np.nanmax(rel_held)),
        },
    }


def normalise(rows: pd.DataFrame) -> pd.DataFrame:
    """Bench rows with every column the fit reads (older tables lack some)."""
    rows = rows.copy()
    if "uncached_groups" not in rows:
        rows["uncached_groups"] = 0
    for column in ("arrival_cpu_s_per_request", "arrival_hashes_cpu_s_per_request"):
        if column not in rows:
            rows[column] = np.nan
    return rows


def fit_bench(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Every component the rows measure, fitted."""
    rows = normalise(rows)
    by_component: dict[str, list[pd.Series]] = {}
    for _, row in rows.iterrows():
        for component in components_of(row):
            by_component.setdefault(component, []).append(row)
    return {name: fit_component(name, group) for name, group in sorted(by_component.items())}


def bench_record(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the data keeps of each bench run's provenance: host, versions, code, times."""
    kept = []
    for record in records:
        prov = record.get("provenance", {})
        kept.append({
            "implementations": prov.get("config", {}).get("implementations"),
            "sweep": prov.get("config", {}).get("sweep"),
            "repeats": prov.get("config", {}).get("repeats"),
            "host": prov.get("host"),
            "packages": prov.get("packages"),
            "python": (prov.get("python") or {}).get("version"),
            "git": prov.get("git"),
            "started_utc": prov.get("started_utc"),
            "finished_utc": prov.get("finished_utc"),
            "skipped": record.get("skipped", []),
        })
    return kept


def measured_data(
    rows: pd.DataFrame,
    records: Sequence[dict[str, Any]],
    rows_file: str | None = None,
) -> dict[str, Any]:
    """The data file `MeasuredCostModel` reads: fitted components, models, provenance."""
    rows = normalise(rows)
    components = fit_bench(rows)
    models = {}
    for release in RELEASES:
        needed = [f"{release}:{part}" for part in ("match", "lpm", "lpm-fallback", "dfs-weight")]
        needed += ["vllm:lookup", "feather:decision", "feather:arrival"]
        missing = [c for c in needed if c not in components]
        if missing:
            raise ValueError(f"the bench rows lack what model {release} needs: {missing} "
                             f"(run the overhead experiment's full sweep with every baseline)")
        models[release] = {"release": release}
    versions = sorted({f"{r.engine} {r.engine_version} ({r.structure})"
                       for r in rows.itertuples()})
    csv_bytes = bench_csv(rows).encode()
    return {
        "format": FORMAT,
        "host_note": HOST_NOTE,
        "bench": {
            "rows_file": rows_file,
            "rows_sha256": hashlib.sha256(csv_bytes).hexdigest(),
            "rows": len(rows),
            "cases": int(rows[list(CASE_FIELDS)].drop_duplicates().shape[0]),
            "implementations": versions,
            "runs": bench_record(records),
        },
        "fit": {
            "method": "non-negative least squares on error relative to the prediction "
                      "(reweighted 1/predicted from 1/measured, 20 rounds)",
            "forms": {name: list(features) for name, features in FORMS.items()},
            "held_out": "leave-one-case-out: each case's row predicted by a fit without it",
        },
        "models": models,
        "components": components,
        "provenance": collect_provenance(config={"rows_sha256": hashlib.sha256(
            csv_bytes).hexdigest(), "forms": {k: list(v) for k, v in FORMS.items()}}),
    }


def extend_data(
    data: dict[str, Any],
    rows: pd.DataFrame,
    records: Sequence[dict[str, Any]],
    only: Sequence[str],
    rows_file: str | None = None,
) -> dict[str, Any]:
    """`data` with the components `only` fitted from another bench run (e.g. a component the
    committed sweep did not measure), that run's provenance listed under `extensions`; every
    other component is kept as it was."""
    rows = normalise(rows)
    fitted = fit_bench(rows)
    missing = [c for c in only if c not in fitted]
    if missing:
        raise ValueError(f"the bench rows do not measure {missing}")
    out = json.loads(json.dumps(data))
    out["components"].update({c: fitted[c] for c in only})
    out.setdefault("extensions", []).append({
        "components": list(only),
        "rows_file": rows_file,
        "rows_sha256": hashlib.sha256(bench_csv(rows).encode()).hexdigest(),
        "rows": len(rows),
        "runs": bench_record(records),
    })
    return out


def bench_csv(rows: pd.DataFrame) -> str:
    """The rows the fit reads, as compact, stable text (committed beside the data)."""
    rows = normalise(rows)
    # a column later benches added is written only where measured (older rows stay as they were)
    columns = [c for c in ROW_COLUMNS if c in rows
               and (c != "arrival_hashes_cpu_s_per_request" or rows[c].notna().any())]
    ordered = rows[columns].sort_values(
        [*CASE_FIELDS, "engine", "engine_version", "structure", "variant"], kind="stable")
    return ordered.to_csv(index=False, float_format="%.9g", lineterminator="\n")


def rows_from_csv(text: str) -> pd.DataFrame:
    """Rows back from `bench_csv` text (which they reproduce exactly)."""
    import io

    return normalise(pd.read_csv(io.StringIO(text)))


# ---- prices at reference points, and the drift between two fits -------------------------------

def reference_costs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each component's price at the reference points (a pass, or 64 requests / decisions)."""
    out = []
    for component, part in sorted(data["components"].items()):
        for w, p in REFERENCE_POINTS:
            row = {"waiting": w, "prefix_tokens": p, "groups": 8, "batch": 64, "page": 16,
                   "suffix_tokens": 64, "seed": 0, "uncached_groups": 0,
                   "decisions": 65 if component == "feather:decision" else 64, "admitted": 64,
                   "batch_s": 1.0, "arrival_s_per_request": 1.0,
                   "arrival_cpu_s_per_request": 1.0, "arrival_hashes_cpu_s_per_request": 1.0}
            features, _ = row_features(component, row)
            seconds = sum(c * features[k] for k, c in part["coefficients"].items())
            out.append({"component": component, "waiting": w, "prefix_tokens": p,
                        "seconds": seconds})
    return out


def drift_report(committed: dict[str, Any], refit: dict[str, Any]) -> str:
    """Markdown: coefficients and reference-point prices, committed default vs refit."""
    lines = [
        "# Scheduling-cost models: committed default vs refit from this run's overhead bench",
        "",
        "The simulator keeps using the committed default; this page says how far a refit "
        f"moves it. {HOST_NOTE}",
        "",
        f"- committed: bench of {_when(committed)}, {committed['bench']['rows']} rows",
        f"- refit: bench of {_when(refit)}, {refit['bench']['rows']} rows",
        "",
        "## Prices at reference points (8 cached groups, 64 own tokens, batch 64, page 16)",
        "",
        "A pass (lpm, dfs-weight, lpm-fallback) or 64 lookups / matches / decisions.",
        "",
        "| component | W | P | committed (ms) | refit (ms) | refit / committed |",
        "|---|---|---|---|---|---|",
    ]
    mine = {(r["component"], r["waiting"], r["prefix_tokens"]): r["seconds"]
            for r in reference_costs(refit)}
    for r in reference_costs(committed):
        new = mine.get((r["component"], r["waiting"], r["prefix_tokens"]))
        ratio = f"{new / r['seconds']:.2f}x" if new is not None and r["seconds"] else "-"
        new_ms = f"{new * 1e3:.3f}" if new is not None else "missing"
        lines.append(f"| {r['component']} | {r['waiting']:,} | {r['prefix_tokens']:,} | "
                     f"{r['seconds'] * 1e3:.3f} | {new_ms} | {ratio} |")
    lines += ["", "## Coefficients", "", "| component | coefficient | committed | refit |",
              "|---|---|---|---|"]
    for component, part in sorted(committed["components"].items()):
        other = refit["components"].get(component, {}).get("coefficients", {})
        for name, value in part["coefficients"].items():
            new = other.get(name)
            lines.append(f"| {component} | {name} | {value:.4g} | "
                         f"{'missing' if new is None else f'{new:.4g}'} |")
    lines += ["", "## Fit quality of the refit (held out: leave-one-case-out)", "",
              "| component | rows | R^2 | median error | held-out median | held-out max |",
              "|---|---|---|---|---|---|"]
    for component, part in sorted(refit["components"].items()):
        q = part["quality"]
        lines.append(f"| {component} | {q['rows']} | {q['r2']:.3f} | "
                     f"{100 * q['median_rel_error']:.1f}% | "
                     f"{100 * q['held_out_median_rel_error']:.1f}% | "
                     f"{100 * q['held_out_max_rel_error']:.1f}% |")
    return "\n".join(lines) + "\n"


def _when(data: dict[str, Any]) -> str:
    runs = data["bench"].get("runs") or [{}]
    hosts = sorted({str((r.get("host") or {}).get("hostname")) for r in runs})
    started = min((r.get("started_utc") or "?") for r in runs)
    return f"{started} on {', '.join(hosts)}"


def read_bench(paths: Sequence[Path]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Rows of one or more bench tables (a sweep run in pieces), with their .json records;
    a (case, implementation, variant) measured twice keeps its first measurement."""
    import json

    frames, records = [], []
    for path in paths:
        frames.append(pd.read_parquet(path))
        record = Path(path).with_suffix(".json")
        if record.exists():
            records.append(json.loads(record.read_text()))
    rows = normalise(pd.concat(frames, ignore_index=True))
    key = [*CASE_FIELDS, "engine", "engine_version", "structure", "variant"]
    return rows.drop_duplicates(subset=key, keep="first").reset_index(drop=True), records
