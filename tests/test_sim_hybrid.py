"""A model with sliding-window layers (Gemma 4 31B): vLLM 0.26.0's KV-cache groups sharing one
block pool (capplan/kvlayout.py), derived from the model spec and held to what real engines
measured; the simulator's sliding-window block accounting, unit by unit and step by step
against a transcription of vLLM's HybridKVCacheCoordinator, FullAttentionManager and
SlidingWindowManager; and the one-group path left as it was."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capplan.calibrate.store import pool_blocks
from capplan.kvlayout import derive_layout, max_in_flight_tokens
from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profile import Profile
from capplan.sim.core import CoreConfig, EngineCore
from capplan.sim.request import RUNNING, SimRequest
from capplan.sim.run import setup_pool, simulate
from test_sim_properties import Arrival, RefVllm, _Req, draw_arrivals, drive, lockstep

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "calibration" / "_raw"
PROFILES = ROOT / "calibration" / "h200" / "vllm-0.26.0"
GEMMA = load_model_spec("gemma-4-31b")

# --- the layout, against measured engines ------------------------------------------------------


def test_gemma_layout_is_one_full_and_five_sliding_groups() -> None:
    """10 full-attention layers (4 KV heads x 512, K and V) and 50 sliding ones (16 x 256):
    a full layer's 16-token page is half a sliding one's, so full layers get 32-token
    blocks; groups of 10 layers: one full-attention group, five sliding-window groups; a
    pool block is 10 pages of 256 KiB (BF16 KV)."""
    layout = derive_layout(GEMMA)
    assert (layout.full_groups, layout.full_block_size) == (1, 32)
    assert (layout.sliding_groups, layout.sliding_block_size, layout.sliding_window) == (
        5, 16, 1024)
    assert (layout.layers_per_group, layout.page_bytes) == (10, 256 * 1024)
    assert layout.block_bytes == 2_621_440
    assert layout.scheduler_block_size == 32
    # 8192 batched tokens, async scheduling: 16384 tokens in flight
    assert layout.max_blocks_per_request(32768, 16384) == 1024 + 5 * 1089
    assert derive_layout(GEMMA, kv_dtype_bytes=1).block_bytes == 1_310_720


@pytest.mark.parametrize("blocks,tokens", [(37931, 192_135), (26696, 135_225)])
def test_layout_reproduces_vllms_kv_cache_size(blocks: int, tokens: int) -> None:
    """vLLM's "GPU KV cache size" for Gemma 4 31B FP8 (37,931 blocks) and BF16 (26,696) at
    max_model_len 32768: max_concurrency x max_model_len."""
    layout = derive_layout(GEMMA)
    assert layout.vllm_kv_tokens(blocks, 32768, max_in_flight_tokens(8192, True)) == tokens


@pytest.mark.parametrize("meta", sorted(RAW.glob("gemma-4-31b--*.meta.json")), ids=lambda p: p.name)
def test_layout_matches_every_measured_gemma_engine(meta: Path) -> None:
    """Every Gemma engine the runner measured: its KV-cache groups, bytes per block and
    logged "GPU KV cache size" follow from the layout and its num_gpu_blocks."""
    import json

    m = json.loads(meta.read_text())
    kv, eng = m["kv"], m["engine"]
    layout = derive_layout(GEMMA, block_size=kv["block_size"],
                           kv_dtype_bytes=1 if kv["cache_dtype"] == "fp8" else 2)
    assert layout.num_groups == kv["kv_cache_groups"]
    assert layout.block_bytes * kv["num_gpu_blocks"] == pytest.approx(kv["kv_tensor_bytes"],
                                                                      abs=1)
    in_flight = max_in_flight_tokens(eng["max_num_batched_tokens"], eng["async_scheduling"])
    assert layout.vllm_kv_tokens(kv["num_gpu_blocks"], eng["max_model_len"],
                                 in_flight) == kv["vllm_kv_tokens"]


def test_validation_engine_pool_is_predicted_in_blocks() -> None:
    """The Gemma FP8 validation engine (util 0.92, max_model_len 8192) had 39,069 blocks;
    the profile's measured pool line predicts it within 0.1 %, and the simulator takes that
    pool, not vLLM's max_model_len-dependent token figure."""
    import json

    folder = PROFILES / "gemma-4-31b" / "validation" / "gemma-4-31b-fp8"
    measured = json.loads((folder / "measured.json").read_text())["engine"]
    prof = Profile.load(PROFILES / "gemma-4-31b" / "fp8")
    assert prof.kv.pooled and prof.kv.layout == derive_layout(GEMMA)
    assert prof.kv.blocks(0.92) == pytest.approx(measured["num_gpu_blocks"], rel=1e-3)
    pool = Pool(name="v", model="gemma-4-31b", precision="fp8",
                engine={"gpu_memory_utilization": 0.92, "max_model_len": 8192,  # type: ignore[arg-type]
                        "limit_mm_per_prompt": {"image": 0}})
    st_ = setup_pool(pool)
    assert st_.layout == derive_layout(GEMMA)
    assert st_.num_blocks == prof.kv.blocks(0.92) - 1  # the null block
    assert st_.block_tokens == pytest.approx(measured["kv_tokens"], rel=1e-3)
    # vLLM's own figure for this engine: 39,069 / (256 + 5 x 513) x 8192
    assert st_.kv_tokens == pytest.approx(113_453, rel=1e-3)


