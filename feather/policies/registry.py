"""Scheduler registry: a name -> class table, plus any class given as `package.module:Class`.

A user adds a scheduler without touching this package: write a subclass of
`AdmissionPolicy` anywhere importable and name it by dotted path in the config.
"""

from __future__ import annotations

import importlib
import inspect
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from feather.policies.base import AdmissionPolicy

_BUILTIN: dict[str, str] = {
    "fcfs": "feather.policies.fcfs:FCFSPolicy",
    "lpm": "feather.policies.lpm:LPMPolicy",
    "dfs-weight": "feather.policies.dfs_weight:DFSWeightPolicy",
    # a prefix-blind control (C5): shortest prompt first, which groups L-Eval's questions by
    # accident; a baseline, never Feather (its label must not start with "feather")
    "shortest-prompt": "feather.policies.shortest_prompt:ShortestPromptPolicy",
    "feather-static": "feather.policies.static_rules:FeatherStaticPolicy",
    "feather-nostop": "feather.policies.static_rules:FeatherNoStopPolicy",
    "feather-reference": "feather.policies.static_rules:FeatherReferencePolicy",
    # the learners under the paper's reading (asked at every group change, a STOP held until
    # the running groups change, credited over the batch a decision formed: learned.py)
    "feather-ucb": "feather.policies.learned:FeatherUCBPolicy",
    "feather-qlearn": "feather.policies.learned:FeatherQLearningPolicy",
    # the same learners under the kernel-gated rule (asked only where the kernel reads the
    # batch's common prefix once, a STOP for one step, credited until the next decision)
    "feather-ucb-kernel-gated": "feather.policies.learned:FeatherUCBKernelGatedPolicy",
    "feather-qlearn-kernel-gated": "feather.policies.learned:FeatherQLearningKernelGatedPolicy",
    # the paper's reading, exploring only within a budget of the tokens ADD would earn, an
    # exploratory STOP held at most 16 steps (learned.py CONSERVATIVE, conservative.py)
    "feather-ucb-conservative": "feather.policies.learned:FeatherUCBConservativePolicy",
    "feather-qlearn-conservative": "feather.policies.learned:FeatherQLearningConservativePolicy",
    "batches": "feather.policies.fixed_batches:FixedBatchesPolicy",
}

# the learners `feather train` trains: each learner under the paper's reading, then each under
# the kernel-gated rule, then each exploring conservatively
LEARNERS = (
    "feather-ucb",
    "feather-qlearn",
    "feather-ucb-kernel-gated",
    "feather-qlearn-kernel-gated",
    "feather-ucb-conservative",
    "feather-qlearn-conservative",
)


class UnknownSchedulerError(ValueError):
    """A scheduler name that is neither registered nor an importable `module:Class` path."""


def scheduler_names() -> list[str]:
    """The registered scheduler names, in the order the paper discusses them."""
    return list(_BUILTIN)


def _import_class(path: str, name: str) -> type:
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise UnknownSchedulerError(
            f"unknown scheduler {name!r}: not one of {', '.join(_BUILTIN)}, "
            "and not a dotted path of the form 'package.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownSchedulerError(
            f"scheduler {name!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise UnknownSchedulerError(
            f"scheduler {name!r}: module {module_name!r} has no attribute {class_name!r}"
        ) from exc


def resolve_scheduler(name: str) -> type[AdmissionPolicy]:
    """The policy class for a registered name or a `package.module:Class` path."""
    if not isinstance(name, str) or not name:
        raise UnknownSchedulerError(f"scheduler name must be a non-empty string, got {name!r}")
    cls = _import_class(_BUILTIN.get(name, name), name)
    if not (isinstance(cls, type) and issubclass(cls, AdmissionPolicy)):
        raise UnknownSchedulerError(
            f"scheduler {name!r} resolves to {cls!r}, which is not an AdmissionPolicy subclass"
        )
    return cls


class SchedulerParamError(ValueError):
    """A parameter the scheduler class does not have, or a value of the wrong type."""


