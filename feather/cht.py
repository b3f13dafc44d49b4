"""The Chunked Hash Tree (CHT): cheap prefix detection for batch formation.

A prompt is cut into chunks of C tokens, each named by a cumulative hash (equal hash at
position k <=> equal first (k+1)*C tokens; see `feather.chunk_hash`), so two prompts are
compared by hash lookups, never token by token. The tree is a compressed trie over those
hashes: a node is a run of chunks no two known prompts diverge inside, so a prompt's path
has one node per branch point (a handful), not one per chunk.

Requests are *waiting* or *active*. The working set is the set of chunks held by active
requests. It is prefix-closed and a union of whole nodes (every prompt ends at a node
boundary), so each node carries two subtree counters, `n_active` and `n_waiting`, and:

- a waiting request's depth in the working set is the end of its deepest ancestor node with
  n_active > 0, its *missing* count is its chunk count minus that depth;
- the batch's shared depth (chunks common to all A active requests) is the end of the deepest
  node with n_active == A, and the depth a candidate would leave is the end of the deepest
  node on *its* path with n_active == A; w is that node's n_waiting minus the candidate.

All three are one walk up a path of a few nodes. admit/finish/preempt update the counters on
one path: only nodes that enter or leave the working set change state, never each chunk.

`best()` is a min-heap of waiting requests keyed by (missing, arrival). Missing counts fall
when the working set grows and rise when it shrinks. Rising keys are re-keyed lazily when
they surface (a stored key is then a lower bound, which keeps the heap top exact once it is
validated); falling keys must be pushed eagerly: on admit, only waiting requests below the
topmost node that entered the working set can gain depth, and the subtree walk from that node
finds exactly them (the "index from chunk hash to waiting requests" is the tree itself).
Waiting requests that share no chunk with the working set sit in a second heap keyed by their
chunk count, so the best request that shares *something* is available on its own
(`best_sharing`) - the Feather policies need it, see `feather.policies.feather`.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from feather.arrival import ArrivalQueue
from feather.chunk_hash import chunk_hashes as hash_chunks
from feather.chunk_hash import token_array

RequestId = Hashable

_WAITING = 0
_ACTIVE = 1


class UnknownRequestError(KeyError):
    """An operation named a request id the tree does not hold."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class CandidateState:
    """What admitting one waiting request would do to the batch (the policy's state).

    new_depth: shared depth (chunks common to all active requests) after admitting it.
    delta:     shared depth now minus new_depth. Defined as 0 for an empty batch (there is no
               shared prefix to lose). For a one-request batch the shared depth is that
               request's own chunk count, so delta = its chunks beyond the common prefix.
    w:         other waiting requests that share the new shared prefix (its first new_depth
               chunks): how many could follow at no further loss. At new_depth 0 that is
               every other waiting request.
    """

    new_depth: int
    delta: int
    w: int


class _Node:
    """A run of chunks at depths [start, end) with no branch point inside."""

    __slots__ = (
        "children",
        "end",
        "ends",
        "n_active",
        "n_waiting",
        "offset",
        "parent",
        "ref",
        "start",
    )

    def __init__(self, parent: _Node | None, ref: list, offset: int, start: int, end: int) -> None:
        self.parent = parent
        self.ref = ref  # chunk hashes; ref[i] is the hash at depth offset + i
        self.offset = offset
        self.start = start
        self.end = end
        self.children: dict[Hashable, _Node] = {}
        self.ends: dict[RequestId, _Request] = {}  # requests whose prompt ends here
        self.n_waiting = 0  # waiting requests ending in this subtree
        self.n_active = 0  # active requests ending in this subtree

    def hash_at(self, depth: int) -> Hashable:
        return self.ref[depth - self.offset]


class _Request:
    __slots__ = ("key", "n", "node", "push_id", "req_id", "seq", "state")

    def __init__(self, req_id: RequestId, seq: int, n: int, node: _Node) -> None:
        self.req_id = req_id
        self.seq = seq  # arrival order; kept across preemption
        self.n = n  # full chunks in the prompt
        self.node = node  # the node its prompt ends at
        self.state = _WAITING
        self.push_id = 0  # only the heap entry with this id is live
        self.key = 0  # missing count stored with the live entry (a lower bound)


