"""One replica in simulated time: the engine-core loop of vLLM 0.26.0 around `EngineCore`.

vllm/v1/engine/core.py (EngineCore.step_with_batch_queue): with async scheduling the core
keeps two steps in flight. It schedules a step and launches it, and while the batch queue
has room it schedules the next one at once, without waiting for the GPU; with the queue
full it waits for the oldest step, processes its output (the tokens stream out then) and
schedules again. So a request that arrives while step n runs joins step n+2, and the CPU's
scheduling time hides under the GPU's. Without async scheduling (EngineCore.step) the core
schedules, runs and processes one step at a time.

Launching is not free: the core spends `launch` seconds on every step (StepTimer.step_times)
scheduling it, preparing its inputs, launching its kernels and sampling
(vllm/v1/worker/gpu/model_runner.py execute_model, sample_tokens): a decode-only step
replays one full CUDA graph (the profile's `core_graph_s`, 3.0 ms for Llama-3.1-8B on the
H200 host measured), a step with a prefill chunk runs piecewise graphs and launches its
attention layer by layer (`core_piecewise_s`, 12.7 ms), and a step past the largest CUDA
graph runs without one (`eager_floor_s`). Meanwhile the core can neither schedule nor hand
out the output of the step before, requests that arrive meanwhile wait for the next
schedule, and the GPU cannot finish the step before its launch has. So a request that
arrives at an idle engine gets its first token only after the core has also launched the
step after its prefill (docs/validation.md, "Where the engine core's time goes"). That is
what keeps a closed-loop wave together: measured on the H200, a wave's requests, sent
0.2-0.6 ms apart, land in the steps the simulator puts them in, wave after wave
(docs/validation.md).

Step durations come from the profile's step-time model (`StepTimer`), which was fitted to
completion-to-completion gaps of the real engine in exactly this mode: a run of steps takes
the larger of a step's work and its launch each. The launch is the core's median time for
such a step; the serving core's own time varies from step to step (its core traces:
ln(p90 / p10) / 2.563 = 0.10-0.17 for decode-only steps, 0.14-0.24 for piecewise ones,
0.20-0.27 past the largest graph),
and with `simulation.core_spread` each step's launch is drawn as the median x exp(sigma z)
(LaunchSpread, `StepTimer.launch_sigma`). Without asynchronous scheduling the core schedules,
launches, waits for the step's tokens and updates from them in turn (vllm/v1/engine/core.py
EngineCore.step), so its own time a step adds to the step's (`StepTimer.serial_core_s`).
A step that encodes a picture pays one of the profile's measured picture steps around the
encoder's pass, drawn in the replica's own slow and fast spells (PictureDraws).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT

from capplan.sim.client import ClientLoop, OutputJitter
from capplan.sim.core import EngineCore
from capplan.sim.metrics import StepGaps, WorkloadRecorder
from capplan.sim.request import SimRequest, StepPlan
from capplan.steptime import StepTimer
from capplan.tiles import blocks_of

INPUT_S = 0.15e-3
INPUT_TOKEN_S = 0.3e-6
"""The engine core process's input thread (vllm/v1/engine/core.py process_input_sockets)
decodes each arriving request and builds it (EngineCore.preprocess_add_request: the
Request and its prompt's block hashes) in about INPUT_S + INPUT_TOKEN_S per prompt token,
holding the GIL: measured by the core traces of the thirteenth session, 0.21-0.30 ms for a
512-token prompt and 0.46-0.76 ms for a 2,048-token one (scripts/validation_analysis.py
core). While the core's own loop is busy launching a step, it loses that time to the
thread, so a wave that arrives during the launch of its first requests' step holds that
launch until the wave is decoded, and the rest of the wave joins one step, as the engine's
waves do (docs/validation.md, "Where the engine core's time goes"). While the core waits
for the GPU, the GIL is free and arrivals cost it nothing."""

TILE_EXACT_SEQS = 8
TILE_REFRESH_STEPS = 16
"""A decode-only step of up to TILE_EXACT_SEQS sequences takes F (FlashAttention's last
wave, steptime.StepTimer.tail_factor) of its own lengths; a larger one takes the last F
taken while the batch keeps that step's size (past 4 x TILE_EXACT_SEQS, stays within an
eighth of it), for up to TILE_REFRESH_STEPS steps. F walks every tile of the step (eight a
sequence, or more: tiles.py), and a large batch changes a block count almost every step, so
the exact F would cost the simulator most of its time there (2.6x the time of `capplan size
--traffic examples/which-gpu.yaml`); its lengths' mix moves slowly."""

