"""The byte counter against hand counts on small hand-built batches."""

from __future__ import annotations

from feather.kernels.plan import make_plan
from feather.kernels.traffic import plan_bytes

# 3 requests, block size 4: requests 0 and 1 share blocks 0,1 (8 tokens); request 2 shares
# block 0 only. Lengths 10, 11, 6. Shapes: 4 query heads, 2 KV heads, head_dim 8, 2 bytes.
TABLES = [[0, 1, 2], [0, 1, 3], [0, 4, 0]]
LENS = [10, 11, 6]
SHAPES = {"q_heads": 4, "kv_heads": 2, "head_dim": 8, "dtype_bytes": 2}
KV_TOKEN = 2 * 2 * 8 * 2  # K and V, 2 heads, 8 dims, 2 bytes = 64
Q_ROW = 4 * 8 * 2  # 64
PARTIAL = 2 * 4 * (8 + 1) * 4  # one partial written and read back, fp32: 288


def count(kernel: str):
    return plan_bytes(make_plan(kernel, TABLES, LENS, 4), 3, **SHAPES)


def test_paged_reads_every_request_own_tokens() -> None:
    got = count("paged")
    assert got.kv == (10 + 11 + 6) * KV_TOKEN
    assert got.query == 3 * Q_ROW and got.output == 3 * Q_ROW and got.merge == 0
    assert got.total == got.kv + 6 * Q_ROW


def test_cascade_reads_the_batch_prefix_once() -> None:
    got = count("cascade")
    # batch-wide prefix: block 0 (4 tokens, full in all); suffixes 6, 7 and 2 tokens
    assert got.kv == (4 + 6 + 7 + 2) * KV_TOKEN
    assert got.query == (3 + 3) * Q_ROW  # the prefix segment loads all 3, suffixes 1 each
    assert got.merge == 2 * 3 * PARTIAL  # every request has two partials


def test_pat_reads_each_tree_node_once() -> None:
    got = count("pat")
    # nodes: block 0 {0,1,2} 4 tokens; block 1 {0,1} 4; block 2 {0} 2; block 3 {1} 3;
    # block 4 {2} 2 tokens
    assert got.kv == (4 + 4 + 2 + 3 + 2) * KV_TOKEN
    assert got.query == (3 + 2 + 1 + 1 + 1) * Q_ROW
    assert got.merge == (3 + 3 + 2) * PARTIAL  # partials of requests with >1 segment
    assert got.to_json()["total"] == got.total


def test_unshared_batch_costs_the_same_everywhere_but_merges() -> None:
    tables, lens = [[0, 1], [2, 3]], [8, 5]
    counts = [plan_bytes(make_plan(k, tables, lens, 4), 2, **SHAPES) for k in ("paged", "pat")]
    assert counts[0] == counts[1]
    cascade = plan_bytes(make_plan("cascade", tables, lens, 4), 2, **SHAPES)
    assert cascade == counts[0]
