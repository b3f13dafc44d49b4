"""Scheduling time is priced by the kind of work a policy's class declares, never by its name:
a class under any name costs what its kind costs, a class that declares none is refused where
scheduling is priced, and the engines call the optional policy hooks unconditionally."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import pytest

from feather.policies import AdmissionPolicy, SchedCostKind, SchedCostKindError
from feather.policies.base import declared_cost_kind
from feather.policies.dfs_weight import DFSWeightPolicy
from feather.policies.fcfs import FCFSPolicy
from feather.policies.fixed_batches import FixedBatchesPolicy
from feather.policies.learned import FeatherQLearningPolicy, FeatherUCBPolicy
from feather.policies.lpm import LPMPolicy
from feather.policies.registry import resolve_scheduler, scheduler_names
from feather.policies.static_rules import (
    FeatherNoStopPolicy,
    FeatherReferencePolicy,
    FeatherStaticPolicy,
)
from feather.sim.run import SimulationSpec, simulate
from feather.sim.sched_cost import SchedulingCostModel, StepWork
from feather.workloads import load_workload

# more than 128 waiting at first: lpm's FCFS fallback and its full pass both price steps
WORKLOAD = "synthetic:groups=4,per_group=40,prefix=300,suffix=20,output=8,order=shuffled,seed=2"
MODULE = __name__  # the classes below, by `module:Class` path, as a user's config names them


# ---- a user's classes, named unlike what they do -----------------------------------------------
class LpmCopy(FCFSPolicy):
    """FCFS under a name a name-based price would read as another policy's."""

    name = "lpm-copy"


class NamedLpm(FCFSPolicy):
    """FCFS whose name is a built-in's: a name-based price charges it SGLang's LPM pass."""

    name = "lpm"


class NamedFeather(FCFSPolicy):
    """FCFS named like Feather: a name-based price charges it the CHT."""

    name = "feather-copy"


class FeatherFoo(FeatherStaticPolicy):
    """Feather's static rule under a name of its own."""

    name = "feather-foo"


class Plain(FeatherStaticPolicy):
    """Feather's static rule under a name with no hint of Feather: a name-based price
    charges it FCFS's lookups only."""

    name = "mine"


class Undeclared(AdmissionPolicy):
    """A user's policy written against AdmissionPolicy that declares no kind."""

    name = "undeclared"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._waiting: list = []

    def _on_arrival(self, request) -> None:
        self._waiting.append(request.req_id)

    def _on_admit(self, req_id) -> None:
        self._waiting.remove(req_id)

    def _on_leave_running(self, req_id, *, finished: bool) -> None:
        if not finished:
            self._waiting.insert(0, req_id)

    def _on_drop_waiting(self, req_id) -> None:
        self._waiting.remove(req_id)

    def _choose(self):
        return self._waiting[0] if self._waiting else None


def test_every_registered_scheduler_declares_its_kind() -> None:
    kinds = {name: declared_cost_kind(resolve_scheduler(name)) for name in scheduler_names()}
    assert kinds == {
        "fcfs": SchedCostKind.FIFO,
        "lpm": SchedCostKind.RADIX_LPM,
        "dfs-weight": SchedCostKind.RADIX_DFS_WEIGHT,
        "shortest-prompt": SchedCostKind.FIFO,
        "feather-static": SchedCostKind.CHT,
        "feather-nostop": SchedCostKind.CHT,
        "feather-reference": SchedCostKind.CHT,
        "feather-ucb": SchedCostKind.CHT,
        "feather-qlearn": SchedCostKind.CHT,
        "feather-ucb-kernel-gated": SchedCostKind.CHT,
        "feather-qlearn-kernel-gated": SchedCostKind.CHT,
        "feather-ucb-conservative": SchedCostKind.CHT,
        "feather-qlearn-conservative": SchedCostKind.CHT,
        "batches": SchedCostKind.PLAN,
    }


def test_a_class_that_declares_no_kind_is_named_with_how_to_declare_one() -> None:
    with pytest.raises(SchedCostKindError) as raised:
        declared_cost_kind(Undeclared)
    message = str(raised.value)
    assert f"{MODULE}.Undeclared" in message
    assert "sched_cost_kind = SchedCostKind." in message and "radix-lpm" in message


def _summary(scheduler: str, **changes) -> dict:
    spec = SimulationSpec(WORKLOAD, scheduler, "a100-80gb", "llama-3.1-8b", num_blocks=400)
    summary = dict(simulate(replace(spec, **changes), workload=load_workload(WORKLOAD)).summary)
    for volatile in ("wall_s", "provenance", "sched_cpu_s_measured",
                     "sched_cpu_fraction_of_gpu_time"):  # fmt: skip
        summary.pop(volatile)
    return summary