class ChunkedHashTree:
    """Waiting and active requests over a compressed trie of cumulative chunk hashes."""

    def __init__(self, chunk_size: int = 16) -> None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self._root = _Node(None, [], 0, 0, 0)
        self._requests: dict[RequestId, _Request] = {}
        self._active: dict[RequestId, _Request] = {}
        self._anchor: _Request | None = None  # any active request: the shared path is on it
        self._sharing: list[tuple[int, int, int, _Request]] = []  # (missing, seq, id, req)
        self._apart: list[tuple[int, int, int, _Request]] = []  # (chunks, seq, id, req)
        self._arrival = ArrivalQueue()
        self._pushes = 0
        self._next_seq = 0
        self._hash_source: str | None = None

    # ---- registering requests ------------------------------------------------------------
    def add_waiting(
        self,
        req_id: RequestId,
        token_ids: Iterable[int] | None = None,
        *,
        chunk_hashes: Sequence[Hashable] | None = None,
    ) -> None:
        """Register a waiting request by its token ids or by precomputed cumulative hashes.

        Only full chunks count. Precomputed hashes must be cumulative (an engine's block
        hashes with block size = chunk_size); one tree never mixes the two sources.
        """
        if req_id in self._requests:
            raise ValueError(f"duplicate request id {req_id!r}: it is already in the tree")
        if (token_ids is None) == (chunk_hashes is None):
            raise ValueError(f"request {req_id!r}: give exactly one of token_ids or chunk_hashes")
        source = "tokens" if chunk_hashes is None else "hashes"
        if self._hash_source not in (None, source):
            raise ValueError(
                f"request {req_id!r} gives {source}, but this tree was built from "
                f"{self._hash_source}: mixing hash schemes would never match"
            )
        if chunk_hashes is None:
            hashes = hash_chunks(
                token_array(token_ids, what=f"token_ids of {req_id!r}"), self.chunk_size
            )
        else:
            if isinstance(chunk_hashes, (str, bytes)):
                raise TypeError(f"chunk_hashes of {req_id!r} must be a sequence of hashes")
            hashes = list(chunk_hashes)
        self._hash_source = source
        node = self._insert_path(hashes)
        req = _Request(req_id, self._next_seq, len(hashes), node)
        self._next_seq += 1
        self._requests[req_id] = req
        node.ends[req_id] = req
        x: _Node | None = node
        while x is not None:
            x.n_waiting += 1
            x = x.parent
        self._push(req)
        self._arrival.push(req_id, req.seq)

    def admit(self, req_id: RequestId) -> None:
        """Waiting -> active: the working set grows by the request's chunks."""
        req = self._get(req_id, _WAITING, "admit")
        req.state = _ACTIVE
        self._arrival.discard(req_id)
        self._active[req_id] = req
        if self._anchor is None:
            self._anchor = req
        entering: _Node | None = None  # topmost node that joins the working set
        x: _Node | None = req.node
        while x is not None:
            x.n_waiting -= 1
            if x.n_active == 0 and x.parent is not None:
                entering = x
            x.n_active += 1
            x = x.parent
        if entering is not None and entering.n_waiting:
            self._push_gainers(entering)

    def finish(self, req_id: RequestId) -> None:
        """Remove an active or waiting request; an active one shrinks the working set."""
        req = self._requests.get(req_id)
        if req is None:
            raise UnknownRequestError(f"finish of unknown request id {req_id!r}")
        if req.state == _ACTIVE:
            self._deactivate(req)
        else:
            self._arrival.discard(req_id)
            x: _Node | None = req.node
            while x is not None:
                x.n_waiting -= 1
                x = x.parent
        req.state = -1  # invalidates its heap entries
        del self._requests[req_id]
        node = req.node
        del node.ends[req_id]
        self._prune(node)

    def preempt(self, req_id: RequestId) -> None:
        """Active -> waiting, at its original place in arrival order."""
        req = self._get(req_id, _ACTIVE, "preempt")
        self._deactivate(req)
        req.state = _WAITING
        x: _Node | None = req.node
        while x is not None:
            x.n_waiting += 1
            x = x.parent
        self._push(req)
        self._arrival.push(req_id, req.seq)

    # ---- queries -------------------------------------------------------------------------
    def best(self) -> tuple[RequestId, int] | None:
        """The waiting request with the fewest chunks missing from the working set.

        Ties go to the earliest-added request. Returns (req_id, missing) or None.
        """
        sharing = self._top_sharing()
        apart = self._top_apart()
        if sharing is None and apart is None:
            return None
        use_sharing = apart is None or (sharing is not None and sharing[:2] < apart[:2])
        top = sharing if use_sharing else apart
        return top[3].req_id, top[0]

    def best_sharing(self) -> tuple[RequestId, int] | None:
        """Like `best`, among waiting requests sharing at least one chunk with the working set."""
        top = self._top_sharing()
        return None if top is None else (top[3].req_id, top[0])

    def oldest(self) -> RequestId | None:
        """The earliest-added waiting request (preempted requests keep their place)."""
        return self._arrival.peek()

    def missing(self, req_id: RequestId) -> int:
        """Chunks of a waiting request not in the working set."""
        req = self._get(req_id, _WAITING, "missing")
        return req.n - self._ws_depth(req.node)

    def shared_depth(self) -> int:
        """Chunks common to all active requests (0 if none is active)."""
        if self._anchor is None:
            return 0
        return self._trunk_node(self._anchor.node).end

    def candidate_state(self, req_id: RequestId) -> CandidateState:
        """new shared depth, delta and w if this waiting request were admitted."""
        req = self._get(req_id, _WAITING, "candidate_state")
        if self._anchor is None:
            return CandidateState(new_depth=req.n, delta=0, w=req.node.n_waiting - 1)
        meet = self._trunk_node(req.node)
        depth_now = self._trunk_node(self._anchor.node).end
        return CandidateState(new_depth=meet.end, delta=depth_now - meet.end, w=meet.n_waiting - 1)

    def shared_depth_if_admitted(self, req_id: RequestId) -> int:
        return self.candidate_state(req_id).new_depth

    def delta(self, req_id: RequestId) -> int:
        return self.candidate_state(req_id).delta

    def w(self, req_id: RequestId) -> int:
        return self.candidate_state(req_id).w

    def num_chunks(self, req_id: RequestId) -> int:
        req = self._requests.get(req_id)
        if req is None:
            raise UnknownRequestError(f"unknown request id {req_id!r}")
        return req.n

    def is_waiting(self, req_id: RequestId) -> bool:
        req = self._requests.get(req_id)
        return req is not None and req.state == _WAITING

    def is_active(self, req_id: RequestId) -> bool:
        return req_id in self._active

    @property
    def num_active(self) -> int:
        return len(self._active)

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._active)

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._requests

    # ---- internals: the trie -------------------------------------------------------------
    def _insert_path(self, hashes: list) -> _Node:
        """The node a prompt with these hashes ends at, creating and splitting as needed."""
        node = self._root
        depth = 0
        n = len(hashes)
        while depth < n:
            child = node.children.get(hashes[depth])
            if child is None:
                leaf = _Node(node, hashes[depth:], depth, depth, n)
                node.children[hashes[depth]] = leaf
                return leaf
            stop = min(child.end, n)
            if child.hash_at(stop - 1) == hashes[stop - 1]:  # cumulative: equal through stop
                if stop == child.end:
                    node, depth = child, stop
                    continue
                return self._split(child, n)  # the prompt ends inside this run
            lo, hi = depth + 1, stop - 1  # the first lo chunks match, the first stop do not
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if child.hash_at(mid - 1) == hashes[mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            head = self._split(child, lo)
            leaf = _Node(head, hashes[lo:], lo, lo, n)
            head.children[hashes[lo]] = leaf
            return leaf
        return node

    def _split(self, node: _Node, depth: int) -> _Node:
        """Cut a run at `depth`; the new head keeps the upper part, `node` the lower."""
        parent = node.parent
        assert parent is not None and node.start < depth < node.end
        head = _Node(parent, node.ref, node.offset, node.start, depth)
        head.n_waiting = node.n_waiting
        head.n_active = node.n_active
        head.children[node.hash_at(depth)] = node
        parent.children[node.hash_at(node.start)] = head
        node.parent = head
        node.start = depth
        return head

    def _prune(self, node: _Node) -> None:
        """Drop nodes no request needs any more; merge a run that stopped branching."""
        while node.parent is not None and not node.ends and not node.children:
            del node.parent.children[node.hash_at(node.start)]
            node = node.parent
        parent = node.parent
        if parent is None or node.ends or len(node.children) != 1:
            return
        (child,) = node.children.values()
        if child.offset > node.start:  # child's hashes do not reach up to node.start
            child.ref = (
                node.ref[node.start - node.offset : node.end - node.offset]
                + child.ref[child.start - child.offset : child.end - child.offset]
            )
            child.offset = node.start
        child.start = node.start
        child.parent = parent
        parent.children[child.hash_at(child.start)] = child

    # ---- internals: working set and heaps ------------------------------------------------
    def _ws_depth(self, node: _Node) -> int:
        """Depth of the working set along the path ending at `node`."""
        while node.n_active == 0 and node.parent is not None:
            node = node.parent
        return node.end

    def _trunk_node(self, node: _Node) -> _Node:
        """Deepest node on this path that every active request passes through."""
        total = len(self._active)
        while node.n_active != total:
            node = node.parent  # the root always holds every active request
        return node

    def _deactivate(self, req: _Request) -> None:
        del self._active[req.req_id]
        x: _Node | None = req.node
        while x is not None:
            x.n_active -= 1
            x = x.parent
        if self._anchor is req:
            self._anchor = next(iter(self._active.values()), None)

    def _push(self, req: _Request) -> None:
        depth = self._ws_depth(req.node)
        self._push_keyed(req, req.n - depth, depth > 0)

    def _push_keyed(self, req: _Request, missing: int, sharing: bool) -> None:
        self._pushes += 1
        req.push_id = self._pushes
        req.key = missing
        heapq.heappush(
            self._sharing if sharing else self._apart, (missing, req.seq, self._pushes, req)
        )
        if len(self._sharing) + len(self._apart) > 2 * len(self._requests) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop dead heap entries once they outnumber live ones: lazy deletion must not let
        finished requests (and the nodes they point to) pile up in a heap whose top is
        rarely looked at. Each entry is dropped once, so this is amortised O(1) per push."""
        for heap in (self._sharing, self._apart):
            heap[:] = [e for e in heap if e[3].state == _WAITING and e[3].push_id == e[2]]
            heapq.heapify(heap)

    def _push_gainers(self, top: _Node) -> None:
        """Eagerly re-key waiting requests whose depth grew when `top` joined the working set."""
        stack = [(top, 0)]
        while stack:
            node, depth_above = stack.pop()
            depth = node.end if node.n_active else depth_above
            for req in node.ends.values():
                if req.state == _WAITING and req.n - depth < req.key:
                    self._push_keyed(req, req.n - depth, True)
            for child in node.children.values():
                if child.n_waiting:
                    stack.append((child, depth))

    def _top_sharing(self) -> tuple[int, int, int, _Request] | None:
        heap = self._sharing
        while heap:
            entry = heap[0]
            key, _, push_id, req = entry
            if req.state != _WAITING or req.push_id != push_id:
                heapq.heappop(heap)
                continue
            depth = self._ws_depth(req.node)
            if depth == 0:  # it no longer shares anything: move it to the other heap
                heapq.heappop(heap)
                self._push_keyed(req, req.n, False)
            elif req.n - depth != key:  # its key rose (lazy re-keying)
                heapq.heappop(heap)
                self._push_keyed(req, req.n - depth, True)
            else:
                return entry
        return None

    def _top_apart(self) -> tuple[int, int, int, _Request] | None:
        heap = self._apart
        while heap:
            entry = heap[0]
            req = entry[3]
            if req.state == _WAITING and req.push_id == entry[2]:
                return entry  # exact: gaining any shared chunk would have re-pushed it
            heapq.heappop(heap)
        return None

    def _get(self, req_id: RequestId, state: int, what: str) -> _Request:
        req = self._requests.get(req_id)
        if req is None:
            raise UnknownRequestError(f"{what} of unknown request id {req_id!r}")
        if req.state != state:
            actual = "active" if req.state == _ACTIVE else "waiting"
            expected = "active" if state == _ACTIVE else "waiting"
            raise ValueError(f"{what} of request {req_id!r}: it is {actual}, expected {expected}")
        return req