def test_pool_blocks_of_the_raw_record() -> None:
    assert pool_blocks({"num_gpu_blocks": 39069, "kv_tokens": 625104, "block_size": 16}) == 39069
    assert pool_blocks({"kv_tokens": 625104, "block_size": 16}) == 39069


def test_profile_without_a_pool_still_loads_and_simulates() -> None:
    """A Gemma profile written before pools were recorded (vLLM's tokens only) is converted
    back to blocks through vLLM's formula at its engine's max_model_len."""
    prof = Profile.load(PROFILES / "gemma-4-31b" / "fp8")
    old = prof.model_copy(update={"kv": prof.kv.model_copy(update={
        "layout": None, "slope_blocks": None, "intercept_blocks": None})})
    assert not old.kv.pooled and "layout" not in old.to_json()["kv"]
    pool = Pool(name="v", model="gemma-4-31b", precision="fp8",
                engine={"gpu_memory_utilization": 0.9, "limit_mm_per_prompt": {"image": 0},  # type: ignore[arg-type]
                        "max_model_len": 8192})
    a, b = setup_pool(pool, profile=old), setup_pool(pool, profile=prof)
    assert a.layout == b.layout
    assert abs(a.num_blocks - b.num_blocks) <= 2  # 37,930 usable either way


# --- sliding-window block accounting ------------------------------------------------------------


def _gemma_core(num_blocks: int = 40_000, **kw: Any) -> EngineCore:
    args: dict[str, Any] = {"enable_prefix_caching": False, "async_scheduling": False, **kw}
    cfg = CoreConfig(num_blocks=num_blocks, block_size=32, max_num_seqs=256,
                     max_num_scheduled_tokens=8192, max_model_len=32768, sw_groups=5,
                     sw_block_size=16, sw_window=1024, max_in_flight_tokens=8192, **args)
    return EngineCore(cfg, random.Random(0), [0.0])


def _run_steps(core: EngineCore, steps: int) -> list[int]:
    used = []
    for _ in range(steps):
        plan = core.schedule()
        core.update_from_output(plan)
        used.append(core.kv.num_used)
    return used


def test_a_prompt_holds_every_block_then_only_its_window() -> None:
    """A 4096-token prompt in one chunk: 128 full-attention blocks and 256 blocks in each of
    the five sliding groups while it prefills; from its first decode step the sliding
    groups keep only the window (tokens from num_computed - 1023 on, in 16-token blocks:
    65 blocks) while the full-attention group keeps growing (SlidingWindowManager
    remove_skipped_blocks)."""
    core = _gemma_core()
    r = SimRequest(0, 0, 0.0, 4096, 200)
    core.add_request(r)
    plan = core.schedule()
    assert plan.tokens == [4096]
    assert (r.blocks, r.sw_hi, r.sw_lo) == (128, 256, 0)
    assert core.kv.num_used == 128 + 5 * 256
    core.update_from_output(plan)
    used = _run_steps(core, 1)  # first decode: 4096 processed, one more slot
    assert (r.computed, r.blocks, r.sw_hi) == (4097, 129, 257)
    assert r.sw_lo == (4096 - 1023) // 16 == 192
    assert used[-1] == 129 + 5 * (257 - 192)
    layout = derive_layout(GEMMA)
    for _ in range(100):  # decode: blocks leave the window as they enter it
        _run_steps(core, 1)
        held_sw = r.sw_hi - r.sw_lo
        assert held_sw == 65 - ((r.computed - 1) % 16 == 15)
        assert r.sw_lo == (r.computed - 1 - 1023) // 16
        assert core.kv.num_used == r.blocks + 5 * held_sw
        assert core.kv.num_used == layout.blocks_held(r.computed, r.computed - 1)


def test_admission_reserves_the_whole_prompt_in_every_group() -> None:
    """scheduler_reserve_full_isl: a waiting request is admitted only if its whole prompt
    fits in every group (the sliding groups' reservation capped at window - 1 + the tokens
    in flight, plus one block: max_admission_blocks_per_request), even though it will hold
    only its window once it decodes."""
    need = 128 + 5 * 256  # 4096-token prompt: 1408 blocks
    core = _gemma_core(num_blocks=need - 1)
    core.add_request(SimRequest(0, 0, 0.0, 4096, 10))
    assert core.schedule().empty
    core = _gemma_core(num_blocks=need)
    core.add_request(SimRequest(0, 0, 0.0, 4096, 10))
    assert core.schedule().tokens == [4096]
    # a 30000-token prompt: 938 full blocks, the sliding groups capped at cdiv(1023 + 8192,
    # 16) + 1 = 577 each for the admission check; its 8192-token chunk takes 512 each
    core = _gemma_core(num_blocks=938 + 5 * 577)
    core.add_request(SimRequest(0, 0, 0.0, 30000, 10))
    assert core.schedule().tokens == [8192]
    assert core.kv.num_used == 256 + 5 * 512
    core = _gemma_core(num_blocks=938 + 5 * 577 - 1)
    core.add_request(SimRequest(0, 0, 0.0, 30000, 10))
    assert core.schedule().empty


