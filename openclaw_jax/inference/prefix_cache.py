"""Prefix cache of the embedded engine: K/V of prompt prefixes reused across requests.

A radix tree over fixed-size token *blocks* (like SGLang's radix cache, but block-granular): a
node is one block of `block` prompt tokens, its key the block's token ids, its parent the block
before it, so a path from the root is a cached prompt prefix and sessions that share a system
prompt share its nodes. Matching walks the tree one block at a time (a dict lookup per block).

K/V live in one device *pool* `[num_layers, slots, block, kv_heads, head_dim]` (k and v); a node
owns one slot. The pool grows by doubling up to the byte budget (`EngineConfig.prefix_cache_bytes`;
each size compiles the small gather/store steps once) and, when full, least recently used leaves
are evicted (a leaf's ancestors are at least as recent, so evicting in LRU order never orphans a
node). Entries belong to one weight generation: `sync(generation)` drops everything when the
engine's weights changed, so a cached prefix is always the K/V the current weights compute. Before
a weight swap the engine recomputes the most recently used prefixes (`hot_paths`) under the new
weights into a fresh cache that replaces this one at the swap (`weight_swap.py`).

Only whole blocks are stored: of each prompt after its prefill, and of prompt + answer when a
sequence finishes (see prefill.py); a hit equals a cold prefill within float rounding.
This module is host bookkeeping plus the calls of the jitted pool steps in `kernels.py`; the
engine thread is its only user (no locking).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.inference.kernels import gather_prefix_jit, grow_pool_jit, store_blocks_jit, zeros_cache_jit
from openclaw_jax.inference.scheduler import bucket

logger = logging.getLogger(__name__)

MIN_POOL_SLOTS = 64  # first allocation (blocks); the pool doubles from there


@dataclass(eq=False)
class Node:
    """One cached block: `slot` in the pool, reached from `parent` by the block's token ids."""

    key: tuple[int, ...] | None
    parent: "Node | None"
    slot: int
    depth: int
    last_used: int = 0
    children: dict[tuple[int, ...], "Node"] = field(default_factory=dict)


@dataclass
class PrefixCacheStats:
    hits: int = 0          # requests that reused at least one block
    cached_tokens: int = 0  # prompt tokens served from the cache (sum over requests)
    stored_blocks: int = 0
    evicted_blocks: int = 0
    invalidations: int = 0
    refreshes: int = 0         # weight swaps whose hot prefixes were recomputed under the new weights
    refreshed_tokens: int = 0  # tokens recomputed by those refreshes (sum)


