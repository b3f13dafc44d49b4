"""The fast L2 model's own cost (CPU time per step) against batch size.

Protocol (fixed so numbers compare across machines and revisions):
- n decode sequences in max(1, n // 100) prefix groups taken round-robin (interleaved), each a
  3,900-token shared prefix plus a private suffix of 100-300 tokens (seeded uniform), so
  ~4,100 tokens on average; block size 16; distinct block ids per group and sequence.
- The kernel grid of llama-3.1-8b decode on the given GPU (GQA-packed, 8 KV heads).
- cold: the memo cleared before each call (the tree build included); memoised: the same batch
  again (the tree build that computes the memo key, plus the lookup). Best of `repeats`.
Not wired to the CLI; call `print_l2_bench()`.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from feather.batch_tree import BatchTree
from feather.models import get_model
from feather.sim.cost import attention_grid
from feather.sim.hardware import get_hardware
from feather.sim.l2 import clear_fast_cache, fast_l2, fast_l2_tree

PREFIX_TOKENS = 3_900
SUFFIX_TOKENS = (100, 300)
BLOCK = 16


@dataclass(frozen=True, slots=True)
class Row:
    seqs: int
    blocks: int
    tree_ms: float
    cold_ms: float
    memo_ms: float
    hit_rate: float


def bench_batch(n: int, seed: int = 0) -> list[tuple[tuple[int, int, int], ...]]:
    rng = random.Random(seed)
    groups = max(1, n // 100)
    prefix = [[(g, -1, k) for k in range(math.ceil(PREFIX_TOKENS / BLOCK))] for g in range(groups)]
    out = []
    for i in range(n):
        g = i % groups
        total = math.ceil((PREFIX_TOKENS + rng.randint(*SUFFIX_TOKENS)) / BLOCK)
        # The prefix's last block is partial (3,900 = 243.75 blocks): shared only if full.
        shared = prefix[g][: PREFIX_TOKENS // BLOCK]
        out.append(tuple(shared + [(g, i, k) for k in range(total - len(shared))]))
    return out


def l2_bench(
    sizes: tuple[int, ...] = (100, 200, 400, 800),
    hardware: str = "a100-80gb",
    repeats: int = 7,
) -> list[Row]:
    model, hw = get_model("llama-3.1-8b"), get_hardware(hardware)
    rows = []
    for n in sizes:
        seqs = bench_batch(n)
        grid = attention_grid(model, hw, n, 1, max(len(s) for s in seqs) * BLOCK, BLOCK)
        tree_s = cold_s = memo_s = math.inf
        for _ in range(repeats):
            clear_fast_cache()
            t0 = time.perf_counter()
            tree = BatchTree.build(seqs)
            t1 = time.perf_counter()
            result = fast_l2_tree(tree, grid)
            t2 = time.perf_counter()
            fast_l2(seqs, grid)
            t3 = time.perf_counter()
            tree_s, cold_s, memo_s = (
                min(tree_s, t1 - t0),
                min(cold_s, t2 - t0),
                min(memo_s, t3 - t2),
            )
        rows.append(
            Row(n, sum(map(len, seqs)), 1e3 * tree_s, 1e3 * cold_s, 1e3 * memo_s, result.hit_rate)
        )
    return rows


def print_l2_bench(**kwargs: object) -> None:
    print(f"{'seqs':>6} {'blocks':>8} {'tree ms':>8} {'cold ms':>8} {'memo ms':>8} {'hit':>6}")
    for r in l2_bench(**kwargs):  # type: ignore[arg-type]
        print(
            f"{r.seqs:>6} {r.blocks:>8} {r.tree_ms:>8.2f} {r.cold_ms:>8.2f} "
            f"{r.memo_ms:>8.2f} {r.hit_rate:>6.3f}"
        )
