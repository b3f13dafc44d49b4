"""A token-level radix tree: the prefix-cache model behind the `lpm` and `dfs-weight` policies.

A compressed trie over token ids with the behaviour of SGLang's `RadixCache`
(`python/sglang/srt/mem_cache/radix_cache.py`), written anew and kept small:

- Keys are handled in whole pages of `page_size` tokens: a sequence is cut down to a
  multiple of `page_size` before matching or insertion, children are told apart by their
  first page, and two keys match page by page (a page matches only if all of it does).
- `match_prefix` splits a node when the match ends inside it, so the node it returns ends
  exactly at the matched length (SGLang's `_match_prefix_helper` / `_split_node`). A split
  keeps the original node object as the *deeper* part and puts the new node in the
  parent's child table at the same position, so references held to nodes stay valid and
  sibling order (insertion order) is unchanged.
- Nodes on the path of a running request are reference-locked (`lock` / `unlock` walk the
  path to the root); only unlocked leaves are evictable, least recently used first.
  "Time" is a logical clock ticked by every `match_prefix` and `insert`, which touch the
  nodes they walk, as SGLang refreshes `last_access_time`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

ChildKey = int | tuple[int, ...]


class RadixNode:
    """One compressed edge: `key` is the token run from `parent` down to this node.

    `lock_ref` counts running requests whose path passes through the node; `last_access`
    is the tree's logical clock at the last match or insertion that walked it.
    """

    __slots__ = ("children", "key", "last_access", "lock_ref", "node_id", "parent")

    def __init__(
        self,
        key: tuple[int, ...],
        parent: RadixNode | None,
        node_id: int,
        last_access: int,
        lock_ref: int = 0,
    ) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[ChildKey, RadixNode] = {}
        self.node_id = node_id
        self.last_access = last_access
        self.lock_ref = lock_ref

    @property
    def prefix_len(self) -> int:
        """Tokens from the root down to the end of this node."""
        n, node = 0, self
        while node is not None:
            n += len(node.key)
            node = node.parent
        return n

    def path_tokens(self) -> tuple[int, ...]:
        """The token sequence from the root down to the end of this node."""
        parts: list[tuple[int, ...]] = []
        node: RadixNode | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(parts)))

    def __repr__(self) -> str:
        head = self.key[:8]
        more = "..." if len(self.key) > 8 else ""
        return f"RadixNode(id={self.node_id}, key={head}{more}, lock_ref={self.lock_ref})"


class RadixTree:
    """Compressed trie over token ids, matched and filled in whole pages, with LRU eviction.

    The root holds no tokens, is permanently locked and is never evicted.
    """

    def __init__(self, page_size: int = 1) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        self.page_size = page_size
        self.reset()

    def reset(self) -> None:
        """Drop every cached token (SGLang's `RadixCache.reset`)."""
        self._ids = itertools.count()
        self._clock = 0
        self.root = RadixNode((), None, next(self._ids), 0, lock_ref=1)
        self._total_tokens = 0
        self._locked_tokens = 0
        self._num_nodes = 0  # besides the root
        self._evictable: set[RadixNode] = set()  # unlocked leaves other than the root

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def total_tokens(self) -> int:
        """Tokens held by the tree (sum of all node key lengths)."""
        return self._total_tokens

    @property
    def num_nodes(self) -> int:
        """Nodes besides the root (what a walk over the whole tree visits)."""
        return self._num_nodes

    @property
    def locked_tokens(self) -> int:
        """Tokens on nodes locked by running requests (SGLang's `protected_size`)."""
        return self._locked_tokens

    @property
    def evictable_tokens(self) -> int:
        """Tokens on unlocked nodes (SGLang's `evictable_size`)."""
        return self._total_tokens - self._locked_tokens

    def iter_nodes(self) -> Iterator[RadixNode]:
        """Every node, root first, parents before children."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    # ---- matching and insertion ----------------------------------------------------------
    def match_prefix(
        self, tokens: Sequence[int], hint: tuple[int, RadixNode] | None = None
    ) -> tuple[int, RadixNode]:
        """Longest cached prefix of `tokens` in whole pages: (matched length, its last node).

        If the match ends inside a node, that node is split there so the returned node ends
        exactly at the matched length; the root is returned for an empty match.

        `hint`: this tree's answer for the same `tokens` at an earlier call. While its node
        is still in the tree its path still spells the first `matched` tokens (a split keeps
        the deeper part as the original node; only leaves are evicted), so the walk resumes
        there instead of comparing the prefix again; the answer, the splits and the nodes
        touched are exactly those of a walk from the root. A stale hint (evicted node, other
        tree) is ignored.
        """
        if not isinstance(tokens, tuple):
            tokens = tuple(tokens)
        end = len(tokens) - len(tokens) % self.page_size
        now = self._tick()
        if hint is not None:
            matched, node = hint
            path = self._path_from_root(node) if matched <= end else None
            if path is not None:
                for n in path:
                    n.last_access = now
                return self._descend(tokens, end, matched, node, now)
        self.root.last_access = now
        return self._descend(tokens, end, 0, self.root, now)

    def _descend(
        self, tokens: tuple[int, ...], end: int, pos: int, node: RadixNode, now: int
    ) -> tuple[int, RadixNode]:
        """Walk down from `node`, which ends at `pos`, matching tokens[pos:end]."""
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            child.last_access = now
            n = self._common_len(child.key, tokens, pos, end)
            pos += n
            if n < len(child.key):
                node = self._split(child, n)
                break
            node = child
        return pos, node

    def insert(self, tokens: Sequence[int]) -> RadixNode:
        """Cache `tokens` (cut to whole pages); return the node that ends at their end."""
        key = self._page_aligned(tokens)
        now = self._tick()
        node = self.root
        node.last_access = now
        pos = 0
        while pos < len(key):
            child_key = self._child_key(key, pos)
            child = node.children.get(child_key)
            if child is None:
                leaf = RadixNode(key[pos:], node, next(self._ids), now)
                node.children[child_key] = leaf
                self._total_tokens += len(leaf.key)
                self._num_nodes += 1
                self._evictable.discard(node)  # no longer a leaf
                self._evictable.add(leaf)
                return leaf
            child.last_access = now
            n = self._common_len(child.key, key, pos, len(key))
            pos += n
            node = self._split(child, n) if n < len(child.key) else child
        return node

    # ---- locking -------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        """Protect `node` and its ancestors from eviction (SGLang's `inc_lock_ref`)."""
        for n in self._path_to_root(node):
            if n.lock_ref == 0:
                self._locked_tokens += len(n.key)
                self._evictable.discard(n)
            n.lock_ref += 1

    def unlock(self, node: RadixNode) -> None:
        """Release one lock taken by `lock(node)` (SGLang's `dec_lock_ref`)."""
        path = self._path_to_root(node)
        if any(n.lock_ref <= 0 for n in path):
            raise ValueError(f"unlock of {node!r}: it is not locked")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._locked_tokens -= len(n.key)
                if not n.children:
                    self._evictable.add(n)

    # ---- eviction ------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until `num_tokens` are freed.

        Whole nodes go, so more than `num_tokens` may be freed; fewer if too little is
        unlocked. A parent left childless and unlocked becomes a candidate in turn.
        Returns the number of tokens evicted.
        """
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.node_id, n) for n in self._evictable]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key, 0)]
            leaf.parent = None  # detached: lock/unlock on it now fail loudly
            self._evictable.discard(leaf)
            self._total_tokens -= len(leaf.key)
            self._num_nodes -= 1
            evicted += len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._evictable.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return evicted

    def evict_to(self, capacity_tokens: int) -> int:
        """Evict LRU unlocked leaves until at most `capacity_tokens` remain (or none can go)."""
        return self.evict(self._total_tokens - capacity_tokens)

    # ---- helpers -------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _page_aligned(self, tokens: Sequence[int]) -> tuple[int, ...]:
        n = len(tokens) - len(tokens) % self.page_size
        return tuple(tokens[:n])

    def _child_key(self, key: tuple[int, ...], start: int) -> ChildKey:
        if self.page_size == 1:
            return key[start]
        return key[start : start + self.page_size]

    def _common_len(
        self, node_key: tuple[int, ...], key: tuple[int, ...], start: int, end: int
    ) -> int:
        """Common prefix of `node_key` and `key[start:end]`, in whole pages."""
        n = len(node_key)
        if start + n <= end and key[start : start + n] == node_key:  # common, at C speed
            return n
        limit = min(n, end - start)
        i = 0
        while i < limit and node_key[i] == key[start + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, child: RadixNode, split_len: int) -> RadixNode:
        """Cut `child` after `split_len` tokens; the new upper part is returned.

        The new node takes `child`'s slot in the parent's table (same key, same position)
        and inherits its lock count and access time; `child` keeps the lower part.
        """
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        upper = RadixNode(
            child.key[:split_len], parent, next(self._ids), child.last_access, child.lock_ref
        )
        parent.children[self._child_key(child.key, 0)] = upper
        self._num_nodes += 1
        child.key = child.key[split_len:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        return upper

    def _path_from_root(self, node: RadixNode) -> list[RadixNode] | None:
        """The nodes from the root down to `node`, root included; None if `node` is not
        in this tree (evicted, or from before a reset)."""
        path: list[RadixNode] = []
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            path.append(n)
            n = n.parent
        if n is None:
            return None
        path.append(n)
        return path

    def _path_to_root(self, node: RadixNode) -> list[RadixNode]:
        """The nodes from `node` up to (not including) the root; fails for foreign nodes."""
        path: list[RadixNode] = []
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            path.append(n)
            n = n.parent
        if n is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted, or from before a reset)")
        return path