def test_chunked_prefill_frees_on_the_processed_basis() -> None:
    """Async scheduling: blocks leave the window only once the tokens that pushed them out
    are settled (num_computed - num_in_flight_tokens): a chunk in flight keeps them."""
    cfg = replace(_gemma_core().cfg, async_scheduling=True, max_num_scheduled_tokens=2048,
                  max_in_flight_tokens=4096)
    core = EngineCore(cfg, random.Random(0), [0.0])
    r = SimRequest(0, 0, 0.0, 8192, 10)
    core.add_request(r)
    first = core.schedule()  # chunk 1: [0, 2048)
    second = core.schedule()  # chunk 2 scheduled while chunk 1 is in flight
    assert r.inflight == 4096 and r.sw_lo == 0  # nothing settled yet
    core.update_from_output(first)
    third = core.schedule()  # chunk 1 settled: 2048 - 1023 tokens out of the window
    assert r.sw_lo == (2048 - 1023) // 16 == 64
    core.update_from_output(second)
    core.schedule()
    assert r.sw_lo == (4096 - 1023) // 16
    assert third.tokens == [2048]


def test_finished_request_returns_every_block() -> None:
    core = _gemma_core(enable_prefix_caching=True)
    r = SimRequest(0, 0, 0.0, 3000, 40)
    core.add_request(r)
    for _ in range(60):
        if not core.has_work:
            break
        core.update_from_output(core.schedule())
    assert r.out == 40 and core.kv.num_used == 0 and core.kv.num_free == 40_000


# --- step by step against vLLM's hybrid KV manager ----------------------------------------------


class _HBlk:
    __slots__ = ("h", "id", "null", "ref")

    def __init__(self, i: int, null: bool = False) -> None:
        self.id, self.ref, self.h, self.null = i, 0, None, null


