"""A hybrid model's sliding-window KV-cache groups, for sim/core.py's EngineCore.

A model with sliding-window layers (`CoreConfig.sw_groups`, from kvlayout.py) keeps one
full-attention KV-cache group, whose blocks (`block_size` tokens, 32 for Gemma 4) cover every
token, and `sw_groups` sliding-window groups (`sw_block_size` tokens) holding only the
blocks of the window, all from one pool (vllm/v1/core/kv_cache_coordinator.py:
HybridKVCacheCoordinator; vllm/v1/core/single_type_kv_cache_manager.py: SlidingWindowManager).
A request keeps the same counters for every sliding group (they are allocated, freed and
cached together): `sw_hi` block-table entries, the first `sw_lo` of them freed (null) once
out of the window, freed on the processed-token basis (`inflight`: num_in_flight_tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capplan.sim.kvcache import UNIQUE_SHIFT, KVCache
from capplan.sim.request import FINISHED, NEVER, SimRequest

if TYPE_CHECKING:
    from capplan.sim.core import CoreConfig

SW_SHIFT = 52  # group bits of a sliding-window block's hash (above the request-unique ones)


class SlidingWindowGroups:
    """The engine core's sliding-window groups: a part of EngineCore, kept apart (it shares
    the core's state, declared here)."""

    cfg: CoreConfig
    kv: KVCache
    sw: int  # sliding-window groups (0: one full-attention group)
    _sw_k: int  # sliding blocks per full-attention block

    def _sw_hashes(self, r: SimRequest, lo: int, hi: int, g: int) -> list[int]:
        """Hashes of sliding blocks [lo, hi) of group g: a shared prefix's blocks as the
        prefix's (negative), the rest unique to r; each group apart (the pool caches
        (hash, group) pairs, block_pool.py get_cached_block)."""
        tag = (g + 1) << SW_SHIFT
        pre = r.prefix_blocks * self._sw_k
        pre = hi if hi < pre else pre
        base = r.prefix_base - tag
        out = list(range(base - lo, base - pre, -1)) if lo < pre else []
        if hi > pre:
            unique = (r.rid << UNIQUE_SHIFT) + tag
            out += range(unique + (lo if lo > pre else pre), unique + hi)
        return out

    def _cache_sw(self, r: SimRequest, start: int, full: int) -> None:
        """Cache the sliding blocks that full-attention blocks [start, full) cover
        (HybridKVCacheCoordinator.cache_blocks: every group up to the same multiple of the
        scheduler block size). As for the full-attention group, only blocks a lookup can
        reach get their hash now: a shared prefix's, and every block of a request that was
        preempted (its own content may still be cached from before); `sw_keys` holds them."""
        k = self._sw_k
        lo = max(start * k, r.sw_lo, r.pinned_blocks * k)
        hi = full * k
        if not r.preemptions and hi > r.prefix_blocks * k:
            hi = r.prefix_blocks * k
        if lo >= hi:
            return
        keys = r.sw_keys
        assert keys is not None
        cache = self.kv.cache
        for g in range(self.sw):
            keys[g] += map(cache, self._sw_hashes(r, lo, hi, g))

    def _sw_release(self, r: SimRequest, a: int, b: int) -> None:
        """Free sliding blocks [a, b) of every group (a = max(sw_lo, pinned), b > a): in
        group order, each from its tail (_remove_blocks_in_range). Cached ones go to the LRU
        tail: those a lookup can reach with their hashes, those unique to a request never
        preempted anonymously (kvcache.py free_anon: only this request could ask for its own
        content, after a preemption, and such a hit needs the window's last blocks, not these;
        docs/simulator.md); the rest to the free queue's front."""
        kv = self.kv
        n = b - a
        if not kv.caching:
            kv.free_unhashed += self.sw * n
            return
        k = self._sw_k
        keys = r.sw_keys
        assert keys is not None
        m = min(n, len(keys[0]))
        reg = r.n_reg * k
        anon = min(b, reg) - (a + m)
        if anon < 0:
            anon = 0
        private = n - m - anon
        shared = min(r.prefix_blocks * k, a + m) - a
        if shared < 0:
            shared = 0
        for g in range(self.sw):
            kv.free_anon(anon)
            kv.free(keys[g][:m], private, shared)
            del keys[g][:m]

    def _sw_skip(self, r: SimRequest, processed: int) -> None:
        """remove_skipped_blocks: free the sliding blocks every token of which precedes the
        window of the next token (get_num_skipped_tokens: processed - window + 1)."""
        cfg = self.cfg
        sbs = cfg.sw_block_size
        lo = (processed - cfg.sw_window + 1) // sbs
        if lo > r.sw_hi:
            lo = r.sw_hi
        if lo > r.sw_lo:
            pin = r.pinned_blocks * self._sw_k
            a = r.sw_lo if r.sw_lo > pin else pin
            if lo > a:
                self._sw_release(r, a, lo)
            r.sw_lo = lo
        r.sw_free_at = (r.sw_lo + 1) * sbs + cfg.sw_window - 1

    def _free_sw(self, r: SimRequest) -> None:
        """Free every sliding group's blocks (before the full-attention group's: group order,
        sliding layers first in Gemma 4). A finished request's blocks unique to it can never
        be hit again (anonymous); a preempted one's are cached under their hashes for its
        return (vLLM cached them as they filled; here they get their hashes now)."""
        k = self._sw_k
        pin = r.pinned_blocks * k
        a = r.sw_lo if r.sw_lo > pin else pin
        b = r.sw_hi
        kv = self.kv
        if b > a:
            if not kv.caching:
                kv.free_unhashed += self.sw * (b - a)
            else:
                keys = r.sw_keys
                assert keys is not None
                m = len(keys[0])
                reg = r.n_reg * k
                mid = min(b, reg) - (a + m)  # cached, unique to r, without a hash yet
                if mid < 0:
                    mid = 0
                private = (b - a) - m - mid
                shared = min(r.prefix_blocks * k, a + m) - a
                if shared < 0:
                    shared = 0
                finished = r.status == FINISHED
                for g in range(self.sw):
                    held = keys[g]
                    if mid and not finished:
                        held = held + list(map(kv.cache, self._sw_hashes(r, a + m, a + m + mid,
                                                                         g)))
                    elif mid:
                        kv.free_anon(mid)
                    kv.free(held, private, shared)
        r.sw_hi = r.sw_lo = 0
        r.sw_keys = None
        r.sw_free_at = NEVER

    def _sw_hit(self, r: SimRequest, max_tokens: int) -> tuple[int, int]:
        """SlidingWindowManager.find_longest_cache_hit over the sliding groups (one spec,
        looked up together: a block is a hit only if every group has it cached), at most
        `max_tokens`: scanning right to left, the first run of cdiv(window - 1, block)
        contiguous cached blocks whose right edge is a multiple of the scheduler block size
        (the full-attention block); without one, the cached blocks contiguous from block 0.
        EAGLE/MTP: one block more, then dropped. Pinned blocks count as cached. Returns
        (hit tokens, first block of the hit that is not a null block)."""
        cfg = self.cfg
        sbs = cfg.sw_block_size
        align = cfg.block_size
        eagle = cfg.drop_eagle_block
        need = -(-(cfg.sw_window - 1) // sbs) + (1 if eagle else 0)
        pin = r.pinned_blocks * self._sw_k
        cached = self.kv.is_cached
        hashes = self._sw_hashes
        count = 0
        found = False
        i = max_tokens // sbs - 1
        while i >= 0:
            if i < pin or all(cached(h) for g in range(self.sw)
                              for h in hashes(r, i, i + 1, g)):
                if count == 0 and sbs != align and ((i if eagle else i + 1) * sbs) % align:
                    i -= 1
                    continue
                count += 1
                if count >= need:
                    found = True
                    break
            else:
                count = 0
            i -= 1
        if found:
            n, first = i + count, i
        else:
            n, first = count, 0
            while sbs != align and n * sbs % align:
                n -= 1
        if eagle and n:
            n -= 1
            while sbs != align and n * sbs % align:
                n -= 1
        return n * sbs, first

    def _sw_net_need(self, r: SimRequest, end: int, need: int) -> int | None:
        """Blocks an explicit request of a hybrid model takes this step, less the sliding
        blocks it frees first; None when the step must take the ordered walk: it would free
        blocks a lookup can reach, or ones not cached, whose place in the free queue depends
        on the order of the walk."""
        cfg = self.cfg
        sbs = cfg.sw_block_size
        if need < 0:
            need = 0
        sw_need = -(-end // sbs) - r.sw_hi
        if sw_need > 0:
            need += self.sw * sw_need
        computed = r.computed
        processed = (computed if computed < cfg.max_model_len else cfg.max_model_len) - r.inflight
        if processed >= r.sw_free_at:
            lo = (processed - cfg.sw_window + 1) // sbs
            if lo > r.sw_hi:
                lo = r.sw_hi
            k = self._sw_k
            pin = r.pinned_blocks * k
            a = r.sw_lo if r.sw_lo > pin else pin
            if lo > a:
                if self.kv.caching and (
                    (r.sw_keys is not None and r.sw_keys[0]) or lo > r.n_reg * k
                ):
                    return None
                need -= self.sw * (lo - a)
        return need

    def _sw_admission(
        self, r: SimRequest, hit_blocks: int, hit_hashes: list[int], evictable: int
    ) -> tuple[int, list[int], int, tuple[int, int, list[list[int]], int]]:
        """A hybrid model's prefix-cache hit (HybridKVCacheCoordinator.find_longest_cache_hit,
        one full-attention and one sliding-window spec: one pass, full attention first): the
        sliding groups' hit within the full-attention one, the full-attention hit cut to it.
        Returns the full-attention (hit blocks, their hashes, evictable ones) and the sliding
        groups' (hit tokens, first block held: skipped and null blocks before it, hashes to
        touch per group, evictable blocks of all groups)."""
        cfg = self.cfg
        kv = self.kv
        bs = cfg.block_size
        sbs = cfg.sw_block_size
        k = self._sw_k
        pinned = r.pinned_blocks
        hit = (pinned + hit_blocks) * bs
        first = 0
        if hit_blocks:
            limit = hit
            if cfg.drop_eagle_block:  # the EAGLE margin: one sliding block more, dropped
                limit = min(hit + sbs, r.num_tokens - 1)
            hit, first = self._sw_hit(r, limit)
            hit = max(hit, pinned * bs)
            cut = hit // bs - pinned
            if cut < hit_blocks:
                hit_blocks = cut
                del hit_hashes[cut:]
                evictable = sum(map(kv.is_free, hit_hashes))
        skipped = max(0, hit - cfg.sw_window + 1) // sbs
        lo = max(skipped, first)
        start = max(lo, pinned * k)
        end = hit // sbs
        keys: list[list[int]] = [[] for _ in range(self.sw)]
        sw_evictable = 0
        if end > start:
            for g in range(self.sw):
                keys[g] = kv.hit_keys(self._sw_hashes(r, start, end, g))
                sw_evictable += sum(map(kv.is_free, keys[g]))
        return hit_blocks, hit_hashes, evictable, (hit, lo, keys, sw_evictable)
