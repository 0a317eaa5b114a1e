"""KVCache: vLLM 0.26.0's block pool as counts and hashes (vllm/v1/core/block_pool.py,
vllm/v1/core/kv_cache_utils.py FreeKVCacheBlockQueue, vllm/v1/core/kv_cache_manager.py)."""

from __future__ import annotations

import pytest

from capplan.sim.kvcache import KVCache


def cache(num_blocks: int = 8, *, caching: bool = True) -> KVCache:
    return KVCache(num_blocks, 16, enable_prefix_caching=caching)


def hold(kv: KVCache, hashes: list[int], private: int = 0) -> None:
    """What a request does when its blocks fill: allocate, then register each full block."""
    kv.allocate(len(hashes) + private)
    for h in hashes:
        assert kv.register(h)


def test_rejects_empty_pool() -> None:
    """A pool needs at least one usable block; the bad value is named."""
    with pytest.raises(ValueError, match="0"):
        KVCache(0, 16, enable_prefix_caching=True)


def test_allocate_and_free_balance() -> None:
    """Blocks taken by allocate come back with free: used + free == capacity at all times."""
    kv = cache(8)
    kv.allocate(5)
    assert (kv.num_used, kv.num_free) == (5, 3)
    kv.free([], 5)
    assert (kv.num_used, kv.num_free) == (0, 8)


def test_allocate_beyond_free_raises() -> None:
    """Taking more blocks than are free is a bug in the caller, never a silent overdraft."""
    kv = cache(4)
    kv.allocate(3)
    with pytest.raises(RuntimeError):
        kv.allocate(2)


def test_freed_cached_blocks_stay_hittable_and_count_as_free() -> None:
    """block_pool.py free_blocks: a freed block keeps its hash (hittable) yet is free
    (evictable), so cache contents never reduce the capacity the scheduler sees."""
    kv = cache(8)
    hold(kv, [1, 2, 3])
    assert kv.longest_hit([1, 2, 3]) == (3, 0)  # held: hits, none evictable
    kv.free([1, 2, 3], 0)
    assert kv.num_free == 8
    assert kv.longest_hit([1, 2, 3]) == (3, 3)  # free: hits, all evictable


def test_longest_hit_is_a_leading_run() -> None:
    """Chained hashes (kv_cache_utils.py hash_block_tokens): a miss ends the hit, later
    blocks cannot hit without their predecessors (find_longest_cache_hit breaks)."""
    kv = cache(8)
    hold(kv, [1, 2, 4])
    assert kv.longest_hit([1, 2, 3, 4]) == (2, 0)
    assert kv.longest_hit([9, 1, 2]) == (0, 0)


def test_no_hits_when_caching_disabled() -> None:
    """enable_prefix_caching=False: get_computed_blocks returns nothing."""
    kv = cache(8, caching=False)
    kv.allocate(2)
    kv.free([], 2)
    assert kv.longest_hit([1, 2]) == (0, 0)


def test_unhashed_blocks_are_reused_before_cached_ones() -> None:
    """block_pool.py free_blocks: blocks without a hash go to the front of the free queue
    (prepend_n), so allocation consumes them before evicting any cached block."""
    kv = cache(4)
    hold(kv, [1, 2], private=2)
    kv.free([1, 2], 2)  # two cached + two private blocks back in the pool
    kv.allocate(2)
    assert kv.longest_hit([1, 2]) == (2, 2)  # both cached blocks survived
    kv.allocate(1)
    assert kv.longest_hit([1, 2]) == (1, 1)  # now one had to go


def test_tail_blocks_are_evicted_first() -> None:
    """kv_cache_manager.py free: a request frees its blocks in reverse order, so under
    LRU eviction a prompt's tail goes before its head (the head stays hittable longest)."""
    kv = cache(3)
    hold(kv, [1, 2, 3])
    kv.free([1, 2, 3], 0)
    kv.allocate(1)
    assert kv.longest_hit([1, 2, 3]) == (2, 2)  # block 3 (tail) evicted
    kv.allocate(1)
    assert kv.longest_hit([1, 2, 3]) == (1, 1)  # then block 2
    kv.allocate(1)
    assert kv.longest_hit([1, 2, 3]) == (0, 0)


def test_least_recently_freed_request_is_evicted_first() -> None:
    """FreeKVCacheBlockQueue is LRU: blocks freed earlier are evicted before blocks freed
    later (append_n puts newly freed cached blocks at the back)."""
    kv = cache(4)
    hold(kv, [1, 2])
    hold(kv, [11, 12])
    kv.free([1, 2], 0)  # older
    kv.free([11, 12], 0)  # newer
    kv.allocate(2)
    assert kv.longest_hit([1, 2]) == (0, 0)
    assert kv.longest_hit([11, 12]) == (2, 2)


def test_touch_takes_a_hit_block_out_of_the_free_queue() -> None:
    """block_pool.py touch: a cache hit on a free block (ref_cnt 0) removes it from the free
    queue, so it is no longer evictable and no longer counted free."""
    kv = cache(3)
    hold(kv, [1, 2])
    kv.free([1, 2], 0)
    kv.touch([1])
    assert kv.num_free == 2
    assert kv.longest_hit([1, 2]) == (2, 1)  # block 1 held again, block 2 still evictable
    kv.allocate(2)  # the unhashed block, then block 2: block 1 is safe
    assert kv.longest_hit([1, 2]) == (1, 0)


def test_shared_block_is_freed_only_by_its_last_holder() -> None:
    """ref_cnt: a block hit by two requests returns to the free queue only when both free it."""
    kv = cache(4)
    hold(kv, [1])
    kv.touch([1])  # a second request hits it
    kv.free([1], 0)
    assert kv.longest_hit([1]) == (1, 0)
    assert kv.num_used == 1
    kv.free([1], 0)
    assert kv.longest_hit([1]) == (1, 1)
    assert kv.num_used == 0


def test_touch_then_free_moves_block_to_lru_back() -> None:
    """A block that was hit and freed again is the most recently used: evicted last."""
    kv = cache(2)
    hold(kv, [1])
    hold(kv, [2])
    kv.free([1], 0)
    kv.free([2], 0)  # LRU order: 1, 2
    kv.touch([1])
    kv.free([1], 0)  # LRU order: 2, 1
    kv.allocate(1)
    assert kv.longest_hit([2]) == (0, 0)
    assert kv.longest_hit([1]) == (1, 1)


def test_duplicate_content_keeps_the_balance() -> None:
    """Two blocks with the same content (computed concurrently by two requests) are two
    physical blocks: however the duplicate is tracked, freeing both returns both and the
    content stays hittable. (Where vLLM puts the duplicate in the free queue is guarded in
    test_scheduler.py: test_duplicate_prefix_block_stays_cached_in_lru_order.)"""
    kv = cache(4)
    hold(kv, [1])
    kv.allocate(1)
    dup_cached = kv.register(1)
    assert kv.num_used == 2
    kv.free([1], 0)
    kv.free([1], 0) if dup_cached else kv.free([], 1)
    assert (kv.num_used, kv.num_free) == (0, 4)
    assert kv.longest_hit([1])[0] == 1
