"""The step-time model: how long one engine step takes, from a profile's coefficients
(capplan/profile.py `StepModel`), and its fast evaluation in the simulator (`StepTimer`).

Step-time model (one engine step, seconds), physically shaped:

    t = fixed_s
      + per_token_s * max(T_pad, knee_tokens)        # GEMMs: weight-streaming floor, then compute
      + prefill_attn_s * sum(chunk * (ctx + chunk/2))  # prefill attention over prior KV
      + decode_ctx_s * (sum(context of decode seqs)   # decode attention = KV read,
          - shared_ctx_saving * S)                     #   less what shared blocks save
      + per_seq_s * seqs                               # sampling, bookkeeping per sequence
      + k * draft_pass_s + draft_token_s * T_pad       # the drafter (spec decode), every step:
      + (k - 1) * draft_seq_s * seqs                   #   a first pass over T, k - 1 over seqs
      + encoder pass (encoder_pass_s)                  # vision encoder, on an image's first chunk,
      + encoder_step_s if the step encodes             #   and the step's own work around it
      + prefill_step_s if any prefill chunk            # piecewise, not full, CUDA graph
      + gemm_switch_s if T_pad > 128                   # quantized GEMMs' tile stairs:
      + gemm_rows_s * (ceil(T_pad / 256) - 1)          #   see below
      + gemm_holes_s * row_holes(T) if T > the         # FP8: a last row of tiles half
          largest capture size                         #   empty or more, see below
      + eager_offset_s[T] if T > the largest           # FP8: what the scan measured at a
          capture size                                 #   full row's count, see below
      + eager_step_s if T > the largest capture size   # no CUDA graph at all
      + graph_offset_s[T_pad] if decode-only and       # the graph size's own offset,
          within the largest CUDA graph                #   and its own KV read
          + (graph_ctx_s - decode_ctx_s) * sum(context)
          + graph_ctx_s * sum(context) * (F - 1)       # FlashAttention's last wave (tiles.py)

where a step past the largest capture size costs at least `eager_floor_s` before the drafter's
and encoder's terms: without a graph the CPU launches every kernel, and a small such step
waits for those launches, not for the GPU (measured: Llama-3.1-8B FP8 takes 31.2 ms for 512
prefill tokens beside 16 decodes, where the other terms give 18.9 ms;
scripts/calibration_analysis.py floor). Every other step holds the engine core for its own
time too, `core_graph_s` for a decode-only step and `core_piecewise_s` for one with a prefill
chunk: scheduling, preparing inputs, launching (a piecewise step launches its attention layer
by layer), sampling. They are measured on a serving engine of the model by the validation
runner's core trace (validate/corelaunch.py; Llama-3.1-8B on an H200 host: 3.0 and 12.7 ms).
The calibration runner times them too (runner.py: `cpu_launch_s`, `cpu_update_s`), but its
in-process engine has neither the serving engine's input and output threads nor its loop's
other work (0.64-0.87x of serving's for Llama-3.1-8B and Qwen3-32B), so a profile takes the
calibration's figures only where no serving trace of its model exists
(calibrate/build.py); a profile with neither charges none.

The GEMM stairs follow the kernel vLLM picks by the token count M
(scaled_mm_sm90_fp8_dispatch.cuh in vLLM's CUDA sources: past M = 128 the FP8
GEMM runs 128-row tiles in clusters of two, so it works in rows of 256 tokens); the 4-bit
kernels (Machete, Marlin) jump at the same counts on the H200. Measured, Gemma 4 31B FP8
decodes 128 sequences in 33.3 ms and 129 in 46.4, and its MTP verify steps are flat between
the multiples of 256 tokens and jump at them (scripts/calibration_analysis.py stairs). BF16
GEMMs (cuBLAS) show no such stairs, and their profiles keep both terms at 0.

Past the largest CUDA graph a step runs its own token count, and there FP8's GEMMs cost more
when the last row of tiles is half empty or emptier than when it is full: measured on the
H100 (lone prompts at 44 token counts, scripts/calibration_analysis.py holes), Qwen3-32B FP8
runs a prompt of 2,048 tokens in 128.7 ms, 2,049 in 167.3, 2,176 in 171.0, 2,240 in 164.0 and
2,304 in 153.9: within a row the cost falls as the row fills. `gemm_holes_s` prices it, in
proportion to the row's empty tokens up to half a row (`row_holes`). AWQ's kernel (Machete)
costs the whole row however empty (2,049 tokens 191.3 ms, 2,304 193.7) and BF16's cuBLAS has
no rows: those profiles keep it at 0, and so does a profile whose runs hold no such scan,
because the sweep's graph-less steps alone cannot tell a row's holes from the floor under
the small ones (calibrate/build.py). At a full row the rows and holes still miss: both FP8
models the H100 scanned run 2,032-2,048 tokens 5-10 % under the line through the other
counts (Qwen3-32B FP8 129.5 ms at 2,048 where the terms give 137.3) and 4,080-4,096 2-4 %,
and served steps of 2,048 tokens run as far under their price (0.92 of it on Qwen3-32B FP8,
docs/calibration.md "The counts the rows leave"). `eager_offset_s` holds, for each scanned
count whose last row is (nearly) full and whose prompt's attention is a small share of its
step, the scan's median less the terms above (calibrate/fit.py eager_offsets); a count
between two of them in one row takes the line between them, any other none (`eager_offset`).

A decode-only step replays the full CUDA graph captured for its padded size, and the sizes
do not cost what the linear terms say: measured, Llama-3.1-8B FP8 decodes 16 sequences in
3.9 ms, 32 in 4.9 and 64 in 5.1 at 512 tokens of context (calibration_analysis.py decode),
where the FP8 GEMM runs one kernel configuration for M in (16, 64]
(scaled_mm_sm90_fp8_dispatch.cuh in vLLM's CUDA sources). `graph_offset_s`
holds, for each size a graph-scan run timed (a decode-only batch at every capture size,
sweep.graph_points), the median of its steps less the terms above; a size between two
scanned ones takes the line between their offsets, one outside them none. The same scan
times a few sizes again at a longer context, and their difference gives the decode-only
step's own cost of a context token, `graph_ctx_s`: the fit's `decode_ctx_s` serves the
steps that hold a prefill chunk too, whose attention runs outside the graph. Under
speculative decoding a decode-only step of B requests runs B (1 + k) tokens, graphs come in
multiples of 1 + k, and the scan times B = size / (1 + k) at each; a decode-only step past
the largest graph (more than 102 requests at k = 4) runs without a graph and takes
neither term.

F, at least 1, is FlashAttention 3's decode kernel's time over its bandwidth-bound time
for the step's sequences (tiles.tail_factor): each sequence's KV is cut into splits chosen
from the step's own lengths, one tile per KV head and split, and the tiles are taken in
order by one thread block per SM; where they overflow a whole wave by fewer than
SMs / `tile_rho`, the last ones run with most SMs idle. It depends on each sequence's length,
not their sum, so the simulator hands the step's lengths to StepTimer.tail_factor. Measured
on the H100 (Llama-3.1-8B FP8, 8 KV heads), the sweep's decode steps of 17 sequences ran
8.6 % over the summed-context price and of 16 sequences 2.1 % (calibration_analysis.py
tiles); six decodes of 4,096 tokens beside two of 12,288 ran 5.5 % over eight of 6,144
(calibration_analysis.py mixlen). `tile_rho` is fitted on the decode-only steps after the
graph scan (calibrate/scans.py tile_rho); where no value prices them better than none, or the
profile has no graph scan, F is 1.

S counts the context tokens that running requests read in common with another: a
prefix-cache hit takes the cached KV blocks themselves (vllm/v1/core/kv_cache_manager.py
get_computed_blocks, vllm/v1/core/block_pool.py touch), so every request of a prefix group
after the first reads the same memory, S = sum over groups of (readers - 1) * shared
tokens. A later reader's prefix costs less than its own context: measured, a decode batch
whose 90 % prefix is one cached prompt runs 0.4-2.9 ms faster than the same batch without
one, 30-53 % of its shared reads' decode_ctx_s (the `shared` points of a prefix-cache engine,
scripts/calibration_analysis.py cached), as much on Llama-3.1-8B as on Qwen3-32B; the
GPU's L2 holding the prefix's blocks for the batch's later readers is the likely reason.

T = scheduled tokens (decode seqs count 1 + k each). T_pad pads T up to the next CUDA-graph
capture size (vllm/config/vllm.py: _set_cudagraph_sizes) when T is within the largest one.

The drafter's terms follow vllm/v1/spec_decode/llm_base_proposer.py (SpecDecodeBaseProposer
.propose, the MTP, EAGLE and draft-model proposers' common path): after every step whose
inputs fit the drafter (vllm/v1/worker/gpu_model_runner.py: sample_tokens), its first pass
runs over every token the target scheduled, prefill chunks included (that keeps the drafter's
KV in step with the target's), and k - 1 more passes run over one token of each request.

A model with sliding-window layers (Gemma 4) is fitted with a term per attention kind
(`StepModel.window_tokens` W > 0): the two context terms above stand for its full-attention
layers, and its sliding layers, which attend at most W tokens, add

      + decode_window_s * sum(min(ctx, W))              # sliding layers' KV read
      + prefill_window_s * sum(chunk * min(ctx + chunk/2, W))

(the decode sum over sequences taken at their mean context: exact when all are on one side
of the window, as the calibration's points are). A decode-only step of such a model reads
its sliding layers' context at `graph_window_s` where a graph scan measured it: the scan's
two contexts give one equation for the two kinds of layer, and the full-attention layers
keep their fitted rate, since the sliding ones carry most of a step's context time and
their fitted rate is the one that differs between precisions of the same KV and kernel
(Gemma 4 31B FP8 229.8 ns a token, BF16 179.7; scanned, 193.9 and 186.4).
"""

