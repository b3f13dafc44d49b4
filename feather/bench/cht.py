"""`feather bench cht`: the cost of batch formation with the CHT against a brute-force scan.

Protocol (fixed so numbers compare across machines and revisions):
- W waiting requests of 4,000 tokens: a 3,900-token prefix shared within each of 50 groups
  plus a 100-token suffix of its own; random token ids (vocabulary 32,000), groups in
  shuffled arrival order; chunk size 16.
- Batches of 100 are formed by repeated best() + admit(), then all finished; repeated
  until no request waits. Reported: microseconds per admitted request amortised over the
  whole cycle (best, admit and finish), and per insert (hashing the tokens + the tree).
- A second pass does what the Feather policy does per decision: best_sharing() +
  candidate_state() (b, delta, w) + admit().
- Brute force: for each decision, every waiting request's missing count is computed
  against the working set (a set intersection per request, in C), the minimum taken; it
  runs the same cycle until a time budget is spent, and its first decisions are checked to
  equal the CHT's.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from feather.cht import ChunkedHashTree
from feather.chunk_hash import chunk_hashes

VOCAB = 32_000


@dataclass(frozen=True, slots=True)
class Protocol:
    groups: int = 50
    prefix_tokens: int = 3_900
    suffix_tokens: int = 100
    chunk_size: int = 16
    batch_size: int = 100
    seed: int = 0
    brute_budget_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Row:
    waiting: int
    insert_us: float
    cht_us_per_admit: float
    cht_policy_us_per_admit: float
    brute_us_per_admit: float
    brute_decisions: int
    brute_agrees: bool

    @property
    def speedup(self) -> float:
        return self.brute_us_per_admit / self.cht_us_per_admit


class _Workload:
    """The protocol's requests, generated one at a time (W x 4,000 tokens do not fit twice)."""

    def __init__(self, protocol: Protocol, waiting: int) -> None:
        self.p = protocol
        rng = random.Random(protocol.seed)
        self.prefixes = [
            [rng.randrange(VOCAB) for _ in range(protocol.prefix_tokens)]
            for _ in range(protocol.groups)
        ]
        self.group_of = [i % protocol.groups for i in range(waiting)]
        rng.shuffle(self.group_of)
        self.suffix_seeds = [rng.getrandbits(64) for _ in range(waiting)]

    def tokens(self, i: int) -> list[int]:
        suffix_rng = random.Random(self.suffix_seeds[i])
        suffix = [suffix_rng.randrange(VOCAB) for _ in range(self.p.suffix_tokens)]
        return self.prefixes[self.group_of[i]] + suffix

    def interned_hashes(self) -> list[list[bytes]]:
        """Every request's chunk hashes, prefix hashes shared per group (for brute force)."""
        c = self.p.chunk_size
        full = self.p.prefix_tokens // c
        group_hashes = [chunk_hashes(prefix[: full * c], c) for prefix in self.prefixes]
        out = []
        for i, g in enumerate(self.group_of):
            parent = group_hashes[g][-1] if full else b""
            tail = self.tokens(i)[full * c :]
            out.append(group_hashes[g] + chunk_hashes(tail, c, parent))
        return out


def _cycle(tree: ChunkedHashTree, batch_size: int, pick: Callable[[], object]) -> int:
    admitted = 0
    while tree.num_waiting:
        batch = []
        for _ in range(batch_size):
            req_id = pick()
            if req_id is None:
                break
            tree.admit(req_id)
            batch.append(req_id)
        for req_id in batch:
            tree.finish(req_id)
        admitted += len(batch)
    return admitted


def _filled_tree(work: _Workload, waiting: int) -> tuple[ChunkedHashTree, float]:
    tree = ChunkedHashTree(work.p.chunk_size)
    insert_s = 0.0
    for i in range(waiting):
        tokens = work.tokens(i)
        t0 = time.perf_counter()
        tree.add_waiting(i, tokens)
        insert_s += time.perf_counter() - t0
    return tree, insert_s


def _cht_pick(tree: ChunkedHashTree) -> Callable[[], object]:
    def pick() -> object:
        top = tree.best()
        return None if top is None else top[0]

    return pick


def _policy_pick(tree: ChunkedHashTree) -> Callable[[], object]:
    def pick() -> object:
        top = tree.best_sharing()
        req_id = tree.oldest() if top is None else top[0]
        if req_id is not None:
            tree.candidate_state(req_id)
        return req_id

    return pick


