"""One replica in simulated time: the engine-core loop of vLLM 0.26.0 around `EngineCore`.

vllm/v1/engine/core.py (EngineCore.step_with_batch_queue): with async scheduling the core
keeps two steps in flight: it schedules step n+1 while step n runs on the GPU, and
processes step n's output when n ends, before scheduling n+2. So a request that arrives
while step n runs joins step n+2, tokens stream out at the end of the step that made them,
and the CPU's scheduling time hides under the GPU's. Without async scheduling (EngineCore.step)
the core schedules, runs and processes one step at a time.

Step durations come from the profile's step-time model (`StepTimer`), which was fitted to
completion-to-completion gaps of the real engine in exactly this mode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT

from capplan.profile import StepTimer
from capplan.sim.core import EngineCore, SimRequest, StepPlan
from capplan.sim.metrics import StepGaps, WorkloadRecorder


class Window:
    """The measurement window [start_s, end_s) and where measured figures go."""

    __slots__ = ("end_s", "recorders", "start_s", "steps")

    def __init__(self, start_s: float, end_s: float, recorders: list[WorkloadRecorder]) -> None:
        self.start_s = start_s
        self.end_s = end_s
        self.recorders = recorders
        self.steps = StepGaps(recorders)  # the decode cohort's figures (`close` adds them)

    def close(self) -> None:
        """Add the decode cohort's buffered window tokens to the recorders (its ITL gaps go
        into the histograms whenever they flush, as add_repeated's would)."""
        self.steps.fold_tokens()


class _StepEnd:
    """The end of an engine step, in the simpy queue: what `Environment.step` needs of an event
    (callbacks, _ok, _value) and nothing else. A replica waits for it with a callback, not as
    a simpy process: no Timeout and no generator to resume each step, the same events in the
    same order (one scheduled event a step, as `yield env.timeout(dt)` had)."""

    __slots__ = ("_ok", "_value", "callbacks")

    def __init__(self, callback: Callable[[Any], None]) -> None:
        self.callbacks = [callback]
        self._ok = True
        self._value = None


