"""Simulate one pool of a traffic mix: N replicas behind a router, replaying its workloads.

Open-loop workloads arrive as generated up front; closed-loop users send their next request
when the last one ends. Requests arriving in [warmup, duration) are measured; traffic keeps
flowing after `duration` until every measured request has finished (or `drain_s` runs out,
and the unfinished ones count as infinitely late).
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from capplan.errors import ConfigError
from capplan.kvlayout import KvLayout, derive_layout, max_in_flight_tokens
from capplan.mix import TrafficMix, max_model_len
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import Pool, refuse_open
from capplan.profile import Profile
from capplan.sim.client import PICTURE_INPUT_TOKEN_S, ClientLoop, OutputJitter
from capplan.sim.core import CoreConfig, EngineCore
from capplan.sim.metrics import WorkloadRecorder
from capplan.sim.replica import LaunchSpread, PictureDraws, Replica, Window
from capplan.sim.request import SimRequest
from capplan.sim.results import KvRows, PoolRunResult, RequestColumns, SimResult, summarise
from capplan.sim.router import Router
from capplan.sim.verdict import CHECK_EVERY_S, MissWatch
from capplan.sim.workload import (
    TARGET_HIT_RATE,
    ArrivalStream,
    ClosedLoopSampler,
    RequestBatch,
)
from capplan.steptime import StepTimer
from capplan.traffic import ClosedLoop, Workload

_GROUP_SHIFT = 22  # block-index bits of a shared-prefix hash




@dataclass(frozen=True, slots=True)
class PoolSetup:
    """A pool resolved for simulation: its profile and the engine limits derived from it.

    `num_blocks` are the pool's blocks requests can take (vLLM's num_gpu_blocks less the
    null block); `layout` is set for a model with sliding-window layers, whose KV-cache groups
    share them (kvlayout.py), None for one group of `block_size`-token blocks."""

    pool: Pool
    spec: ModelSpec
    profile: Profile
    num_blocks: int
    max_model_len: int
    layout: KvLayout | None = None

    @property
    def kv_tokens(self) -> int:
        """KV capacity in tokens as vLLM reports it ("GPU KV cache size"): blocks x block
        size for one group; with sliding-window groups, requests at max_model_len (each
        window counted once: kv_cache_utils.py get_kv_cache_capacity)."""
        if self.layout is None:
            return self.num_blocks * self.pool.engine.block_size
        eng = self.pool.engine
        return self.layout.vllm_kv_tokens(
            self.num_blocks + 1, self.max_model_len,
            max_in_flight_tokens(eng.max_num_batched_tokens, eng.async_scheduling))

    @property
    def block_tokens(self) -> int:
        """The pool's blocks x the engine's block size (what vLLM's num_gpu_blocks x
        block_size is to a measured engine), whatever the layout."""
        return self.num_blocks * self.pool.engine.block_size


def pool_layout(profile: Profile, spec: ModelSpec, pool: Pool) -> tuple[KvLayout, int] | None:
    """A sliding-window model's KV layout on this pool's engine and its pool's blocks (the
    null block included) at the engine's utilisation; None for a one-group model.

    The blocks come from the profile's measured pool (KvCapacity.blocks); a profile recorded
    before pools were (vLLM's tokens only) is converted back through vLLM's own formula at its
    engine's max_model_len. A block size other than the profile's scales them by bytes."""
    eng = pool.engine
    kvb = 1 if profile.kv_cache_dtype == "fp8" else 2
    layout = derive_layout(spec, block_size=eng.block_size, kv_dtype_bytes=kvb, tp=profile.tp)
    if not layout.hybrid:
        return None
    if layout.full_groups != 1:
        raise ConfigError(f"{spec.name}: {layout.full_groups} full-attention KV-cache groups; "
                          "the simulator models one beside the sliding-window groups")
    kv = profile.kv
    util = eng.gpu_memory_utilization
    if kv.pooled:
        assert kv.layout is not None
        ref, blocks = kv.layout, kv.blocks(util, text_only=eng.text_only)
    else:
        meas = profile.engine
        ref = derive_layout(spec, block_size=int(meas.get("block_size") or 16),  # type: ignore[call-overload]
                            kv_dtype_bytes=kvb, tp=profile.tp)
        m = int(meas.get("max_model_len") or spec.max_position_embeddings)  # type: ignore[call-overload]
        in_flight = max_in_flight_tokens(int(meas.get("max_num_batched_tokens") or 8192),  # type: ignore[call-overload]
                                         bool(meas.get("async_scheduling", True)))
        per_req = ref.max_blocks_per_request(m, in_flight)
        blocks = kv.tokens(util, text_only=eng.text_only) * per_req // m
    if ref.block_bytes != layout.block_bytes:
        blocks = blocks * ref.block_bytes // layout.block_bytes
    return layout, blocks


def setup_pool(pool: Pool, *, profile: Profile | None = None, source: str = "") -> PoolSetup:
    """Resolve a pool's profile and KV blocks; refuse what vLLM would refuse to start."""
    from capplan.profiles import resolve_profile

    if pool.precision == "auto":
        raise ConfigError(
            f"pool {pool.name!r} has precision: auto; `capplan size` chooses it, simulate "
            "needs bf16, fp8, nvfp4 or awq",
            file=source or None,
            field="precision",
        )
    refuse_open(pool, file=source or None)  # a placeholder must never be simulated
    spec = load_model_spec(pool.model)
    if spec.num_attention_heads % pool.tp:
        # vllm/config/model.py ModelConfig.verify_with_parallel_config
        ways = [n for n in range(1, spec.num_attention_heads + 1)
                if spec.num_attention_heads % n == 0 and n <= 8]
        raise ConfigError(
            f"pool {pool.name!r}: tp {pool.tp} does not divide {spec.name}'s "
            f"{spec.num_attention_heads} attention heads (vLLM refuses to start); set tp to "
            + ", ".join(map(str, ways)),
            file=source or None,
            field="tp",
        )
    eng = pool.engine
    if (spec.images_whole and not eng.text_only
            and eng.max_num_batched_tokens < spec.image_tokens_per_image):
        # vllm/v1/core/encoder_cache_manager.py compute_mm_encoder_budget
        raise ConfigError(
            f"pool {pool.name!r}: vLLM schedules a {spec.name} picture's "
            f"{spec.image_tokens_per_image} tokens in one step and refuses to start with "
            f"max_num_batched_tokens {eng.max_num_batched_tokens}; raise "
            f"engine.max_num_batched_tokens to {spec.image_tokens_per_image} or more, or set "
            "engine.limit_mm_per_prompt {image: 0} for a text-only pool",
            file=source or None,
            field="engine.max_num_batched_tokens",
        )
    prof = profile or resolve_profile(pool, spec, source=source or None)
    if pool.host != "any":  # sizing prices `any` on each host in turn (solve/choose.py)
        prof = prof.on_host(pool.host)
    hybrid = pool_layout(prof, spec, pool)
    if hybrid is not None:
        return _setup_hybrid(pool, spec, prof, *hybrid, source)
    kv_tokens = prof.kv.tokens(eng.gpu_memory_utilization, text_only=eng.text_only)
    num_blocks = kv_tokens // eng.block_size - 1  # block_pool.py: one null block
    limit = max_model_len(pool, spec)
    if num_blocks < 1:
        raise _no_room_for_kv(pool, spec, source)
    if num_blocks * eng.block_size < limit:
        raise ConfigError(
            f"pool {pool.name!r}: KV cache holds {num_blocks * eng.block_size} tokens, fewer "
            f"than max_model_len {limit} (vLLM refuses to start); lower engine.max_model_len "
            "or raise gpu_memory_utilization",
            file=source or None,
            field="engine.max_model_len",
        )
    return PoolSetup(pool, spec, prof, num_blocks, limit)


def _no_room_for_kv(pool: Pool, spec: ModelSpec, source: str) -> ConfigError:
    return ConfigError(
        f"pool {pool.name!r}: at gpu_memory_utilization {pool.engine.gpu_memory_utilization} "
        f"the weights of {spec.name} ({pool.precision}) and the activations leave no room "
        "for a KV cache (vLLM refuses to start); raise gpu_memory_utilization or pick a "
        "smaller precision",
        file=source or None,
        field="engine.gpu_memory_utilization",
    )


def _setup_hybrid(pool: Pool, spec: ModelSpec, prof: Profile, layout: KvLayout, blocks: int,
                  source: str) -> PoolSetup:
    eng = pool.engine
    limit = max_model_len(pool, spec)
    if blocks - 1 < 1:
        raise _no_room_for_kv(pool, spec, source)
    # kv_cache_utils.py _check_enough_kv_cache_memory: one request at max_model_len must fit
    need = layout.max_blocks_per_request(
        limit, max_in_flight_tokens(eng.max_num_batched_tokens, eng.async_scheduling))
    if need > blocks:
        raise ConfigError(
            f"pool {pool.name!r}: KV cache holds {blocks} blocks, fewer than the {need} one "
            f"request at max_model_len {limit} may need (vLLM refuses to start); lower "
            "engine.max_model_len or raise gpu_memory_utilization",
            file=source or None,
            field="engine.max_model_len",
        )
    return PoolSetup(pool, spec, prof, blocks - 1, limit, layout)  # one null block


def simulate(
    mix: TrafficMix,
    pool: str,
    replicas: int,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    seed: int | None = None,
    rate_scale: float = 1.0,
    profile: Profile | None = None,
    setup: PoolSetup | None = None,
    decode_cohort: bool = True,
    keep_requests: bool = True,
    client_latency_s: float | None = None,
    stop_when_missed: bool = False,
    drain_cap_s: float | None = None,
    arrivals: Mapping[int, RequestBatch] | None = None,
    route_log: list[tuple[int, int, int]] | None = None,
) -> SimResult:
    """Simulate `replicas` replicas of `pool` serving its workloads (rates x rate_scale).

    `decode_cohort=False` walks every request every step (the reference path the cohort's
    shortcut is tested against); `keep_requests=False` keeps no per-request rows (memory
    then stays flat in the duration; the percentiles are the same). `client_latency_s` overrides
    the mix's one-way client-engine latency (`simulation.client_latency_s`).
    `stop_when_missed=True` (sizing) ends the run as soon as a TTFT or E2E target is missed
    for certain (sim/verdict.py); the result's `stopped_at_s` then says when, and its figures
    cover the run up to that moment only. `drain_cap_s` (sizing's probes) ends the drain
    after that long at most without changing a single request: the arrival streams still
    run to the mix's `duration_s + drain_s`, whose length sets how many requests each chunk
    of a stream draws sizes for, so a capped run serves the requests of the full one.
    `arrivals` replaces open-loop workloads' streams (by workload index) with the given
    requests; `route_log` receives (workload, request id, replica) for every request routed,
    in routing order (request ids count up in each workload's arrival order)."""
    if replicas < 1:
        raise ConfigError(f"replicas must be >= 1, got {replicas}", field="replicas")
    p = mix.pool(pool)
    workloads = mix.workloads_of(pool)
    if not workloads:
        raise ConfigError(f"pool {pool!r} serves no workload", file=mix.source, field="workloads")
    st = setup or setup_pool(p, profile=profile, source=mix.source)
    sim = mix.simulation
    duration = duration_s if duration_s is not None else sim.duration_s
    warmup = warmup_s if warmup_s is not None else (
        sim.warmup if duration_s is None else 0.1 * duration
    )
    seed = sim.seed if seed is None else seed
    if client_latency_s is None:
        client_latency_s = sim.client_latency_s
    if client_latency_s < 0:
        raise ConfigError(f"client_latency_s must be >= 0, got {client_latency_s}")
    return _Run(mix, st, workloads, replicas, duration, warmup, sim.drain_s, seed,
                rate_scale, decode_cohort, keep_requests, client_latency_s,
                stop_when_missed, drain_cap_s, arrivals, route_log).run()


def simulate_timed(
    mix: TrafficMix, pool: str, replicas: int, **kwargs: Any
) -> tuple[SimResult, float]:
    """`simulate` and the wall-clock seconds it took (a worker process's run, timed there)."""
    t0 = time.perf_counter()
    res = simulate(mix, pool, replicas, **kwargs)
    return res, time.perf_counter() - t0


class _Run:
    def __init__(
        self,
        mix: TrafficMix,
        st: PoolSetup,
        workloads: list[Workload],
        replicas: int,
        duration: float,
        warmup: float,
        drain: float,
        seed: int,
        rate_scale: float,
        decode_cohort: bool = True,
        keep_requests: bool = True,
        client_latency_s: float = 0.0,
        stop_when_missed: bool = False,
        drain_cap_s: float | None = None,
        arrivals: Mapping[int, RequestBatch] | None = None,
        route_log: list[tuple[int, int, int]] | None = None,
    ) -> None:
        self.mix, self.st, self.workloads = mix, st, workloads
        self.arrivals, self.route_log = arrivals or {}, route_log
        self.end_s = duration + (drain if drain_cap_s is None else min(drain, drain_cap_s))
        self.latency = client_latency_s
        send_s = mix.simulation.client_send_s
        self.client = ClientLoop(send_s) if send_s else None
        # a picture's time from the send stamp to the engine core, per image token: the
        # client making it, then AsyncLLM taking it in (sim/client.py)
        self.picture_token_s = mix.simulation.client_picture_token_s + PICTURE_INPUT_TOKEN_S
        self.duration, self.warmup, self.drain, self.seed = duration, warmup, drain, seed
        self.rate_scale = rate_scale
        self.env = simpy.Environment()
        self.recorders = [WorkloadRecorder(keep_requests=keep_requests) for _ in workloads]
        self.window = Window(warmup, duration, self.recorders)
        self.created = [0] * len(workloads)  # measured requests created, per workload
        self.pending = 0  # measured requests not yet finished
        self.arrivals_done = False
        self.done = self.env.event()
        self.rid = 0
        # Independent random streams: arrivals per workload ([seed, 1, w]), closed-loop
        # users ([seed, 3, w]), each replica's draft acceptance ([seed, 2, r]); so the same
        # traffic meets every replica count and configuration (common random numbers).
        eng = st.pool.engine
        spec = eng.speculative
        k = st.profile.spec_k if spec else 0
        acceptance = [w.acceptance(spec) if spec else 0.0 for w in workloads]
        layout = st.layout
        self.bs = layout.full_block_size if layout is not None else eng.block_size
        if eng.max_num_scheduled_tokens <= 0:
            raise ConfigError(
                f"pool {st.pool.name!r}: a draft model keeps max_num_seqs ({eng.max_num_seqs}) "
                f"of max_num_batched_tokens ({eng.max_num_batched_tokens}) for its slots, "
                "leaving no tokens to schedule; raise max_num_batched_tokens or lower "
                "max_num_seqs (vLLM refuses to start)")
        cfg = CoreConfig(
            num_blocks=st.num_blocks,
            block_size=self.bs,
            max_num_seqs=eng.max_num_seqs,
            max_num_scheduled_tokens=eng.max_num_scheduled_tokens,
            max_model_len=st.max_model_len,
            enable_prefix_caching=eng.enable_prefix_caching,
            policy=eng.scheduling_policy,
            async_scheduling=eng.async_scheduling,
            spec_k=k,
            spec_lookahead=spec is not None and spec.method != "ngram",
            drop_eagle_block=spec is not None and spec.method in ("mtp", "eagle", "eagle3"),
            long_prefill_token_threshold=eng.long_prefill_token_threshold,
            decode_cohort=decode_cohort,
            images_whole=st.spec.images_whole,
            workloads=len(workloads),
            **({} if layout is None else {
                "sw_groups": layout.sliding_groups,
                "sw_block_size": layout.sliding_block_size,
                "sw_window": layout.sliding_window,
                "max_in_flight_tokens": max_in_flight_tokens(eng.max_num_batched_tokens,
                                                             eng.async_scheduling),
            }),
        )
        self.timers = []
        self.replicas = []
        for i in range(replicas):
            replica_rng = np.random.default_rng([seed, 2, i])
            core = EngineCore(cfg, random.Random(int(replica_rng.integers(2**63))), acceptance)
            timer = StepTimer(
                st.profile,
                max_num_seqs=eng.max_num_seqs,
                max_num_batched_tokens=eng.max_num_batched_tokens,
            )
            self.timers.append(timer)
            jitter = mix.simulation.output_jitter_s
            self.replicas.append(Replica(
                self.env, i, core, timer, self.window, self._finished, client_latency_s,
                self.client,
                OutputJitter(jitter, np.random.default_rng([seed, 4, i])) if jitter else None,
                LaunchSpread(np.random.default_rng([seed, 5, i]))
                if mix.simulation.core_spread else None,
                PictureDraws(timer.encoder_draws, np.random.default_rng([seed, 6, i]),
                             timer.encoder_spells)
                if timer.encoder_draws else None,
                LaunchSpread(np.random.default_rng([seed, 7, i])),
            ))
        self.router = Router(st.pool.router, self.replicas)
        self.samplers: dict[int, tuple[ClosedLoopSampler, np.random.Generator]] = {}
        self.watch = (
            MissWatch(workloads, self._expected_measured(), client_latency_s)
            if stop_when_missed else None
        )
        self.stopped = self.env.event()
        self.stopped_by: str | None = None

    def _streams(self) -> list[ArrivalStream]:
        """The open-loop workloads' arrival streams (each call replays them from the start)."""
        return [
            ArrivalStream(
                w, i, self.duration + self.drain, np.random.default_rng([self.seed, 1, i]),
                rate_scale=self.rate_scale, base_dir=self.mix.base_dir,
                batch=self.arrivals.get(i),
            )
            for i, w in enumerate(self.workloads) if not isinstance(w.arrival, ClosedLoop)
        ]

    def _expected_measured(self) -> list[int | None]:
        """Measured requests each workload will create: open-loop ones counted on a replay
        of their arrival streams; None for closed loops (known only at the end)."""
        out: list[int | None] = [None] * len(self.workloads)
        for stream in self._streams():
            n = 0
            batch = stream.next_batch()
            while batch is not None:
                a = batch.arrival_s
                n += int(np.count_nonzero((a >= self.warmup) & (a < self.duration)))
                if len(a) and a[-1] >= self.duration:
                    break
                batch = stream.next_batch()
            out[stream.index] = n
        return out

    def _watch_misses(self) -> Generator[simpy.Event, Any, None]:
        """Look for a certain SLO miss every CHECK_EVERY_S; stop the run when one is found."""
        assert self.watch is not None
        env = self.env
        while True:
            yield env.timeout(CHECK_EVERY_S)
            miss = self.watch.certain_miss(env.now, self.created, self.arrivals_done)
            if miss is not None:
                self.stopped_by = miss
                self.stopped.succeed()
                return

    # -- request making ---------------------------------------------------------------------
    def _request(
        self, wl: int, t: float, prompt: int, out: int, group: int, prefix_tokens: int,
        image: int = 0, user: int = -1,
    ) -> SimRequest:
        w = self.workloads[wl]
        bs = self.bs
        measured = self.warmup <= t < self.duration
        prefix_base = prefix_blocks = pinned = 0
        if group >= 0:
            prefix_blocks = prefix_tokens // bs
            prefix_base = -(((wl << 20) | group) << _GROUP_SHIFT) - 1
        elif group == TARGET_HIT_RATE:
            pinned = prefix_tokens // bs
        out = min(out, self.st.max_model_len - prompt)
        r = SimRequest(
            self.rid, wl, t, prompt, out, priority=w.priority, prefix_base=prefix_base,
            prefix_blocks=prefix_blocks, pinned_blocks=pinned, measured=measured, user=user,
            image_tokens=image,
            images=w.image.images_per_request if image and w.image is not None else 0,
        )
        self.rid += 1
        if measured:
            self.created[wl] += 1
            self.pending += 1
            if self.watch is not None:
                self.watch.add(r)
        return r

    def _submit(self, r: SimRequest, sent: bool = False) -> None:
        """Send `r` (its arrival_s is when the client sends it); the engine sees it
        `latency` later. A single client (`client_send_s` > 0, sim/client.py) sends one
        request at a time: a request due while its loop is busy waits, and its send time is
        when it leaves (the validation harness stamps it so); `sent`: that is settled. A
        request with pictures reaches the engine later by the time they take in the loop
        (`picture_token_s` an image token), and holds the client's loop that long."""
        if self.client is not None and not sent:
            r.arrival_s = self.client.send(r.arrival_s)
        delay = r.arrival_s + self.latency - self.env.now
        if r.image_tokens:  # its pictures are made and taken in before it leaves the loop
            picture = r.image_tokens * self.picture_token_s
            if self.client is not None:
                self.client.hold(r.arrival_s, picture)
            delay += picture
        if delay <= 0:
            self._route(r)
            return
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _: self._route(r))

    def _route(self, r: SimRequest) -> None:
        replica = self.router.route(r)
        if self.route_log is not None:
            self.route_log.append((r.wl, r.rid, replica.index))
        replica.add_request(r)

    def _finished(self, r: SimRequest, replica: Replica, seen: float) -> None:
        """`r` ended; its client read the last token at `seen`."""
        self.router.finished(r, replica)
        if r.measured:
            self.pending -= 1
            self._check_done()
        if r.user >= 0:
            wl, user = r.wl, r.user
            think = self.samplers[wl][0].think_time_s
            at = seen + think  # the user sees the last token `latency` after the engine
            if self.client is not None and not think and at < self.duration:
                # it sends at once, before its client's loop reads on (sim/client.py)
                at = self.client.send(at)
                sent = True
            else:
                sent = False
            if at > self.env.now:
                ev = self.env.timeout(at - self.env.now)
                ev.callbacks.append(lambda _: self._next_closed(wl, user, at, sent))
            else:
                self._next_closed(wl, user, at, sent)

    def _check_done(self) -> None:
        if self.arrivals_done and self.pending == 0 and not self.done.triggered:
            self.done.succeed()

    def _next_closed(self, wl: int, user: int, at: float, sent: bool = False) -> None:
        if at >= self.duration:
            return  # the benchmark's last requests have been sent
        sampler, rng = self.samplers[wl]
        inp, out, group, ptoks, img = sampler.next(rng)
        self._submit(self._request(
            wl, at, int(inp), int(out), int(group), int(ptoks), int(img), user
        ), sent)

    # -- arrival processes ------------------------------------------------------------------
    def _open_loop(self) -> Generator[simpy.Event, Any, None]:
        """Open-loop arrivals of every workload, merged in time order, a chunk at a time."""
        streams = self._streams()
        rows: list[list[tuple[float, int, int, int, int, int]]] = [[] for _ in streams]
        heap: list[tuple[float, int, int]] = []  # (arrival, stream, row), ties by stream

        def refill(k: int) -> None:
            batch = streams[k].next_batch()
            while batch is not None and not len(batch):
                batch = streams[k].next_batch()
            rows[k] = [] if batch is None else list(zip(
                batch.arrival_s.tolist(), batch.input_tokens.tolist(),
                batch.output_tokens.tolist(), batch.prefix_group.tolist(),
                batch.prefix_tokens.tolist(), batch.image_tokens.tolist(), strict=True,
            ))
            if rows[k]:
                heapq.heappush(heap, (rows[k][0][0], k, 0))

        for k in range(len(streams)):
            refill(k)
        env = self.env
        while heap:
            at, k, j = heapq.heappop(heap)
            if at >= self.duration and not self.arrivals_done:
                self.arrivals_done = True
                self._check_done()
            if self.done.triggered:
                return
            if at > env.now:
                yield env.timeout(at - env.now)
            if self.done.triggered:
                return
            _, inp, out, group, ptoks, img = rows[k][j]
            self._submit(self._request(streams[k].index, at, inp, out, group, ptoks, img))
            if j + 1 < len(rows[k]):
                heapq.heappush(heap, (rows[k][j + 1][0], k, j + 1))
            else:
                refill(k)
        if env.now < self.duration:
            yield env.timeout(self.duration - env.now)
        self.arrivals_done = True
        self._check_done()

    def run(self) -> SimResult:
        env = self.env
        user = 0
        for i, w in enumerate(self.workloads):
            if isinstance(w.arrival, ClosedLoop):
                rng = np.random.default_rng([self.seed, 3, i])
                self.samplers[i] = (ClosedLoopSampler(w, i), rng)
                for _ in range(w.arrival.concurrency):
                    self._next_closed(i, user, env.now)
                    user += 1
        env.process(self._open_loop())
        ends = [self.done, env.timeout(self.end_s)]
        if self.watch is not None:
            env.process(self._watch_misses())
            ends.append(self.stopped)
        env.run(until=simpy.AnyOf(env, ends))
        return self._result()

    def _result(self) -> SimResult:
        st, env = self.st, self.env
        self.window.close()
        window = self.duration - self.warmup
        results = [
            summarise(w, rec, self.created[i], window)
            for i, (w, rec) in enumerate(zip(self.workloads, self.recorders, strict=True))
        ]
        n = len(self.replicas)
        elapsed = max(env.now, 1e-9)
        queried = sum(r.core.prompt_tokens_queried for r in self.replicas)
        hit = sum(r.core.prompt_tokens_hit for r in self.replicas)
        blocks = st.num_blocks
        pool = PoolRunResult(
            pool=st.pool.name,
            replicas=n,
            gpus=n * st.pool.tp,
            profile=f"{st.profile.gpu}/{st.profile.model}/{st.profile.key}",
            profile_source=_source(st.profile, text_only=st.pool.engine.text_only,
                                   shared=hit > 0, host=st.pool.host),
            kv_tokens_per_replica=st.kv_tokens,
            duration_s=self.duration,
            warmup_s=self.warmup,
            simulated_s=round(env.now, 6),
            steps=sum(r.steps for r in self.replicas),
            utilisation=sum(r.busy_s for r in self.replicas) / (n * elapsed),
            kv_usage_mean=sum(r.kv_used_block_s for r in self.replicas) / (n * elapsed * blocks),
            kv_usage_peak=max(r.kv_peak_blocks for r in self.replicas) / blocks,
            prefix_hit_rate=hit / queried if queried else 0.0,
            preemptions=sum(r.core.preemptions for r in self.replicas),
            extrapolated_steps=sum(t.extrapolated_steps for t in self.timers),
            output_tokens_per_s=sum(w.output_tokens_per_s for w in results),
            seed=self.seed,
        )
        stopped = self.stopped.triggered
        if self.watch is not None and not stopped:
            for want, got in zip(self.watch.expected, self.created, strict=True):
                if want is not None and want != got:  # the replayed streams must agree
                    raise RuntimeError(f"expected {want} measured requests, created {got}")
        res = SimResult(pool=pool, workloads=results,
                        stopped_at_s=round(env.now, 6) if stopped else None,
                        stopped_by=self.stopped_by if stopped else None)
        res._requests = RequestColumns([w.name for w in self.workloads], self.recorders)
        res._kv_series = KvRows([
            {"replica": rep.index, "time_s": t, "kv_usage": used / blocks, "running": n}
            for rep in self.replicas
            for t, used, n in rep.kv_series
        ])
        return res