class RefHybrid(RefVllm):
    """RefVllm's scheduler over vLLM 0.26.0's hybrid KV cache, transcribed from
    kv_cache_manager.py (allocate_slots, get_computed_blocks), kv_cache_coordinator.py
    (HybridKVCacheCoordinator: find_longest_cache_hit, cache_blocks, free),
    single_type_kv_cache_manager.py (FullAttentionManager, SlidingWindowManager:
    get_num_blocks_to_allocate, add_local_computed_blocks, allocate_new_blocks,
    remove_skipped_blocks, find_longest_cache_hit) and block_pool.py, with real blocks per
    group. Groups in vLLM's order for Gemma 4: the sliding ones first (layer 0 slides).

    One deliberate difference, the simulator's documented simplification: a sliding block
    a request frees out of its window while never preempted, unique to it, keeps no hash
    (the simulator frees it anonymously: counted and evicted in turn, never hit)."""

    def __init__(self, cfg: CoreConfig, acceptance: float) -> None:
        super().__init__(cfg, acceptance)
        self.free = {i: _HBlk(i) for i in range(cfg.num_blocks)}  # type: ignore[misc]
        self.null = _HBlk(-1, null=True)
        self.ns, self.sbs, self.win = cfg.sw_groups, cfg.sw_block_size, cfg.sw_window
        self.fbs = cfg.block_size
        self.k = self.fbs // self.sbs
        self.full_gid = self.ns
        self.bsz = [self.sbs] * self.ns + [self.fbs]
        in_flight = cfg.max_in_flight_tokens
        self.cap = -(-min(self.win - 1 + in_flight, cfg.max_model_len) // self.sbs) + 1
        self.hybrid: dict[int, dict[str, Any]] = {}

    def _st(self, r: _Req) -> dict[str, Any]:
        s = self.hybrid.get(r.rid)
        if s is None:
            s = self.hybrid[r.rid] = {"blocks": [[] for _ in self.bsz], "ncb": {}}
        return s

    # content identity at the hash block size (the sliding one)
    def _h16(self, r: _Req, i: int) -> tuple[Any, ...]:
        return ("P", r.base, i) if i < r.nshared * self.k else ("U", r.rid, i)

    def _ghash(self, r: _Req, gid: int, i: int) -> tuple[Any, ...]:
        if gid == self.full_gid:  # BlockHashListWithBlockSize: the last hash in the block
            return (self._h16(r, (i + 1) * self.k - 1), gid)
        return (self._h16(r, i), gid)

    # block_pool.py
    def _popleft(self, n: int) -> list[_HBlk]:  # type: ignore[override]
        out = []
        for _ in range(n):
            b = self.free.pop(next(iter(self.free)))
            if b.h is not None:
                d = self.cached[b.h]  # type: ignore[index]
                del d[b.id]
                if not d:
                    del self.cached[b.h]  # type: ignore[arg-type]
                b.h = None
            b.ref = 1
            out.append(b)
        return out

    def _free_blocks(self, ordered: list[_HBlk]) -> None:  # type: ignore[override]
        without, with_hash = [], []
        for b in ordered:
            if b.null:
                continue
            b.ref -= 1
            if b.ref == 0:
                (with_hash if b.h is not None else without).append(b)
        front = {b.id: b for b in without}
        front.update(self.free)
        self.free = front  # type: ignore[assignment]
        for b in with_hash:
            self.free[b.id] = b  # type: ignore[assignment]

    def _touch(self, blocks: list[_HBlk]) -> None:
        for b in blocks:
            if b.ref == 0 and not b.null:
                del self.free[b.id]
            b.ref += 1

    def _get_cached(self, h: tuple[Any, ...], gids: list[int]) -> list[_HBlk] | None:
        out = []
        for g in gids:
            d = self.cached.get((h, g))  # type: ignore[call-overload]
            if not d:
                return None
            out.append(next(iter(d.values())))
        return out

    # single_type_kv_cache_manager.py
    def _skipped_tokens(self, gid: int, computed: int) -> int:
        return max(0, computed - self.win + 1) if gid != self.full_gid else 0

    def _num_to_allocate(self, r: _Req, gid: int, num_tokens: int, new: list[_HBlk],
                         total_computed: int, cap: bool) -> int:
        s = self._st(r)
        bs = self.bsz[gid]
        required = -(-num_tokens // bs)
        if cap and gid != self.full_gid:
            required = min(required, self.cap)
        nreq = len(s["blocks"][gid])
        if gid in s["ncb"]:
            return max(required - nreq, 0)
        skipped = self._skipped_tokens(gid, total_computed) // bs
        local = len(new) + nreq
        n = max(required - max(skipped, local), 0)
        skip_new = max(0, skipped - nreq)
        return n + sum(b.ref == 0 and not b.null for b in new[skip_new:])

    def _remove_skipped(self, r: _Req, processed: int) -> None:
        s = self._st(r)
        for gid in range(self.ns):
            blocks = s["blocks"][gid]
            skip = min(self._skipped_tokens(gid, processed) // self.sbs, len(blocks))
            freed, anon = [], []
            for i in range(skip - 1, -1, -1):
                if blocks[i].null:
                    break
                freed.append(blocks[i])
                if blocks[i].h is not None and blocks[i].h[0] == ("U", r.rid, i) \
                        and not r.preemptions:
                    anon.append(blocks[i])
                blocks[i] = self.null
            self._free_blocks(freed)
            for b in anon:  # the simulator's simplification: at the LRU tail, never hit
                d = self.cached[b.h]  # type: ignore[index]
                del d[b.id]
                if not d:
                    del self.cached[b.h]  # type: ignore[arg-type]
                b.h = None

    def _cache_group(self, r: _Req, gid: int, num_tokens: int) -> None:
        s = self._st(r)
        bs = self.bsz[gid]
        full = num_tokens // bs
        start = s["ncb"].get(gid, 0)
        if start >= full:
            return
        blocks = s["blocks"][gid]
        for i in range(start, full):
            b = blocks[i]
            if b.null:
                continue
            h = self._ghash(r, gid, i)
            b.h = h  # type: ignore[assignment]
            self.cached.setdefault(h, {})[b.id] = b  # type: ignore[index, arg-type]
        s["ncb"][gid] = full

    # kv_cache_coordinator.py HybridKVCacheCoordinator
    def _cache_blocks(self, r: _Req, num_tokens: int) -> None:  # type: ignore[override]
        if not self.cfg.enable_prefix_caching:
            return
        aligned = num_tokens // self.fbs * self.fbs
        for gid in range(len(self.bsz)):
            self._cache_group(r, gid, aligned)

    def _free_req(self, r: _Req) -> None:  # type: ignore[override]
        s = self._st(r)
        for gid in range(len(self.bsz)):
            self._free_blocks(s["blocks"][gid][::-1])
        self.hybrid.pop(r.rid)

    def _hit(self, r: _Req) -> Any:  # type: ignore[override]
        empty: Any = ([[] for _ in self.bsz], 0)
        if not self.cfg.enable_prefix_caching:
            return empty
        max_len = r.num_tokens - 1
        fgid = [self.full_gid]
        full: list[_HBlk] = []
        for j in range(max_len // self.fbs):
            c = self._get_cached(self._ghash(r, self.full_gid, j)[0], fgid)
            if not c:
                break
            full.append(c[0])
        hit = len(full) * self.fbs
        sw_gids = list(range(self.ns))
        need = -(-(self.win - 1) // self.sbs)
        n_blocks = hit // self.sbs
        comp: list[list[_HBlk]] = [[self.null] * n_blocks for _ in sw_gids]
        count, found, i = 0, False, n_blocks - 1
        while i >= 0:
            c = self._get_cached(self._h16(r, i), sw_gids)
            if c:
                if count == 0 and self.sbs != self.fbs and ((i + 1) * self.sbs) % self.fbs:
                    i -= 1
                    continue
                for lst, b in zip(comp, c, strict=True):
                    lst[i] = b
                count += 1
                if count >= need:
                    for lst in comp:
                        del lst[i + count:]
                    found = True
                    break
            else:
                count = 0
            i -= 1
        if not found:
            for lst in comp:
                del lst[count:]
            while self.sbs != self.fbs and len(comp[0]) * self.sbs % self.fbs:
                for lst in comp:
                    lst.pop()
        hit = len(comp[0]) * self.sbs
        del full[-(-hit // self.fbs):]
        return ([*comp, full], hit)

    def _hit_tokens(self, hit: Any) -> int:  # type: ignore[override]
        return int(hit[1])

    # kv_cache_manager.py allocate_slots
    def _alloc(self, r: _Req, n: int, hit: Any = None, computed: int = 0) -> bool:  # type: ignore[override]
        cfg = self.cfg
        max_len = cfg.max_model_len
        s = self._st(r)
        new: list[list[_HBlk]] = hit[0] if hit is not None else [[] for _ in self.bsz]
        local = r.computed + (computed if hit is not None else 0)
        total = min(local, max_len)
        if hit is not None:  # full_sequence_must_fit (scheduler_reserve_full_isl)
            full_num = min(r.num_tokens, max_len)
            need = sum(self._num_to_allocate(r, g, full_num, new[g], total, True)
                       for g in range(len(self.bsz)))
            if need > len(self.free):
                return False
        slots = min(total + n + self.la, max_len)
        self._remove_skipped(r, max(0, total - r.inflight))
        need = sum(self._num_to_allocate(r, g, slots, new[g], local, False)
                   for g in range(len(self.bsz)))
        if need > len(self.free):
            return False
        if hit is not None and any(new):
            for g in range(len(self.bsz)):  # add_local_computed_blocks
                skipped = self._skipped_tokens(g, local) // self.bsz[g]
                blocks = new[g][skipped:] if skipped > 0 else new[g]
                self._touch(blocks)
                s["blocks"][g] = [self.null] * skipped + list(blocks)
                s["ncb"][g] = len(s["blocks"][g])
        for g in range(len(self.bsz)):  # allocate_new_blocks
            more = -(-slots // self.bsz[g]) - len(s["blocks"][g])
            if more > 0:
                s["blocks"][g] += self._popleft(more)
        self._cache_blocks(r, min(total + n, r.num_tokens))
        return True


@st.composite
def hybrid_scenarios(draw: st.DrawFn) -> tuple[CoreConfig, float, list[Arrival]]:
    sbs = draw(st.sampled_from([4, 8]))
    k = draw(st.sampled_from([1, 2]))
    fbs = sbs * k
    # a window of at least k sliding blocks before a boundary (SlidingWindowManager caches
    # every block then: reachable_block_mask)
    window = draw(st.integers(sbs * (k - 1) + 2, 6 * fbs))
    ns = draw(st.integers(1, 3))
    async_ = draw(st.booleans())
    mnbt = draw(st.integers(8, 160))
    in_flight = (2 if async_ else 1) * mnbt
    max_len = draw(st.integers(2, 24 * fbs))
    probe = replace(_BASE, block_size=fbs, sw_groups=ns, sw_block_size=sbs, sw_window=window,
                    max_model_len=max_len, max_in_flight_tokens=in_flight)
    least = _max_blocks_per_request(probe)
    num_blocks = draw(st.integers(least, least + 40 * (ns + 1)))
    spec_k = draw(st.sampled_from([0, 0, 2]))
    cfg = replace(
        probe,
        num_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_scheduled_tokens=mnbt,
        enable_prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        async_scheduling=async_,
        spec_k=spec_k,
        spec_lookahead=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 24])),
        drop_eagle_block=spec_k > 0 and draw(st.booleans()),
        decode_cohort=draw(st.booleans()),
    )
    acceptance = draw(st.sampled_from([0.0, 0.6, 0.95]))
    return cfg, acceptance, draw_arrivals(draw, max_len, fbs, max_out=60)


_BASE = CoreConfig(num_blocks=1)


def _max_blocks_per_request(cfg: CoreConfig) -> int:
    """kvlayout.py KvLayout.max_blocks_per_request for a test configuration."""
    sw = -(-min(cfg.sw_window - 1 + cfg.max_in_flight_tokens, cfg.max_model_len)
           // cfg.sw_block_size) + 1
    return -(-cfg.max_model_len // cfg.block_size) + cfg.sw_groups * sw


@given(hybrid_scenarios())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hybrid_engine_loses_nothing_and_keeps_kv_in_bounds(
    case: tuple[CoreConfig, float, list[Arrival]],
) -> None:
    """The hybrid engine's invariants (test_sim_properties.py drive): every request
    finishes, every token is accounted for, KV in use within [0, capacity], every block
    back at the end."""
    drive(*case)


@given(hybrid_scenarios())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hybrid_decode_cohort_changes_no_step(
    case: tuple[CoreConfig, float, list[Arrival]],
) -> None:
    """The decode cohort's sliding phases (sim/cohort.py) stand in for the walk exactly."""
    cfg, acceptance, arrivals = case
    on, t_on = drive(replace(cfg, decode_cohort=True), acceptance, arrivals)
    off, t_off = drive(replace(cfg, decode_cohort=False), acceptance, arrivals)
    assert t_on == t_off
    assert [(r.preemptions, r.cached_tokens, r.scheduled_s) for r in on] == [
        (r.preemptions, r.cached_tokens, r.scheduled_s) for r in off
    ]


@given(hybrid_scenarios())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hybrid_engine_matches_reference_vllm(
    case: tuple[CoreConfig, float, list[Arrival]],
) -> None:
    """Step by step, a hybrid EngineCore schedules the same requests with the same token
    counts, emits the same tokens and keeps the same number of free blocks as RefHybrid
    (without EAGLE's extra cached block, which the simulator does not model)."""
    cfg, acceptance, arrivals = case
    cfg = replace(cfg, decode_cohort=False, drop_eagle_block=False)
    ref = RefHybrid(cfg, acceptance)

    def sliding_blocks_held(t: int, reqs: list[SimRequest]) -> None:
        for r in reqs:
            if r.status == RUNNING:
                s = ref.hybrid[r.rid]
                held_sw = sum(not b.null for b in s["blocks"][0])
                assert r.sw_hi - r.sw_lo == held_sw, f"sliding blocks of {r.rid} at step {t}"

    lockstep(cfg, acceptance, arrivals, ref, sliding_blocks_held)


def _gemma_mix(workload: dict[str, Any], caching: bool = True) -> TrafficMix:
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "gemma-4-31b", "precision": "fp8",
                   "engine": {"gpu_memory_utilization": 0.92, "max_model_len": 8192,
                              "enable_prefix_caching": caching,
                              "limit_mm_per_prompt": {"image": 0}}}],
        "workloads": [{"name": "w", "pool": "p", **workload}],
        "simulation": {"duration_s": 20.0, "warmup_s": 2.0, "drain_s": 60.0},
    })


@pytest.mark.parametrize("prefix", [{"shared_tokens": 3000, "groups": 2},
                                    {"shared_fraction": 0.5, "groups": 1},
                                    {"target_hit_rate": 0.6}])
def test_gemma_shared_prefixes_hit_through_the_sliding_window(prefix: dict[str, Any]) -> None:
    """Shared prefixes on a hybrid pool: hits happen (the sliding groups find the window
    before the hit point cached), the cohort changes nothing, the pool stays in bounds."""
    mix = _gemma_mix({"arrival": {"kind": "poisson", "rate_rps": 6},
                      "input_tokens": {"kind": "lognormal", "mean": 4000, "sigma": 0.4,
                                       "max": 7000},
                      "output_tokens": {"kind": "constant", "value": 100},
                      "prefix": prefix})
    a = simulate(mix, "p", 1, seed=2)
    b = simulate(mix, "p", 1, seed=2, decode_cohort=False)
    assert a.model_dump_json() == b.model_dump_json()
    assert a.pool.prefix_hit_rate > 0.2
    assert 0 < a.pool.kv_usage_peak <= 1.0
    if "target_hit_rate" not in prefix:  # (that one is assumed cached whatever the engine)
        no = simulate(_gemma_mix(mix.workloads[0].model_dump(exclude={"name", "pool"}),
                                 caching=False), "p", 1, seed=2)
        assert no.pool.prefix_hit_rate == 0


def test_gemma_under_kv_pressure_preempts_and_recovers() -> None:
    """A Gemma pool squeezed to a few thousand blocks preempts and still finishes every
    request, with or without the decode cohort, caching on."""
    mix = TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "gemma-4-31b", "precision": "fp8",
                   "engine": {"gpu_memory_utilization": 0.3, "max_model_len": 8192,
                              "limit_mm_per_prompt": {"image": 0}}}],
        "workloads": [{"name": "w", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 2},
                       "input_tokens": {"kind": "lognormal", "mean": 2000, "sigma": 0.5,
                                        "max": 4000},
                       "output_tokens": {"kind": "constant", "value": 3000},
                       "prefix": {"shared_tokens": 1500, "groups": 3}}],
        "simulation": {"duration_s": 8.0, "warmup_s": 1.0, "drain_s": 300.0},
    })
    a = simulate(mix, "p", 1, seed=4)
    b = simulate(mix, "p", 1, seed=4, decode_cohort=False)
    assert a.pool.preemptions > 0
    assert a.model_dump_json() == b.model_dump_json()
    w = a.workload("w")
    assert w.completed == w.requests


