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

`best()` needs the waiting request with the fewest missing chunks. Missing counts fall when
the working set grows and rise when it shrinks, and one admit can change them for thousands
of requests (a group's first member brings the group prefix), so keys are kept per *node*,
not per request: every waiting request below a working-set node y whose path leaves the
working set at y misses n - y.end chunks, and the best of them is the best (n, arrival) in
the hanging subtrees below y, or one ending at y itself (missing 0). So:

- each node keeps `sub`, the best (chunks, arrival) waiting request in its subtree, from a
  heap of its own waiting requests and a heap of its children's `sub` (`kids_all`), plus a
  heap over its children outside the working set only (`kids_out`);
- each working-set node keeps `att`, its best attached request: (0, arrival) for one ending
  at it, or (sub.n - y.end, arrival) for the best child subtree outside the working set;
- a global heap holds every working-set node's `att`; the root's `att` (requests sharing
  nothing with the working set) is kept beside it, so the best request that shares
  *something* is available on its own (`best_sharing`; the Feather policies need it).

Two candidate orders (`order=`), the same aggregates with a different key:

- `fewest-missing` (the paper's heap key): a request's key is its missing count, ties by
  arrival. Among requests attached at one working-set node the missing count differs only by
  their own length, so this order is also shortest-prompt-first.
- `deepest`: the request sharing the deepest prefix with the working set, ties by arrival.
  Requests attached at one node keep their arrival order, so where arrival order already keeps
  prefix groups together (a grouped workload) the tree offers what FCFS would. Keys: `sub` and
  the child heaps compare arrival only, `att` is the oldest attached request, and the global
  heap orders working-set nodes by depth (deepest first).

Prefix groups. `num_active_groups` counts the distinct prefixes the active requests run:
two requests are in one group when they share their first `group_chunks` chunks (a prompt
shorter than that is keyed by its whole length; a prompt without a full chunk is a group of
its own). It is kept as a count per group key, updated on admit and deactivate in O(1): what
a learned policy's state needs to tell a homogeneous running set from a mixed one.
`group_changes` counts the times a group started or stopped running: a learned policy's
reward window ends where it moves (the running set's composition changed).

An operation recomputes these along one path (stopping where nothing changed) and for the
nodes that enter or leave the working set: amortised O(path x log W) with lazy deletion from
the heaps (an entry is live while its stamp matches; dead entries are compacted away once they
outnumber live ones). No operation touches every member of a prefix group.
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
        "alive",
        "att",
        "att_stamp",
        "children",
        "end",
        "ends",
        "kids_all",
        "kids_out",
        "n_active",
        "n_waiting",
        "offset",
        "own",
        "parent",
        "ref",
        "start",
        "sub",
        "sub_stamp",
    )

    def __init__(self, parent: _Node | None, ref: list, offset: int, start: int, end: int) -> None:
        self.parent = parent
        self.ref = ref  # chunk hashes; ref[i] is the hash at depth offset + i
        self.offset = offset
        self.start = start
        self.end = end
        self.alive = True
        self.children: dict[Hashable, _Node] = {}
        self.ends: dict[RequestId, _Request] = {}  # requests whose prompt ends here
        self.n_waiting = 0  # waiting requests ending in this subtree
        self.n_active = 0  # active requests ending in this subtree (> 0: in the working set)
        self.own: list[tuple[int, int, _Request]] = []  # (seq, epoch, req), waiting ends
        self.kids_all: list[tuple[int, int, int, _Node]] = []  # (n, seq, stamp, child)
        self.kids_out: list[tuple[int, int, int, _Node]] = []  # same, children outside the set
        self.sub: tuple[int, int, _Request] | None = None  # best (n, seq) waiting in subtree
        self.sub_stamp = 0
        self.att: tuple[int, int, _Request] | None = None  # best (missing, seq) attached here
        self.att_stamp = 0  # changes whenever att does: stamps its one live entry in _attached

    def hash_at(self, depth: int) -> Hashable:
        return self.ref[depth - self.offset]


class _Request:
    __slots__ = ("epoch", "n", "node", "req_id", "seq", "state")

    def __init__(self, req_id: RequestId, seq: int, n: int, node: _Node) -> None:
        self.req_id = req_id
        self.seq = seq  # arrival order; kept across preemption
        self.n = n  # full chunks in the prompt
        self.node = node  # the node its prompt ends at
        self.state = _WAITING
        self.epoch = 0  # bumped each time it starts waiting: older heap entries are dead


ORDERS = ("fewest-missing", "deepest")


class ChunkedHashTree:
    """Waiting and active requests over a compressed trie of cumulative chunk hashes.

    `order`: how `best()` / `best_sharing()` rank waiting requests (see the module docstring).
    """

    def __init__(
        self, chunk_size: int = 16, order: str = "fewest-missing", group_chunks: int = 1
    ) -> None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not isinstance(group_chunks, int) or group_chunks < 1:
            raise ValueError(f"group_chunks must be a positive integer, got {group_chunks!r}")
        self.group_chunks = group_chunks
        if order not in ORDERS:
            raise ValueError(f"unknown candidate order {order!r}; orders: {', '.join(ORDERS)}")
        self.chunk_size = chunk_size
        self.order = order
        self._by_depth = order == "deepest"
        self._root = _Node(None, [], 0, 0, 0)
        self._requests: dict[RequestId, _Request] = {}
        self._active: dict[RequestId, _Request] = {}
        self._anchor: _Request | None = None  # any active request: the shared path is on it
        self._attached: list[tuple[int, int, int, _Node]] = []  # (missing, seq, stamp, node)
        self._arrival = ArrivalQueue()
        self._stamps = 0
        self._next_seq = 0
        self._hash_source: str | None = None
        # requests per first chunk, and how many first chunks two or more requests hold: two
        # requests share some chunk iff they share the first (hashes are cumulative)
        self._first_chunk: dict[RequestId, Hashable] = {}
        self._per_first_chunk: dict[Hashable, int] = {}
        self._shared_first_chunks = 0
        # prefix groups (see the module docstring): each request's key, active ones counted
        self._group_key: dict[RequestId, Hashable] = {}
        self._active_groups: dict[Hashable, int] = {}
        self._group_changes = 0

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
        if hashes:
            first = hashes[0]
            self._first_chunk[req_id] = first
            count = self._per_first_chunk.get(first, 0) + 1
            self._per_first_chunk[first] = count
            self._shared_first_chunks += count == 2
        self._group_key[req_id] = (
            hashes[min(len(hashes), self.group_chunks) - 1] if hashes else ("no-chunk", req_id)
        )
        node = self._insert_path(hashes)
        req = _Request(req_id, self._next_seq, len(hashes), node)
        self._next_seq += 1
        self._requests[req_id] = req
        node.ends[req_id] = req
        x: _Node | None = node
        while x is not None:
            x.n_waiting += 1
            x = x.parent
        self._start_waiting(req)

    def admit(self, req_id: RequestId) -> None:
        """Waiting -> active: the working set grows by the request's chunks."""
        req = self._get(req_id, _WAITING, "admit")
        req.state = _ACTIVE
        self._arrival.discard(req_id)
        self._active[req_id] = req
        key = self._group_key[req_id]
        running = self._active_groups.get(key, 0)
        self._active_groups[key] = running + 1
        if not running:
            self._group_changes += 1
        if self._anchor is None:
            self._anchor = req
        entering: list[_Node] = []  # nodes that join the working set, deepest first
        x: _Node | None = req.node
        while x is not None:
            x.n_waiting -= 1
            if x.n_active == 0 and x.parent is not None:
                entering.append(x)
            x.n_active += 1
            x = x.parent
        self._refresh_up(req.node)  # it no longer waits
        for node in entering:
            self._refresh_att(node)
        if entering:
            self._refresh_att(entering[-1].parent)  # one child fewer outside the set

    def finish(self, req_id: RequestId) -> None:
        """Remove an active or waiting request; an active one shrinks the working set."""
        req = self._requests.get(req_id)
        if req is None:
            raise UnknownRequestError(f"finish of unknown request id {req_id!r}")
        if req.state == _ACTIVE:
            self._deactivate(req)
            req.state = -1
        else:
            self._arrival.discard(req_id)
            req.state = -1
            x: _Node | None = req.node
            while x is not None:
                x.n_waiting -= 1
                x = x.parent
            self._refresh_up(req.node)
        del self._requests[req_id]
        del self._group_key[req_id]
        first = self._first_chunk.pop(req_id, None)
        if first is not None:
            count = self._per_first_chunk.pop(first) - 1
            if count:
                self._per_first_chunk[first] = count
            self._shared_first_chunks -= count == 1
        node = req.node
        del node.ends[req_id]
        self._prune(node)

    def preempt(self, req_id: RequestId) -> None:
        """Active -> waiting, at its original place in arrival order."""
        req = self._get(req_id, _ACTIVE, "preempt")
        self._deactivate(req)
        x: _Node | None = req.node
        while x is not None:
            x.n_waiting += 1
            x = x.parent
        self._start_waiting(req)

    # ---- queries -------------------------------------------------------------------------
    def best(self) -> tuple[RequestId, int] | None:
        """The waiting request first in the tree's order: by default the one with the fewest
        chunks missing from the working set; with order="deepest" the one sharing the deepest
        prefix with it. Ties go to the earliest-added request. Returns (req_id, missing) or None.
        """
        top = self._top_attached()
        apart = self._root.att
        if top is None and apart is None:
            return None
        if top is not None:
            sharing_key = (top[1], top[0][1])
            apart_key = (0 if self._by_depth else apart[0], apart[1]) if apart else None
            if apart_key is None or sharing_key < apart_key:
                return self._answer(top[0], top[2])
        return self._answer(apart, self._root)

    def best_sharing(self) -> tuple[RequestId, int] | None:
        """Like `best`, among waiting requests sharing at least one chunk with the working set."""
        top = self._top_attached()
        return None if top is None else self._answer(top[0], top[2])

    @staticmethod
    def _answer(att: tuple[int, int, _Request], node: _Node) -> tuple[RequestId, int]:
        req = att[2]
        return req.req_id, req.n - node.end

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
    def num_active_groups(self) -> int:
        """Distinct prefix groups among the active requests (see the module docstring)."""
        return len(self._active_groups)

    @property
    def group_changes(self) -> int:
        """Times a prefix group started or stopped running (its first member admitted, its
        last one finished or preempted): unchanged while the running set's groups are."""
        return self._group_changes

    def joins_active_group(self, req_id: RequestId) -> bool:
        """Whether a waiting request's prefix group already runs (admitting it joins a group
        rather than opening one)."""
        self._get(req_id, _WAITING, "joins_active_group")
        return self._group_key[req_id] in self._active_groups

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._active)

    def __len__(self) -> int:
        return len(self._requests)

    def any_shared(self) -> bool:
        """Whether any two requests in the tree (waiting or active) share a chunk, in O(1):
        where none do, no decision can keep or lose a shared prefix (claim C6)."""
        return self._shared_first_chunks > 0

    def footprint(self) -> dict[str, int]:
        """What the tree holds (requests, trie nodes below the root, heap entries live or
        dead), walked in O(nodes): for a long-running server's leak checks, not hot paths."""
        nodes, stack = 0, list(self._root.children.values())
        while stack:
            node = stack.pop()
            nodes += 1
            stack.extend(node.children.values())
        return {
            "requests": len(self._requests),
            "nodes": nodes,
            "heap_entries": len(self._attached) + self._arrival.heap_entries,
        }

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
        """Cut a run at `depth`; a new head takes the upper part, `node` keeps the lower."""
        parent = node.parent
        assert parent is not None and node.start < depth < node.end
        head = _Node(parent, node.ref, node.offset, node.start, depth)
        head.n_waiting = node.n_waiting
        head.n_active = node.n_active
        head.children[node.hash_at(depth)] = node
        parent.children[node.hash_at(node.start)] = head
        node.parent = head
        node.start = depth
        if node.sub is not None:  # same subtree below: same best; att(head) is empty
            self._offer_to_parent(node)
            head.sub = node.sub
            self._stamps += 1
            head.sub_stamp = self._stamps
            self._offer_to_parent(head)
        return head

    def _prune(self, node: _Node) -> None:
        """Drop nodes no request needs any more; merge a run that stopped branching."""
        while node.parent is not None and not node.ends and not node.children:
            del node.parent.children[node.hash_at(node.start)]
            node.alive = False
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
        node.alive = False
        if child.sub is not None:  # it takes node's place (and node's best) in the parent
            self._offer_to_parent(child)

    # ---- internals: working set ----------------------------------------------------------
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
        """Active -> not active: nodes it alone held leave the working set."""
        del self._active[req.req_id]
        key = self._group_key[req.req_id]
        left = self._active_groups.pop(key) - 1
        if left:
            self._active_groups[key] = left
        else:
            self._group_changes += 1
        leaving: list[_Node] = []
        x: _Node | None = req.node
        while x is not None:
            x.n_active -= 1
            if x.n_active == 0 and x.parent is not None:
                leaving.append(x)
            x = x.parent
        for node in leaving:  # outside the set now: their subtrees hang from their parents
            # No entry is pushed with stamp 0, so this kills the node's entry in _attached for
            # good. Keeping the old stamp would revive that entry (a request that may be gone or
            # active) if the node re-enters with nothing attached: _refresh_att then finds
            # None == att, pushes nothing, and the dead entry hides every live one behind it.
            node.att = None
            node.att_stamp = 0
            if node.sub is not None:
                parent = node.parent
                heapq.heappush(parent.kids_out, self._kid_entry(node))
                if len(parent.kids_out) > 2 * len(parent.children) + 8:
                    self._compact_kids(parent)
        if leaving:
            self._refresh_att(leaving[-1].parent)
        if self._anchor is req:
            self._anchor = next(iter(self._active.values()), None)

    # ---- internals: the best-request aggregates -----------------------------------------
    def _start_waiting(self, req: _Request) -> None:
        req.state = _WAITING
        req.epoch += 1
        node = req.node
        heapq.heappush(node.own, (req.seq, req.epoch, req))
        if len(node.own) > 2 * len(node.ends) + 8:
            node.own[:] = [e for e in node.own if e[2].state == _WAITING and e[2].epoch == e[1]]
            heapq.heapify(node.own)
        self._arrival.push(req.req_id, req.seq)
        self._refresh_up(node)

    @staticmethod
    def _kid_entry(node: _Node) -> tuple[int, int, int, _Node]:
        n, seq, _ = node.sub
        return n, seq, node.sub_stamp, node

    def _offer_to_parent(self, node: _Node) -> None:
        """Push node's current best into its parent's child heaps."""
        parent = node.parent
        entry = self._kid_entry(node)
        heapq.heappush(parent.kids_all, entry)
        if node.n_active == 0:
            heapq.heappush(parent.kids_out, entry)
        if len(parent.kids_all) > 2 * len(parent.children) + 8:
            self._compact_kids(parent)

    @staticmethod
    def _compact_kids(node: _Node) -> None:
        def live(e: tuple[int, int, int, _Node]) -> bool:
            child = e[3]
            return child.alive and child.parent is node and child.sub_stamp == e[2]

        node.kids_all[:] = [e for e in node.kids_all if live(e)]
        node.kids_out[:] = [e for e in node.kids_out if live(e) and e[3].n_active == 0]
        heapq.heapify(node.kids_all)
        heapq.heapify(node.kids_out)

    def _refresh_up(self, node: _Node) -> None:
        """Recompute sub (and att) from `node` up, while something changes."""
        x: _Node | None = node
        outside = True  # whether the change reached x from outside the working set
        while x is not None:
            changed = self._refresh_sub(x)
            if outside and (x.n_active or x.parent is None):
                self._refresh_att(x)  # att only sees x's own requests and hanging children
            if not changed or x.parent is None:
                return
            if x.sub is not None:
                self._offer_to_parent(x)
            outside = x.n_active == 0
            x = x.parent

    def _refresh_sub(self, x: _Node) -> bool:
        own = x.own
        while own and (own[0][2].state != _WAITING or own[0][2].epoch != own[0][1]):
            heapq.heappop(own)
        best = (0 if self._by_depth else x.end, own[0][0], own[0][2]) if own else None
        kids = x.kids_all
        while kids:
            n, seq, stamp, child = kids[0]
            if child.alive and child.parent is x and child.sub_stamp == stamp:
                if best is None or (n, seq) < best[:2]:
                    best = child.sub
                break
            heapq.heappop(kids)
        if (best and best[1]) == (x.sub and x.sub[1]) and (best is None) == (x.sub is None):
            return False
        x.sub = best
        self._stamps += 1
        x.sub_stamp = self._stamps
        return True

    def _refresh_att(self, y: _Node) -> None:
        """Recompute the best request attached at working-set node (or root) y."""
        own = y.own
        while own and (own[0][2].state != _WAITING or own[0][2].epoch != own[0][1]):
            heapq.heappop(own)
        best = (0, own[0][0], own[0][2]) if own else None  # missing 0 (or depth y.end)
        kids = y.kids_out
        while kids:
            n, seq, stamp, child = kids[0]
            if (
                child.alive
                and child.parent is y
                and child.sub_stamp == stamp
                and child.n_active == 0
            ):
                if self._by_depth:  # same depth as y's own: the older one
                    if best is None or seq < best[1]:
                        best = (0, seq, child.sub[2])
                elif best is None:  # own requests (missing 0) beat every hanging one
                    best = (n - y.end, seq, child.sub[2])
                break
            heapq.heappop(kids)
        if best == y.att:
            return
        y.att = best
        if y.parent is None:
            return  # the root's att is read directly
        self._stamps += 1
        y.att_stamp = self._stamps
        if best is not None:
            key = -y.end if self._by_depth else best[0]
            heapq.heappush(self._attached, (key, best[1], self._stamps, y))
            if len(self._attached) > 2 * len(self._requests) + 64:
                self._attached[:] = [
                    e
                    for e in self._attached
                    if e[3].alive and e[3].n_active and e[3].att_stamp == e[2]
                ]
                heapq.heapify(self._attached)

    def _top_attached(self) -> tuple[tuple[int, int, _Request], int, _Node] | None:
        """(att, heap key, node) of the first live working-set node in the global heap."""
        heap = self._attached
        while heap:
            key, _, stamp, node = heap[0]
            if node.alive and node.n_active and node.att_stamp == stamp:
                return node.att, key, node
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
