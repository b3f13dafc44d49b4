"""What the engine tells the cost model about one step: the sequences in it, in kernel order.

This is the only thing that crosses from the engine (`feather.sim.engine`) to the physics
(`feather.sim.cost`): plain data, so either side can change without the other.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeqStep:
    """One sequence's work in one step.

    block_ids: the KV blocks the sequence attends over this step, in position order, one id
        per block of `block_size` tokens (the last may be partial). Blocks shared by several
        sequences (prefix caching) carry the same id; ids are engine-chosen hashables.
    context_tokens: tokens of KV already present before this step (cached or computed).
    new_tokens: tokens computed this step (1 for a decode step; a chunk for prefill).
    group: the sequence's innermost prefix group (for traces; the physics uses block_ids).
    """

    block_ids: tuple[Hashable, ...]
    context_tokens: int
    new_tokens: int
    group: str = ""

    @property
    def is_decode(self) -> bool:
        return self.new_tokens == 1 and self.context_tokens > 0


@dataclass(frozen=True, slots=True)
class BatchStep:
    """All sequences of one step, in the order the engine lays them out (kernel order).

    idle_block_ids: block lists of requests that hold KV but are not scheduled this step
    (vLLM counts them when deciding whether a prefix is common to everyone, for cascade).
    """

    seqs: tuple[SeqStep, ...]
    block_size: int
    idle_block_ids: tuple[tuple[Hashable, ...], ...] = ()