from __future__ import annotations

import bisect
from typing import Any

from capplan.errors import CalibrationCoverageError
from capplan.profile import Profile
from capplan.tiles import kv_blocks, tail_factor


def window_pairs(chunk: float, ctx: float, window: float) -> float:
    """Attended token pairs of one prefill chunk in a sliding-window layer: each of its
    tokens sees at most `window` tokens."""
    return chunk * min(ctx + chunk / 2, window)


GEMM_SWITCH_TOKENS = 128
"""Past this many tokens the FP8 GEMM switches to its largest tiles (`gemm_switch_s`)."""
GEMM_ROW_TOKENS = 256
"""Tokens a row of those tiles covers: two 128-row tiles a cluster (`gemm_rows_s`)."""
TILE_CACHE_SIZE = 1 << 14
"""Batches whose F (StepTimer.tail_factor) a timer keeps before it starts again."""


def row_holes(t_pad: int) -> float:
    """How empty the last row of tiles runs at `t_pad` tokens, in half rows, at most one:
    0 for a full row, 1 for a row half empty or emptier (`gemm_holes_s`)."""
    empty = -t_pad % GEMM_ROW_TOKENS
    half = GEMM_ROW_TOKENS // 2
    return (empty if empty < half else half) / half


def graph_offset(offsets: dict[int, float], t_pad: int) -> float:
    """A decode-only step's offset at `t_pad` padded tokens (StepModel.graph_offset_s): the
    measured one, the line between the two scanned sizes around it, or 0 outside them."""
    if t_pad in offsets:
        return offsets[t_pad]
    sizes = sorted(offsets)
    if not sizes or t_pad < sizes[0] or t_pad > sizes[-1]:
        return 0.0
    return _line(offsets, sizes, bisect.bisect_left(sizes, t_pad), t_pad)