def _source(profile: Profile, *, text_only: bool, shared: bool = False,
            host: str = "median") -> str:
    """`measured`, `analytic`, or `measured (<terms>: analytic)` for a measured profile with
    terms its calibration did not measure (profiles.py: _with_encoder) that this pool uses:
    a text-only pool uses neither the vision encoder nor its KV reservation. A measured
    profile without the engine core's time a step (StepModel.core_graph_s,
    core_piecewise_s: neither a serving core trace of its model nor a calibration run that
    timed the core, calibrate/build.py) says so too: its steps charge none. So does one
    without a shared-prefix saving (StepModel.shared_ctx_saving: no prefix-cache engine
    measured it) in a pool whose requests hit the prefix cache (`shared`): it prices the
    context they read in common in full, which on the H100's Llama-3.1-8B BF16, before its
    prefix-cache engine ran, put the ITL p50 of a 90 % shared prefix at 44 req/s at 26.5 ms
    where vLLM took 12.7 (thirty-third session, docs/validation.md). A pool sized on the
    slowest or the fastest traced host (Pool.host) names it, or says the profile traced
    none."""
    terms = () if text_only else profile.provenance.analytic_terms
    parts = [f"{', '.join(terms)}: analytic"] if terms else []
    if host in ("slowest", "fastest"):
        end = profile.traced_host(host)
        whose = (f"the {host} of {len(profile.hosts)} traced hosts' core"
                 if len(profile.hosts) > 1 else "the one traced host's core")
        parts.append(f"{whose}, {end.engine}: "
                     f"{end.core_eager_s * 1e3:.1f} ms a graph-less step, "
                     f"{end.core_graph_s * 1e3:.2f} a decode-only one" if end is not None
                     else f"{host} host: none traced, the profile's core")
        drafter = profile.traced_drafter(host)
        if drafter is not None:
            parts.append(f"the {host} of {len(profile.drafter_hosts)} traced drafters' pace, "
                         f"{drafter.engine}: {drafter.step_s * 1e3:.1f} ms a lone request's "
                         "step")
    elif host == "any":  # capplan size prices each host in turn (solve/choose.py)
        parts.append("host any: the median host's core here; capplan size sizes on each")
    step = profile.step
    if profile.source == "measured" and not (step.core_graph_s or step.core_piecewise_s):
        parts.append("engine core's time: not measured")
    if profile.source == "measured" and shared and not step.shared_ctx_saving:
        parts.append("shared-prefix saving: not measured, none assumed")
    return f"{profile.source} ({'; '.join(parts)})" if parts else profile.source