ENGINE_WAKE_S = 0.13e-3
"""From the input thread's end of decoding the first request that reaches an idle engine
core to the schedule that takes it: the busy loop sleeps in its input queue's blocking get
(vllm/v1/engine/core.py run_busy_loop, _process_input_queue), wakes when the thread has
queued the request, and drains whatever has arrived by then. Measured by the core traces of
the thirteenth session: 0.10-0.17 ms at concurrency 1, 0.09-0.17 ms after a wave's last
request (scripts/validation_analysis.py core). So an idle core schedules `idle_wake_s` after
a request reaches it: 0.43 ms for a 512-token prompt, 0.89 ms for a 2,048-token one, where
a fixed 0.75 ms had been fitted to the suite's first waves before the core was traced (the
engine's own first step varies from run to run, 1 to 16 requests across the suite: `band`
in scripts/validation_analysis.py shows what that does to a row)."""


def idle_wake_s(prompt_tokens: int) -> float:
    """Seconds from a request's arrival at an idle engine core to the schedule that takes
    it: the input thread's time on it (INPUT_S) and the core's wake (ENGINE_WAKE_S)."""
    return INPUT_S + INPUT_TOKEN_S * prompt_tokens + ENGINE_WAKE_S

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


class LaunchSpread:
    """Each step's core time about its median: a factor exp(sigma z), z standard normal,
    drawn a step at a time from the replica's own stream (the median is kept)."""

    __slots__ = ("_at", "_buf", "_rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._buf: list[float] = []
        self._at = 0

    def factor(self, sigma: float) -> float:
        if self._at == len(self._buf):
            self._buf = self._rng.standard_normal(4096).tolist()
            self._at = 0
        self._at += 1
        return math.exp(sigma * self._buf[self._at - 1])


class PictureDraws:
    """What each step that encodes a picture costs around the encoder's pass: one of the
    profile's measured steps (StepModel.encoder_step_draws_s), drawn from the replica's own
    stream. Where the profile measured how long the slow and fast spells last
    (`encoder_slow_spell_s`, `encoder_fast_spell_s`), the replica is in one or the other,
    each lasting an exponential time of that mean, starting in the slow one as often as the
    spells' lengths say, and draws among that spell's steps (those past, or not past,
    `encoder_slow_above_s`): a burst of pictures meets one spell, as served."""

    __slots__ = ("_fast", "_means", "_rng", "_slow", "_slow_now", "_until")

    def __init__(self, draws: tuple[float, ...], rng: np.random.Generator,
                 spells: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        above, slow_s, fast_s = spells
        self._rng = rng
        self._slow = tuple(d for d in draws if d > above)
        self._fast = tuple(d for d in draws if d <= above)
        self._means = (fast_s, slow_s)
        if not (slow_s and fast_s and self._slow and self._fast):  # drawn on their own
            self._slow, self._fast, self._means = draws, draws, (math.inf, math.inf)
        self._slow_now = bool(rng.random() < slow_s / (slow_s + fast_s)) if slow_s else False
        self._until = float(rng.exponential(self._means[self._slow_now]))

    def draw(self, now: float) -> float:
        while self._until <= now:
            self._slow_now = not self._slow_now
            self._until += float(self._rng.exponential(self._means[self._slow_now]))
        pool = self._slow if self._slow_now else self._fast
        return pool[int(self._rng.integers(len(pool)))]


class Replica:
    """A vLLM engine in a simpy environment."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        core: EngineCore,
        timer: StepTimer,
        window: Window,
        on_finish: Callable[[SimRequest, Replica, float], None],
        client_latency_s: float = 0.0,
        client: ClientLoop | None = None,
        jitter: OutputJitter | None = None,
        spread: LaunchSpread | None = None,
        pictures: PictureDraws | None = None,
        eager_draws: LaunchSpread | None = None,
    ) -> None:
        self.env = env
        self.spread = spread  # each step's core time about its median, or the median
        # the core's time on steps past the largest CUDA graph, where the profile measured it
        # apart from the GPU's span (StepTimer.eager_spread): drawn
        self.draws = eager_draws or LaunchSpread(np.random.default_rng(index))
        self.pictures = pictures  # a picture's step around its pass, drawn, or the median
        self.latency = client_latency_s  # outputs reach the client this much later
        self.client = client  # one load generator's event loop (sim/client.py), or none
        self.jitter = jitter  # the output path's delay, a step at a time (sim/client.py)
        self._read = client is not None or jitter is not None  # _emit_read, not _emit
        self._cohort_lag = 0.0  # how late the client read the decode cohort's last tokens
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
        self._idle = False  # nothing in flight or to do: the core waits for a request
        # steps in flight, oldest first: (plan, when it ends, its time on the GPU, KV blocks
        # in use while it runs)
        self._inflight: deque[tuple[StepPlan, float, float, int]] = deque()
        self._async = core.cfg.async_scheduling
        # without asynchronous scheduling the core's own time a step is serial with the GPU's
        self._serial = 0.0 if self._async else timer.serial_core_s
        # FlashAttention's last wave on a decode-only step, where the profile prices it: F of
        # the step's own lengths (steptime.py, tiles.py)
        self._tiles = timer.tiles is not None
        self._tile = (0, 0, 1.0)  # the last F taken: (sequences, steps since, F)
        self._gpu_free = 0.0  # when the GPU ends the last step launched
        self._core_free = 0.0  # when the core ends launching the last step (INPUT_S)
        self._last_out = 0.0  # when the core last handed out a step's outputs
        self._ended = self._step_end
        # the engine loop starts when simpy would start a process made now (an URGENT event)
        env.schedule(_StepEnd(self._start), URGENT)  # type: ignore[arg-type]

    def add_request(self, r: SimRequest) -> None:
        self.outstanding += 1
        self.core.add_request(r)
        decode = INPUT_S + INPUT_TOKEN_S * r.prompt  # the input thread's time on it
        if self._core_free > self.env.now:  # the input thread takes the GIL from a launch
            self._core_free += decode
            inflight = self._inflight
            if inflight and inflight[-1][1] < self._core_free:  # its GPU waits for it
                plan, _end, _dt, used = inflight[-1]
                begin = _end - _dt
                inflight[-1] = (plan, self._core_free, self._core_free - begin, used)
                self._gpu_free = self._core_free
        if self._idle:  # the first arrival at an idle core: it schedules a bit later
            self._idle = False
            self.env.schedule(_StepEnd(self._woken), NORMAL,  # type: ignore[arg-type]
                              decode + ENGINE_WAKE_S)  # idle_wake_s(r.prompt)

    # -- the engine loop, as callbacks: _advance while the core is free, _step_end after a
    # -- step's outputs are processed --------------------------------------------------------

    def _tail_factor(self, plan: StepPlan, seqs: int) -> float:
        """F of a decode-only step (StepTimer.tail_factor) from its sequences' lengths; past
        TILE_EXACT_SEQS sequences, the last one taken while the batch keeps its size then
        (past 4 x TILE_EXACT_SEQS, within an eighth of it), for up to TILE_REFRESH_STEPS steps
        (a large batch's mix of lengths moves slowly, and F is costly there: an evaluation
        shortcut, docs/simulator.md)."""
        n, age, f = self._tile
        # a batch a sequence larger or smaller makes 8 tiles more or fewer (a KV head's),
        # which at 32 sequences or fewer can cross a wave: there only the same size reuses F
        near = seqs == n or (n > 4 * TILE_EXACT_SEQS and abs(seqs - n) * 8 <= n)
        if seqs > TILE_EXACT_SEQS and near and age < TILE_REFRESH_STEPS:
            self._tile = (n, age + 1, f)
            return f
        f = self.timer.tail_factor(blocks_of(self.core.decode_contexts(plan)))
        self._tile = (seqs, 0, f)
        return f

    def _start(self, _event: object) -> None:
        self._advance()

    def _woken(self, _event: object) -> None:
        if self._core_free > self.env.now:  # arrivals lengthened the launch (INPUT_S)
            self.env.schedule(_StepEnd(self._woken), NORMAL,  # type: ignore[arg-type]
                              self._core_free - self.env.now)
            return
        self._advance()

    def _advance(self) -> None:
        """The core is free now: schedule and launch steps while the batch queue has room
        (two with async scheduling, one without), then wait for the oldest step's output;
        with nothing in flight and nothing to do, wait for a request.

        vllm/v1/engine/core.py step_with_batch_queue: a step is launched as soon as it is
        scheduled, and the core schedules the next one without waiting for the GPU while
        the queue has room, but only once it has launched this one: every step keeps the
        core `launch` seconds (StepTimer.step_times), and requests that arrive meanwhile
        join the next step. The GPU runs the launched steps in order; the
        core hands out a step's outputs when the step has ended and the core is free again.
        """
        env, core = self.env, self.core
        inflight = self._inflight
        now = env.now
        limit = 2 if self._async else 1
        while len(inflight) < limit and (core.running or core._fcfs or core._heap):
            core.now = now
            plan = core.schedule()
            if plan.empty:
                if plan.preempted and not inflight:
                    continue  # a step that only preempted: vLLM's busy loop schedules again
                # With a step in flight (async scheduling), the empty step still takes the
                # batch queue's other slot, so the core waits for the oldest step's output
                # before it schedules again (core.py step_with_batch_queue)
                break
            seqs = len(plan.reqs) + plan.cohort_size
            factor = 1.0
            if self.timer.eager_spread and self.timer.eager(plan.total_tokens):
                # the core's own time on a step past the largest CUDA graph, measured apart
                # from the GPU's span with its spread under load: drawn every such step
                factor = self.draws.factor(self.timer.eager_spread)
            elif self.spread is not None:
                sigma = self.timer.launch_sigma(plan.total_tokens, plan.prefill_seqs > 0)
                if sigma:
                    factor = self.spread.factor(sigma)
            draft = 1.0
            if self.timer.draft_spread:  # the drafter's pass, the host's moment (steptime.py)
                draft = self.draws.factor(self.timer.draft_spread)
            tile = None
            if self._tiles and not plan.prefill_seqs and not plan.encoder_tokens and seqs:
                tile = self._tail_factor(plan, seqs)
            work, launch = self.timer.step_times(
                plan.total_tokens,
                seqs,
                plan.prefill_attn,
                plan.decode_ctx,
                plan.encoder_tokens,
                decode_seqs=seqs - plan.prefill_seqs,
                prefill_attn_window=plan.prefill_attn_w,
                shared_ctx=int(plan.shared_ctx),
                encoder_images=plan.encoder_images,
                encoder_step_s=(self.pictures.draw(now)
                                if plan.encoder_tokens and self.pictures is not None else None),
                launch_factor=factor,
                draft_factor=draft,
                tile_factor=tile,
            )
            if self._serial:
                work += self._serial
                launch += self._serial
            begin = self._gpu_free if self._gpu_free > now else now
            end = begin + work
            if end < now + launch:
                end = now + launch
            kv = core.kv
            inflight.append((plan, end, end - begin,
                             kv.num_blocks - kv.free_unhashed - kv.free_cached))
            self._gpu_free = end
            if launch:
                now += launch
                self._core_free = now
                if len(inflight) < limit:  # the core schedules again once it has launched
                    env.schedule(_StepEnd(self._woken), NORMAL, now - env.now)  # type: ignore[arg-type]
                    return
        if inflight:
            at = inflight[0][1]
            env.schedule(_StepEnd(self._ended), NORMAL,  # type: ignore[arg-type]
                         (at if at > now else now) - env.now)
            return
        self._idle = True

    def _step_end(self, _event: object) -> None:
        """The oldest step in flight has ended and the core is free: its outputs, then the
        engine loop."""
        env, core = self.env, self.core
        now = env.now
        if self._core_free > now:  # arrivals lengthened the launch (INPUT_S)
            env.schedule(_StepEnd(self._ended), NORMAL, self._core_free - now)  # type: ignore[arg-type]
            return
        cur, _end, dt, used = self._inflight.popleft()
        self.steps += 1
        self.busy_s += dt
        self.kv_used_block_s += used * dt
        if used > self.kv_peak_blocks:
            self.kv_peak_blocks = used
        if now >= self._next_sample_s:
            self.kv_series.append((now, used, len(core.running)))
            self._next_sample_s = now + 1.0
        core.now = now
        emitted = core.update_from_output(cur)
        if not self._read:
            if emitted:
                self._emit(emitted, now)
            if cur.cohort_size:
                self._emit_cohort(cur, now - self._last_out, now)
        else:
            # the step's outputs reach the client `latency` later, plus the output path's
            # delay; the client reads them when its loop is free (sim/client.py)
            arrive = now + self.latency
            if self.jitter is not None:
                arrive += self.jitter.draw()
            if emitted:
                self._emit_read(emitted, now, arrive)
            if cur.cohort_size:
                client = self.client
                lag = (arrive if client is None else client.read(arrive)) - now - self.latency
                self._emit_cohort(cur, now - self._last_out + lag - self._cohort_lag, now)
                self._cohort_lag = lag
        self._last_out = now
        self._advance()

    def _emit_cohort(self, plan: StepPlan, dt: float, now: float) -> None:
        """Tokens of the decode cohort's implicit members: one each, all after a gap of
        `dt`, this step (every member also received a token at the end of the last; with a
        client loop, also how much later the client read this step's tokens than the last's)."""
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
                r.first_seen_s - r.arrival_s,
                seen - r.arrival_s,
                max(r.scheduled_s, r.arrival_s) - r.arrival_s,
                r.prompt,
                r.out,
                r.cached_tokens,
                r.preemptions,
                self.index,
            )
        self.on_finish(r, self, seen)

    def _emit(self, emitted: list[tuple[SimRequest, int, bool]], now: float) -> None:
        """Stream tokens to clients: TTFT, ITL and completion, as vllm bench sees them (the
        client sees each token `latency` after the step that made it ends, or when its loop
        is free: sim/client.py, `_emit_read`)."""
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
                r.first_seen_s = seen
                if in_window:
                    recorders[wl].input_tokens_in_window += r.prompt
            elif r.measured:
                gaps[wl].append(now - r.last_token_s)
            r.last_token_s = now
            if done:
                self._finish(r, recorders[wl], seen)
        _hand_over(recorders, tokens, gaps, in_window)

    def _emit_read(self, emitted: list[tuple[SimRequest, int, bool]], now: float,
                   arrive: float) -> None:
        """`_emit` for tokens that reach the client at `arrive` (the output path's delay
        included) and are read through its event loop, if it has one (sim/client.py): in
        output order, each when the loop is free, and a user whose request ends sends its
        next one (Run._finished) before the loop reads on. A token's gap runs from when the
        last one was read: that one's own lag (`lag`, at engine time `lag_at`), or, had the
        decode cohort emitted it since, the cohort's. Kept apart from `_emit`, which sizing
        runs and which has no lag to track: one loop for both, with lags of 0, ran
        `scripts/bench_sim.py` about 3.5 % slower (median of five runs each)."""
        client, lat = self.client, self.latency
        window = self.window
        in_window = window.start_s <= now < window.end_s
        recorders = window.recorders
        tokens = [0] * len(recorders)
        gaps: list[list[float]] = [[] for _ in recorders]
        for r, new, done in emitted:
            wl = r.wl
            tokens[wl] += new
            seen = arrive if client is None else client.read(arrive)
            if r.first_token_s < 0:
                r.first_token_s = now
                r.first_seen_s = seen
                if in_window:
                    recorders[wl].input_tokens_in_window += r.prompt
            elif r.measured:
                lag = r.lag if r.lag_at == r.last_token_s else self._cohort_lag
                gaps[wl].append(seen - (r.last_token_s + lat + lag))
            r.last_token_s = now
            r.lag, r.lag_at = seen - now - lat, now
            if done:
                self._finish(r, recorders[wl], seen)
        _hand_over(recorders, tokens, gaps, in_window)


def _hand_over(recorders: list[WorkloadRecorder], tokens: list[int], gaps: list[list[float]],
               in_window: bool) -> None:
    """One step's tokens and ITL gaps, per workload, to its recorder (after the step's loop:
    the bookkeeping stays out of it)."""
    for rec, n, xs in zip(recorders, tokens, gaps, strict=True):
        if in_window:
            rec.output_tokens_in_window += n
        if xs:
            rec.itl.add_many(xs)