class PrefixCache:
    """Block radix tree + device pool; see the module docstring."""

    def __init__(self, *, block: int, budget_bytes: int, kv_bytes_per_token: int,
                 slot_shape: tuple[int, int, int], dtype: Any):
        self.block = int(block)
        self.max_slots = int(budget_bytes) // (self.block * int(kv_bytes_per_token))
        self._slot_shape = tuple(int(x) for x in slot_shape)  # (num_layers, kv_heads, head_dim)
        self._dtype = jnp.dtype(dtype)
        self.pool = None  # KVCache [layers, slots, block, K, D], allocated on the first store
        self.generation: int | None = None
        self.stats = PrefixCacheStats()
        self._tick = 0
        self._reset_index()

    @property
    def enabled(self) -> bool:
        return self.max_slots > 0

    @property
    def capacity(self) -> int:
        return 0 if self.pool is None else int(self.pool.k.shape[1])

    @property
    def used_blocks(self) -> int:
        return self.capacity - len(self._free)

    def _reset_index(self) -> None:
        self.root = Node(key=None, parent=None, slot=-1, depth=0)
        self._nodes: list[Node] = []
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))

    def clear(self) -> None:
        """Forget every entry (the pool stays allocated for reuse)."""
        self._reset_index()

    def sync(self, generation: int) -> None:
        """Entries computed by other weights are dropped (called before each use)."""
        if self.generation != generation:
            if self.generation is not None and self._nodes:
                self.stats.invalidations += 1
                logger.info("prefix cache: weights changed, dropped %d cached blocks", len(self._nodes))
            self.clear()
            self.generation = generation

    # ------------------------------------------------------------------ lookup
    def match(self, ids: Sequence[int], max_tokens: int) -> list[Node]:
        """Path of cached blocks of the longest block prefix of `ids` within `max_tokens` (touched)."""
        path: list[Node] = []
        if not self.enabled:
            return path
        node = self.root
        self._tick += 1
        for i in range(max(max_tokens, 0) // self.block):
            child = node.children.get(tuple(ids[i * self.block:(i + 1) * self.block]))
            if child is None:
                break
            child.last_used = self._tick
            path.append(child)
            node = child
        return path

    def gather(self, tables: np.ndarray, new_len: int):
        """KVCache `[layers, b, nb * block + new_len, K, D]`: the blocks of `tables [b, nb]` then zeros."""
        return gather_prefix_jit(self.pool, tables, int(new_len))

    # ------------------------------------------------------------------ insertion
    def insert(self, ids: Sequence[int], path: list[Node], n_blocks: int, protect: set) -> tuple[list[Node], list[tuple[int, int]]]:
        """Extend `path` (cached blocks of `ids`) to `n_blocks` blocks.

        Returns (the longer path, [(block index, slot)] of the blocks the caller must write into
        the pool). Blocks another request inserted meanwhile are reused, not rewritten; stops early
        when no slot can be freed (every candidate is protected: in use by this admission round).
        """
        node = path[-1] if path else self.root
        path = list(path)
        writes: list[tuple[int, int]] = []
        self._tick += 1
        for i in range(len(path), n_blocks):
            key = tuple(ids[i * self.block:(i + 1) * self.block])
            child = node.children.get(key)
            if child is None:
                slot = self._alloc(protect | set(path), needed=n_blocks - i)
                if slot is None:
                    break
                child = Node(key=key, parent=node, slot=slot, depth=node.depth + 1)
                node.children[key] = child
                self._nodes.append(child)
                writes.append((i, slot))
            child.last_used = self._tick
            path.append(child)
            node = child
        self.stats.stored_blocks += len(writes)
        return path, writes

    def write(self, cache, rows: Sequence[int], src_blocks: Sequence[int], slots: Sequence[int]) -> None:
        """Copy blocks `src_blocks[j]` of row `rows[j]` of a prefill or running cache into pool `slots[j]`."""
        if not slots:
            return
        n = bucket(len(slots), 8)
        pad = n - len(slots)
        rows_a = np.asarray(list(rows) + [0] * pad, np.int32)
        src_a = np.asarray(list(src_blocks) + [0] * pad, np.int32)
        dst_a = np.asarray(list(slots) + [self.capacity] * pad, np.int32)  # past the end: dropped
        devices = jax.tree.leaves(cache)[0].devices()
        if not self.pool.k.committed and len(devices) == 1:
            # a fresh pool is uncommitted, the store's output committed like its cache input: place
            # it like the cache once, so the store compiles one variant, not two
            self.pool = jax.device_put(self.pool, next(iter(devices)))
        self.pool = store_blocks_jit(self.pool, cache, rows_a, src_a, dst_a)

    def _alloc(self, protect: set, needed: int) -> int | None:
        if not self._free:
            self._grow(needed)
        if not self._free:
            self._evict(protect, max(needed, 1))
        return self._free.pop() if self._free else None

    def _grow(self, needed: int) -> None:
        cap = self.capacity
        if cap >= self.max_slots:
            return
        new_cap = min(self.max_slots, max(bucket(cap + needed), 2 * cap, MIN_POOL_SLOTS))
        if self.pool is None:
            layers, heads, dim = self._slot_shape
            self.pool = zeros_cache_jit((layers, new_cap, self.block, heads, dim), self._dtype.name)
        else:
            self.pool = grow_pool_jit(self.pool, new_cap)
        self._free = list(range(new_cap - 1, cap - 1, -1)) + self._free
        logger.debug("prefix cache pool: %d -> %d blocks of %d tokens", cap, new_cap, self.block)

    def _evict(self, protect: set, count: int) -> None:
        """Free up to `count` slots: least recently used leaves first (deepest first on ties)."""
        evicted: set[int] = set()
        for node in sorted(self._nodes, key=lambda n: (n.last_used, -n.depth)):
            if len(evicted) >= count:
                break
            if node.children or node in protect:
                continue
            del node.parent.children[node.key]
            self._free.append(node.slot)
            evicted.add(id(node))
        if evicted:
            self._nodes = [n for n in self._nodes if id(n) not in evicted]
            self.stats.evicted_blocks += len(evicted)

    def hot_paths(self, max_tokens: int, max_entries: int) -> list[list[int]]:
        """Token ids of the most recently used cached prefixes: the paths to the `max_entries` most
        recently used leaves (a session's system prompt and turns so far), newest first, each cut so
        that the blocks they hold together (a shared system prompt counts once) stay within
        `max_tokens`. No LRU touch."""
        room = max(int(max_tokens), 0) // self.block
        leaves = sorted((n for n in self._nodes if not n.children), key=lambda n: (-n.last_used, -n.depth))
        chosen: set[int] = set()
        out: list[list[int]] = []
        for leaf in leaves[:max(int(max_entries), 0)]:
            path = []
            node = leaf
            while node is not None and node.key is not None:
                path.append(node)
                node = node.parent
            path.reverse()
            shared = sum(1 for n in path if id(n) in chosen)  # always a prefix of the path (a tree)
            keep = min(len(path), shared + room - len(chosen))
            if keep <= shared:
                continue
            chosen.update(id(n) for n in path[:keep])
            out.append([t for n in path[:keep] for t in n.key])
            if len(chosen) >= room:
                break
        return out

    def contains(self, ids: Sequence[int]) -> int:
        """Tokens of `ids` cached as whole blocks (no LRU touch; for tests and stats)."""
        node, n = self.root, 0
        for i in range(len(ids) // self.block):
            node = node.children.get(tuple(ids[i * self.block:(i + 1) * self.block]))
            if node is None:
                break
            n += self.block
        return n