def _line(offsets: dict[int, float], keys: list[int], i: int, x: int) -> float:
    """The line between `offsets` at keys[i - 1] and keys[i], at x between them."""
    lo, hi = keys[i - 1], keys[i]
    return offsets[lo] + (offsets[hi] - offsets[lo]) * (x - lo) / (hi - lo)


def eager_offset(offsets: dict[int, float], tokens: int,
                 counts: list[int] | None = None) -> float:
    """A step past the largest CUDA graph's offset at `tokens` (StepModel.eager_offset_s):
    the measured one, else the line between the two scanned counts around it where both lie
    in its row of tiles (the same ceil(T / GEMM_ROW_TOKENS)), else 0: the offsets are taken
    at counts whose last row is (nearly) full, and a line across rows would carry them over
    the holes between. `counts` is `offsets`' keys, sorted (StepTimer keeps them)."""
    if tokens in offsets:
        return offsets[tokens]
    counts = sorted(offsets) if counts is None else counts
    i = bisect.bisect_left(counts, tokens)
    if i == 0 or i == len(counts) or (-(-counts[i] // GEMM_ROW_TOKENS)
                                      != -(-counts[i - 1] // GEMM_ROW_TOKENS)):
        return 0.0
    return _line(offsets, counts, i, tokens)


def cudagraph_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, spec_k: int = 0
) -> list[int]:
    """vLLM 0.26.0's default capture sizes (vllm/config/vllm.py: _set_cudagraph_sizes), rounded
    up to multiples of 1 + k with speculative decoding (vllm/config/compilation.py:
    adjust_cudagraph_sizes_for_spec_decode)."""
    largest = min(max_num_seqs * (1 + spec_k) * 2, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)) if s <= largest]
    q = 1 + spec_k
    if q > 1:
        sizes = sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= largest}) or [q]
    return sizes


