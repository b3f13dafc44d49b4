"""Every decode kernel (paged, cascade, pat; PyTorch and Triton-interpreted) against float64.

The reference gathers token by token and runs a plain softmax in float64 (no blocks, no
chunks, no merge), so it shares no code with the kernels. Outputs are NaN-poisoned before each
run (and the Triton partial buffers too), so an element a kernel fails to write fails the test.
Batches: random nested sharing (hypothesis for PyTorch, seeded cases for the slow
interpreter), plus the named corners: one request, all sharing everything, nothing shared,
a three-level tree, partial last blocks, block ids reused without their prefix, empty requests.
"""

from __future__ import annotations

import os
import random

os.environ["TRITON_INTERPRET"] = "1"  # must precede any import of triton

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather.kernels.block_tables import grouped_batch
from feather.kernels.decode import decode_attention, prepare
from feather.kernels.plan import KERNELS, make_plan

# ||out - ref|| / ||ref|| and elementwise bounds: fp32 arithmetic, or the output's rounding
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def random_tables(
    rng: random.Random, num_seqs: int, block_size: int, max_blocks: int, *, reuse_ids: bool
) -> tuple[list[list[int]], list[int], int]:
    """Requests that copy a random earlier request's first blocks (nested sharing), with
    partial last blocks; `reuse_ids` also drops shared ids at positions whose prefix differs."""
    tables: list[list[int]] = []
    lens: list[int] = []
    next_id = 0
    for _ in range(num_seqs):
        n = rng.randint(0, max_blocks * block_size) if rng.random() < 0.9 else 0
        need = -(-n // block_size)
        row: list[int] = []
        if tables and rng.random() < 0.8:
            donor = rng.randrange(len(tables))
            row = tables[donor][: rng.randint(0, min(need, len(tables[donor])))]
        while len(row) < need:
            if reuse_ids and next_id and rng.random() < 0.2:
                row.append(rng.randrange(next_id))  # an id shared without its prefix
            else:
                row.append(next_id)
                next_id += 1
        tables.append(row)
        lens.append(n)
    width = max(1, max(len(r) for r in tables))
    padded = [r + [rng.randrange(next_id + 1) for _ in range(width - len(r))] for r in tables]
    return padded, lens, next_id + 1


def make_inputs(
    tables: list[list[int]],
    lens: list[int],
    num_blocks: int,
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    q = torch.randn(len(lens), q_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return (
        q,
        k,
        v,
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
    )


def dense_reference(q, k, v, bt, sl, scale: float) -> torch.Tensor:
    """Token-by-token gather, heads repeated for GQA, softmax in float64."""
    num_seqs, q_heads, head_dim = q.shape
    block_size, kv_heads = k.shape[1], k.shape[2]
    out = torch.zeros(num_seqs, q_heads, head_dim, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(sl[s])
        if n == 0:
            continue
        ks = torch.stack([k[int(bt[s, t // block_size]), t % block_size] for t in range(n)])
        vs = torch.stack([v[int(bt[s, t // block_size]), t % block_size] for t in range(n)])
        ks = ks.double().repeat_interleave(q_heads // kv_heads, dim=1)
        vs = vs.double().repeat_interleave(q_heads // kv_heads, dim=1)
        att = torch.softmax(torch.einsum("hd,thd->ht", q[s].double(), ks) * scale, dim=-1)
        out[s] = torch.einsum("ht,thd->hd", att, vs)
    return out


def assert_close_to(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    assert out.dtype == dtype and bool(torch.isfinite(out).all()), "unwritten or NaN output"
    got = out.double()
    norm = torch.linalg.vector_norm(ref).item()
    if norm > 0:
        assert torch.linalg.vector_norm(got - ref).item() / norm < tol
    torch.testing.assert_close(got, ref, rtol=2 * tol, atol=2 * tol)


def run_kernel(kernel: str, impl: str, inputs, scale: float, **options) -> torch.Tensor:
    q, k, v, bt, sl = inputs
    out = torch.full_like(q, float("nan"))  # poisoned
    bound = prepare(kernel, impl, k, v, bt, sl, q.shape[1], scale, **options)
    if impl == "triton" and kernel != "paged":
        from feather.kernels.attend_triton import TritonDecode

        # poison the partial buffers too: a (query, head) row no program writes stays NaN
        run = TritonDecode(bound.plan, k, q.shape[0], q.shape[1], **options)
        got = run(q, k, v, scale, out=out, poison_partials=True)
    else:
        got = bound.step(q, out)
    assert got is out
    return out


# ---------------------------------------------------------------------------------------------
# PyTorch, on random nested sharing (hypothesis)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    num_seqs=st.integers(1, 7),
    heads=st.sampled_from([(4, 4), (8, 2), (6, 2), (8, 1)]),
    block_size=st.sampled_from([1, 2, 4, 8]),
    chunk_tokens=st.sampled_from([1, 5, 64]),
    reuse_ids=st.booleans(),
)
def test_torch_kernels_match_float64(
    seed, num_seqs, heads, block_size, chunk_tokens, reuse_ids
) -> None:
    rng = random.Random(seed)
    tables, lens, nb = random_tables(rng, num_seqs, block_size, 6, reuse_ids=reuse_ids)
    q_heads, kv_heads = heads
    inputs = make_inputs(
        tables,
        lens,
        nb,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=8,
        block_size=block_size,
        dtype=torch.float32,
        seed=seed,
    )
    ref = dense_reference(*inputs, 0.4)
    for kernel in KERNELS:
        out = run_kernel(kernel, "torch", inputs, 0.4, chunk_tokens=chunk_tokens)
        assert_close_to(out, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# Named corners, every kernel and implementation


def corner_batches() -> dict[str, tuple[list[list[int]], list[int], int, int]]:
    """name -> (tables, lens, num_blocks, block_size)."""
    bs = 4
    out = {}
    one = grouped_batch("one", [1], prefix_tokens=9, suffix_tokens=6, block_size=bs)
    same = [[0, 1, 2, 3]] * 5  # everything shared, last block full
    out["single_request"] = (one.tables, one.seq_lens, one.num_blocks, bs)
    out["all_share_everything"] = (same, [16] * 5, 4, bs)
    out["all_share_partial_last"] = ([[0, 1, 2]] * 4, [10] * 4, 3, bs)
    none = grouped_batch("none", [1] * 5, prefix_tokens=0, suffix_tokens=13, block_size=bs)
    out["nothing_shared"] = (none.tables, none.seq_lens, none.num_blocks, bs)
    nested = grouped_batch(
        "nested",
        [3, 2, 1],
        root_tokens=10,
        prefix_tokens=9,
        suffix_tokens=5,
        block_size=bs,
        divergent=1,
        shuffle_seed=3,
    )
    out["nested_three_levels"] = (nested.tables, nested.seq_lens, nested.num_blocks, bs)
    # depth 4 by hand: root [0], two branches, one of which branches again; ragged lengths
    deep = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 5, 6], [0, 7, 8, 9], [0, 1, 2, 3]]
    out["deep_tree_ragged"] = (deep, [15, 13, 16, 9, 14], 10, bs)
    out["with_empty_request"] = ([[0, 1], [0, 2], [3, 3]], [7, 8, 0], 4, bs)
    return out


CORNERS = corner_batches()
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.mark.parametrize("name", sorted(CORNERS))
@pytest.mark.parametrize("kernel", KERNELS)
def test_torch_corners(name: str, kernel: str) -> None:
    tables, lens, nb, bs = CORNERS[name]
    for dtype in DTYPES.values():
        inputs = make_inputs(
            tables,
            lens,
            nb,
            q_heads=8,
            kv_heads=2,
            head_dim=16,
            block_size=bs,
            dtype=dtype,
            seed=len(name),
        )
        ref = dense_reference(*inputs, 0.25)
        assert_close_to(run_kernel(kernel, "torch", inputs, 0.25, chunk_tokens=4), ref, dtype)


@pytest.mark.parametrize("name", sorted(CORNERS))
@pytest.mark.parametrize("kernel", ["cascade", "pat"])
def test_triton_corners_interpreted(name: str, kernel: str) -> None:
    tables, lens, nb, bs = CORNERS[name]
    dtype = torch.bfloat16 if "nested" in name else torch.float32
    inputs = make_inputs(
        tables,
        lens,
        nb,
        q_heads=8,
        kv_heads=2,
        head_dim=16,
        block_size=bs,
        dtype=dtype,
        seed=len(name),
    )
    ref = dense_reference(*inputs, 0.25)
    # tiny splits and query tiles: several KV splits and query tiles per segment
    out = run_kernel(kernel, "triton", inputs, 0.25, split_tokens=16, query_tile=2)
    assert_close_to(out, ref, dtype)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kernel", KERNELS)
def test_triton_random_interpreted(seed: int, kernel: str) -> None:
    rng = random.Random(100 + seed)
    tables, lens, nb = random_tables(rng, 6, 4, 5, reuse_ids=seed % 2 == 1)
    q_heads, kv_heads = [(4, 4), (8, 2), (6, 2), (16, 2)][seed]
    dtype = list(DTYPES.values())[seed % 3]
    inputs = make_inputs(
        tables,
        lens,
        nb,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=16,
        block_size=4,
        dtype=dtype,
        seed=seed,
    )
    ref = dense_reference(*inputs, 0.3)
    out = run_kernel(kernel, "triton", inputs, 0.3, split_tokens=16, query_tile=4)
    assert_close_to(out, ref, dtype)


def test_decode_attention_entry_point_and_errors() -> None:
    tables, lens, nb, bs = CORNERS["nested_three_levels"]
    inputs = make_inputs(
        tables,
        lens,
        nb,
        q_heads=4,
        kv_heads=2,
        head_dim=16,
        block_size=bs,
        dtype=torch.float32,
        seed=1,
    )
    ref = dense_reference(*inputs, 0.5)
    assert_close_to(decode_attention("pat", *inputs, 0.5), ref, torch.float32)
    with pytest.raises(ValueError, match="unknown kernel"):
        decode_attention("flash", *inputs, 0.5)
    with pytest.raises(ValueError, match="unknown implementation"):
        decode_attention("pat", *inputs, 0.5, implementation="cuda")
    q, k, v, bt, sl = inputs
    with pytest.raises(ValueError, match="share one dtype"):
        decode_attention("pat", q.half(), k, v, bt, sl, 0.5, implementation="triton")


def test_plans_of_a_mixed_batch_differ_as_designed() -> None:
    """Same batch: paged reads every request, cascade finds the root, pat every level."""
    tables, lens, _, bs = CORNERS["nested_three_levels"]
    paged, cascade, pat = (make_plan(k, tables, lens, bs) for k in KERNELS)
    assert len(paged) == len(lens)
    # the divergent request holds no root: cascade has nothing batch-wide to share
    assert all(len(seg.queries) == 1 for seg in cascade)
    assert max(len(seg.queries) for seg in pat) == 5  # the root, under the five grouped ones


def test_torch_gathers_kv_in_bounded_chunks() -> None:
    """The gather buffers hold at most chunk_tokens of KV, whatever the batch's length."""
    from feather.kernels.attend_torch import TorchDecode

    batch = grouped_batch("long", [6], prefix_tokens=400, suffix_tokens=30, block_size=4)
    inputs = make_inputs(
        batch.padded_tables(),
        batch.seq_lens,
        batch.num_blocks,
        q_heads=4,
        kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        seed=5,
    )
    for kernel in KERNELS:
        plan = make_plan(kernel, batch.tables, batch.seq_lens, 4)
        run = TorchDecode(plan, inputs[1], 6, 4, chunk_tokens=32)
        assert run._k_buf.shape[0] * 4 <= 32 and run._v_buf.shape == run._k_buf.shape
        out = run(inputs[0], inputs[1], inputs[2], 0.3)
        assert_close_to(out, dense_reference(*inputs, 0.3), torch.float32)
