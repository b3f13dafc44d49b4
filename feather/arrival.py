"""Waiting requests in arrival order, with O(log W) removal from anywhere."""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class ArrivalQueue:
    """A heap of (arrival_seq, epoch, req_id) with lazy deletion.

    An entry is live while its request waits in the epoch it was pushed in; pushing a
    request again (after preemption) starts a new epoch, so stale entries never resurface.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable]] = []
        self._epoch: dict[Hashable, int] = {}
        self._counter = 0

    def push(self, req_id: Hashable, seq: int) -> None:
        self._counter += 1
        self._epoch[req_id] = self._counter
        heapq.heappush(self._heap, (seq, self._counter, req_id))
        if len(self._heap) > 2 * len(self._epoch) + 64:  # dead entries dominate: drop them
            self._heap = [e for e in self._heap if self._epoch.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def discard(self, req_id: Hashable) -> None:
        self._epoch.pop(req_id, None)

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._epoch

    def __len__(self) -> int:
        return len(self._epoch)

    @property
    def heap_entries(self) -> int:
        """Entries in the heap, dead ones included (bounded by the compaction in push)."""
        return len(self._heap)

    def peek(self) -> Hashable | None:
        """The earliest-arrived waiting request, or None."""
        heap, epoch = self._heap, self._epoch
        while heap:
            _, pushed, req_id = heap[0]
            if epoch.get(req_id) == pushed:
                return req_id
            heapq.heappop(heap)
        return None
