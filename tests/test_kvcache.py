"""KVCache: vLLM 0.26.0's block pool as counts and hashes (vllm/v1/core/block_pool.py,
vllm/v1/core/kv_cache_utils.py FreeKVCacheBlockQueue, vllm/v1/core/kv_cache_manager.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.sim.kvcache import UNIQUE_SHIFT, KVCache


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


class ReferencePool:
    """The block pool kept the plain way: every cached copy under a key of its own (the
    first copy of a hash under the hash itself), the free queue a list, LRU first."""

    def __init__(self, num_blocks: int) -> None:
        self.unhashed = num_blocks
        self.lru: list[int] = []
        self.ref: dict[int, int] = {}
        self.copies: dict[int, list[int]] = {}  # hash -> keys of its cached copies, oldest first
        self.hash_of: dict[int, int] = {}
        self.next_key = 1 << 62

    @property
    def num_free(self) -> int:
        return self.unhashed + len(self.lru)

    def longest_hit(self, hashes: list[int]) -> tuple[int, int]:
        n = evictable = 0
        for h in hashes:
            if not self.copies.get(h):
                break
            n += 1
            evictable += self.copies[h][0] in self.lru
        return n, evictable

    def hit_keys(self, hashes: list[int]) -> list[int]:
        return [self.copies[h][0] for h in hashes]

    def touch(self, keys: list[int]) -> None:
        for k in keys:
            if k in self.lru:
                self.lru.remove(k)
            self.ref[k] = self.ref.get(k, 0) + 1

    def allocate(self, n: int) -> None:
        take = min(n, self.unhashed)
        self.unhashed -= take
        for _ in range(n - take):
            k = self.lru.pop(0)
            self.copies[self.hash_of.pop(k)].remove(k)

    def cache(self, h: int) -> int:
        key = h
        if self.copies.get(h):
            key, self.next_key = self.next_key, self.next_key + 1
        self.copies.setdefault(h, []).append(key)
        self.hash_of[key] = h
        self.ref[key] = 1
        return key

    def free(self, keys: list[int], unhashed: int) -> None:
        self.unhashed += unhashed
        for k in reversed(keys):
            self.ref[k] -= 1
            if not self.ref[k]:
                del self.ref[k]
                self.lru.append(k)


REQUEST = st.tuples(
    st.integers(0, 1),  # prefix group
    st.integers(0, 4),  # shared-prefix blocks
    st.integers(0, 5),  # own full blocks
    st.integers(0, 1),  # blocks without a hash (the partial tail, lookahead)
)


@settings(max_examples=200, deadline=None)
@given(
    num_blocks=st.integers(4, 16),
    requests=st.lists(REQUEST, min_size=2, max_size=10),
    actions=st.lists(st.tuples(st.sampled_from("aacfp"), st.integers(0, 9)), min_size=30),
)
def test_runs_hit_and_evict_like_one_key_per_block(
    num_blocks: int, requests: list[tuple[int, int, int, int]], actions: list[tuple[str, int]]
) -> None:
    """A request's own blocks freed as one run (free(own=...)) are hit, touched and evicted
    exactly as if each block were cached under its own hash, as vLLM's pool keeps them.
    Random admissions (a: its chain looked up as core.py does, hits touched, all blocks
    allocated), caching of the blocks it computed (c: later, so two requests can compute the
    same prefix block), finishes (f) and preemptions (p), checked against ReferencePool."""
    _against_reference(num_blocks, requests, actions, chains=False)


SHARING = st.tuples(
    st.integers(0, 1),  # prefix group
    st.integers(1, 6),  # shared-prefix blocks
    st.integers(0, 3),  # own full blocks
    st.integers(0, 1),  # blocks without a hash
)


@settings(max_examples=400, deadline=None)
@given(
    num_blocks=st.integers(6, 24),
    requests=st.lists(SHARING, min_size=3, max_size=10),
    actions=st.lists(st.tuples(st.sampled_from("aaaccfp"), st.integers(0, 9)), min_size=40),
)
def test_prefix_chains_hit_and_evict_like_one_reference_per_block(
    num_blocks: int, requests: list[tuple[int, int, int, int]], actions: list[tuple[str, int]]
) -> None:
    """The same, with every admission whose hit on its prefix is all in use holding it as a
    chain (hold_chain, free(chain=, base=)), as core.py does: hits, evictions and the free
    count are those of one reference per block, also with duplicate copies, chains of
    different lengths on one prefix and requests holding its blocks one by one beside them."""
    _against_reference(num_blocks, requests, actions, chains=True)


def _against_reference(
    num_blocks: int, requests: list[tuple[int, int, int, int]], actions: list[tuple[str, int]],
    *, chains: bool,
) -> None:
    kv, ref = KVCache(num_blocks, 16, enable_prefix_caching=True), ReferencePool(num_blocks)
    chained: dict[int, int] = {}  # running request -> prefix blocks it holds as a chain
    keys: dict[int, list[int]] = {}  # running request -> cached keys held, in block order
    ref_keys: dict[int, list[int]] = {}
    computed: dict[int, list[int]] = {}  # running request -> hashes it computed, not cached yet
    untracked: dict[int, range] = {}  # running request -> own blocks held outside the cache
    preempted: set[int] = set()
    finished: set[int] = set()

    def chain(rid: int) -> tuple[list[int], list[int]]:
        group, shared, own, _ = requests[rid]
        base = (rid + 1) << UNIQUE_SHIFT
        return [-(group * 100) - 1 - i for i in range(shared)], [base | i for i in range(own)]

    for action, i in actions:
        rid = i % len(requests)
        prefix, own = chain(rid)
        tail = requests[rid][3]
        if action == "a" and rid not in keys and rid not in finished:
            lookup = prefix + own if rid in preempted else prefix
            if not tail:
                lookup = lookup[: len(prefix) + len(own) - 1]  # never the last token's block
            hit, evictable, in_use = kv.hit(lookup)
            assert (hit, evictable) == ref.longest_hit(lookup)
            assert (hit, evictable) == kv.longest_hit(lookup)
            need = len(prefix) + len(own) + tail - hit
            if need + evictable > kv.num_free:
                continue
            keys[rid] = kv.hit_keys(lookup[:hit])
            ref_keys[rid] = ref.hit_keys(lookup[:hit])
            # core.py: a request never preempted whose hit (on its prefix) is all in use
            if chains and rid not in preempted and hit and in_use >= hit and hit <= len(prefix):
                assert keys[rid] == prefix[:hit]
                if kv.chains and kv.cover(prefix[0]) >= hit:
                    assert in_use == hit
                kv.hold_chain(prefix[0], hit)
                chained[rid] = hit
            else:
                kv.touch(keys[rid])
            ref.touch(ref_keys[rid])
            kv.allocate(need)
            ref.allocate(need)
            computed[rid] = (prefix + own)[hit:]
            untracked[rid] = range(0)
        elif action == "c" and computed.get(rid):
            ref_keys[rid] += [ref.cache(h) for h in computed[rid]]
            if rid in preempted:
                keys[rid] += [kv.cache(h) for h in computed[rid]]
            else:  # core.py _cache_blocks: own blocks of a request never preempted stay out
                keys[rid] += [kv.cache(h) for h in computed[rid] if h in prefix]
                mine = [h for h in computed[rid] if h not in prefix]
                untracked[rid] = range(mine[0], mine[-1] + 1) if mine else range(0)
            computed[rid] = []
        elif action in "fp" and rid in keys:
            held = len(prefix) + len(own) + tail
            own_blocks = untracked.pop(rid)
            kv.free(keys[rid], held - len(keys[rid]) - len(own_blocks), len(prefix), own_blocks,
                    chained.pop(rid, 0), prefix[0] if prefix else 0)
            ref.free(ref_keys[rid], held - len(ref_keys[rid]))
            del keys[rid], ref_keys[rid], computed[rid]
            (preempted if action == "p" else finished).add(rid)
        assert kv.num_free == ref.num_free
        for r in range(len(requests)):
            prefix, own = chain(r)
            if r in untracked:
                own = []  # held outside the cache while it runs: no lookup can reach them
            assert kv.longest_hit(prefix + own) == ref.longest_hit(prefix + own)