# (a class by its `module:Class` path, the built-in whose class it runs as)
SAME_WORK = [
    (f"{MODULE}:LpmCopy", "fcfs"),
    (f"{MODULE}:NamedLpm", "fcfs"),
    (f"{MODULE}:NamedFeather", "fcfs"),
    (f"{MODULE}:FeatherFoo", "feather-static"),
    (f"{MODULE}:Plain", "feather-static"),
]


@pytest.mark.parametrize("mode", ["vllm", "sglang"])
@pytest.mark.parametrize("cost_model", ["sglang-0.5.10", "sglang-0.5.23-rust"])
@pytest.mark.parametrize("path,builtin", SAME_WORK)
def test_a_class_under_another_name_costs_what_its_class_costs(path, builtin, cost_model, mode):
    """Measured models: every number of the run is the built-in's, whatever the name."""
    ours = _summary(path, sched_cost_model=cost_model, engine_mode=mode)
    theirs = _summary(builtin, sched_cost_model=cost_model, engine_mode=mode)
    assert ours["sched_model_s"] == theirs["sched_model_s"] > 0
    assert ours == theirs


@pytest.mark.parametrize("path,builtin", SAME_WORK)
def test_the_port_model_prices_a_class_without_a_fit_by_its_kinds_stand_in(path, builtin):
    """`port` holds a fit per calibrated class: any other class gets its kind's stand-in's
    numbers, and the run names it as priced without a fit of its own."""
    ours = _summary(path, sched_cost_model="port")
    theirs = _summary(builtin, sched_cost_model="port")
    label = resolve_scheduler(path).name
    assert ours.pop("sched_model_fallback_for") == [label]
    assert theirs.pop("sched_model_fallback_for") == []
    assert ours["sched_model_s"] == theirs["sched_model_s"] > 0
    assert ours == theirs


def test_a_config_label_over_a_builtin_class_is_priced_as_that_class() -> None:
    """`feather-foo: {class: feather-static}` and `lpm-copy: {class: fcfs}`: the label names
    the run (its spec.json), the class prices it."""
    from feather.sim.run_spec import RunSpec

    for label, cls in (("feather-foo", "feather-static"), ("lpm-copy", "fcfs")):
        spec = SimulationSpec(WORKLOAD, cls, "a100-80gb", "llama-3.1-8b", num_blocks=400)
        labelled = RunSpec.from_json(RunSpec(label, spec).to_json())
        assert labelled.label == label
        assert _summary(labelled.simulation.scheduler) == _summary(cls)


def test_a_class_without_a_kind_is_refused_where_scheduling_is_priced() -> None:
    with pytest.raises(SchedCostKindError, match=r"Undeclared declares no scheduling-cost kind"):
        _summary(f"{MODULE}:Undeclared")
    # with scheduling unpriced it runs: the kind only prices scheduling
    assert _summary(f"{MODULE}:Undeclared", sched_time="zero")["sched_model_s"] == 0.0


def test_the_port_model_prices_each_calibrated_class_by_its_own_fit() -> None:
    model = SchedulingCostModel.default()
    work = StepWork(candidates=3, arrivals=2, arrival_tokens=500, finished=1, waiting=10,
                    waiting_tokens=2000, policy_pass=True)  # fmt: skip
    calibrated = (FCFSPolicy, LPMPolicy, DFSWeightPolicy, FeatherStaticPolicy, FeatherUCBPolicy,
                  FeatherQLearningPolicy, FixedBatchesPolicy)  # fmt: skip
    prices = {cls: model(cls, work) for cls in calibrated}
    assert len(set(prices.values())) == len(calibrated) and model.uncalibrated == set()
    # Feather's policies without a fit of their own: feather-static's, named
    for cls in (FeatherNoStopPolicy, FeatherReferencePolicy):
        assert model(cls, work) == prices[FeatherStaticPolicy]
    assert model.uncalibrated == {"feather-nostop", "feather-reference"}
    assert SchedulingCostModel.zero()(Undeclared, work) == 0.0


# ---- optional hooks: declared on AdmissionPolicy, called unconditionally ------------------------
class Planner(FCFSPolicy):
    """Records the workload it was bound to."""

    name = "planner"
    bound: ClassVar[list] = []

    def bind_workload(self, requests) -> None:
        Planner.bound.append([r.request_id for r in requests])


def test_every_policy_takes_the_hooks_and_the_simulator_binds_the_workload() -> None:
    policy = FCFSPolicy()
    assert policy.bind_workload([]) is None and policy.alias("a", "b") is None
    assert policy.tree_nodes == 0 and not policy.plans_over_workload
    assert FixedBatchesPolicy.plans_over_workload
    Planner.bound.clear()
    workload = load_workload(WORKLOAD)
    _summary(f"{MODULE}:Planner")
    assert Planner.bound == [[r.request_id for r in workload.requests]]