def eager_threshold(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Steps of more tokens than this pay `eager_step_s`: the base engine's largest CUDA
    graph. Under speculative decoding vLLM's graphs stop at the largest multiple of 1 + k
    below it (510 for k = 4), but a step of 511-512 tokens then costs what it costs without
    speculation: Gemma 4 FP8 with MTP k = 4 prefilled a 512-token prompt, a step without a
    graph there, in the time the engine without MTP took (TTFT at concurrency 1, 37.6
    against 37.0 ms, docs/validation.md)."""
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens)
    return sizes[-1] if sizes else 0


def encoder_work_s(tokens: Any, images: Any, token_s: float, token2_s: float) -> Any:
    """The vision encoder's work on `images` pictures of `tokens` image tokens in all, taken
    as of one size: `token_s` a token and `token2_s` a token squared a picture (its
    attention over its own patches). A pass costs at least the profile's `encoder_floor_s`
    beside it (StepTimer.encoder_pass_s). Scalars or numpy arrays alike (scans.encoder_scan)."""
    return token_s * tokens + token2_s * tokens * tokens / images


class StepTimer:
    """Fast evaluation of a profile's step model inside the simulator's hot loop.

    Counts the steps that fall outside the calibrated box (`extrapolated_steps`); with
    `strict=True` such a step raises CalibrationCoverageError instead.
    """

    __slots__ = (
        "_box",
        "_c",
        "_core",
        "_core_eager",
        "_draft",
        "_draft_in_launch",
        "_eager",
        "_eager_above",
        "_eager_floor",
        "_eager_gpu",
        "_eager_offset",
        "_enc",
        "_enc_step",
        "_gemm",
        "_graph_ctx",
        "_graph_max",
        "_graph_offset",
        "_graph_win",
        "_graphs",
        "_holes",
        "_pad",
        "_prefill_step",
        "_shared",
        "_sigma",
        "_stairs",
        "_tile_cache",
        "_tile_rate",
        "_tiles",
        "_window",
        "box",
        "draft_spread",
        "eager_spread",
        "encoder_draws",
        "encoder_spells",
        "extrapolated_steps",
        "k",
        "strict",
    )

    def __init__(
        self,
        profile: Profile,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        strict: bool = False,
    ) -> None:
        s = profile.step
        self._c = (s.fixed_s, s.per_token_s, s.knee_tokens, s.prefill_attn_s, s.decode_ctx_s,
                   s.per_seq_s)
        self.k = profile.spec_k
        # the drafter's k passes, its first pass's per-token cost, its later passes' per request
        # (a draft model's at a serving host's pace: `draft_serving_scale`)
        scale = s.draft_serving_scale
        self._draft = (self.k * s.draft_pass_s * scale, s.draft_token_s * scale,
                       max(self.k - 1, 0) * s.draft_seq_s * scale)
        # a draft model's passes hold the engine core: vLLM runs the drafter inside the
        # step's sample_tokens (vllm/v1/worker/gpu_model_runner.py propose_draft_token_ids,
        # vllm/v1/spec_decode/draft_model.py), a 1B model launched layer by layer
        self._draft_in_launch = profile.spec_method == "draft_model"
        # its pass varies step to step with the host's moment (sim/replica.py draws it)
        self.draft_spread = s.draft_sigma if self.k else 0.0
        self._enc = (s.encoder_token_s, s.encoder_token2_s, s.encoder_floor_s)
        self._enc_step = s.encoder_step_s
        self.encoder_draws = tuple(s.encoder_step_draws_s)
        # the draws' slow spell: where it starts, and the spells' mean lengths (0: none)
        self.encoder_spells = (s.encoder_slow_above_s, s.encoder_slow_spell_s,
                               s.encoder_fast_spell_s)
        self._shared = s.decode_ctx_s * s.shared_ctx_saving
        self._prefill_step = s.prefill_step_s
        self._eager = s.eager_step_s
        self._eager_floor = s.eager_floor_s
        self._core_eager = s.core_eager_s
        self._eager_gpu = s.eager_gpu_s or s.eager_floor_s
        # the core's time on a step past the largest graph, where measured apart from the
        # floor, drawn on every such step with this spread (sim/replica.py; 0: the median)
        self.eager_spread = s.eager_sigma if s.core_eager_s else 0.0
        self._core = (s.core_graph_s, s.core_piecewise_s)
        self._sigma = (s.core_graph_sigma, s.core_piecewise_sigma, s.eager_sigma)
        self._window = ((float(s.window_tokens), s.decode_window_s, s.prefill_window_s)
                        if s.window_tokens else None)
        self._graphs = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, self.k)
        self._graph_max = self._graphs[-1] if self._graphs else 0
        self._eager_above = eager_threshold(max_num_seqs, max_num_batched_tokens)
        # pad(t) for every t up to the largest graph: one lookup a step
        self._pad = [self.pad(t) for t in range(self._graph_max + 1)]
        # the GEMM stairs likewise, for a profile that has them
        self._gemm = (s.gemm_switch_s, s.gemm_rows_s)
        self._holes = s.gemm_holes_s
        # a step past the largest graph's measured offset at its count (None: no scan)
        self._eager_offset = ((dict(s.eager_offset_s), sorted(s.eager_offset_s))
                              if s.eager_offset_s else None)
        self._stairs = ([self.stairs(p) for p in self._pad]
                        if s.gemm_switch_s or s.gemm_rows_s else None)
        # a decode-only step's offset for its graph size, likewise (None: no graph scan)
        self._graph_offset = ([graph_offset(s.graph_offset_s, p) for p in self._pad]
                              if s.graph_offset_s else None)
        self._graph_ctx = s.graph_ctx_s - s.decode_ctx_s if s.graph_offset_s else 0.0
        self._graph_win = (s.graph_window_s - s.decode_window_s
                           if s.graph_offset_s and s.graph_window_s and s.window_tokens else 0.0)
        # FlashAttention's last wave on a decode-only step (tiles.py; None: not priced)
        self._tiles = ((s.tile_kv_heads, s.tile_sms, s.tile_rho)
                       if s.tile_rho and s.tile_kv_heads and s.tile_sms and s.graph_offset_s
                       else None)
        self._tile_rate = s.graph_ctx_s
        self._tile_cache: dict[tuple[int, ...], float] = {}
        self.box = profile.box
        self._box = (self.box.max_tokens, self.box.max_seqs, self.box.max_context_tokens)
        self.strict = strict
        self.extrapolated_steps = 0

    def pad(self, tokens: int) -> int:
        """Tokens after CUDA-graph padding."""
        if tokens > self._graph_max:
            return tokens
        return self._graphs[bisect.bisect_left(self._graphs, tokens)]

    @property
    def tiles(self) -> tuple[int, int] | None:
        """(KV heads, SMs) where the profile prices FlashAttention's last wave on a
        decode-only step (`tail_factor`), else None."""
        return None if self._tiles is None else self._tiles[:2]

    def tail_factor(self, blocks: tuple[int, ...]) -> float:
        """F of the module docstring for a decode-only step whose sequences read `blocks`
        KV blocks each (tiles.kv_blocks of their contexts), in batch order: 1 where the
        profile has no `tile_rho`."""
        if self._tiles is None:
            return 1.0
        f = self._tile_cache.get(blocks)
        if f is None:
            if len(self._tile_cache) > TILE_CACHE_SIZE:
                self._tile_cache.clear()
            heads, sms, rho = self._tiles
            f = self._tile_cache[blocks] = tail_factor(blocks, heads, sms, rho)
        return f

    def stairs(self, t_pad: int) -> float:
        """The quantized GEMM's tile stairs for a step of `t_pad` padded tokens."""
        if t_pad <= GEMM_SWITCH_TOKENS:
            return 0.0
        switch, rows = self._gemm
        return switch + rows * (-(-t_pad // GEMM_ROW_TOKENS) - 1)

    @property
    def serial_core_s(self) -> float:
        """Without asynchronous scheduling, what each step adds to its work and launch: the
        core's own time a decode-only step (`core_graph_s`: schedule, inputs, outputs),
        which then cannot overlap the GPU's work (vllm/v1/engine/core.py EngineCore.step
        schedules, launches, waits for the step's tokens and updates from them in turn;
        step_with_batch_queue overlaps them)."""
        return self._core[0]

    def step_time_s(self, *args: Any, **kwargs: Any) -> float:
        """Seconds for one engine step of this composition (arguments as `step_times`'),
        one step after another: the larger of `step_times`' two."""
        return max(self.step_times(*args, **kwargs))

    def encoder_pass_s(self, tokens: int, images: int = 1) -> float:
        """Seconds of the vision encoder's pass over `images` pictures of `tokens` image
        tokens in all, taken as of one size (as a workload's are): each picture costs
        `encoder_token_s` a token and `encoder_token2_s` a token squared, the pass at least
        `encoder_floor_s`. vLLM encodes every picture a step schedules in one call of the
        model's embed_multimodal (vllm/v1/worker/gpu_model_runner.py _execute_mm_encoder)."""
        per_token, per_token2, floor = self._enc
        t = encoder_work_s(tokens, max(images, 1), per_token, per_token2)
        return t if t > floor else floor

    def eager(self, tokens: int) -> bool:
        """Whether a step of `tokens` tokens runs past the largest CUDA graph."""
        return tokens > self._eager_above

    def launch_sigma(self, tokens: int, prefill: bool) -> float:
        """The spread (sigma of the logarithm) of the core's time on a step of `tokens`
        tokens, with or without a prefill chunk: past the largest CUDA graph the CPU's
        launches' (`eager_sigma`), else a piecewise or a decode-only step's core time's."""
        if tokens > self._eager_above:
            return self._sigma[2]
        return self._sigma[1] if prefill else self._sigma[0]

    def step_times(
        self,
        tokens: int,
        seqs: int,
        prefill_attn: float,
        decode_ctx: int,
        encoder_tokens: int = 0,
        *,
        decode_seqs: int | None = None,
        prefill_attn_window: float | None = None,
        shared_ctx: int = 0,
        encoder_images: int = 1,
        encoder_step_s: float | None = None,
        launch_factor: float = 1.0,
        draft_factor: float = 1.0,
        tile_factor: float | None = None,
    ) -> tuple[float, float]:
        """(work, launch) seconds of one engine step of this composition. `launch` is the
        engine core's own time for the step, during which it can neither schedule nor hand
        out outputs, and before which the GPU cannot finish it: for a step past the largest
        CUDA graph the CPU's launches of every kernel (`eager_floor_s`, with the drafter's
        and encoder's terms), else the measured core time of a decode-only or a piecewise
        step (`core_graph_s`, `core_piecewise_s`; 0 where a profile has none), with a draft
        model's passes, which vLLM runs on the core's thread. `work` is the
        rest of the model: how long the step takes once launched. A run of such steps takes
        the larger of the two a step (`step_time_s`). With a term per attention kind
        (sliding-window models), `decode_seqs` (default: every sequence) takes the decode
        context's mean, and `prefill_attn_window` is the chunks' `window_pairs` (default:
        the pairs uncapped). `shared_ctx` is S of the module docstring: decode context
        tokens read in common with another running request (at most `decode_ctx` count).
        `encoder_tokens` are the image tokens of the `encoder_images` pictures whose vision
        encoder runs in this step (`encoder_pass_s`); the step around the pass costs
        `encoder_step_s`, the profile's median unless given (one of its draws).
        `launch_factor` scales the core's own time (simulation.core_spread), not the
        encoder's, whose spread its draws carry; `draft_factor` the drafter's pass (a draw
        of `draft_spread`). `tile_factor` is a decode-only step's F (`tail_factor` of its
        sequences' lengths); None takes the sequences as of one length."""
        fixed, per_tok, knee, p_attn, d_ctx, per_seq = self._c
        max_tokens, max_seqs, max_context = self._box
        if tokens > max_tokens or seqs > max_seqs or (seqs and decode_ctx > max_context * seqs):
            self.extrapolated_steps += 1
            if self.strict:
                raise CalibrationCoverageError(
                    f"step with {tokens} tokens and {seqs} sequences is outside the calibrated "
                    f"box ({max_tokens} tokens, {max_seqs} sequences)"
                )
        t_pad = self._pad[tokens] if 0 <= tokens <= self._graph_max else self.pad(tokens)
        t = fixed + per_tok * (t_pad if t_pad > knee else knee)
        t += p_attn * prefill_attn + d_ctx * decode_ctx + per_seq * seqs
        if shared_ctx:
            t -= self._shared * (shared_ctx if shared_ctx < decode_ctx else decode_ctx)
        if self._window is not None:
            w, d_win, p_win = self._window
            n = seqs if decode_seqs is None else decode_seqs
            if n > 0 and decode_ctx:
                mean = decode_ctx / n
                t += d_win * n * (mean if mean < w else w)
            if prefill_attn:
                t += p_win * (prefill_attn if prefill_attn_window is None
                              else prefill_attn_window)
        if prefill_attn:
            t += self._prefill_step
        elif (self._graph_offset is not None and not encoder_tokens
              and 0 <= tokens <= self._graph_max):
            # a full CUDA graph's replay (past the largest graph, as under speculative
            # decoding a decode-only step can be, no graph at all: vllm/v1/cudagraph_dispatcher.py
            # CudagraphDispatcher.dispatch returns CUDAGraphMode.NONE)
            t += self._graph_ctx * decode_ctx + self._graph_offset[tokens]
            if self._tiles is not None and seqs and decode_ctx:
                if tile_factor is None:
                    tile_factor = self.tail_factor((kv_blocks(decode_ctx // seqs),) * seqs)
                t += self._tile_rate * decode_ctx * (tile_factor - 1.0)
            if self._graph_win and seqs and decode_ctx:
                w = self._window[0]  # type: ignore[index]
                mean = decode_ctx / seqs
                t += self._graph_win * seqs * (mean if mean < w else w)
        if self._stairs is not None:
            t += self._stairs[tokens] if 0 <= tokens <= self._graph_max else self.stairs(t_pad)
        if self._holes and tokens > self._graph_max:
            t += self._holes * row_holes(tokens)
        if self._eager_offset is not None and tokens > self._graph_max:
            offsets, counts = self._eager_offset
            t += eager_offset(offsets, tokens, counts)
        launch = 0.0
        if tokens > self._eager_above:
            t += self._eager
            launch = self._eager_floor
            if self._core_eager:
                # measured apart, the core's time is its own and the GPU's span at least
                # eager_gpu_s (else the floor): shorter than the span (Qwen3-32B FP8 on an
                # H100: the core's 31.8 ms against 61.3), the core schedules the next step
                # while the GPU still runs this one; longer (Llama-3.1-8B: 20.9 against
                # 19.4), the GPU waits for it (docs/simulator.md)
                if t < self._eager_gpu:
                    t = self._eager_gpu
                launch = self._core_eager
        extra = 0.0
        if self.k:
            passes, per_token, per_seq_later = self._draft
            extra = (passes + per_token * t_pad + per_seq_later * seqs) * draft_factor
        encoder = 0.0
        if encoder_tokens:
            around = self._enc_step if encoder_step_s is None else encoder_step_s
            encoder = max(self.encoder_pass_s(encoder_tokens, encoder_images) + around, 0.0)
        if launch:
            return t + extra + encoder, (launch + extra) * launch_factor + encoder
        # the encoder runs eagerly inside execute_model, the core launching its kernels
        # (gpu_model_runner.py _execute_mm_encoder; compile_mm_encoder and
        # cudagraph_mm_encoder off): it keeps the core as long as the GPU
        core = self._core[1] if prefill_attn else self._core[0]
        if self._draft_in_launch:
            core += extra
        return t + extra + encoder, core * launch_factor + encoder
