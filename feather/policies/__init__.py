"""Batch-formation policies behind one engine-agnostic admission interface."""

from feather.policies.base import (
    Action,
    AdmissionPolicy,
    Decision,
    PolicyError,
    Request,
    SchedCostKind,
    SchedCostKindError,
    StepContext,
    StepOutcome,
    StepRecord,
    StopReason,
)
from feather.policies.registry import (
    SchedulerParamError,
    UnknownSchedulerError,
    check_scheduler_params,
    create_engine_policy,
    create_scheduler,
    create_vllm_policy,
    resolve_scheduler,
    scheduler_names,
)

__all__ = [
    "Action",
    "AdmissionPolicy",
    "Decision",
    "PolicyError",
    "Request",
    "SchedCostKind",
    "SchedCostKindError",
    "SchedulerParamError",
    "StepContext",
    "StepOutcome",
    "StepRecord",
    "StopReason",
    "UnknownSchedulerError",
    "check_scheduler_params",
    "create_engine_policy",
    "create_scheduler",
    "create_vllm_policy",
    "resolve_scheduler",
    "scheduler_names",
]
