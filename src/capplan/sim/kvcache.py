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

The free queue is always [blocks without hash..., blocks with hash in LRU order]: the
first part is kept as a count, the second as an OrderedDict.
"""

from __future__ import annotations

from collections import OrderedDict


class KVCache:
    """Block accounting for one replica."""

    __slots__ = ("block_size", "caching", "free_hashed", "free_unhashed", "num_blocks", "ref")

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
        ref, free = self.ref, self.free_hashed
        for h in hashes:
            if h in ref:
                n += 1
            elif h in free:
                n += 1
                evictable += 1
            else:
                break
        return n, evictable

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
            for _ in range(n):
                pop(last=False)

    def register(self, h: int) -> bool:
        """Cache a block that just became full. False if another request cached the same
        content first: the block then stays private (vLLM keeps such duplicates too)."""
        if h in self.ref or h in self.free_hashed:
            return False
        self.ref[h] = 1
        return True

    def free(self, hashes: list[int], private_blocks: int) -> None:
        """Release a request's blocks: `hashes` (in block order) and its private blocks."""
        self.free_unhashed += private_blocks
        ref, free = self.ref, self.free_hashed
        for h in reversed(hashes):
            r = ref[h] - 1
            if r:
                ref[h] = r
            else:
                del ref[h]
                free[h] = None
