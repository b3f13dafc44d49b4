"""Scheduler registry: a name -> class table, plus any class given as `package.module:Class`.

A user adds a scheduler without touching this package: write a subclass of
`AdmissionPolicy` anywhere importable and name it by dotted path in the config.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from feather.policies.base import AdmissionPolicy

_BUILTIN: dict[str, str] = {
    "fcfs": "feather.policies.fcfs:FCFSPolicy",
    "lpm": "feather.policies.lpm:LPMPolicy",
    "dfs-weight": "feather.policies.dfs_weight:DFSWeightPolicy",
    "feather-static": "feather.policies.feather:FeatherStaticPolicy",
    "feather-ucb": "feather.policies.feather:FeatherUCBPolicy",
    "feather-qlearn": "feather.policies.feather:FeatherQLearningPolicy",
    "batches": "feather.sim.batches:FixedBatchesPolicy",
}


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


def create_scheduler(name: str, **params: Any) -> AdmissionPolicy:
    """Instantiate a scheduler by name or dotted path with its parameters."""
    cls = resolve_scheduler(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"scheduler {name!r}: bad parameters {sorted(params)}: {exc}") from exc


def _accepted_params(cls: type) -> set[str]:
    """Keyword parameters a class's constructor takes, following `**kwargs` up the MRO (the
    learners pass theirs on to FeatherPolicy, whose chunk_size must still be set)."""
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        accepted |= {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return accepted - {"self"}


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
    accepted = _accepted_params(resolve_scheduler(name))
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
    return create_scheduler(name, **params)


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
