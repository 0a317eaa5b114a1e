"""Fit the step-time model and the KV-capacity line to measured samples (numpy/scipy).

The model is `capplan.steptime.StepTimer`'s, term for term, so a fitted `StepModel` is
evaluated exactly as it was fitted. Linear coefficients come from non-negative least
squares on relative residuals (each unit weighted by 1 / its time: the target is the
percentage error), each held at or above its physical floor where one is given (no KV read
is faster than the HBM's peak bandwidth); `knee_tokens` from a 1-D grid search around them.
The unit of fit and of error is one engine step where the GPU timed the steps, a window of
consecutive steps where the CPU did (see `windows`); training units far off a first fit are
trimmed before the second, the held-out error keeps every unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from capplan.errors import CalibrationError
from capplan.profile import FitQuality, KvCapacity, StepModel
from capplan.steptime import (
    GEMM_ROW_TOKENS,
    GEMM_SWITCH_TOKENS,
    cudagraph_capture_sizes,
    eager_offset,
    eager_threshold,
    graph_offset,
    row_holes,
)
from capplan.tiles import kv_blocks, tail_factor

Samples = Mapping[str, np.ndarray]
COEFS = ("fixed_s", "per_token_s", "prefill_attn_s", "decode_ctx_s", "per_seq_s",
         "prefill_step_s", "eager_step_s", "decode_window_s", "prefill_window_s",
         "draft_pass_s", "draft_token_s", "draft_seq_s", "gemm_switch_s", "gemm_rows_s",
         "gemm_holes_s")
WINDOW_COEFS = ("decode_window_s", "prefill_window_s")
DRAFT_COEFS = ("draft_pass_s", "draft_token_s", "draft_seq_s")
KNEE_GRID = np.array([0, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512,
                      640, 768, 1024])
WINDOW = 4
# A step past the largest CUDA graph costs at least the CPU's launches of its kernels
# (`eager_floor_s`), searched over this many quantiles of the eager steps' times
FLOOR_CANDIDATES = 24
MAX_WINDOWS_PER_POINT = 40
TRIM_APE = 0.35  # training windows this far off the first fit are left out of the second
# eager_offsets' counts: a last row of tiles at least 7/8 full (profile.row_holes), and a
# lone prompt's attention at most this share of its step
FULL_ROW_HOLES = 0.125
MAX_ATTN_SHARE = 0.10


def step_times_s(point: np.ndarray, t_sched0: np.ndarray, t_done: np.ndarray) -> np.ndarray:
    """Seconds per step: the gap between consecutive completions within a point, or from
    scheduling when the GPU had nothing queued (see runner.py)."""
    same = np.r_[False, point[1:] == point[:-1]]
    prev_done = np.r_[-np.inf, t_done[:-1]]
    start = np.where(same, np.maximum(prev_done, t_sched0), t_sched0)
    return np.asarray(t_done - start, dtype=float)


def step_times_gpu_s(point: np.ndarray, pipelined: np.ndarray, gpu_t0: np.ndarray,
                     gpu_t1: np.ndarray) -> np.ndarray:
    """Seconds per step from the GPU's own stamps (see runner.py): the gap between
    consecutive ends of work on the stream while batches are queued back to back (any wait
    for the CPU's launches is part of the step), or from the moment the stream reached the
    step when the engine was idle before it. Stamps restart at each point, so a point's
    first step always counts from its own start."""
    prev_end = np.r_[np.nan, gpu_t1[:-1]]
    same = np.r_[False, point[1:] == point[:-1]]
    start = np.where(same & pipelined, prev_end, gpu_t0)
    return np.asarray(gpu_t1 - start, dtype=float)


def prefill_attn(chunks: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Σ chunk * (ctx + chunk / 2) per step: attended token pairs of its prefill chunks."""
    return np.array([sum(c * (x + c / 2) for c, x in step) for step in chunks], dtype=float)


@dataclass(frozen=True)
class FitResult:
    step: StepModel
    quality: FitQuality
    trimmed: int
    test_ape: np.ndarray
    single_step_ape: np.ndarray
    cv_ape: np.ndarray
    point_ape: np.ndarray


def padded(tokens: np.ndarray, sizes: list[int]) -> np.ndarray:
    grid = np.asarray(sizes)
    out = tokens.astype(float).copy()
    inside = tokens <= grid[-1]
    out[inside] = grid[np.searchsorted(grid, tokens[inside], side="left")]
    return out


def attention_by_kind(s: Samples, window: int) -> dict[str, np.ndarray]:
    """The samples with the sliding-window layers' attention (steptime.py, module docstring):
    each step's decode context within the window, at its mean context, and its prefill
    pairs within it (`prefill_attn_window`, from store.samples_of)."""
    n = s["decode_seqs"].astype(float)
    ctx = s["decode_ctx"].astype(float)
    mean = np.divide(ctx, n, out=np.zeros_like(ctx), where=n > 0)
    out = dict(s)
    out["decode_ctx_window"] = n * np.minimum(mean, window)
    return out


def design(s: Samples, knee: float, sizes: list[int], spec_k: int) -> np.ndarray:
    """Per-step columns in COEFS order, combined as StepTimer.step_time_s combines them
    (steps past profile.eager_threshold: `eager_step` as fit_step_model marks them, else
    past the largest of `sizes`)."""
    t_pad = padded(s["tokens"], sizes)
    zero = np.zeros(len(t_pad))
    drafter = 1.0 if spec_k else 0.0
    return np.column_stack([
        np.ones(len(t_pad)),
        np.maximum(t_pad, knee),
        s["prefill_attn"],
        s["decode_ctx"].astype(float),
        s["seqs"].astype(float),
        (s["prefill_attn"] > 0).astype(float),
        s["eager_step"] if "eager_step" in s else (s["tokens"] > max(sizes, default=0)),
        s.get("decode_ctx_window", zero),
        s.get("prefill_attn_window", zero),
        np.full(len(t_pad), float(spec_k)),
        drafter * t_pad,
        max(spec_k - 1, 0) * s["seqs"].astype(float),
        (t_pad > GEMM_SWITCH_TOKENS).astype(float),
        np.maximum(np.ceil(t_pad / GEMM_ROW_TOKENS) - 1, 0),
        # profile.row_holes, on the steps past the largest graph (whose t_pad is their T)
        np.where(s["tokens"] > max(sizes, default=0),
                 np.minimum(-t_pad % GEMM_ROW_TOKENS, GEMM_ROW_TOKENS // 2)
                 / (GEMM_ROW_TOKENS // 2), 0.0),
    ])


def _solve(x: np.ndarray, y: np.ndarray, free: np.ndarray, fixed: np.ndarray,
           floor: np.ndarray) -> np.ndarray:
    """Bounded least squares on relative residuals for the free columns (each >= its floor,
    0 unless physics gives one), fixed ones subtracted first."""
    target = y - x[:, ~free] @ fixed[~free]
    w = 1.0 / y
    beta = fixed.copy()
    if free.any():
        a = x[:, free] * w[:, None]
        scale = np.maximum(np.abs(a).max(axis=0), 1e-300)  # columns span 12 decades
        res = lsq_linear(a / scale, target * w, bounds=(floor[free] * scale, np.inf),
                         method="bvls", max_iter=2000)
        # BVLS can land a hair (1e-21) below a bound; the bound is the physics
        beta[free] = np.maximum(res.x / scale, floor[free])
    return beta


def unit_width(s: Samples) -> int:
    """Steps per fitting unit: one where every step was timed by the GPU's own stamps,
    else a window of WINDOW (see `windows`)."""
    clock = s.get("gpu_clock")
    return 1 if clock is not None and len(clock) and bool(np.all(clock)) else WINDOW


DRAIN_FINISHED = 8
"""Requests that finish in one step of a point for its drain to start (`drain_steps`)."""


def drain_steps(s: Samples) -> np.ndarray:
    """Each point's drain: from the first decode-only step that carries DRAIN_FINISHED or
    more requests fewer than the step before it (the point's requests finishing together,
    16 a step where the sweep prefilled 512-token prompts in 8,192-token chunks) to the
    point's end. These are not the compositions the point was designed to time, and on the
    H200 they ran slower than the same batches held steady on most engines (Qwen3-32B BF16:
    65 requests in 31.1 ms in a drain, 64 steady in 21.8): the engine core's launch of such
    a step waits for the GPU, which then idles before the next (`stalled_steps`), where
    drains of one a step and a serving engine's decode-only steps after up to six requests
    finished cost about what steady ones do (docs/calibration.md, "A point's drain")."""
    point, seqs = s["point"], s["seqs"]
    only = decode_only(s)
    out = np.zeros(len(point), dtype=bool)
    bounds = np.flatnonzero(np.r_[True, point[1:] != point[:-1], True])
    for a, b in pairwise(bounds):
        dropped = seqs[a:b - 1] - seqs[a + 1:b]
        start = np.flatnonzero(only[a + 1:b] & (dropped >= DRAIN_FINISHED))
        if len(start):
            out[a + 1 + start[0]:b] = True
    return out


STALL_S = 5e-4
"""GPU idle time before a step past which the step is a stall (`stalled_steps`)."""


def stalled_steps(s: Samples) -> np.ndarray:
    """The drain steps (`drain_steps`) the GPU began STALL_S or more after the step before
    it ended (store.gpu_gap_s): the engine core was still blocked in the step before's
    launch, which in a drain lasts about as long as that step's GPU work (the runner's
    `cpu_launch_s`; 2-4 ms in a steady step), so the stream ran dry while the core updated,
    scheduled and prepared this one. Such a step's time is the host's wait, not the batch's
    cost: in a drain whose steps kept the stream busy the profiles price the GPU's work
    within a millisecond (docs/calibration.md, "A point's drain"). The wait comes with a
    batch size the engine had not run before (`after_new_size`), as every drain step's is."""
    gap = s.get("gpu_gap_s")
    if gap is None:
        return np.zeros(len(s["point"]), dtype=bool)
    return drain_steps(s) & (gap >= STALL_S)


def after_new_size(s: Samples, run: np.ndarray | None = None) -> np.ndarray:
    """The steps launched just after the engine first ran a step of as many requests: the
    next two after each step whose request count its engine had not run before (`run`
    numbers each step's engine; one engine if None). The step that follows such a first
    use is where a drain's stall shows: in the H100 drain scans (thirty-third session) the
    engine core's launch of a step of a new size waited in the model's `compute_logits`, the
    lm_head product the CUDA graph leaves out, for about the GPU's step (13-23 ms against
    0.3 ms), and over every timed and scan run the GPU idled before 21.8 % of the
    decode-only steps that follow a first use and before 0.5 % of the others, the engines
    whose every launch is slow (a draft model's, MTP k = 2's) aside (docs/calibration.md,
    "A point's drain"). A serving engine meets each size for the first time once."""
    seqs = s["seqs"]
    run = np.zeros(len(seqs), dtype=int) if run is None else run
    first = np.zeros(len(seqs), dtype=bool)
    seen: set[tuple[int, int]] = set()
    for i, key in enumerate(zip(run.tolist(), seqs.tolist(), strict=True)):
        first[i] = key not in seen
        seen.add(key)
    after: np.ndarray = np.r_[False, first[:-1]] | np.r_[False, False, first[:-2]]
    return after


def windows(s: Samples, seed: int, width: int | None = None) -> np.ndarray:
    """Fitting units: runs of `width` consecutive steps of one point, as [start, stop)
    index pairs; single steps when the GPU timed them (`unit_width`). A CPU completion
    stamp can land up to a step late under async scheduling (one step reads ~2x, a
    neighbour ~0); over a window the gaps telescope to t_done[last] - t_done[first - 1],
    so only its two end stamps matter, and a point's first window starts at the exact
    moment its first step was scheduled onto an idle GPU. Warm-up points are left out; at
    most MAX_WINDOWS_PER_POINT per point, picked with a fixed seed, so one long point
    cannot outvote the sweep."""
    width = unit_width(s) if width is None else width
    rng = np.random.default_rng(seed)
    point = s["point"]
    out: list[tuple[int, int]] = []
    bounds = np.flatnonzero(np.r_[True, point[1:] != point[:-1], True])
    for a, b in pairwise(bounds):
        if s["warmup"][a]:
            continue
        starts = np.arange(a, b - width + 1, width)
        if len(starts) == 0:
            starts = np.array([a])
        if len(starts) > MAX_WINDOWS_PER_POINT:
            starts = np.sort(rng.choice(starts, MAX_WINDOWS_PER_POINT, replace=False))
        out += [(int(st), int(min(st + width, b))) for st in starts]
    return np.array(out, dtype=int).reshape(-1, 2)


def _window_sum(x: np.ndarray, win: np.ndarray) -> np.ndarray:
    c = np.concatenate([np.zeros((1, *x.shape[1:])), np.cumsum(x, axis=0)])
    out: np.ndarray = c[win[:, 1]] - c[win[:, 0]]
    return out


def _eager(s: Samples, sizes: list[int]) -> np.ndarray:
    """Steps that run without a CUDA graph (as `design`'s eager column marks them)."""
    e = s["eager_step"] if "eager_step" in s else s["tokens"] > max(sizes, default=0)
    return np.asarray(e, dtype=bool)


_ON_TOP = np.array([c in DRAFT_COEFS for c in COEFS])  # the drafter launches on its own


def _steps(x: np.ndarray, beta: np.ndarray, eager: np.ndarray, floor_s: float) -> np.ndarray:
    """Per-step times: the linear terms, an eager step's target pass at least
    `floor_s` (StepTimer.step_time_s), the drafter's terms on top."""
    if not floor_s:
        out: np.ndarray = x @ beta
        return out
    base = x[:, ~_ON_TOP] @ beta[~_ON_TOP]
    out = np.where(eager, np.maximum(base, floor_s), base)
    out += x[:, _ON_TOP] @ beta[_ON_TOP]
    return out


def _fit_once(s: Samples, win: np.ndarray, sizes: list[int], spec_k: int,
              free: np.ndarray, fixed: np.ndarray, knees: np.ndarray,
              floor: np.ndarray, eager_floors: Sequence[float] = (0.0,)
              ) -> tuple[float, np.ndarray, float]:
    """(knee, coefficients, eager floor) with the least squared relative error over the
    units `win`, searched over `knees` x `eager_floors`. The linear terms are fitted on
    every unit, floor or not (one solve a knee); each candidate floor is then scored on top
    of them. (Fitting
    them without the steps a floor binds recovers a synthetic floor exactly, but on the
    H200's sweeps it drops the 1,024-token steps that the floor barely binds and so bends
    the eager terms; served, it put fewer validation rows within target; see
    docs/calibration.md.)"""
    y = _window_sum(s["step_s"], win)
    eager = _eager(s, sizes)
    best: tuple[float, float, np.ndarray, float] | None = None
    for knee in knees:
        xs = design(s, float(knee), sizes, spec_k)
        beta = _solve(_window_sum(xs, win), y, free, fixed, floor)
        for f in eager_floors:
            pred = _window_sum(_steps(xs, beta, eager, f), win)
            loss = float(np.sum(((pred - y) / y) ** 2))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, float(knee), beta, float(f))
    assert best is not None
    return best[1], best[2], best[3]


def _floor_candidates(s: Samples, win: np.ndarray, sizes: list[int]) -> list[float]:
    """0 (no floor) and quantiles of the eager steps' measured times, for GPU-timed
    samples (a CPU-stamped window's sum hides which of its steps the floor bounds)."""
    eager = _eager(s, sizes)
    if unit_width(s) != 1 or not eager.any():
        return [0.0]
    y = s["step_s"][win[:, 0]][eager[win[:, 0]]]
    if len(y) < 4:
        return [0.0]
    qs = np.quantile(y, np.linspace(0.02, 0.9, FLOOR_CANDIDATES))
    return [0.0, *sorted({round(float(q), 6) for q in qs})]


def _model(knee: float, beta: np.ndarray, eager_floor: float = 0.0) -> StepModel:
    return StepModel(knee_tokens=knee, eager_floor_s=eager_floor,
                     **dict(zip(COEFS, map(float, beta), strict=True)))


def predict_steps(s: Samples, step: StepModel, sizes: list[int], spec_k: int) -> np.ndarray:
    """The model's time for every step of `s`, as StepTimer.step_time_s gives it."""
    beta = np.array([getattr(step, c) for c in COEFS])
    out = _steps(design(s, step.knee_tokens, sizes, spec_k), beta, _eager(s, sizes),
                 step.eager_floor_s)
    if step.eager_offset_s:
        past = s["tokens"] > max(sizes, default=0)
        offsets = {int(n): eager_offset(step.eager_offset_s, int(n))
                   for n in set(s["tokens"][past])}
        out = out + np.where(past, [offsets.get(int(n), 0.0) for n in s["tokens"]], 0.0)
    if step.graph_offset_s:
        # a decode-only step within the largest CUDA graph (past it, as under speculative
        # decoding it can be, the step runs without a graph: cudagraph_dispatcher.py)
        dec = decode_only(s) & (s["tokens"] <= max(sizes, default=0))
        out = out + np.where(dec, (step.graph_ctx_s - step.decode_ctx_s) * s["decode_ctx"], 0.0)
        if step.graph_window_s and step.window_tokens and "decode_ctx_window" in s:
            out = out + np.where(dec, (step.graph_window_s - step.decode_window_s)
                                 * s["decode_ctx_window"], 0.0)
        t_pad = padded(s["tokens"], sizes)
        offsets = {int(p): graph_offset(step.graph_offset_s, int(p)) for p in set(t_pad[dec])}
        out = out + np.where(dec, [offsets.get(int(p), 0.0) for p in t_pad], 0.0)
        if step.tile_rho and step.tile_kv_heads and step.tile_sms:
            f = tile_factors(s, dec, step.tile_kv_heads, step.tile_sms, step.tile_rho)
            out = out + step.graph_ctx_s * s["decode_ctx"] * (f - 1.0)
    return out


def tile_factors(s: Samples, dec: np.ndarray, kv_heads: int, sms: int,
                 rho: float) -> np.ndarray:
    """F (tiles.tail_factor) of each step in `dec`, its sequences taken as of one length
    (the sweep's decode points are), 1 elsewhere."""
    out = np.ones(len(s["step_s"]))
    seen: dict[tuple[int, int], float] = {}
    for i in np.flatnonzero(dec & (s["decode_seqs"] > 0)):
        b = int(s["decode_seqs"][i])
        key = (b, kv_blocks(int(s["decode_ctx"][i]) // b))
        f = seen.get(key)
        if f is None:
            f = seen[key] = tail_factor((key[1],) * b, kv_heads, sms, rho)
        out[i] = f
    return out



def decode_only(s: Samples) -> np.ndarray:
    """Steps without a prefill chunk or an image to encode: a full CUDA graph's replays."""
    out: np.ndarray = s["prefill_attn"] == 0
    if "encoder_tokens" in s:
        out &= s["encoder_tokens"] == 0
    return out



def window_ape(s: Samples, win: np.ndarray, step: StepModel, sizes: list[int],
               spec_k: int) -> np.ndarray:
    """Absolute relative error of the model's time for each window of steps."""
    pred = _window_sum(predict_steps(s, step, sizes, spec_k), win)
    ape: np.ndarray = np.abs(pred / _window_sum(s["step_s"], win) - 1)
    return ape


def _test_mask(n: int, seed: int, test_fraction: float) -> np.ndarray:
    """Which of `n` fitting units are held out: fit_step_model's seeded split."""
    out: np.ndarray = np.random.default_rng(seed + 1).random(n) < test_fraction
    return out


def _heldout(s: Samples, seed: int, test_fraction: float) -> np.ndarray:
    """fit_step_model's held-out windows."""
    win = windows(s, seed)
    out: np.ndarray = win[_test_mask(len(win), seed, test_fraction)]
    return out


def _heldout_steps(s: Samples, seed: int, test_fraction: float) -> np.ndarray:
    """A mask of the steps inside fit_step_model's held-out windows."""
    held = np.zeros(len(s["tokens"]), dtype=bool)
    for a, b in _heldout(s, seed, test_fraction):
        held[a:b] = True
    return held


def heldout_ape(s: Samples, step: StepModel, *, max_num_seqs: int,
                max_num_batched_tokens: int, spec_k: int = 0, seed: int = 0,
                test_fraction: float = 0.2, window: int = 0) -> np.ndarray:
    """fit_step_model's held-out windows (the same seeded split) priced by `step`: the
    profile as shipped, with the terms fitted after the linear fit (a graph scan's
    offsets and decode-only context rate) where the fit's own figures have only its own."""
    if window:
        s = attention_by_kind(s, window)
    eager = s["tokens"] > eager_threshold(max_num_seqs, max_num_batched_tokens)
    s = {**s, "eager_step": eager.astype(float)}
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, spec_k)
    return window_ape(s, _heldout(s, seed, test_fraction), step, sizes, spec_k)


def heldout_holding(s: Samples, steps: np.ndarray, *, seed: int = 0,
                    test_fraction: float = 0.2) -> np.ndarray:
    """Which of fit_step_model's held-out windows (heldout_ape's, in its order) hold one of
    `steps` (a mask over the samples)."""
    return np.array([bool(steps[a:b].any()) for a, b in _heldout(s, seed, test_fraction)],
                    dtype=bool)


def heldout_in_drain(s: Samples, *, seed: int = 0, test_fraction: float = 0.2) -> np.ndarray:
    """Which of fit_step_model's held-out windows hold a step of a point's drain
    (`drain_steps`)."""
    return heldout_holding(s, drain_steps(s), seed=seed, test_fraction=test_fraction)


def fit_step_model(
    s: Samples,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    spec_k: int = 0,
    fixed: Mapping[str, float] | None = None,
    floors: Mapping[str, float] | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    window: int = 0,
) -> FitResult:
    """Fit on a seeded 80 % of the windows; score on the other 20 %.

    `fixed` holds coefficients taken from elsewhere (a spec-decode profile keeps its base
    model's and fits only the draft terms; a profile without long-context decodes borrows
    the attention term of the same model's BF16 profile, whose kernel and KV it shares).
    `floors` holds physical lower bounds of free coefficients (see `physical_floors`).
    `window` (W > 0) adds the sliding-window layers' terms, for a sliding-window model
    (`attention_by_kind`; the samples then carry `prefill_attn_window`)."""
    if window:
        s = attention_by_kind(s, window)
    eager = s["tokens"] > eager_threshold(max_num_seqs, max_num_batched_tokens)
    s = {**s, "eager_step": eager.astype(float)}
    win = windows(s, seed)
    if len(win) < 8:
        raise CalibrationError(f"only {len(win)} usable step windows; need at least 8 to fit")
    test_mask = _test_mask(len(win), seed, test_fraction)
    train, test = win[~test_mask], win[test_mask]
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, spec_k)
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(COEFS) - {"knee_tokens", "eager_floor_s"}
    if unknown:
        raise CalibrationError(f"cannot fix unknown coefficient(s) {sorted(unknown)}")
    free = np.array([c not in fixed for c in COEFS])
    if not spec_k:
        free &= np.array([c not in DRAFT_COEFS for c in COEFS])
    if not window:
        free &= np.array([c not in WINDOW_COEFS for c in COEFS])
    fixed_vec = np.array([fixed.get(c, 0.0) for c in COEFS])
    floor = np.array([(floors or {}).get(c, 0.0) for c in COEFS])
    knees = np.array([fixed["knee_tokens"]]) if "knee_tokens" in fixed else KNEE_GRID
    eager_floors = ([fixed["eager_floor_s"]] if "eager_floor_s" in fixed
                    else _floor_candidates(s, train, sizes))

    first = _model(*_fit_once(s, train, sizes, spec_k, free, fixed_vec, knees, floor,
                              eager_floors))
    ape = window_ape(s, train, first, sizes, spec_k)
    good = train[ape <= max(TRIM_APE, 4 * float(np.median(ape)))]
    step = _model(*_fit_once(s, good, sizes, spec_k, free, fixed_vec, knees, floor,
                             eager_floors))
    # cross-validation and leave-one-point-out refit the linear terms and the knee; the
    # floor stays the one found here
    held = [step.eager_floor_s]
    test_ape = window_ape(s, test, step, sizes, spec_k)
    if window:
        step = step.model_copy(update={"window_tokens": int(window)})
    nan = float("nan")
    quality = FitQuality(
        n_train=len(good), n_test=len(test),
        median_ape=round(float(np.median(test_ape)), 5) if len(test) else nan,
        p95_ape=round(float(np.percentile(test_ape, 95)), 5) if len(test) else nan,
    )
    single = windows(s, seed, width=1)
    return FitResult(step=step, quality=quality, trimmed=len(train) - len(good),
                     test_ape=test_ape,
                     single_step_ape=window_ape(s, single, step, sizes, spec_k),
                     cv_ape=_cross_validate(s, win, sizes, spec_k, free, fixed_vec, knees,
                                            floor, seed, held),
                     point_ape=_leave_point_out(s, win, sizes, spec_k, free, fixed_vec, knees,
                                                floor, held))


def point_spans(s: Samples) -> np.ndarray:
    """Each measured (non-warm-up) point's steps as one [start, stop) span. Its summed time
    runs from the moment its first step was scheduled onto an idle GPU to its last step's
    completion, so no stamp inside it matters: what a simulation, which adds steps up,
    consumes, without the stamp jitter of a short window."""
    point = s["point"]
    bounds = np.flatnonzero(np.r_[True, point[1:] != point[:-1], True])
    return np.array([(a, b) for a, b in pairwise(bounds) if not s["warmup"][a]],
                    dtype=int).reshape(-1, 2)


def _leave_point_out(s: Samples, win: np.ndarray, sizes: list[int], spec_k: int,
                     free: np.ndarray, fixed: np.ndarray, knees: np.ndarray,
                     floor: np.ndarray, eager_floors: Sequence[float] = (0.0,)) -> np.ndarray:
    """Each point's summed time under a model fitted without any of its windows: how well
    the model predicts a batch composition it has not seen. A point measured in several
    runs of the engine (build._samples) is one point: every run's copy is left out, and
    the error is that of their summed time."""
    spans = point_spans(s)
    ids = s["point"][spans[:, 0]] if len(spans) else np.array([])
    out = []
    for pid in dict.fromkeys(ids):
        mine = spans[ids == pid]
        out_of = np.zeros(len(win), dtype=bool)
        for a, b in mine:
            out_of |= (win[:, 0] < b) & (win[:, 1] > a)
        rest = win[~out_of]
        if len(rest) < 8:
            continue
        step = _model(*_fit_once(s, rest, sizes, spec_k, free, fixed, knees, floor,
                                 eager_floors))
        pred = predict_steps(s, step, sizes, spec_k)
        took = sum(float(s["step_s"][a:b].sum()) for a, b in mine)
        out.append(abs(sum(float(pred[a:b].sum()) for a, b in mine) / took - 1))
    return np.array(out, dtype=float)


def _cross_validate(s: Samples, win: np.ndarray, sizes: list[int], spec_k: int,
                    free: np.ndarray, fixed: np.ndarray, knees: np.ndarray,
                    floor: np.ndarray, seed: int, eager_floors: Sequence[float] = (0.0,),
                    folds: int = 5) -> np.ndarray:
    """Every window's error under a model fitted without it (seeded k-fold): a steadier
    figure than one 20 % hold-out when a sweep yields few windows."""
    fold = np.random.default_rng(seed + 2).integers(0, folds, len(win))
    out = np.full(len(win), np.nan)
    for f in range(folds):
        test = fold == f
        if test.all() or not test.any():
            continue
        step = _model(*_fit_once(s, win[~test], sizes, spec_k, free, fixed, knees, floor,
                                 eager_floors))
        out[test] = window_ape(s, win[test], step, sizes, spec_k)
    kept: np.ndarray = out[~np.isnan(out)]
    return kept


def shared_ctx_saving(s: Samples, decode_ctx_s: float) -> tuple[float, list[dict[str, Any]]]:
    """`StepModel.shared_ctx_saving` from a prefix-cache engine's runs (sweep.cache_points):
    each `shared-b{B}-c{C}-s{P}` point against its twin `decode-b{B}-c{C}`, median decode
    step each (the batch's B decodes alone, its prefills left out), saves
    (twin - shared) / (decode_ctx_s x (B - 1) x P) of the profile's decode attention; the
    median over the pairs, and every pair."""
    median: dict[str, float] = {}
    for name in dict.fromkeys(s["point"]):
        if not name.startswith(("shared-", "decode-")):
            continue
        b = int(name.split("-")[1][1:])
        k = (s["point"] == name) & (s["decode_seqs"] == b) & (s["prefill_tokens"] == 0)
        if k.any():
            median[name] = float(np.median(s["step_s"][k]))
    pairs = []
    for name, t in median.items():
        if not name.startswith("shared-"):
            continue
        _, batch, ctx, prefix = name.split("-")
        twin = median.get(f"decode-{batch}-{ctx}")
        if twin is None:
            continue
        later = (int(batch[1:]) - 1) * int(prefix[1:])
        pairs.append({"point": name, "shared_s": round(t, 6), "unshared_s": round(twin, 6),
                      "saving": round((twin - t) / (decode_ctx_s * later), 4)})
    if not pairs or decode_ctx_s <= 0:
        return 0.0, pairs
    value = float(np.clip(np.median([q["saving"] for q in pairs]), 0.0, 1.0))
    return round(value, 4), pairs


def physical_floors(kv_bytes_per_token: float, hbm_bytes_per_s: float,
                    window_kv_bytes_per_token: float = 0.0) -> dict[str, float]:
    """Lower bounds physics sets: a decode step reads each context token's KV from HBM at
    most at the datasheet's peak bandwidth (the kernels that do it run after the GEMMs,
    not under them); the sliding layers' share within their window likewise."""
    floors = {"decode_ctx_s": kv_bytes_per_token / hbm_bytes_per_s}
    if window_kv_bytes_per_token:
        floors["decode_window_s"] = window_kv_bytes_per_token / hbm_bytes_per_s
    return floors


def fit_kv_capacity(
    points: Sequence[Mapping[str, float]], *, bytes_per_token: int
) -> KvCapacity:
    """The line tokens = slope * util - intercept through the (util, tokens) points."""
    u = np.array([p["gpu_memory_utilization"] for p in points], dtype=float)
    if len(np.unique(u)) < 2:
        raise CalibrationError("KV capacity needs points at two or more utilisations")
    t = np.array([p["tokens"] for p in points], dtype=float)
    slope, offset = np.polyfit(u, t, 1)
    return KvCapacity(bytes_per_token=bytes_per_token, slope_tokens=round(float(slope), 1),
                      intercept_tokens=round(float(-offset), 1),
                      measured=[dict(p) for p in points])


ATTN_MIN_SHARE = 0.15
"""attention_rate's steps: those whose prompt attention is at least this share of the joint
fit's price (long prompts, chunks after a long prior context)."""
ATTN_MIN_STEPS = 30


@dataclass(frozen=True)
class AttentionRate:
    rate: float  # seconds an attention pair (StepModel.prefill_attn_s)
    steps: int
    joint: float  # the joint fit's rate


def attention_rate(s: Samples, step: StepModel, sizes: list[int], spec_k: int, *,
                   seed: int = 0, test_fraction: float = 0.2) -> AttentionRate | None:
    """StepModel.prefill_attn_s from the steps where a prompt's attention weighs: where it
    is at least ATTN_MIN_SHARE of the joint fit's price, the least-squares rate of the
    measured step less the price's other terms against the step's attention pairs, over the
    steps outside fit_step_model's held-out windows (so its held-out error stays unseen).
    Elsewhere the attention term trades against the per-token and row terms across the many
    short steps: on the H200's Llama-3.1-8B FP8 the joint fit took 4.47e-10 s a pair where
    its long prompts say 7.49e-10, and the four Llama-3.1-8B profiles' say 7.5-7.9e-10 on both
    GPUs (FlashAttention's prefill is the die's, not the GEMMs' precision). None with fewer than
    ATTN_MIN_STEPS such steps."""
    held = _heldout_steps(s, seed, test_fraction)
    price = predict_steps(s, step, sizes, spec_k)
    attn = step.prefill_attn_s * s["prefill_attn"]
    use = (~held & ~s["warmup"].astype(bool) & (s["prefill_attn"] > 0)
           & (attn >= ATTN_MIN_SHARE * price))
    if use.sum() < ATTN_MIN_STEPS:
        return None
    x = s["prefill_attn"][use]
    rest = s["step_s"][use] - (price[use] - attn[use])
    return AttentionRate(rate=float(np.sum(rest * x) / np.sum(x * x)), steps=int(use.sum()),
                         joint=step.prefill_attn_s)


def eager_offsets(s: Samples, step: StepModel, sizes: list[int], *, lone: np.ndarray,
                  above_s: float, seed: int = 0, test_fraction: float = 0.2
                  ) -> dict[int, float]:
    """StepModel.eager_offset_s: at each token count of the lone-prompt steps `lone` (a
    mask), the median measured step less the model's terms without the floor, over the
    steps outside fit_step_model's held-out windows (so its held-out error stays unseen).

    Only counts whose last row of tiles is (nearly) full (FULL_ROW_HOLES): there the rows
    alone set the FP8 GEMMs' cost, and the scan departs from the line by as much as the
    serving steps do (Qwen3-32B FP8 on the H100: a lone 2,048-token prompt 0.94 of its
    price, served steps of 2,048 tokens 0.92), where at a half-empty row the lone prompts
    ran dearer than `gemm_holes_s` and the served steps did not (docs/calibration.md, "The
    counts the rows leave"). Only counts whose prompt's attention is at most
    MAX_ATTN_SHARE of the step: a lone long prompt's attention is no served step's. Only
    counts whose measured and priced medians both exceed `above_s` (the floor and the GPU's
    span of a graph-less step, below which the CPU's launches set the time)."""
    held = _heldout_steps(s, seed, test_fraction)
    bare = predict_steps(s, step.model_copy(update={"eager_floor_s": 0.0,
                                                     "eager_offset_s": {}}), sizes, 0)
    use = lone & ~held & (s["tokens"] > max(sizes, default=0))
    out: dict[int, float] = {}
    for n in np.unique(s["tokens"][use]):
        mine = use & (s["tokens"] == n)
        ran, priced = float(np.median(s["step_s"][mine])), float(np.median(bare[mine]))
        attn = step.prefill_attn_s * float(np.median(s["prefill_attn"][mine]))
        if (ran > above_s and priced > above_s and row_holes(int(n)) <= FULL_ROW_HOLES
                and attn <= MAX_ATTN_SHARE * priced):
            out[int(n)] = round(ran - priced, 7)
    return out
