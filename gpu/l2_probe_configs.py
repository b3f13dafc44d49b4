"""The L2 probe's batches: named configurations as block tables and lengths, and their bytes.

Pure Python (no torch): gpu/l2_probe.py times and profiles these, gpu/validate_l2_model.py
rebuilds them to set the simulator's L2 model against the measurements, and the tests check
their structure. Shared prefix blocks are the SAME physical block ids in the block tables
(block-granular sharing, as vLLM's prefix caching); the configurations are listed in
gpu/l2_probe.py's docstring.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

SEED = 20260511

CONFIG_NAMES = (
    "homog_100",
    "homog_100_1div",
    "mixed_100",
    "mixed_800",
    "mixed_800_grouped",
    "unshared_100",
    "unshared_800",
)
SWEEP_NAME = re.compile(r"sweep_g(\d+)_p(\d+)_b(\d+)")


@dataclass(frozen=True)
class ProbeShapes:
    """Attention shapes and workload sizes of one probe run."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # "bfloat16", "float16" or "float32"
    prefix_tokens: int  # shared prefix per group
    own_tokens: int  # each group member's own tokens after the prefix
    unshared_tokens: int  # an unshared sequence's length
    batch_small: int  # the "100" of the config names
    num_groups: int  # the "8" prefix groups

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes


# Llama-3.1-8B, one layer, bf16, vLLM's GPU block size.
FULL_SHAPES = ProbeShapes(
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
    dtype="bfloat16",
    prefix_tokens=3900,
    own_tokens=100,
    unshared_tokens=4000,
    batch_small=100,
    num_groups=8,
)
# --cpu-smoke: the same flow in seconds under Triton's interpreter (partial last blocks, GQA 2).
SMOKE_SHAPES = ProbeShapes(
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    dtype="bfloat16",
    prefix_tokens=30,
    own_tokens=5,
    unshared_tokens=35,
    batch_small=8,
    num_groups=4,
)


@dataclass
class ProbeConfig:
    """One batch of decode queries over a paged KV pool (block ids index the pool)."""

    name: str
    block_tables: list[list[int]]
    seq_lens: list[int]
    groups: list[int]  # prefix group of each sequence; -1: no shared prefix
    num_blocks: int  # physical pool size (ids 0..num_blocks-1, all used)
    description: str

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_blocks(self) -> int:
        return max(len(t) for t in self.block_tables)

    def padded_tables(self, pad_id: int = 0) -> list[list[int]]:
        """Rows padded to max_blocks (the kernel never reads past a sequence's length)."""
        width = self.max_blocks
        return [row + [pad_id] * (width - len(row)) for row in self.block_tables]


