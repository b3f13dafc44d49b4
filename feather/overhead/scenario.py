"""The requests every implementation is timed on: the same tokens in every process.

Standard library only: this module is imported inside SGLang's environment too.

W waiting requests in G prefix groups, interleaved (request i belongs to group i mod G, the
order in which a mixed arrival stream reaches a scheduler); each is its group's P-token
prefix plus S tokens of its own. The *cache* holds the prefix of every group but the last
`uncached_groups` (SGLang's radix tree, vLLM's prefix cache) or, for the CHT, the working set
holds one request of each such group; so every implementation should find the same shared
prefix for every waiting request: P tokens (when P is a multiple of the page size) for a
cached group, none for the others. `expected_matches` is that answer.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    """One point of the sweep. `page` is the CHT's chunk, vLLM's block and SGLang's page."""

    waiting: int
    prefix_tokens: int
    groups: int
    batch: int
    page: int = 16
    suffix_tokens: int = 64
    seed: int = 0
    vocab: int = 32000
    uncached_groups: int = 0  # the last groups, whose prefix nothing holds (a cold cache)

    def __post_init__(self) -> None:
        if self.waiting < 1 or self.groups < 1 or self.batch < 1 or self.page < 1:
            raise ValueError(f"waiting, groups, batch and page must be >= 1: {self}")
        if self.prefix_tokens % self.page or self.suffix_tokens < 1:
            raise ValueError(
                f"prefix_tokens ({self.prefix_tokens}) must be a multiple of page "
                f"({self.page}) and suffix_tokens >= 1, so every implementation can agree"
            )
        if self.groups > self.waiting:
            raise ValueError(f"groups ({self.groups}) > waiting ({self.waiting})")
        if not 0 <= self.uncached_groups <= self.groups:
            raise ValueError(f"uncached_groups must be in 0..groups ({self.groups}): {self}")

    @property
    def cached_groups(self) -> int:
        """Groups 0 .. cached_groups - 1 have their prefix cached."""
        return self.groups - self.uncached_groups

    @property
    def key(self) -> str:
        return (
            f"W{self.waiting}-P{self.prefix_tokens}-G{self.groups}-B{self.batch}"
            f"-page{self.page}-S{self.suffix_tokens}-seed{self.seed}"
            + (f"-U{self.uncached_groups}" if self.uncached_groups else "")
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(**data)


def group_of(case: Case, index: int) -> int:
    return index % case.groups


def group_prefixes(case: Case) -> list[list[int]]:
    """Every group's prefix; the first token differs between groups, so groups share nothing."""
    rng = random.Random(f"prefix-{case.seed}")
    prefixes = []
    for g in range(case.groups):
        tokens = [rng.randrange(case.vocab) for _ in range(case.prefix_tokens)]
        if tokens:
            tokens[0] = g % case.vocab
        prefixes.append(tokens)
    return prefixes


def suffix(case: Case, index: int) -> list[int]:
    """Request `index`'s own tokens: its first token is unlike its group's cached
    continuation (there is none: the cache ends at the prefix) and unlike the other
    members' (ids rotate), so no implementation can match one token beyond the prefix."""
    rng = random.Random(f"suffix-{case.seed}-{index}")
    tokens = [rng.randrange(case.vocab) for _ in range(case.suffix_tokens)]
    tokens[0] = index % case.vocab
    return tokens


def waiting_requests(case: Case, prefixes: list[list[int]] | None = None) -> list[list[int]]:
    """The W waiting prompts, in arrival order."""
    prefixes = prefixes if prefixes is not None else group_prefixes(case)
    return [prefixes[group_of(case, i)] + suffix(case, i) for i in range(case.waiting)]


def expected_matches(case: Case) -> list[int]:
    """The shared prefix, in tokens, every implementation must report for each request."""
    return [
        case.prefix_tokens if group_of(case, i) < case.cached_groups else 0
        for i in range(case.waiting)
    ]


def head_hit_tokens(case: Case) -> int:
    """Cached prefix tokens of the first `batch` requests in arrival order (what a per-request
    lookup over the queue's head finds)."""
    return sum(expected_matches(case)[: case.batch])