# --- the one-group path is unchanged ------------------------------------------------------------


def test_one_group_models_have_no_layout_and_no_sliding_groups() -> None:
    """Llama and Qwen: one KV-cache group of 16-token blocks; the pool, the engine config and
    every counter are what they were (kv tokens // block size, less the null block)."""
    for model in ("llama-3.1-8b", "qwen3-32b"):
        spec = load_model_spec(model)
        layout = derive_layout(spec)
        assert not layout.hybrid and layout.num_groups == 1
        assert layout.full_block_size == 16 and layout.layers_per_group == spec.num_layers
        pool = Pool(name="p", model=model, precision="bf16")
        st_ = setup_pool(pool)
        assert st_.layout is None
        prof = st_.profile
        assert not prof.kv.pooled and "layout" not in prof.to_json()["kv"]
        util = pool.engine.gpu_memory_utilization
        assert st_.num_blocks == prof.kv.tokens(util) // 16 - 1
        assert st_.kv_tokens == st_.block_tokens == st_.num_blocks * 16


def test_sliding_window_model_simulates_end_to_end() -> None:
    """Gemma 4 31B FP8 serving long prompts at concurrency 64 (the validation row long-c64):
    all 64 run at once, none preempted, the pool never over-full; the same seed gives the
    same result with the decode cohort on or off."""
    mix = TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "gemma-4-31b", "precision": "fp8",
                   "engine": {"gpu_memory_utilization": 0.92, "max_model_len": 8192,
                              "limit_mm_per_prompt": {"image": 0}}}],
        "workloads": [{"name": "long", "pool": "p",
                       "arrival": {"kind": "closed", "concurrency": 64},
                       "input_tokens": {"kind": "constant", "value": 4096},
                       "output_tokens": {"kind": "constant", "value": 256}}],
        "simulation": {"duration_s": 30.0, "warmup_s": 0.0, "drain_s": 60.0},
    })
    a = simulate(mix, "p", 1, seed=1)
    b = simulate(mix, "p", 1, seed=1, decode_cohort=False)
    assert a.pool.preemptions == 0 and 0.5 < a.pool.kv_usage_peak <= 1.0
    assert a.model_dump_json() == b.model_dump_json()
    assert a.requests().equals(b.requests())
    running = a.kv_series()["running"].max()
    assert running == 64
    assert math.isfinite(a.workload("long").itl_p50_s)


