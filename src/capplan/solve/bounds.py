"""Analytic brackets for the replica search, and SLOs no replica count can meet.

Every figure here comes from the pool's step model, so it agrees with what the simulator
charges: a token processed costs at least `per_token_s` (GEMMs above the knee) plus its
attention, and a request holds KV for at least its unloaded end-to-end time (Little's law).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from capplan.sim.run import PoolSetup
from capplan.sim.workload import offered_rate_rps
from capplan.steptime import StepTimer, window_pairs
from capplan.traffic import ClosedLoop, ReplayArrival, SloTarget, Workload

_SAMPLES = 20_000


def _timer(st: PoolSetup) -> StepTimer:
    eng = st.pool.engine
    return StepTimer(
        st.profile, max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens
    )


def cached_fraction(w: Workload) -> float:
    """The largest share of a prompt the prefix cache can serve (optimistic: every group warm)."""
    p = w.prefix
    if p is None or w.input_tokens is None:
        return 0.0
    if p.target_hit_rate is not None:
        return p.target_hit_rate
    if p.shared_fraction is not None:
        return p.shared_fraction
    assert p.shared_tokens is not None
    return min(p.shared_tokens / w.mean_input_tokens, 1.0)


def prefill_time_s(st: PoolSetup, prompt_tokens: float) -> float:
    """Seconds one request's prefill takes alone: chunks of max_num_batched_tokens, each step
    attending to the chunks before it (vllm/v1/core/sched/scheduler.py: chunked prefill)."""
    timer = _timer(st)
    chunk_max = st.pool.engine.max_num_batched_tokens
    window = st.profile.step.window_tokens
    left, ctx, t = max(int(prompt_tokens), 1), 0, 0.0
    while left > 0:
        c = min(left, chunk_max)
        t += timer.step_time_s(c, 1, c * (ctx + c / 2), 0, decode_seqs=0,
                               prefill_attn_window=window_pairs(c, ctx, window))
        ctx += c
        left -= c
    return t


def decode_step_s(st: PoolSetup, seqs: int, context_tokens: float) -> float:
    """One decode step of `seqs` sequences, each attending to `context_tokens`."""
    k = st.profile.spec_k
    return _timer(st).step_time_s(seqs * (1 + k), seqs, 0.0, int(seqs * context_tokens))


def _quantile(w: Workload, q: float) -> float:
    assert w.input_tokens is not None
    x = w.input_tokens.sample(np.random.default_rng(0), _SAMPLES)
    extra = w.mean_input_tokens - w.input_tokens.mean  # image tokens
    return float(np.percentile(x, q)) + extra


def slo_floor(st: PoolSetup, w: Workload, t: SloTarget) -> tuple[float, str] | None:
    """The least value `t`'s metric can take at any replica count, and why; None if unknown.

    TTFT at percentile p is at least one prefill of the p-th percentile prompt (uncached part);
    ITL is at least one batch-1 decode step (not bounded with speculative decoding, whose
    tokens arrive in bursts)."""
    if isinstance(w.arrival, ReplayArrival) or w.input_tokens is None:
        return None
    if t.metric == "ttft":
        prompt = _quantile(w, t.percentile) * (1 - cached_fraction(w))
        floor = prefill_time_s(st, prompt)
        return floor, (
            f"one prefill of {prompt:.0f} uncached tokens (p{t.percentile:g} prompt) alone "
            f"takes {floor:.3g} s"
        )
    if t.metric in ("itl", "tpot") and st.profile.spec_k == 0:
        floor = decode_step_s(st, 1, w.mean_input_tokens)
        return floor, f"one decode step at batch 1 alone takes {floor:.3g} s"
    return None


def infeasible_reason(st: PoolSetup, w: Workload, t: SloTarget) -> str | None:
    """Why `t` cannot be met at any replica count, from the step model alone; None if it can."""
    found = slo_floor(st, w, t)
    return found[1] if found and t.limit_s < found[0] else None


@dataclass(frozen=True, slots=True)
class Bracket:
    """Analytic replica counts: `lower` is a floor no simulation can beat (work and KV), and
    `estimate` where the search starts (the work bound at a realistic utilisation)."""

    lower: int
    estimate: int
    busy_replicas: float  # replica-seconds of GPU work per second of traffic (closed incl.)
    kv_replicas: float  # replicas' KV needed to hold the concurrency of Little's law
    seq_replicas: float  # replicas' max_num_seqs needed for that concurrency

    def describe(self) -> str:
        return (
            f"work {self.busy_replicas:.2f}, KV {self.kv_replicas:.2f}, "
            f"seqs {self.seq_replicas:.2f} replicas"
        )


TARGET_UTILISATION = 0.8
"""Where the search starts: the work bound at 80 % busy (queueing needs slack for tails)."""


def rate_of(w: Workload, st: PoolSetup, rate_scale: float, base_dir: object) -> float:
    """Requests per second: offered (open loop) or users / unloaded cycle time (closed loop)."""
    arr = w.arrival
    if isinstance(arr, ClosedLoop):
        return arr.concurrency / (arr.think_time_s + unloaded_e2e_s(st, w))
    rate = offered_rate_rps(w, base_dir=base_dir)  # type: ignore[arg-type]
    assert rate is not None
    return rate * rate_scale


def unloaded_e2e_s(st: PoolSetup, w: Workload) -> float:
    """A mean request's end-to-end time alone on a replica."""
    if w.input_tokens is None or w.output_tokens is None:
        return 1.0
    inp = w.mean_input_tokens
    uncached = inp * (1 - cached_fraction(w))
    per_tok = _tokens_per_step(st)
    return prefill_time_s(st, uncached) + (w.mean_output_tokens - 1) * decode_step_s(
        st, 1, inp
    ) / per_tok


