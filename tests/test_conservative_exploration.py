"""The conservative learners (`feather-ucb-conservative`, `feather-qlearn-conservative`): from
scratch they stay never-worse where the paper's reading exploring from scratch does not, and
trained on the rl experiment's protocol they still learn STOP where stopping pays.

Sizes: the three large cases about 30 s, the training about 40 s on a loaded 2-core machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from test_never_worse import (
    DEFAULTS,
    FAMILY_SETTINGS,
    NAMED,
    _with_examples,
    case_of,
    family,
)

from feather.bench.never_worse import (
    LARGE_CASES,
    LATENCY_CEILING,
    THROUGHPUT_FLOOR,
    Variant,
    compare,
    violations,
)
from feather.pipeline.experiments import load_experiment
from feather.policies import create_scheduler
from feather.policies.base import Action
from feather.policies.conservative import ExplorationBudget, WaitBudget
from feather.sim.run import SimulationSpec
from feather.sim.training import evaluate, train
from feather.workloads import load_workload

REPO = Path(__file__).resolve().parent.parent
CONSERVATIVE = ("feather-ucb-conservative", "feather-qlearn-conservative")


# ---- the budget ------------------------------------------------------------------------------
def test_no_exploratory_stop_before_add_has_earned_anything() -> None:
    budget = ExplorationBudget(0.05)
    assert budget.ask("s", produced_tokens=1e9, step_time_s=0.01, horizon=16) < 0
    assert budget.refused == 1 and budget.allowed == 0


def test_a_stop_is_allowed_only_within_alpha_of_what_was_produced() -> None:
    budget = ExplorationBudget(0.05)
    budget.credit([("s", Action.ADD)], tokens=1000.0, seconds=1.0, estimate=0.0)  # 1000 tok/s
    # kept batch at 800 tok/s over 16 steps of 10 ms: (1000 - 800) x 0.16 s = 32 tokens at risk
    assert budget.estimate("s", 0.01, 16, kept_rate=800.0) == pytest.approx(32.0)
    assert budget.ask("s", 100.0, 0.01, 16, kept_rate=800.0) < 0  # 32 > 5% of 132
    cost = budget.ask("s", 10_000.0, 0.01, 16, kept_rate=800.0)
    assert cost == pytest.approx(32.0) and budget.pending_tokens == pytest.approx(32.0)
    # credited: the STOP's window ran 0.1 s at 500 tok/s, where ADD earns 1000: 50 tokens lost
    budget.credit([("s", Action.STOP)], tokens=50.0, seconds=0.1, estimate=cost)
    assert budget.pending_tokens == 0.0
    assert budget.lost_tokens == pytest.approx(50.0)
    # STOP now credited in "s": its own rate (500 tok/s) replaces the prior, over 0.1 s
    assert budget.estimate("s", 0.01, 16, kept_rate=990.0) == pytest.approx(50.0)


def test_wu_et_als_zero_prior_charges_the_whole_add_rate() -> None:
    budget = ExplorationBudget(0.05, prior="zero")
    budget.credit([("s", Action.ADD)], tokens=1000.0, seconds=1.0, estimate=0.0)
    assert budget.estimate("s", 0.01, 16, kept_rate=800.0) == pytest.approx(160.0)
    with pytest.raises(ValueError, match="explore_budget"):
        ExplorationBudget(1.0)
    with pytest.raises(ValueError, match="explore_prior"):
        ExplorationBudget(0.1, prior="optimistic")


def test_the_wait_budget_refuses_where_nobody_queues() -> None:
    budget = WaitBudget(0.05)
    budget.step(waiting=0, step_time_s=0.04)
    assert not budget.ask(held=1, hold_s=0.64)  # light load: no queueing to spend
    budget.step(waiting=400, step_time_s=1.0)  # 400 request-seconds queued
    assert budget.ask(held=10, hold_s=0.64) and budget.spent_s == pytest.approx(6.4)
    assert not budget.ask(held=100, hold_s=0.64)  # 70.4 > 5% of 464


def test_the_registered_learners_keep_the_papers_reading_and_the_variants_say_theirs() -> None:
    assert create_scheduler("feather-ucb").params()["explore_budget"] is None
    assert create_scheduler("feather-ucb").params()["explore_hold_steps"] is None
    for name in CONSERVATIVE:
        params = create_scheduler(name).params()
        assert (params["explore_budget"], params["explore_prior"]) == (0.01, "kept-batch")
        assert params["explore_hold_steps"] == 16 and params["explore_backlog_only"] is True
        assert params["explore_pool_bound"] is False
        assert (params["consult"], params["stop_holds"]) == ("group", "group-change")
    assert create_scheduler("feather-ucb").params()["explore_pool_bound"] is True


# ---- never-worse from scratch ----------------------------------------------------------------
# where the paper's reading exploring from scratch breaks the promise: C1's shape on the Ada
# (0.93x FCFS), tiny groups under cascade (UCB 0.57x) and Poisson load (TTFT p99 3.6x)
BROKEN = [
    c for c in LARGE_CASES
    if (c.name, c.hardware) in {
        ("c1-shape", "rtx-6000-ada"),
        ("tiny-groups-cascade", "a100-80gb"),
        ("c1-shape-cascade-poisson-0.9", "a100-80gb"),
    }
]


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: f"{c.name}@{c.hardware}")
def test_the_conservative_learners_from_scratch_are_never_worse(case) -> None:
    variants = [Variant(f"{n} (online)", n) for n in ("feather-ucb", *CONSERVATIVE)]
    result = compare(case, variants)
    got = result["feather"]
    assert [v.split(":")[0] for v in violations(result)] == ["feather-ucb (online)"] * len(
        violations(result)
    ), violations(result)
    assert violations(result)  # the paper's reading breaks it here
    for name in CONSERVATIVE:
        assert got[f"{name} (online)"]["throughput_ratio"] >= 0.99
    for name in CONSERVATIVE:  # asked as the paper's reading asks, every group change
        assert got[f"{name} (online)"]["delegated_decisions"] > 0


def test_an_exploratory_stop_held_16_steps_costs_little_where_stop_loses() -> None:
    """The bound alone: on C1's shape on the Ada (paged), where STOP never pays, UCB whose
    exploratory STOPs hold 16 steps stays above FCFS; held until the groups change, 0.93x."""
    case = next(c for c in BROKEN if c.name == "c1-shape")
    bounded = Variant("bounded", "feather-ucb", {"explore_hold_steps": 16})
    result = compare(case, [bounded, Variant("paper", "feather-ucb")])
    got = result["feather"]
    assert got["bounded"]["throughput_ratio"] >= 0.99 > got["paper"]["throughput_ratio"]
    assert 0 < got["bounded"]["stop_decisions"] < 0.2 * got["paper"]["stop_decisions"]


def test_below_saturation_they_explore_only_under_a_backlog() -> None:
    """The family's grouped Poisson draw (8 groups of 20, half of FCFS's capacity, A100,
    paged): within a 5% budget (200 tokens lost) UCB's exploratory STOPs, 16 steps each, made TTFT
    p99 5.0x FCFS's (its 0.17 s is a few steps); allowed only under a backlog (the waiting
    requests do not all fit beside the running batch, or the oldest has waited 16 steps),
    there is no exploratory STOP at all."""
    case = case_of({**DEFAULTS, **NAMED["grouped-poisson"]})
    anywhere = Variant(  # a 5% budget: at 1% these STOPs are refused by the tokens alone
        "anywhere",
        "feather-ucb-conservative",
        {"explore_backlog_only": False, "explore_budget": 0.05},
    )
    online = [Variant(f"{n} (online)", n) for n in CONSERVATIVE]
    result = compare(case, [anywhere, *online])
    got = result["feather"]
    assert got["anywhere"]["stop_decisions"] > 0
    assert got["anywhere"]["ttft_p99_ratio"] > 2.0
    assert [v for v in violations(result) if not v.startswith("anywhere")] == []
    for name in CONSERVATIVE:
        assert got[f"{name} (online)"]["stop_decisions"] == 0


@given(draw=family())
@_with_examples
@FAMILY_SETTINGS
def test_the_conservative_learners_hold_on_the_generated_family(draw) -> None:
    """tests/test_never_worse.py's family (its named cases and 11 draws of its own): both
    conservative learners online from scratch, asked at every group change on any kernel,
    break nothing feather-static does not. Its first draw, one group of 20 with a 128-token
    prefix and 4-token outputs (A100, paged), has feather-static itself at 0.989x FCFS (so on
    main too: `compare` of that case), the CHT's order and not exploration: nobody is asked.
    Held since exploratory STOPs are refused where the KV pool bounds the batch (the test
    below)."""
    case = case_of(draw)
    online = [Variant(f"{n} (online)", n) for n in CONSERVATIVE]
    static = Variant("feather-static", "feather-static")
    result = compare(case, [static, *online], workload=load_workload(case.workload))
    got = result["feather"]
    for name in CONSERVATIVE:
        mine = got[f"{name} (online)"]
        floor = min(THROUGHPUT_FLOOR, got["feather-static"]["throughput_ratio"])
        assert mine["throughput_ratio"] >= floor, (case, name, got)
        for key in ("ttft_p99_ratio", "longest_wait_ratio"):
            ceiling = max(LATENCY_CEILING, got["feather-static"].get(key, 0.0))
            assert mine.get(key, 0.0) <= ceiling, (case, name, key, got)


def test_no_exploratory_stop_where_the_kv_pool_bounds_the_batch() -> None:
    """A family draw (26 groups of 3, 128-token prefixes, 4-token outputs, grouped, a KV pool of
    three requests, Ada, paged): the pool holds six requests and FCFS runs every round at six.
    Exploring there, the learners' STOPs came when the pool was already full (the engine
    would have refused the candidate anyway), were credited at the full batch's rate, so the
    budget charged them nothing and STOP looked as good as ADD; the greedy STOP that followed,
    taken at four requests and held until the groups changed, cost a round: 0.944x FCFS
    (feather-static 0.997x). Refused where the engine refused a candidate or preempted a
    request within the last 16 steps (`explore_pool_bound: false`), there is no STOP and no
    loss."""
    shape = {"shape": "tiny-groups", "groups": 26, "per_group": 3, "prefix": 128, "suffix": 42}
    run = {"output": 4, "order": "grouped", "tight": True, "hardware": "rtx-6000-ada", "seed": 387}
    case = case_of({**DEFAULTS, **shape, **run})
    anywhere = [Variant(f"{n} anywhere", n, {"explore_pool_bound": True}) for n in CONSERVATIVE]
    online = [Variant(f"{n} (online)", n) for n in CONSERVATIVE]
    got = compare(case, [*anywhere, *online])["feather"]
    for name in CONSERVATIVE:
        assert got[f"{name} anywhere"]["throughput_ratio"] < 0.96
        assert got[f"{name} anywhere"]["stop_decisions"] > 0
        assert got[f"{name} (online)"]["throughput_ratio"] >= 0.99
        assert got[f"{name} (online)"]["stop_decisions"] == 0


# ---- still learns STOP where it pays ---------------------------------------------------------
def test_conservative_ucb_still_learns_stop_where_stopping_pays(tmp_path) -> None:
    """experiments/rl.yaml's training (A100, cascade, 12 runs): the table STOPs where a batch
    of 64-127 of one group meets a candidate that opens another group and cuts 1K-4K shared
    tokens with 64-255 waiting (one of the paper's reading's four such states; a budget of 1%
    allows no more in 12 runs), and frozen it beats feather-static on the held-out big groups
    (1.06x; the paper's reading 1.23x); training stays near feather-static (the paper's
    reading: 0.49x in its worst run)."""
    training = load_experiment(REPO / "experiments" / "rl.yaml").training
    base = SimulationSpec(
        workload=training["train_workloads"][0],
        scheduler="feather-ucb-conservative",
        hardware="a100-80gb",
        model="llama-3.1-8b",
        kernel=training["kernel"],
    )
    params = training["params"]
    path = tmp_path / "ucb.json"
    report = train(
        "feather-ucb-conservative",
        base,
        training["train_workloads"],
        training["train_seeds"],
        path,
        params=params,
    )
    stops = [k for k, v in report["policy"].items() if v["action"] == "STOP"]
    assert "b7|d3|w5|g1|j0" in stops, stops
    # STOPs elsewhere only in mixed running sets (5+ groups), never at one group with delta 0
    assert all(k.endswith("|g1|j0") or k.endswith("|g5|j0") for k in stops), stops
    assert min(h["ratio_to_static"] for h in report["history"]) > 0.85
    held_out = evaluate(
        path, "feather-ucb-conservative", base, training["eval_workloads"][:1], [100], params
    )
    run = held_out["runs"][0]
    assert run["stop_decisions"] > 0
    assert run["ratio"] > 1.03  # x feather-static