def test_kv_floor_of_the_sizer_counts_blocks_for_sliding_window_models() -> None:
    """The sizer's KV floor (solve/bounds.py) for a hybrid pool counts the pool's blocks a
    request holds (its full-attention blocks, at most its window in each sliding group), not
    vLLM's tokens at max_model_len: long prompts at ~64 in flight fit one replica, as
    simulated, and the floor says so."""
    from capplan.solve.bounds import bracket

    mix = _gemma_mix({"arrival": {"kind": "poisson", "rate_rps": 2.5},
                      "input_tokens": {"kind": "constant", "value": 4096},
                      "output_tokens": {"kind": "constant", "value": 256}})
    st_ = setup_pool(mix.pool("p"))
    b = bracket(st_, mix.workloads_of("p"))
    assert st_.layout is not None
    per_request = (4096 + 128) / 32 + 5 * 1024 / 16  # blocks at the mean length held
    assert b.kv_replicas < 1.0
    concurrency = b.kv_replicas * st_.num_blocks / per_request
    # in tokens at max_model_len the same concurrency would claim far more of the pool
    assert concurrency * (4096 + 128) / st_.kv_tokens > 2 * b.kv_replicas
    res = simulate(mix, "p", 1, seed=1)
    assert res.pool.kv_usage_peak <= 1.0 and res.pool.preemptions == 0