def _tokens_per_step(st: PoolSetup) -> float:
    """Output tokens a sequence gains per decode step (spec decode: 1 + expected accepted)."""
    k = st.profile.spec_k
    sc = st.pool.engine.speculative
    if not k or sc is None:
        return 1.0
    a = sc.acceptance
    return (1 - a ** (k + 1)) / (1 - a)


def bracket(
    st: PoolSetup, workloads: list[Workload], *, rate_scale: float = 1.0, base_dir: object = None
) -> Bracket:
    """Lower bound and starting estimate of the replicas `workloads` need on this pool.

    Closed-loop users only count towards the estimate: their rate falls as latency grows,
    so the unloaded rate used here is an upper bound, not a floor."""
    s = st.profile.step
    # a floor: the cheaper of the two KV-read rates a decode can pay (steptime.py)
    ctx_rate = min(s.decode_ctx_s, s.graph_ctx_s) if s.graph_offset_s else s.decode_ctx_s
    floor = [0.0, 0.0, 0.0]  # open-loop work, KV tokens (blocks: sliding-window), sequences
    closed_busy = 0.0
    layout = st.layout
    for w in workloads:
        if w.input_tokens is None or w.output_tokens is None:
            continue  # replay: lengths only known from the trace; the search still covers it
        rate = rate_of(w, st, rate_scale, base_dir)
        inp, out = w.mean_input_tokens, w.mean_output_tokens
        cached = inp * cached_fraction(w)
        fresh = inp - cached
        decode_tokens = out * (1 + st.profile.spec_k) / _tokens_per_step(st)
        work = (fresh + decode_tokens) * s.per_token_s
        work += fresh * (cached + fresh / 2) * s.prefill_attn_s
        work += out * (inp + out / 2) * ctx_rate / _tokens_per_step(st)
        if isinstance(w.arrival, ClosedLoop):
            closed_busy += rate * work
            continue
        concurrency = rate * unloaded_e2e_s(st, w)
        floor[0] += rate * work
        held = fresh + out / 2
        if layout is None:
            floor[1] += concurrency * held
        else:
            # the pool's blocks a request of that length holds at least: its full-attention
            # blocks and, in every sliding group, no more than its window
            floor[1] += concurrency * (
                held / layout.full_block_size
                + layout.sliding_groups * min(held, layout.sliding_window)
                / layout.sliding_block_size)
        floor[2] += concurrency
    busy = floor[0]
    kv_r = floor[1] / max(st.kv_tokens if layout is None else st.num_blocks, 1)
    seq_r = floor[2] / st.pool.engine.max_num_seqs
    lower = max(1, math.ceil(max(busy, kv_r, seq_r) - 1e-9))
    estimate = max(lower, math.ceil((busy + closed_busy) / TARGET_UTILISATION))
    return Bracket(lower, estimate, busy + closed_busy, kv_r, seq_r)


def tail_e2e_s(st: PoolSetup, workloads: list[Workload], q: float = 99.0) -> float:
    """A healthy pool's time for a request of q-th percentile prompt and output (batch of 64
    decoding alongside): how long a probe waits past its window for stragglers. Requests
    longer than that count as late, which moves a p99 by at most their share of the tail."""
    worst = 1.0
    rng = np.random.default_rng(0)
    for w in workloads:
        if w.input_tokens is None or w.output_tokens is None:
            continue
        batch = min(st.pool.engine.max_num_seqs, 64)
        out = float(np.percentile(w.output_tokens.sample(rng, _SAMPLES), q))
        t = prefill_time_s(st, _quantile(w, q)) + out * decode_step_s(
            st, batch, w.mean_input_tokens
        ) / _tokens_per_step(st)
        worst = max(worst, t)
    return worst
