"""Feather's side: the Chunked Hash Tree alone (best + admit) and the full Feather policy
(the ADD/STOP decision pass, feather-static), each forming one batch per measurement.

Every decision is one `best()` (or the policy's candidate choice and (b, delta, w) state)
plus one `admit`; the batch is then preempted back to waiting (no re-hashing), so every
repeat forms the same batch from the same W waiting requests.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import feather
from feather.cht import ChunkedHashTree
from feather.chunk_hash import chunk_hashes as hash_chunks
from feather.chunk_hash import token_array
from feather.overhead.base import Implementation, Measured, Prepared, cpu_time
from feather.overhead.scenario import Case, group_prefixes, suffix, waiting_requests
from feather.policies.base import Request, StepContext
from feather.policies.registry import create_scheduler

VARIANTS = ("cht", "feather-static")


class FeatherCHT(Implementation):
    family = "feather"

    def __init__(self) -> None:
        self._tree: ChunkedHashTree | None = None
        self._policy: Any = None
        self._batch = 0

    def facts(self) -> dict[str, Any]:
        return {
            "impl": f"feather-{feather.__version__}",
            "engine": "feather",
            "engine_version": feather.__version__,
            "structure": "ChunkedHashTree",
            "python": sys.version.split()[0],
        }

    def variants(self) -> list[str]:
        return list(VARIANTS)

    def prepare(self, case: Case) -> Prepared:
        prefixes = group_prefixes(case)
        prompts = waiting_requests(case, prefixes)
        tree = ChunkedHashTree(case.page)
        start, start_cpu = time.perf_counter(), time.thread_time()
        for i, tokens in enumerate(prompts):
            tree.add_waiting(i, tokens)
        arrival = (time.perf_counter() - start) / case.waiting
        arrival_cpu = (time.thread_time() - start_cpu) / case.waiting
        # the same insertion from hashes computed beforehand, as vLLM's block hashes arrive
        hashes = [hash_chunks(token_array(tokens), case.page) for tokens in prompts]
        from_hashes = ChunkedHashTree(case.page)
        start_cpu = time.thread_time()
        for i, chunk_hashes in enumerate(hashes):
            from_hashes.add_waiting(i, chunk_hashes=chunk_hashes)
        arrival_hashes_cpu = (time.thread_time() - start_cpu) / case.waiting
        del from_hashes, hashes
        # One request of every group in the working set: then a waiting request's depth in
        # it is what it shares with the running batch (the CHT's answer to "shared prefix").
        reps = [("rep", g) for g in range(case.cached_groups)]
        for g, rep in enumerate(reps):
            tree.add_waiting(rep, prefixes[g] + suffix(case, case.waiting + g))
            tree.admit(rep)
        matches = [
            (tree.num_chunks(i) - tree.missing(i)) * case.page for i in range(case.waiting)
        ]
        for rep in reps:
            tree.finish(rep)
        policy = create_scheduler("feather-static", chunk_size=case.page)
        for i, tokens in enumerate(prompts):
            policy.add_request(Request(req_id=i, prompt_token_ids=tokens))
        self._tree, self._policy, self._batch = tree, policy, case.batch
        return Prepared(matches=matches, arrival_s_per_request=arrival,
                        arrival_cpu_s_per_request=arrival_cpu,
                        arrival_hashes_cpu_s_per_request=arrival_hashes_cpu)

    def measure(self, variant: str) -> Measured:
        if variant == "cht":
            return self._measure_cht()
        if variant == "feather-static":
            return self._measure_policy()
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")

    def _measure_cht(self) -> Measured:
        tree = self._tree
        assert tree is not None

        def form() -> list:
            batch = []
            for _ in range(self._batch):
                top = tree.best()
                if top is None:
                    break
                tree.admit(top[0])
                batch.append(top[0])
            return batch

        seconds, batch = cpu_time(form)
        for req_id in batch:
            tree.preempt(req_id)
        return Measured(seconds=seconds, decisions=len(batch), admitted=len(batch))

    def _measure_policy(self) -> Measured:
        policy = self._policy

        def form() -> tuple[list, int]:
            policy.begin_step(StepContext(num_running=0, max_running=self._batch))
            batch, decisions = [], 0
            while (req_id := policy.next_candidate()) is not None:
                policy.admitted(req_id)
                batch.append(req_id)
                decisions += 1
            return batch, decisions + 1  # the last decision is STOP (or a limit)

        seconds, (batch, decisions) = cpu_time(form)
        for req_id in batch:
            policy.preempted(req_id)
        return Measured(seconds=seconds, decisions=decisions, admitted=len(batch))

    def release(self) -> None:
        self._tree, self._policy = None, None