def test_sliding_layers_keep_the_kernel_block_whatever_block_size() -> None:
    """vLLM gives sliding layers the backend's smallest kernel block (16), not --block-size:
    at block_size 32 Gemma's pages are already equal, the layout the same as at 16."""
    assert derive_layout(GEMMA, block_size=32).model_copy(update={"block_size": 16}) == \
        derive_layout(GEMMA)
    wide = derive_layout(GEMMA, block_size=64)
    assert (wide.full_block_size, wide.sliding_block_size) == (64, 32)
    assert wide.block_bytes == 2 * derive_layout(GEMMA).block_bytes


def test_a_pictures_step_waits_for_the_measured_encoder_pass() -> None:
    """Gemma 4 FP8 at concurrency 1: a prompt of 300 text tokens and one 280-token picture
    reaches its first token one encoder pass (the pass's floor, a lone picture) after a
    text prompt of the same 580 tokens does, and the time vLLM's input path takes its
    pixels to the engine core (sim/client.py PICTURE_INPUT_TOKEN_S); two 280-token pictures
    beside 20 text tokens pay the pictures' per-token terms, past the floor (steptime.py
    StepTimer.encoder_pass_s, vLLM's gpu_model_runner.py _execute_mm_encoder)."""
    from capplan.mix import TrafficMix
    from capplan.sim.client import PICTURE_INPUT_TOKEN_S
    from capplan.sim.run import setup_pool
    from capplan.steptime import StepTimer

    def ttft(text: int, image: dict | None) -> float:
        return float(_picture_ttfts(text, image, {"encoder_step_s": 0.0,
                                                  "encoder_step_draws_s": []}).median())

    mix_setup = setup_pool(TrafficMix.model_validate({
        "schema_version": 1, "name": "enc",
        "pools": [{"name": "v", "model": "gemma-4-31b", "precision": "fp8",
                   "engine": {"max_model_len": 8192}}],
        "workloads": [{"name": "w", "pool": "v", "arrival": {"kind": "closed", "concurrency": 1},
                       "input_tokens": {"kind": "constant", "value": 8},
                       "output_tokens": {"kind": "constant", "value": 8}}]}).pool("v"))
    eng = mix_setup.pool.engine
    timer = StepTimer(mix_setup.profile, max_num_seqs=eng.max_num_seqs,
                      max_num_batched_tokens=eng.max_num_batched_tokens)
    one, two = timer.encoder_pass_s(280, 1), timer.encoder_pass_s(560, 2)
    assert one == mix_setup.profile.step.encoder_floor_s > 0 and two > one
    text = ttft(580, None)
    taken_in = PICTURE_INPUT_TOKEN_S  # AsyncLLM's time on a picture's pixels, a token
    assert ttft(300, {"images_per_request": 1, "tokens_per_image": 280}) - text == \
        pytest.approx(one + 280 * taken_in, abs=1e-3)
    assert ttft(20, {"images_per_request": 2, "tokens_per_image": 280}) - text == \
        pytest.approx(two + 560 * taken_in, abs=1e-3)


def _picture_ttfts(text: int, image: dict | None, step: dict, seed: int = 0) -> pl.Series:
    """Every TTFT of Gemma 4 FP8 at concurrency 1, prompts of `text` tokens and `image`, with
    the shipped profile's step model updated by `step`."""
    from capplan.mix import TrafficMix
    from capplan.sim.run import setup_pool, simulate

    wl = {"name": "w", "pool": "v", "arrival": {"kind": "closed", "concurrency": 1},
          "input_tokens": {"kind": "constant", "value": text},
          "output_tokens": {"kind": "constant", "value": 8}}
    if image:
        wl["image"] = image
    mix = TrafficMix.model_validate({
        "schema_version": 1, "name": "enc",
        "pools": [{"name": "v", "model": "gemma-4-31b", "precision": "fp8",
                   "engine": {"max_model_len": 8192, "limit_mm_per_prompt": {"image": 2}}}],
        "workloads": [wl], "simulation": {"duration_s": 20, "seed": seed}})
    prof = setup_pool(mix.pool("v")).profile
    # a picture's step runs past the largest CUDA graph, whose measured core time is drawn
    # too (sim/replica.py): held at its median here, so that the picture's draws alone vary
    prof = prof.model_copy(update={"step": prof.step.model_copy(
        update={"eager_sigma": 0.0, **step})})
    return simulate(mix, "v", 1, profile=prof).requests()["ttft_s"]


