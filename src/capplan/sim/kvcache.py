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
  hash is an int: shared-prefix blocks share it (negative), every other block is unique to
  its request (block i of request rid: `(rid << UNIQUE_SHIFT) | i`).
- vllm/v1/core/block_pool.py BlockHashToBlockMap: cached blocks are not de-duplicated; a
  block filled with content already cached is cached too, under the same hash, and a lookup
  returns the oldest copy. Here a duplicate copy gets a key of its own (`dup_hash` maps it
  back), so it is freed to the LRU tail and evicted like any cached block.

The free queue is always [blocks without hash..., blocks with hash in LRU order]: the
first part is kept as a count, the second as an OrderedDict. A request's own blocks freed
together (`free(own=...)`) sit in it as one entry, a run, not one entry a block: freed tail
first, a run is evicted from its tail, and a hit on it (the request back after a
preemption) takes its head; its blocks are hits and evictions exactly as single ones.

Cached blocks no lookup will ask for sit in it as anonymous entries (`free_anon`): counted,
evicted in their turn, never hit. The sliding-window groups of a hybrid model (sim/core.py)
free their out-of-window blocks so (a request's own content: only it could come back for
it, and only after a preemption; see docs/simulator.md).

A request admitted with every block of its hit on a shared prefix already in use (blocks
[0, n) of one prefix's chain: a RAG workload's long system prompt, held by the requests
before it) may hold them as a *chain* (`hold_chain`): one count for the lot instead of one
reference per block. A chained block's reference count is its `ref` count (the requests
holding it block by block, possibly 0) plus the chains over it; a block stays in `ref` while
that sum is positive, so every lookup reads as before, and the blocks a release takes to zero
go to the LRU tail in the same order (`free(..., chain=, base=)`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from itertools import compress, filterfalse, islice, repeat, takewhile
from operator import not_

UNIQUE_SHIFT = 22  # block index bits of a request-unique hash (4M blocks = 64M tokens)
_minus_one = (-1).__add__


class _Run:
    """Free cached blocks with hashes [lo, hi) of one request, in the LRU as one entry: the
    block hashed hi - 1 is evicted first, lo last."""

    __slots__ = ("hi", "key", "lo")

    def __init__(self, key: int, lo: int, hi: int) -> None:
        self.key, self.lo, self.hi = key, lo, hi


class _Anon(_Run):
    """`hi - lo` free cached blocks no lookup can reach (not in `runs`)."""

    __slots__ = ()


class KVCache:
    """Block accounting for one replica."""

    __slots__ = (
        "_next_dup",
        "_next_run",
        "block_size",
        "caching",
        "chains",
        "dup_hash",
        "dups",
        "free_cached",
        "free_hashed",
        "free_unhashed",
        "num_blocks",
        "ref",
        "runs",
    )

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"KV cache must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_prefix_caching
        self.free_unhashed = num_blocks
        # evictable cached blocks, LRU first (OrderedDict: O(1) pops from the front): a key
        # with None is one block under that key, a key with a _Run stands for the run
        self.free_hashed: OrderedDict[int, _Run | None] = OrderedDict()
        self.free_cached = 0  # blocks in free_hashed, runs counted block by block
        self.runs: dict[int, _Run] = {}  # request id -> its run in free_hashed
        # cached blocks in use -> number of requests holding them (a Counter: a hit's
        # references are taken in one call)
        self.ref: Counter[int] = Counter()
        self.dups: dict[int, list[int]] = {}  # hash -> keys of its duplicate copies, oldest first
        self.dup_hash: dict[int, int] = {}  # duplicate copy's key -> its hash
        # prefix chain (its block 0's hash) -> lengths of the chains held on it (hold_chain)
        self.chains: dict[int, Counter[int]] = {}
        self._next_dup = 1 << 62  # above every request-unique hash
        self._next_run = 1 << 63  # runs' keys: above every duplicate's

    @property
    def num_free(self) -> int:
        return self.free_unhashed + self.free_cached

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.free_unhashed - self.free_cached

    def _run_of(self, h: int) -> _Run | None:
        """The run holding block `h` free, if any."""
        run = self.runs.get(h >> UNIQUE_SHIFT) if self.runs and h >= 0 else None
        return run if run is not None and run.lo <= h < run.hi else None

    def is_free(self, key: int) -> bool:
        """Is the cached copy `key` in the free queue (evictable)?"""
        return key in self.free_hashed or self._run_of(key) is not None

    def is_cached(self, h: int) -> bool:
        """Is content `h` cached (held or free, itself or a duplicate copy)?"""
        return (h in self.ref or h in self.free_hashed or self._run_of(h) is not None
                or (bool(self.dups) and h in self.dups))

    def free_anon(self, n: int) -> None:
        """Free `n` cached blocks no lookup will ask for to the LRU tail (merged with an
        anonymous entry already there: their order among themselves cannot matter)."""
        if n <= 0:
            return
        free = self.free_hashed
        self.free_cached += n
        if free:
            last = free[next(reversed(free))]
            if type(last) is _Anon:
                last.hi += n
                return
        key = self._next_run
        self._next_run += 1
        free[key] = _Anon(key, 0, n)

    def longest_hit(self, hashes: list[int]) -> tuple[int, int]:
        """Leading blocks of `hashes` present in the cache, and how many of those are free
        (a hit on a free block costs a free block: vllm/v1/core/single_type_kv_cache_manager.py
        get_num_blocks_to_allocate counts evictable hits)."""
        return self.hit(hashes)[:2]

    def hit(self, hashes: list[int]) -> tuple[int, int, int]:
        """`longest_hit`, and how many leading blocks of the hit are in use (held by running
        requests)."""
        if not self.caching:
            return 0, 0, 0
        ref = self.ref
        # the leading blocks in use by other requests (a shared prefix, usually all of the
        # hit), counted in C; the walk below goes on from the first that is not
        n = in_use = len(list(takewhile(ref.__contains__, hashes)))
        if n == len(hashes):
            return n, 0, in_use
        evictable = 0
        free, dups = self.free_hashed, self.dups
        for h in islice(hashes, n, None):
            if h in ref:
                n += 1
            elif h in free or self._run_of(h) is not None:
                n += 1
                evictable += 1
            elif dups and h in dups:
                n += 1
                if self.is_free(dups[h][0]):
                    evictable += 1
            else:
                break
        return n, evictable, in_use

    def hit_keys(self, hashes: list[int]) -> list[int]:
        """The cached copy each hit hash resolves to (get_one_block: the oldest)."""
        ref, dups = self.ref, self.dups
        if not dups:
            return hashes
        return [h if h in ref or self.is_free(h) else dups[h][0] for h in hashes]

    def touch(self, hashes: list[int]) -> None:
        """Take a reference on cached blocks hit by a newly admitted request."""
        ref, free = self.ref, self.free_hashed
        for h in list(filterfalse(ref.__contains__, hashes)):  # free ones: out of the free queue
            self.free_cached -= 1
            if h in free:
                del free[h]
                continue
            run = self._run_of(h)
            if run is None or h != run.lo:  # hits are a chain: they reach a run at its head
                raise RuntimeError(f"touch: block {h} is not free on its own or a run's head")
            run.lo += 1
            if run.lo == run.hi:
                self._drop_run(run)
        ref.update(hashes)

    def cover(self, base: int) -> int:
        """Leading blocks of the prefix chain `base` (its block 0's hash) held as chains."""
        held = self.chains.get(base)
        return max(held) if held else 0

    def hold_chain(self, base: int, n: int) -> None:
        """A request holds blocks [0, n) of the prefix chain `base` (hashes base, base - 1,
        ...), every one of them in use already: as one chain, not n references (`free` with
        chain=n lets go)."""
        held = self.chains.get(base)
        if held is None:
            held = self.chains[base] = Counter()
        held[n] += 1

    def _drop_run(self, run: _Run) -> None:
        del self.free_hashed[run.key]
        del self.runs[run.lo >> UNIQUE_SHIFT]

    def allocate(self, n: int) -> None:
        """Take `n` free blocks from the front of the free queue, evicting cached hashes."""
        unhashed = self.free_unhashed
        if n <= unhashed:  # the common case: blocks no cached hash lives in
            self.free_unhashed = unhashed - n
            return
        self.free_unhashed = 0
        n -= unhashed
        if n > self.free_cached:
            raise RuntimeError("allocate called without enough free blocks")
        self.free_cached -= n
        free, dup_hash = self.free_hashed, self.dup_hash
        pop = free.popitem
        while n:
            key, run = pop(last=False)
            if run is not None:
                size = run.hi - run.lo
                if size > n:  # evict the run's tail; the rest stays first in line
                    run.hi -= n
                    free[key] = run
                    free.move_to_end(key, last=False)
                    return
                n -= size
                if type(run) is not _Anon:
                    del self.runs[run.lo >> UNIQUE_SHIFT]
                continue
            n -= 1
            if dup_hash and key in dup_hash:  # evicting a duplicate copy
                h = dup_hash.pop(key)
                copies = self.dups[h]
                copies.remove(key)
                if not copies:
                    del self.dups[h]

    def cache(self, h: int) -> int:
        """Cache a block that just became full; returns the key its copy is held under:
        `h` itself, or a duplicate's own key when content `h` is cached already."""
        if h in self.ref or h in self.free_hashed or h in self.dups or self._run_of(h):
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

    def free(
        self,
        hashes: list[int],
        private_blocks: int,
        shared: int | None = None,
        own: range = range(0),
        chain: int = 0,
        base: int = 0,
    ) -> None:
        """Release a request's blocks, tail first: `private_blocks` without a hash to the
        front of the free queue, its cached blocks to the LRU tail. Those are `hashes` (in
        block order; only the first `shared` entries can be held by other requests too, None:
        any) and after them `own`: the hashes of full blocks unique to the request that were
        never entered in the cache (nobody else can hit them while it holds them), freed as
        one run. `base`: the request's prefix chain (entry k of `hashes` its block k), the
        first `chain` entries of which it holds as a chain (hold_chain)."""
        self.free_unhashed += private_blocks
        ref, free = self.ref, self.free_hashed
        if own:
            rid = own.start >> UNIQUE_SHIFT
            if rid in self.runs:
                raise RuntimeError(f"request {rid} frees a second run of its own blocks")
            run = self.runs[rid] = _Run(self._next_run, own.start, own.stop)
            self._next_run += 1
            free[run.key] = run
            self.free_cached += len(own)
        if shared is None:
            shared = len(hashes)
        if shared < len(hashes):
            mine = hashes[shared:]
            mine.reverse()
            deque(map(ref.pop, mine, repeat(None)), 0)  # del ref[h] each, in C
            free.update(dict.fromkeys(mine))
            self.free_cached += len(mine)
        if not shared:
            return
        # shared ones: one reference less each (a request holds a key once); those nobody
        # holds any more go to the LRU tail, tail first: the entries past a chain, then the
        # chain's blocks (whose count only the chains over them make up)
        if shared > chain:
            held = hashes[chain:shared]
            held.reverse()
            refs = list(map(ref.__getitem__, held))
            dict.update(ref, zip(held, map(_minus_one, refs), strict=True))  # (Counter adds)
            if 1 in refs:
                cover = self.cover(base) if base and self.chains else 0
                if cover > chain:
                    # block k < cover stays in use (count 0 in ref), held by other requests'
                    # chains, if this entry is the block itself (not a duplicate copy)
                    blocks = range(chain + len(held) - 1, chain - 1, -1)
                    last = [h for k, h, n in zip(blocks, held, refs, strict=True)
                            if n == 1 and not (k < cover and h == base - k)]
                else:
                    last = [h for h, n in zip(held, refs, strict=True) if n == 1]
                deque(map(ref.pop, last, repeat(None)), 0)  # del ref[h] each, in C
                free.update(dict.fromkeys(last))
                self.free_cached += len(last)
        if chain:
            self._let_go(hashes, chain, base)

    def _let_go(self, hashes: list[int], chain: int, base: int) -> None:
        """A chain over blocks [0, chain) of `base` lets go: the blocks no other chain covers
        and no request holds block by block (count 0) go to the LRU tail, tail first."""
        held = self.chains[base]
        held[chain] -= 1
        if not held[chain]:
            del held[chain]
        cover = max(held) if held else 0
        if not held:
            del self.chains[base]
        if cover >= chain:
            return
        ref = self.ref
        seg = hashes[cover:chain]
        seg.reverse()
        last = list(compress(seg, map(not_, map(ref.__getitem__, seg))))
        deque(map(ref.pop, last, repeat(None)), 0)  # del ref[h] each, in C
        self.free_hashed.update(dict.fromkeys(last))
        self.free_cached += len(last)
