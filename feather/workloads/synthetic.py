"""Synthetic workloads from an inline spec, usable anywhere a workload file is:

    synthetic:groups=8,per_group=100,prefix=4000,suffix=100,output=128,order=shuffled,seed=0

Keys (defaults): groups (8), per_group (100), prefix (4000: tokens shared within a group,
including `system`), system (0: tokens shared by every group), suffix (100: tokens of each
request's own), output (128), order (shuffled | grouped | interleaved), arrival (all |
poisson:RATE | bursts:SIZE:INTERVAL_S), unshared (0.0: fraction of requests made to share
nothing), spread (0.0: each group's size and document length drawn uniformly within
+-spread of per_group and prefix - system, so the seed changes the workload's shape, not only
its token ids and order), vocab (32000), seed (0). Token ids are uniform in [3, vocab) from a seeded
generator, so the same spec always gives the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

import numpy as np

from feather.workloads.builder import (
    BuildOptions,
    arrival_times,
    make_unshared,
    order_requests,
)
from feather.workloads.schema import WorkloadError, WorkloadRequest, measure_prefix_lens

PREFIX = "synthetic:"


@dataclass(frozen=True)
class SyntheticSpec:
    groups: int = 8
    per_group: int = 100
    prefix: int = 4000
    system: int = 0
    suffix: int = 100
    output: int = 128
    order: str = "shuffled"
    arrival: str = "all"
    unshared: float = 0.0
    spread: float = 0.0
    vocab: int = 32_000
    seed: int = 0

    def canonical(self) -> str:
        return PREFIX + ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def is_synthetic(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse_spec(spec: str) -> SyntheticSpec:
    """A `synthetic:key=value,...` string; unknown keys and bad values are errors."""
    if not is_synthetic(spec):
        raise WorkloadError(f"a synthetic spec starts with {PREFIX!r}: {spec!r}")
    types = {f.name: f.type for f in fields(SyntheticSpec)}
    values: dict[str, object] = {}
    body = spec[len(PREFIX) :]
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not raw:
            raise WorkloadError(f"malformed synthetic spec item {item!r} (expected key=value)")
        if key not in types:
            raise WorkloadError(f"unknown synthetic spec key {key!r}; keys: {', '.join(types)}")
        if key in values:
            raise WorkloadError(f"synthetic spec key {key!r} given twice")
        kind = types[key]
        try:
            values[key] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
        except ValueError:
            raise WorkloadError(f"synthetic spec {key}={raw!r}: expected {kind}") from None
    parsed = SyntheticSpec(**values)
    for name in ("groups", "per_group", "output", "vocab"):
        if getattr(parsed, name) < 1:
            raise WorkloadError(f"synthetic spec {name} must be >= 1")
    if min(parsed.prefix, parsed.suffix, parsed.system) < 0 or parsed.system > parsed.prefix:
        raise WorkloadError("synthetic spec needs 0 <= system <= prefix and suffix >= 0")
    if parsed.vocab <= 3:
        raise WorkloadError("synthetic spec vocab must be > 3")
    if not 0.0 <= parsed.spread < 1.0:
        raise WorkloadError("synthetic spec spread must be in [0, 1)")
    return parsed


def build_synthetic(spec: SyntheticSpec) -> list[WorkloadRequest]:
    options = BuildOptions(
        order=spec.order,
        arrival=spec.arrival,  # validates both
        unshared_fraction=spec.unshared,
        seed=spec.seed,
    )
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    system = rng.integers(3, spec.vocab, size=spec.system, dtype=np.int32)
    shape = random.Random(f"{spec.seed}:spread")  # its own stream: spread=0 changes nothing

    def spread(value: int) -> int:
        return round(value * shape.uniform(1 - spec.spread, 1 + spec.spread))

    groups = []
    for g in range(spec.groups):
        size = max(1, spread(spec.per_group)) if spec.spread else spec.per_group
        document = spread(spec.prefix - spec.system) if spec.spread else spec.prefix - spec.system
        prefix = np.concatenate(
            [system, rng.integers(3, spec.vocab, size=document, dtype=np.int32)]
        )
        group = []
        for i in range(size):
            suffix = rng.integers(3, spec.vocab, size=spec.suffix, dtype=np.int32)
            group.append(
                WorkloadRequest(
                    request_id=f"synthetic/g{g}/{i}",
                    source="synthetic",
                    task="synthetic",
                    group_path=["synthetic", f"synthetic/g{g}"],
                    prefix_lens=[0, 0],
                    prompt_token_ids=np.concatenate([prefix, suffix]),
                    output_len=spec.output,
                )
            )
        groups.append(group)
    requests = order_requests(groups, options)
    make_unshared(requests, options, spec.vocab, after=0)
    measure_prefix_lens(requests)
    times = arrival_times(spec.arrival, len(requests), random.Random(f"{spec.seed}:arrival"))
    for request, t in zip(requests, times, strict=True):
        request.arrival_time_s = t
    return requests
