"""What a warm start serves before a run: one request per prefix group.

A server that has answered questions on a document keeps the document's KV in its prefix
cache. The real engine (`prefix_cache: warm`, feather/engines/vllm/runner.py), the simulator
(feather/sim/warm_start.py) and the online sweep (feather/engines/vllm/online.py) all start a
run so by serving, unmeasured, the first request of each prefix group in workload order: the
offline ones its shared prefix alone, the online one its whole prompt as a client would.
"""

from __future__ import annotations

from collections.abc import Sequence

from feather.workloads.schema import WorkloadRequest


def warm_up_requests(requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
    """Each prefix group's first request, in workload order. Raises where no request shares
    a prefix: there is nothing to warm."""
    first: dict[str, WorkloadRequest] = {}
    for r in requests:
        if r.shared_prefix_len > 0 and r.group_id not in first:
            first[r.group_id] = r
    if not first:
        raise ValueError("prefix_cache 'warm': no request of the workload shares a prefix to cache")
    return list(first.values())
