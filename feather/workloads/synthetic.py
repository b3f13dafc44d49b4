"""Synthetic workloads from an inline spec, usable anywhere a workload file is:

    synthetic:groups=8,per_group=100,prefix=4000,suffix=100,output=128,order=shuffled,seed=0

Keys (defaults): groups (8), per_group (100), prefix (4000: tokens shared within a group,
including `system`), system (0: tokens shared by every group), suffix (100: tokens of each
request's own), output (128), order (shuffled | grouped | interleaved), arrival (all |
poisson:RATE | bursts:SIZE:INTERVAL_S), unshared (0.0: fraction of requests made to share
nothing), spread (0.0: each group's size and document length drawn uniformly within
+-spread of per_group and prefix - system, so the seed changes the workload's shape, not only
its token ids and order), suffix_spread (0.0: each request's own suffix length drawn uniformly
within +-suffix_spread of suffix, so prompt lengths vary within a group and overlap across
groups: a length order then reveals nothing of the group), vocab (32000), seed (0). Token ids
are uniform in [3, vocab) from a seeded generator, so the same spec always gives the same
workload.

A spec whose workload cannot fit in memory is refused before anything is allocated (the
estimate: `BYTES_PER_TOKEN` per prompt token and `BYTES_PER_REQUEST` per request, measured
on a build and write of such workloads; see `feather.memory`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields

import numpy as np

from feather.memory import check_fits
from feather.workloads.builder import (
    BuildOptions,
    arrival_times,
    make_unshared,
    order_requests,
)
from feather.workloads.schema import WorkloadError, WorkloadRequest, measure_prefix_lens

PREFIX = "synthetic:"
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32
MAX_COUNT = 2**31 - 1
# Peak memory of building and writing a synthetic workload: ~17 bytes per prompt token (the
# int32 ids, their concatenation into the Parquet column, its encoding) and ~2.2 KB per
# request (objects, group paths, statistics); measured with ru_maxrss, rounded up.
BYTES_PER_TOKEN = 20
BYTES_PER_REQUEST = 2_500


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
    suffix_spread: float = 0.0
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
    for name in ("groups", "per_group", "output"):
        if not 1 <= getattr(parsed, name) <= MAX_COUNT:
            raise WorkloadError(
                f"synthetic spec {name}={getattr(parsed, name)}: expected 1..{MAX_COUNT}"
            )
    for name in ("prefix", "suffix", "system"):
        if not 0 <= getattr(parsed, name) <= MAX_COUNT:
            raise WorkloadError(
                f"synthetic spec {name}={getattr(parsed, name)}: expected 0..{MAX_COUNT}"
            )
    if parsed.system > parsed.prefix:
        raise WorkloadError("synthetic spec needs 0 <= system <= prefix and suffix >= 0")
    if parsed.prefix + parsed.suffix < 1:
        raise WorkloadError("synthetic spec prefix + suffix must be >= 1 (a prompt has a token)")
    if not 3 < parsed.vocab <= MAX_TOKEN_ID:
        raise WorkloadError(f"synthetic spec vocab={parsed.vocab}: expected 4..{MAX_TOKEN_ID}")
    if not 0 <= parsed.seed < 2**63:
        raise WorkloadError(f"synthetic spec seed={parsed.seed}: expected 0..{2**63 - 1}")
    try:
        _options(parsed)  # order, arrival and unshared, checked as the builder checks them
    except WorkloadError as exc:
        raise WorkloadError(f"synthetic spec: {exc}") from None
    if not 0.0 <= parsed.spread < 1.0:
        raise WorkloadError(f"synthetic spec spread={parsed.spread}: expected 0 <= spread < 1")
    if not 0.0 <= parsed.suffix_spread < 1.0:
        raise WorkloadError(
            f"synthetic spec suffix_spread={parsed.suffix_spread}: expected 0 <= suffix_spread < 1"
        )
    return parsed


def _options(spec: SyntheticSpec) -> BuildOptions:
    return BuildOptions(
        order=spec.order, arrival=spec.arrival, unshared_fraction=spec.unshared, seed=spec.seed
    )


def estimated_bytes(spec: SyntheticSpec) -> int:
    """Peak memory of building the spec's workload (see BYTES_PER_TOKEN)."""
    requests = spec.groups * spec.per_group
    longest = spec.prefix + math.ceil(spec.suffix * (1 + spec.suffix_spread))
    return requests * (longest * BYTES_PER_TOKEN + BYTES_PER_REQUEST)


def build_synthetic(spec: SyntheticSpec) -> list[WorkloadRequest]:
    check_fits(f"synthetic spec {spec.canonical()!r}", estimated_bytes(spec))
    options = _options(spec)
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    system = rng.integers(3, spec.vocab, size=spec.system, dtype=np.int32)
    shape = random.Random(f"{spec.seed}:spread")  # its own stream: spread=0 changes nothing

    suffixes = random.Random(f"{spec.seed}:suffix")  # its own stream, as `shape`'s

    def spread(value: int) -> int:
        return round(value * shape.uniform(1 - spec.spread, 1 + spec.spread))

    def suffix_len() -> int:
        if not spec.suffix_spread or not spec.suffix:
            return spec.suffix
        lo, hi = 1 - spec.suffix_spread, 1 + spec.suffix_spread
        return max(1, round(spec.suffix * suffixes.uniform(lo, hi)))

    groups = []
    for g in range(spec.groups):
        size = max(1, spread(spec.per_group)) if spec.spread else spec.per_group
        document = spread(spec.prefix - spec.system) if spec.spread else spec.prefix - spec.system
        prefix = np.concatenate(
            [system, rng.integers(3, spec.vocab, size=document, dtype=np.int32)]
        )
        group = []
        for i in range(size):
            suffix = rng.integers(3, spec.vocab, size=suffix_len(), dtype=np.int32)
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