def _brute_force(
    work: _Workload, hashes: list[list[bytes]], budget_s: float, reference: list[int]
) -> tuple[float, int, bool]:
    """Per admitted request time of the scan, over as many decisions as the budget allows."""
    waiting = dict(enumerate(hashes))  # arrival order = insertion order = request index
    held: Counter[bytes] = Counter()
    ws: set[bytes] = set()
    decisions = 0
    chosen: list[int] = []
    gc.collect()
    start = time.perf_counter()
    while waiting and time.perf_counter() - start < budget_s:
        batch = []
        for _ in range(work.p.batch_size):
            if not waiting or time.perf_counter() - start >= budget_s:
                break
            best_key, best_id = None, None
            for req_id, chunks in waiting.items():
                key = len(chunks) - len(ws.intersection(chunks))
                if best_key is None or key < best_key:
                    best_key, best_id = key, req_id
            chunks = waiting.pop(best_id)
            for h in chunks:
                if held[h] == 0:
                    ws.add(h)
                held[h] += 1
            batch.append(chunks)
            chosen.append(best_id)
            decisions += 1
        for chunks in batch:
            for h in chunks:
                held[h] -= 1
                if held[h] == 0:
                    ws.discard(h)
                    del held[h]
    elapsed = time.perf_counter() - start
    return elapsed / decisions * 1e6, decisions, chosen == reference[: len(chosen)]


def run_row(protocol: Protocol, waiting: int, progress: Callable[[str], None]) -> Row:
    work = _Workload(protocol, waiting)
    progress(
        f"W={waiting:,}: inserting {waiting:,} requests of "
        f"{protocol.prefix_tokens + protocol.suffix_tokens:,} tokens"
    )
    tree, insert_s = _filled_tree(work, waiting)

    order: list[int] = []
    best = _cht_pick(tree)

    def recording_pick() -> object:
        req_id = best()
        if req_id is not None and len(order) < 10_000:
            order.append(req_id)
        return req_id

    progress(f"W={waiting:,}: forming batches with best() + admit()")
    gc.collect()  # start each timed phase with no garbage pending
    t0 = time.perf_counter()
    admitted = _cycle(tree, protocol.batch_size, recording_pick)
    cht_s = time.perf_counter() - t0
    assert admitted == waiting

    progress(f"W={waiting:,}: forming batches as the Feather policy does")
    tree, _ = _filled_tree(work, waiting)
    gc.collect()
    t0 = time.perf_counter()
    _cycle(tree, protocol.batch_size, _policy_pick(tree))
    policy_s = time.perf_counter() - t0
    del tree

    progress(f"W={waiting:,}: brute-force scan (budget {protocol.brute_budget_s:g} s)")
    brute_us, decisions, agrees = _brute_force(
        work, work.interned_hashes(), protocol.brute_budget_s, order
    )
    return Row(
        waiting=waiting,
        insert_us=insert_s / waiting * 1e6,
        cht_us_per_admit=cht_s / admitted * 1e6,
        cht_policy_us_per_admit=policy_s / admitted * 1e6,
        brute_us_per_admit=brute_us,
        brute_decisions=decisions,
        brute_agrees=agrees,
    )


def run_benchmark(
    sizes: list[int], protocol: Protocol, progress: Callable[[str], None] | None = None
) -> list[Row]:
    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    return [run_row(protocol, w, say) for w in sizes]


def format_table(rows: list[Row]) -> str:
    header = (
        f"{'waiting W':>10} {'insert us':>10} {'CHT us/admit':>13} {'policy us/admit':>16} "
        f"{'brute us/admit':>15} {'(decisions)':>12} {'speedup':>9} {'agree':>6}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.waiting:>10,} {r.insert_us:>10.1f} {r.cht_us_per_admit:>13.2f} "
            f"{r.cht_policy_us_per_admit:>16.2f} {r.brute_us_per_admit:>15,.0f} "
            f"{r.brute_decisions:>12,} {r.speedup:>8,.0f}x {r.brute_agrees!s:>6}"
        )
    return "\n".join(lines)


def rows_to_json(rows: list[Row]) -> list[dict]:
    return [{**asdict(r), "speedup": r.speedup} for r in rows]


def stderr_progress(message: str) -> None:
    print(f"[bench cht] {message}", file=sys.stderr, flush=True)


def protocol_to_json(protocol: Protocol) -> dict:
    return asdict(protocol)
