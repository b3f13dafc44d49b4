"""The registered learners follow the paper's reading of its RL policy; the kernel-gated rule
is a variant with its own name.

`feather-ucb` and `feather-qlearn` are asked at every group change, whatever the kernel
(`consult="group"`), a STOP holds until a prefix group starts or stops running
(`stop_holds="group-change"`) and a decision is credited with the decode throughput of the
batch it formed (`reward_window="lifetime"`). `feather-ucb-kernel-gated` and
`feather-qlearn-kernel-gated` are asked only where the kernel reads a batch's common prefix
once, a STOP for one step, credited until the next deciding step: trained on a kernel that
reads every request's own KV (the simulator's default, paged) they never decide and learn
nothing. Every test here fails if the registered default reverts to the kernel-gated rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_engine import ToyRequest, run

from feather.cli import main
from feather.pipeline.experiments import learner_params, load_experiment, training_specs
from feather.policies import create_engine_policy, create_scheduler, scheduler_names
from feather.policies.learned import (
    KERNEL_GATED,
    LEARNER_DEFAULTS,
    FeatherQLearningPolicy,
    FeatherUCBPolicy,
)
from feather.sim.run import SimulationSpec
from feather.sim.run_spec import TrainSpec
from feather.sim.training import LEARNERS, train

REPO = Path(__file__).resolve().parent.parent
PAPER = {"consult": "group", "stop_holds": "group-change", "reward_window": "lifetime"}
GATED = {"consult": "kernel", "stop_holds": "step", "reward_window": "until-next"}
REGISTERED = {"feather-ucb": FeatherUCBPolicy, "feather-qlearn": FeatherQLearningPolicy}
# two shuffled shapes (few big groups, many small ones), none of rl.yaml's
SHAPES = (
    "synthetic:groups=4,per_group=30,prefix=1024,suffix=16,output=32,order=shuffled,"
    "spread=0.25,seed={seed}",
    "synthetic:groups=16,per_group=6,prefix=512,suffix=16,output=32,order=shuffled,"
    "spread=0.25,seed={seed}",
    "synthetic:groups=8,per_group=12,prefix=2048,suffix=16,output=64,order=interleaved,"
    "spread=0.25,seed={seed}",
)
# Issue 45's bar: trained with the defaults on shapes it never saw, a learner visits at least
# 20 states. Measured 2026-12-07 (A100, paged): on the first two shapes, seeds 0-1, UCB 19 and
# Q-learning 17 states; seeds 0-2 (`feather train`'s default) 21 and 19; all three shapes,
# seeds 0-1, 22 and 21.
MIN_STATES = 20


def _rule(policy) -> dict[str, str]:
    params = policy.params()
    return {key: params[key] for key in ("consult", "stop_holds", "reward_window")}


def test_the_registered_learners_default_to_the_papers_reading() -> None:
    assert LEARNER_DEFAULTS == PAPER and KERNEL_GATED == GATED
    for name, cls in REGISTERED.items():
        policy = create_scheduler(name)
        assert type(policy) is cls and policy.name == name
        assert _rule(policy) == PAPER, name
        # as the engines build it too (the vLLM class, SGLang's plugin, the simulator)
        assert _rule(create_engine_policy(name, {}, block_size=16)) == PAPER, name


def test_the_kernel_gated_rule_is_a_variant_with_its_own_name() -> None:
    for name, cls in REGISTERED.items():
        variant = f"{name}-kernel-gated"
        assert variant in scheduler_names() and variant in LEARNERS
        policy = create_scheduler(variant)
        assert isinstance(policy, cls) and policy.name == variant
        assert policy.table_kind == cls.table_kind  # its tables load into the learner
        assert _rule(policy) == GATED, variant
        # any of the three may still be given
        assert create_scheduler(variant, consult="always").consult == "always"
    assert scheduler_names().index("feather-qlearn") < scheduler_names().index(
        "feather-ucb-kernel-gated"
    )


@pytest.mark.parametrize("learner", list(REGISTERED))
def test_trained_with_the_defaults_on_a_paged_kernel_a_learner_visits_states(
    learner, tmp_path
) -> None:
    """As a user trains it (the simulator's default kernel, paged, A100 profile): the
    registered learner decides, is credited and saves its rule; the kernel-gated variant is
    never asked there (0 states, 0 updates)."""
    base = SimulationSpec(SHAPES[0], learner, "a100-80gb", "llama-3.1-8b")
    assert base.kernel == "paged"
    report = train(learner, base, SHAPES, [0, 1], tmp_path / "p.json")
    assert report["states"] >= MIN_STATES and report["history"][-1]["updates"] >= 20
    assert json.loads((tmp_path / "p.json").read_text())["decision"] == {
        "consult": "group", "stop_holds": "group-change"}  # fmt: skip
    gated = train(f"{learner}-kernel-gated", base, SHAPES, [0, 1], tmp_path / "g.json")
    assert gated["states"] == 0 and gated["history"][-1]["updates"] == 0


def test_feather_train_with_its_defaults_learns(tmp_path, capsys) -> None:
    """`feather train --learner feather-ucb` with nothing but workloads and a device."""
    out = tmp_path / "ucb.json"
    argv = ["train", "--learner", "feather-ucb", "--hardware", "a100-80gb", "--model",
            "llama-3.1-8b", "--out", str(out), "--quiet"]  # fmt: skip
    for shape in SHAPES:
        argv += ["--train-workload", shape]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kernel"] == "paged" and report["spec"]["params"] == {}
    assert report["training"]["states"] >= MIN_STATES
    assert report["training"]["history"][-1]["updates"] >= 20
    assert json.loads(out.read_text())["decision"]["consult"] == "group"


def _episodes(policy, episodes: int) -> list[int]:
    """Two interleaved groups of 10 on a kernel that reads every request's own KV (paged):
    a batch of one group decodes in 1 s, a mixed one in 4 s (10 tok/s against 5). Returns the
    most groups any step ran, per episode."""
    most = []
    for e in range(episodes):
        reqs = [ToyRequest(e * 100 + i, [i % 2 + 1] * 32 + [e * 100 + i] * 4, 24, i % 2)
                for i in range(20)]  # fmt: skip
        logs = run(
            policy,
            reqs,
            max_running=20,
            step_time_s=lambda batch: 1.0 if len({r.group for r in batch}) == 1 else 4.0,
        )
        most.append(max(len(s.groups) for s in logs if s.running))
    return most


@pytest.mark.parametrize("learner", list(REGISTERED))
def test_with_the_defaults_a_learner_learns_a_held_stop_whatever_the_kernel(
    learner, tmp_path
) -> None:
    """Asked at the group change, a STOP held until the first group drains and judged on the
    batch it kept: the learner learns STOP, and deployed frozen it runs one group at a time.
    The kernel-gated variant is never asked on this kernel and mixes both groups."""
    policy = create_scheduler(learner, chunk_size=4, min_share_tokens=0, seed=1)
    _episodes(policy, 20)
    assert "STOP" in {v["action"] for v in policy.greedy_policy().values()}
    frozen = create_scheduler(
        learner, chunk_size=4, min_share_tokens=0, frozen=True,
        policy_file=policy.save(tmp_path / "p.json"),
    )  # fmt: skip
    assert _episodes(frozen, 3) == [1, 1, 1]
    gated = create_scheduler(f"{learner}-kernel-gated", chunk_size=4, min_share_tokens=0)
    assert _episodes(gated, 3) == [2, 2, 2] and gated.decisions_taken == 0


def test_rl_yaml_passes_only_what_differs_from_the_defaults() -> None:
    """The rl experiment's learners train under the registered rule without naming it; its
    transfer table keeps the rule it was trained and measured with (asked always, a STOP
    for one step, credited until the next deciding step)."""
    experiment = load_experiment(REPO / "experiments" / "rl.yaml")
    training = experiment.training
    for learner in training["learners"]:
        assert not set(PAPER) & set(learner_params(training, learner)), learner
    config = {"models": ["llama-3.1-8b"], "hardware_profiles": {}, "model_profiles": {}}
    for where, raw in training_specs(experiment, config).items():
        spec = TrainSpec.from_json(raw)
        policy = create_engine_policy(spec.learner, spec.params, block_size=16)
        if "-transfer/" in where:
            assert _rule(policy) == {**GATED, "consult": "always"}, where
        else:
            assert _rule(policy) == PAPER, where


def test_a_table_saved_before_the_rule_was_recorded_held_its_stops_for_one_step(
    tmp_path,
) -> None:
    """Held STOPs came with the recorded rule: a file without one ran its STOPs for a step,
    whatever today's default; its consult stays the one given."""
    trained = create_scheduler("feather-ucb", chunk_size=4, min_share_tokens=0)
    _episodes(trained, 2)
    data = trained.to_json()
    del data["decision"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = create_scheduler("feather-ucb", policy_file=tmp_path / "old.json", frozen=True)
    assert (old.consult, old.stop_holds) == ("group", "step")
    given = create_scheduler(
        "feather-ucb", policy_file=tmp_path / "old.json", frozen=True, consult="kernel"
    )
    assert (given.consult, given.stop_holds) == ("kernel", "step")