def scheduler_parameters(cls: type) -> dict[str, Any]:
    """The keyword parameters a policy class accepts, with their annotations (Any where
    none), following `**kwargs` up the class hierarchy as `super().__init__(**kwargs)` does."""
    accepted: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # unresolvable annotations (e.g. TYPE_CHECKING names): unchecked
            hints = {}
        forwards = False
        for param in list(inspect.signature(init).parameters.values())[1:]:
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                forwards = True
            elif param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
                accepted.setdefault(param.name, hints.get(param.name, Any))
        if not forwards or klass is object:
            break
    return accepted


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON/YAML value can be passed for a parameter annotated `hint`."""
    if hint is Any:  # a class since Python 3.11: isinstance() would refuse it
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if isinstance(hint, type) and issubclass(hint, PurePath):
        return isinstance(value, str | PurePath)
    if origin in (list, tuple, typing.Sequence, Sequence):
        return isinstance(value, list | tuple) and all(
            _fits(v, args[0]) for v in value if args and args[-1] is not Ellipsis
        )
    if origin in (dict, Mapping, typing.Mapping):
        return isinstance(value, dict) and (
            not args or all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
        )
    if isinstance(hint, type) and hint is not object:
        return isinstance(value, hint)
    return True  # Any, type variables, unresolved annotations


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


# Parameters naming files a workflow produces before the job that reads them runs (a trained
# table): their values are checked when the job loads them, not at parse time.
PRODUCED_FILE_PARAMS = frozenset({"policy_file"})


def check_scheduler_params(
    name: str, params: Mapping[str, Any], where: str = "", *, values: bool = True
) -> None:
    """Every parameter is one the scheduler's class takes, with a value of its declared
    type and in the class's own range; checked before the engine or the workflow starts,
    naming only what was given (`where`: the flag or config key the parameters came from).

    The range is the class's own: it is built once with the given parameters (less any
    `PRODUCED_FILE_PARAMS`), so the CLI, the workflow and the engines refuse the same values
    with the same message. `values=False` skips that build (a caller about to build it)."""
    cls = resolve_scheduler(name)
    _check_param_types(cls, name, params, where)
    if not values:
        return
    try:
        cls(**{k: v for k, v in params.items() if k not in PRODUCED_FILE_PARAMS})
    except (TypeError, ValueError) as exc:  # the class's own range checks
        given = f" (given in {where})" if where else ""
        raise SchedulerParamError(f"scheduler {name!r}{given}: {exc}") from exc


def _check_param_types(
    cls: type[AdmissionPolicy], name: str, params: Mapping[str, Any], where: str
) -> None:
    given = f" (given in {where})" if where else ""
    if not isinstance(params, Mapping):
        raise SchedulerParamError(
            f"scheduler {name!r}: parameters{given} must be a mapping of name: value, "
            f"got {params!r}"
        )
    accepted = scheduler_parameters(cls)
    for key, value in params.items():
        if key not in accepted:
            raise SchedulerParamError(
                f"scheduler {name!r} has no parameter {key!r}{given}; its parameters: "
                f"{', '.join(accepted) or 'none'}"
            )
        if not _fits(value, accepted[key]):
            raise SchedulerParamError(
                f"scheduler {name!r}: parameter {key} = {value!r}{given}: expected "
                f"{_type_name(accepted[key])}"
            )


def create_scheduler(name: str, **params: Any) -> AdmissionPolicy:
    """Instantiate a scheduler by name or dotted path with its parameters."""
    return _build(resolve_scheduler(name), name, params)


def _build(cls: type[AdmissionPolicy], name: str, params: dict[str, Any]) -> AdmissionPolicy:
    _check_param_types(cls, name, params, "")
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:  # the class's own range checks
        raise SchedulerParamError(f"scheduler {name!r}: {exc}") from exc


def create_engine_policy(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    block_size: int,
    seed: int = 0,
    page_size: int | None = None,
    cache_capacity_tokens: int | None = None,
) -> AdmissionPolicy:
    """A policy configured for one engine: what the engine fixes is set here, once.

    Chunk-based policies (Feather's) get `chunk_size` = the engine's block size, because they
    reuse the engine's block hashes; a different configured value is an error. Radix-based
    ports (lpm, dfs-weight) get the engine's `page_size` and KV capacity where the engine
    gives them. The user's `params` win for everything else; `seed` is the default seed.
    """
    params = dict(params or {})
    cls = resolve_scheduler(name)  # once: the checks and the build below use the class
    # the user's own, before the engine's are added (their range when the class is built)
    _check_param_types(cls, name, params, "")
    accepted = scheduler_parameters(cls)
    if "chunk_size" in accepted:
        params.setdefault("chunk_size", block_size)
        if params["chunk_size"] != block_size:
            raise ValueError(
                f"{name}: chunk_size {params['chunk_size']} must equal the engine's block size "
                f"{block_size} (the policy reuses the engine's block hashes)"
            )
    if page_size is not None and "page_size" in accepted:
        params.setdefault("page_size", page_size)
    if cache_capacity_tokens is not None and "cache_capacity_tokens" in accepted:
        params.setdefault("cache_capacity_tokens", cache_capacity_tokens)
    params.setdefault("seed", seed)
    return _build(cls, name, params)


def create_vllm_policy(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    block_size: int,
    cache_capacity_tokens: int | None,
    seed: int = 0,
) -> AdmissionPolicy:
    """A policy as our vLLM scheduler class configures it (and the simulator's vllm mode,
    which must match it): chunks and radix pages are vLLM's blocks, and the radix ports
    mirror a cache of the KV pool's size."""
    return create_engine_policy(
        name,
        params,
        block_size=block_size,
        seed=seed,
        page_size=block_size,
        cache_capacity_tokens=cache_capacity_tokens,
    )
