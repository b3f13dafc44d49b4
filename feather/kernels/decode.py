"""The decode kernels by name: (kernel, implementation) -> a step function.

kernel: paged, cascade or pat (`feather.kernels.plan`); implementation: torch (CPU or GPU,
`attend_torch`) or triton (GPU, or the CPU under TRITON_INTERPRET; paged uses
`paged_decode`'s kernel, cascade and pat `attend_triton`'s). `prepare` does the per-step host
work an engine does before launching (planning, work items, buffers) once, so benchmarks
time the launch alone and report the planning time apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from feather.kernels.attend_torch import TorchDecode
from feather.kernels.paged_decode import _check_inputs, paged_decode_triton
from feather.kernels.plan import KERNELS, Segment, make_plan

IMPLEMENTATIONS = ("torch", "triton")

StepFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]  # (q, out) -> out


@dataclass(frozen=True)
class PreparedDecode:
    """A kernel bound to one batch: `step(q, out)` runs one decode step."""

    kernel: str
    implementation: str
    plan: list[Segment]
    step: StepFn


def prepare(
    kernel: str,
    implementation: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_q_heads: int,
    scale: float,
    **options: int,
) -> PreparedDecode:
    """Plan `kernel` for this batch and bind it to its KV cache (options: chunk_tokens for
    torch; split_tokens, query_tile for triton)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}"
        )
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    num_seqs = int(seq_lens.shape[0])
    block_size = k_cache.shape[1]
    plan = make_plan(kernel, block_tables.tolist(), seq_lens.tolist(), block_size)
    if implementation == "torch":
        run = TorchDecode(plan, k_cache, num_seqs, num_q_heads, **options)

        def step(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            return run(q, k_cache, v_cache, scale, out=out)

    elif kernel == "paged":

        def step(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, out=out)

    else:
        from feather.kernels.attend_triton import TritonDecode

        launch = TritonDecode(plan, k_cache, num_seqs, num_q_heads, **options)

        def step(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            return launch(q, k_cache, v_cache, scale, out=out)

    return PreparedDecode(kernel, implementation, plan, step)


def decode_attention(
    kernel: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    implementation: str = "torch",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step: q [S, Hq, D], k/v [blocks, block_size, Hkv, D], tables [S, max_blocks]
    int32, seq_lens [S]; returns [S, Hq, D] in q's dtype (zeros for an empty sequence)."""
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    if implementation == "triton" and kernel != "paged":
        from feather.kernels.attend_triton import check_triton_inputs

        check_triton_inputs(q, k_cache, v_cache)
    bound = prepare(
        kernel, implementation, k_cache, v_cache, block_tables, seq_lens, q.shape[1], scale
    )
    return bound.step(q, out)
