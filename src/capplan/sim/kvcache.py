"""vLLM's KV block pool with prefix caching, kept as block counts and block hashes.

Rules followed (vLLM 0.26.0):
- vllm/v1/core/block_pool.py: one block is the null block, so a pool of `num_gpu_blocks`
  gives `num_gpu_blocks - 1` to requests; freed blocks without a hash go to the front of
  the free queue (reused first), freed blocks with a hash to its back (LRU eviction);
  taking a free block that still holds a hash evicts that hash from the cache; a cache
  hit on a free block takes it out of the free queue (`touch`).
- vllm/v1/core/kv_cache_manager.py: a request frees its blocks in reverse order, so a
  prompt's tail is evicted before its head; only full blocks are cached, and only tokens
  that are final (not unverified draft tokens).
- vllm/v1/core/kv_cache_utils.py: block hashes chain over all earlier blocks, so block i of
  two prompts has the same hash only if tokens [0, (i+1)*block_size) are the same. Here a
  hash is an int: shared-prefix blocks share it, every other block is unique to its request.
- vllm/v1/core/block_pool.py BlockHashToBlockMap: cached blocks are not de-duplicated; a
  block filled with content already cached is cached too, under the same hash, and a lookup
  returns the oldest copy. Here a duplicate copy gets a key of its own (`dup_hash` maps it
  back), so it is freed to the LRU tail and evicted like any cached block.

The free queue is always [blocks without hash..., blocks with hash in LRU order]: the
first part is kept as a count, the second as an OrderedDict.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import repeat


class KVCache:
    """Block accounting for one replica."""

    __slots__ = (
        "_next_dup",
        "block_size",
        "caching",
        "dup_hash",
        "dups",
        "free_hashed",
        "free_unhashed",
        "num_blocks",
        "ref",
    )

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"KV cache must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_prefix_caching
        self.free_unhashed = num_blocks
        # evictable cached blocks, LRU first (OrderedDict: O(1) pops from the front)
        self.free_hashed: OrderedDict[int, None] = OrderedDict()
        self.ref: dict[int, int] = {}  # cached blocks in use -> number of requests holding them
        self.dups: dict[int, list[int]] = {}  # hash -> keys of its duplicate copies, oldest first
        self.dup_hash: dict[int, int] = {}  # duplicate copy's key -> its hash
        self._next_dup = 1 << 62  # above every request-unique hash

    @property
    def num_free(self) -> int:
        return self.free_unhashed + len(self.free_hashed)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def longest_hit(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` present in the cache, and how many of those are free
        (a hit on a free block costs a free block: vllm/v1/core/single_type_kv_cache_manager.py
        get_num_blocks_to_allocate counts evictable hits)."""
        if not self.caching:
            return 0, 0
        n = evictable = 0
        ref, free, dups = self.ref, self.free_hashed, self.dups
        for h in hashes:
            if h in ref:
                n += 1
            elif h in free:
                n += 1
                evictable += 1
            elif dups and h in dups:
                n += 1
                if dups[h][0] in free:
                    evictable += 1
            else:
                break
        return n, evictable

    def hit_keys(self, hashes: list[int]) -> list[int]:
        """The cached copy each hit hash resolves to (get_one_block: the oldest)."""
        ref, free, dups = self.ref, self.free_hashed, self.dups
        if not dups:
            return hashes
        return [h if h in ref or h in free else dups[h][0] for h in hashes]

    def touch(self, hashes: list[int]) -> None:
        """Take a reference on cached blocks hit by a newly admitted request."""
        ref, free = self.ref, self.free_hashed
        for h in hashes:
            if h in free:
                del free[h]
                ref[h] = 1
            else:
                ref[h] += 1

    def allocate(self, n: int) -> None:
        """Take `n` free blocks from the front of the free queue, evicting cached hashes."""
        take = min(n, self.free_unhashed)
        self.free_unhashed -= take
        n -= take
        if n:
            if n > len(self.free_hashed):
                raise RuntimeError("allocate called without enough free blocks")
            pop = self.free_hashed.popitem
            dup_hash = self.dup_hash
            if not dup_hash:  # no duplicate copies to untangle: evict in C, LRU first
                deque(map(pop, repeat(False, n)), maxlen=0)
                return
            for _ in range(n):
                key, _none = pop(last=False)
                if dup_hash and key in dup_hash:  # evicting a duplicate copy
                    h = dup_hash.pop(key)
                    copies = self.dups[h]
                    copies.remove(key)
                    if not copies:
                        del self.dups[h]

    def cache(self, h: int) -> int:
        """Cache a block that just became full; returns the key its copy is held under:
        `h` itself, or a duplicate's own key when content `h` is cached already."""
        if h in self.ref or h in self.free_hashed or h in self.dups:
            key = self._next_dup
            self._next_dup += 1
            self.dups.setdefault(h, []).append(key)
            self.dup_hash[key] = h
            self.ref[key] = 1
            return key
        self.ref[h] = 1
        return h

    def register(self, h: int) -> bool:
        """Cache a full block; False if it became a duplicate of a cached one."""
        return self.cache(h) == h

    def free(self, hashes: list[int], private_blocks: int, shared: int | None = None) -> None:
        """Release a request's blocks: `hashes` (in block order) and its private blocks.
        Only the first `shared` entries can be held by other requests too (None: any); the
        rest are the request's own, each freed straight to the LRU tail."""
        self.free_unhashed += private_blocks
        ref, free = self.ref, self.free_hashed
        if shared is None:
            shared = len(hashes)
        if shared < len(hashes):
            own = hashes[shared:]
            own.reverse()
            deque(map(ref.pop, own), maxlen=0)
            free.update(dict.fromkeys(own))
        for h in reversed(hashes[:shared]):
            r = ref[h] - 1
            if r:
                ref[h] = r
            else:
                del ref[h]
                free[h] = None