class _BlockAllocator:
    """Hands out physical block ids in order, as a fresh vLLM block pool does."""

    def __init__(self) -> None:
        self.next_id = 0

    def take(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _group_sequences(alloc: _BlockAllocator, shapes: ProbeShapes, count: int) -> list[list[int]]:
    """`count` sequences sharing one new prefix: its full blocks shared, the rest private."""
    shared = alloc.take(shapes.prefix_tokens // shapes.block_size)
    total = _blocks_for(shapes.prefix_tokens + shapes.own_tokens, shapes.block_size)
    return [shared + alloc.take(total - len(shared)) for _ in range(count)]


def _unshared_sequences(alloc: _BlockAllocator, shapes: ProbeShapes, count: int) -> list[list[int]]:
    return [
        alloc.take(_blocks_for(shapes.unshared_tokens, shapes.block_size)) for _ in range(count)
    ]


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of `parts` groups summing to `total`, the larger ones first (100/8: 13 x4, 12 x4)."""
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def build_config(name: str, shapes: ProbeShapes = FULL_SHAPES, seed: int = SEED) -> ProbeConfig:
    """Block tables and lengths of a named configuration (deterministic in `seed`)."""
    rng = random.Random(f"{seed}:{name}")
    alloc = _BlockAllocator()
    member_len = shapes.prefix_tokens + shapes.own_tokens
    small, n_groups = shapes.batch_small, shapes.num_groups
    rows: list[tuple[list[int], int, int]] = []  # (block table, seq_len, group)

    def add_groups(sizes: Sequence[int]) -> None:
        for group, size in enumerate(sizes):
            rows.extend((t, member_len, group) for t in _group_sequences(alloc, shapes, size))

    def add_unshared(count: int) -> None:
        rows.extend(
            (t, shapes.unshared_tokens, -1) for t in _unshared_sequences(alloc, shapes, count)
        )

    if name == "homog_100":
        add_groups([small])
        text = f"{small} sequences sharing one {shapes.prefix_tokens}-token prefix"
    elif name == "homog_100_1div":
        add_groups([small - 1])
        add_unshared(1)
        divergent = rows.pop()
        position = rng.randrange(small)
        rows.insert(position, divergent)
        text = f"homog_100 with the sequence at index {position} unshared"
    elif name == "mixed_100":
        add_groups(split_evenly(small, n_groups))
        rng.shuffle(rows)
        text = f"{small} sequences from {n_groups} prefix groups, shuffled"
    elif name in ("mixed_800", "mixed_800_grouped"):
        add_groups([small] * n_groups)
        if name == "mixed_800":
            rng.shuffle(rows)
            text = f"{n_groups} groups of {small}, shuffled"
        else:
            text = f"{n_groups} groups of {small}, each group contiguous"
    elif name == "unshared_100":
        add_unshared(small)
        text = f"{small} sequences of {shapes.unshared_tokens} own tokens"
    elif name == "unshared_800":
        add_unshared(small * n_groups)
        text = f"{small * n_groups} sequences of {shapes.unshared_tokens} own tokens"
    elif (sweep := SWEEP_NAME.fullmatch(name)) is not None:
        # sweep_g{G}_p{P}_b{B}: B sequences in G groups sharing P-token prefixes, shuffled
        n_groups, prefix, batch = (int(x) for x in sweep.groups())
        shapes = replace(shapes, prefix_tokens=prefix)
        member_len = prefix + shapes.own_tokens
        add_groups(split_evenly(batch, n_groups))
        rng.shuffle(rows)
        text = f"{batch} sequences in {n_groups} groups sharing {prefix}-token prefixes, shuffled"
    else:
        raise ValueError(
            f"unknown config {name!r}; known: {', '.join(CONFIG_NAMES)}, "
            "or sweep_g<groups>_p<prefix tokens>_b<sequences>"
        )
    return ProbeConfig(
        name=name,
        block_tables=[r[0] for r in rows],
        seq_lens=[r[1] for r in rows],
        groups=[r[2] for r in rows],
        num_blocks=alloc.next_id,
        description=text,
    )


# ---------------------------------------------------------------------------------------------
# Bookkeeping (pure Python)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Byte accounting
# ---------------------------------------------------------------------------------------------


def logical_kv_bytes(config: ProbeConfig, shapes: ProbeShapes) -> int:
    """Every K and V byte a plain paged kernel reads (shared blocks once per sequence)."""
    return sum(config.seq_lens) * shapes.kv_bytes_per_token


def unique_kv_bytes(config: ProbeConfig, shapes: ProbeShapes) -> int:
    """K and V bytes of the distinct tokens read: the DRAM floor with perfect reuse."""
    used: dict[int, int] = {}
    for table, seq_len in zip(config.block_tables, config.seq_lens, strict=True):
        for i, block in enumerate(table[: _blocks_for(seq_len, shapes.block_size)]):
            tokens = min(shapes.block_size, seq_len - i * shapes.block_size)
            used[block] = max(used.get(block, 0), tokens)
    return sum(used.values()) * shapes.kv_bytes_per_token


def describe_config(config: ProbeConfig, shapes: ProbeShapes) -> dict[str, Any]:
    """What the JSON records about a configuration's structure."""
    group_sizes: dict[int, int] = {}
    for g in config.groups:
        group_sizes[g] = group_sizes.get(g, 0) + 1
    return {
        "description": config.description,
        "num_seqs": config.num_seqs,
        "num_blocks": config.num_blocks,
        "max_blocks": config.max_blocks,
        "seq_lens_total_tokens": sum(config.seq_lens),
        "group_sizes": {str(k): v for k, v in sorted(group_sizes.items())},
        "group_order_head": config.groups[:32],
        "programs": config.num_seqs * shapes.num_kv_heads,
        "logical_kv_bytes": logical_kv_bytes(config, shapes),
        "unique_kv_bytes": unique_kv_bytes(config, shapes),
        "q_bytes": config.num_seqs * shapes.num_q_heads * shapes.head_dim * shapes.dtype_bytes,
    }