class Replica:
    """A vLLM engine in a simpy environment."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        core: EngineCore,
        timer: StepTimer,
        window: Window,
        on_finish: Callable[[SimRequest, Replica], None],
        client_latency_s: float = 0.0,
    ) -> None:
        self.env = env
        self.latency = client_latency_s  # outputs reach the client this much later
        self.index = index
        self.core = core
        self.timer = timer
        self.window = window
        self.on_finish = on_finish
        self.outstanding = 0
        self.steps = 0
        self.busy_s = 0.0
        self.kv_used_block_s = 0.0  # integral of used blocks over time
        self.kv_peak_blocks = 0
        self.kv_series: list[tuple[float, int, int]] = []  # (time, used blocks, running), 1/s
        self._next_sample_s = 0.0
        self._wake: simpy.Event | None = None
        self._inflight: deque[StepPlan] = deque()
        self._async = core.cfg.async_scheduling
        self._dt = 0.0  # the step in flight: its duration and the KV blocks used during it
        self._used = 0
        self._ended = self._step_end
        # the engine loop starts when simpy would start a process made now (an URGENT event)
        env.schedule(_StepEnd(self._start), URGENT)  # type: ignore[arg-type]

    def add_request(self, r: SimRequest) -> None:
        self.outstanding += 1
        self.core.add_request(r)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- the engine loop, as callbacks: _advance up to a step's end, _step_end after it ------

    def _start(self, _event: object) -> None:
        self._advance()

    def _woken(self, _event: object) -> None:
        self._wake = None
        self._advance()

    def _advance(self) -> None:
        """Schedule (with async scheduling, up to two steps in flight) and run the step first
        in flight until its end; or, with nothing to do, wait for a request."""
        env, core = self.env, self.core
        inflight = self._inflight
        while not inflight:
            core.now = env.now
            plan = core.schedule() if core.has_work else None
            if plan is not None and plan.empty and plan.preempted:
                continue  # a step that only preempted: vLLM's busy loop schedules again
            if plan is None or plan.empty:
                self._wake = env.event()
                self._wake.callbacks.append(self._woken)
                return
            inflight.append(plan)
        core.now = env.now
        # (core.has_work, plan.empty and kv.num_used written out: this runs every step)
        if self._async and len(inflight) < 2 and (core.running or core._fcfs or core._heap):
            ahead = core.schedule()
            if ahead.reqs or ahead.cohort_size:
                inflight.append(ahead)
        cur = inflight[0]
        seqs = len(cur.reqs) + cur.cohort_size
        self._dt = dt = self.timer.step_time_s(
            cur.total_tokens,
            seqs,
            cur.prefill_attn,
            cur.decode_ctx,
            cur.encoder_tokens,
            decode_seqs=seqs - cur.prefill_seqs,
            prefill_attn_window=cur.prefill_attn_w,
            shared_ctx=int(cur.shared_ctx),
        )
        kv = core.kv
        self._used = kv.num_blocks - kv.free_unhashed - kv.free_cached
        env.schedule(_StepEnd(self._ended), NORMAL, dt)  # type: ignore[arg-type]

    def _step_end(self, _event: object) -> None:
        """The step first in flight has ended: its outputs, then the next step."""
        env, core = self.env, self.core
        now = env.now
        dt, used = self._dt, self._used
        self.steps += 1
        self.busy_s += dt
        self.kv_used_block_s += used * dt
        if used > self.kv_peak_blocks:
            self.kv_peak_blocks = used
        if now >= self._next_sample_s:
            self.kv_series.append((now, used, len(core.running)))
            self._next_sample_s = now + 1.0
        cur = self._inflight.popleft()
        core.now = now
        emitted = core.update_from_output(cur)
        if emitted:
            self._emit(emitted, now)
        if cur.cohort_size:
            self._emit_cohort(cur, dt, now)
        self._advance()

    def _emit_cohort(self, plan: StepPlan, dt: float, now: float) -> None:
        """Tokens of the decode cohort's implicit members: one each, all after a gap of
        exactly this step (every member also received a token at the end of the last)."""
        window = self.window
        steps = window.steps
        if window.start_s <= now < window.end_s:
            steps.tokens.extend(plan.cohort_all)
        steps.dt.append(dt)
        steps.counts.extend(plan.cohort_meas)  # ITL: each measured member saw a gap of dt
        if len(steps.dt) >= steps.check_at:
            steps.fold()

    def _finish(self, r: SimRequest, rec: WorkloadRecorder, seen: float) -> None:
        """A request's last token reached the client at `seen`: its row, and the router."""
        self.outstanding -= 1
        if r.measured:
            rec.add_request(
                r.arrival_s,
                r.first_token_s + self.latency - r.arrival_s,
                seen - r.arrival_s,
                max(r.scheduled_s, r.arrival_s) - r.arrival_s,
                r.prompt,
                r.out,
                r.cached_tokens,
                r.preemptions,
                self.index,
            )
        self.on_finish(r, self)

    def _emit(self, emitted: list[tuple[SimRequest, int, bool]], now: float) -> None:
        """Stream tokens to clients: TTFT, ITL and completion, as vllm bench sees them (the
        client sees each token `latency` after the step that made it ends)."""
        window = self.window
        seen = now + self.latency
        in_window = window.start_s <= now < window.end_s
        recorders = window.recorders
        # per workload: tokens in the window and ITL gaps, handed over after the loop (one
        # step's outputs of ~100 requests: the bookkeeping stays out of the loop)
        tokens = [0] * len(recorders)
        gaps: list[list[float]] = [[] for _ in recorders]
        for r, new, done in emitted:
            wl = r.wl
            tokens[wl] += new
            if r.first_token_s < 0:
                r.first_token_s = now
                if in_window:
                    recorders[wl].input_tokens_in_window += r.prompt
            elif r.measured:
                gaps[wl].append(now - r.last_token_s)
            r.last_token_s = now
            if done:
                self._finish(r, recorders[wl], seen)
        for rec, n, xs in zip(recorders, tokens, gaps, strict=True):
            if in_window:
                rec.output_tokens_in_window += n
            if xs:
                rec.itl.add_many(xs)