def test_each_pictures_step_draws_its_cost_around_the_pass() -> None:
    """With measured picture steps (StepModel.encoder_step_draws_s) each step that encodes
    pays one of them, drawn from the replica's own seeded stream (sim/replica.py
    PictureDraws): lone pictures' TTFTs take the two drawn values, 100 ms apart, each about
    as often, and the same seed draws the same; without draws every step pays
    encoder_step_s."""
    pic = {"images_per_request": 1, "tokens_per_image": 280}
    alone = {"encoder_step_s": 0.05, "encoder_step_draws_s": [0.0, 0.1],
             "encoder_slow_spell_s": 0.0, "encoder_fast_spell_s": 0.0}
    drawn = _picture_ttfts(300, pic, alone)
    low = float(drawn.min())
    assert float(drawn.max()) - low == pytest.approx(0.1, abs=1e-3)
    high = int((drawn > low + 0.05).sum())
    assert 0.3 < high / len(drawn) < 0.7 and len(drawn) > 50
    again = _picture_ttfts(300, pic, alone)
    assert again.to_list() == drawn.to_list()
    median = _picture_ttfts(300, pic, {"encoder_step_s": 0.05, "encoder_step_draws_s": []})
    assert float(median.max() - median.min()) < 1e-3
    assert float(median.median()) == pytest.approx(low + 0.05, abs=1e-3)


def test_a_gemma_pool_with_pictures_needs_a_picture_a_step() -> None:
    """vLLM schedules a Gemma 4 picture's tokens in one step (disable_chunked_mm_input,
    forced for its bidirectional attention within a picture) and refuses to start with a
    token budget below one picture (encoder_cache_manager.py compute_mm_encoder_budget):
    setup_pool says so in one line naming the field; a text-only pool of the same budget,
    and a budget of one picture, start."""
    from capplan.errors import ConfigError
    from capplan.pool import Pool
    from capplan.sim.run import setup_pool

    def pool(budget: int, images: int | None) -> Pool:
        eng: dict = {"max_model_len": 8192, "max_num_batched_tokens": budget,
                     "max_num_seqs": budget}
        if images is not None:
            eng["limit_mm_per_prompt"] = {"image": images}
        return Pool.model_validate({"name": "v", "model": "gemma-4-31b", "precision": "fp8",
                                    "engine": eng})

    with pytest.raises(ConfigError, match="picture's 280 tokens in one step") as e:
        setup_pool(pool(256, 1))
    assert e.value.field == "engine.max_num_batched_tokens"
    assert setup_pool(pool(256, 0)).num_blocks > 0
    assert setup_pool(pool(280, 1)).num_blocks > 0


def test_without_async_scheduling_each_step_adds_the_cores_own_time() -> None:
    """vLLM's EngineCore.step schedules, launches, waits for the step's tokens and updates
    from them in turn, so the core's time a step (core_graph_s) is serial to the GPU's
    (sim/replica.py `_serial`); with the batch queue it hides under the step before. A lone
    chat's decode steps are then core_graph_s apart in ITL, nothing else moving."""
    from capplan.steptime import StepTimer

    def itl_p50(async_scheduling: bool) -> float:
        mix = TrafficMix.model_validate({
            "schema_version": 1, "name": "sync",
            "pools": [{"name": "v", "model": "llama-3.1-8b", "precision": "bf16",
                       "engine": {"max_model_len": 4096,
                                  "async_scheduling": async_scheduling}}],
            "workloads": [{"name": "w", "pool": "v",
                           "arrival": {"kind": "closed", "concurrency": 1},
                           "input_tokens": {"kind": "constant", "value": 512},
                           "output_tokens": {"kind": "constant", "value": 64}}],
            "simulation": {"duration_s": 10, "seed": 0}})
        return simulate(mix, "v", 1).workload("w").itl_p50_s

    prof = setup_pool(Pool(name="v", model="llama-3.1-8b", precision="bf16")).profile
    serial = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192).serial_core_s
    assert serial == prof.step.core_graph_s > 0
    assert itl_p50(False) - itl_p50(True) == pytest.approx(serial, abs=0.1e-3)


def test_picture_steps_come_in_spells_of_the_measured_length() -> None:
    """PictureDraws with spells: draws close in time come from one spell (a burst of
    pictures meets one), the slow spell's share of the time is slow / (slow + fast), and
    the same seed draws the same; without spell lengths every draw is independent."""
    import numpy as np

    from capplan.sim.replica import PictureDraws

    draws = (0.0, 0.001, 0.1, 0.101)

    def run(spells: tuple[float, float, float], seed: int = 0) -> list[float]:
        pd = PictureDraws(draws, np.random.default_rng(seed), spells)
        return [pd.draw(t * 0.01) for t in range(200_000)]  # every 10 ms for 2,000 s

    got = np.array(run((0.05, 3.0, 1.0)))
    slow = got > 0.05
    assert np.mean(slow) == pytest.approx(0.75, abs=0.05)
    # two spells end every 3 + 1 s: 0.005 of the 10 ms steps change spell
    assert np.mean(slow[1:] != slow[:-1]) == pytest.approx(0.01 * 2 / 4.0, rel=0.15)
    assert run((0.05, 3.0, 1.0)) == got.tolist()
    alone = np.array(run((0.0, 0.0, 0.0))) > 0.05
    assert np.mean(alone[1:] != alone[:-1]) == pytest.approx(0.5, abs=0.02)
