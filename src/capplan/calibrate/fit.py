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
import polars as pl
from scipy.optimize import least_squares, lsq_linear

from capplan.calibrate.sweep import GRAPH_SCAN_CONTEXT
from capplan.errors import CalibrationError
from capplan.profile import FitQuality, KvCapacity, StepModel
from capplan.steptime import (
    GEMM_ROW_TOKENS,
    GEMM_SWITCH_TOKENS,
    cudagraph_capture_sizes,
    eager_offset,
    eager_threshold,
    encoder_work_s,
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


def _pad(tokens: np.ndarray, sizes: list[int]) -> np.ndarray:
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
    t_pad = _pad(s["tokens"], sizes)
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
    decode_only = _decode_only(s)
    out = np.zeros(len(point), dtype=bool)
    bounds = np.flatnonzero(np.r_[True, point[1:] != point[:-1], True])
    for a, b in pairwise(bounds):
        dropped = seqs[a:b - 1] - seqs[a + 1:b]
        start = np.flatnonzero(decode_only[a + 1:b] & (dropped >= DRAIN_FINISHED))
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
        dec = _decode_only(s) & (s["tokens"] <= max(sizes, default=0))
        out = out + np.where(dec, (step.graph_ctx_s - step.decode_ctx_s) * s["decode_ctx"], 0.0)
        if step.graph_window_s and step.window_tokens and "decode_ctx_window" in s:
            out = out + np.where(dec, (step.graph_window_s - step.decode_window_s)
                                 * s["decode_ctx_window"], 0.0)
        t_pad = _pad(s["tokens"], sizes)
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


TILE_RHOS = tuple(round(1.0 + 0.1 * i, 1) for i in range(31))
"""The values of `tile_rho` the fit tries (1: a lone tile no faster than any other; 4: all
but the shortest tails free)."""
TILE_MIN_CONTEXT = 1024
"""Context tokens a sequence a decode-only cell must hold to join `tile_rho`'s fit."""
TILE_MIN_MOVE = 0.02
"""A decode-only cell joins `tile_rho`'s fit where F at rho 1 would add this share of its
price or more."""
TILE_MIN_GAIN = 0.2
"""A fitted `tile_rho` stands where it cuts the decode-only cells' root-mean-square error
by at least this share; else F stays 1."""


@dataclass(frozen=True)
class TileFit:
    """`tile_rho`'s fit over a profile's decode-only cells (a sweep point's steps with one
    count of decoding sequences) whose F can exceed 1: how many, and the RMS of their median
    error without the term and with it."""

    rho: float
    cells: int
    rms_without_s: float
    rms_with_s: float


def tile_rho(s: Samples, step: StepModel, sizes: list[int], spec_k: int, kv_heads: int,
             sms: int) -> TileFit | None:
    """Fit `tile_rho` on the decode-only steps within the largest CUDA graph, once the graph
    scan's terms are in `step`: the value of TILE_RHOS whose F brings each cell's median
    step closest to the measured median, in the root mean square over cells. None without a
    graph scan or such steps, or where no value cuts the error by TILE_MIN_GAIN."""
    if not step.graph_offset_s:
        return None
    dec = (_decode_only(s) & (s["tokens"] <= max(sizes, default=0)) & (s["decode_seqs"] > 0)
           & ~s["warmup"].astype(bool))
    if not dec.any():
        return None
    base = predict_steps(s, step.model_copy(update={"tile_rho": 0.0}), sizes, spec_k)
    cells: dict[tuple[str, int], list[int]] = {}
    for i in np.flatnonzero(dec):
        cells.setdefault((str(s["point"][i]), int(s["decode_seqs"][i])), []).append(int(i))
    # the cells the term can move by TILE_MIN_MOVE of their price or more (at the slowest
    # tail, rho 1) whose sequences hold TILE_MIN_CONTEXT tokens or more; the others keep
    # their error whatever rho is, or errors of their own (a short-context point's ramp, its
    # decodes between its prompts' steps, runs up to 70 % over its price at any rho)
    cost = step.graph_ctx_s * s["decode_ctx"]
    most = cost * (tile_factors(s, dec, kv_heads, sms, TILE_RHOS[0]) - 1.0)
    idx = []
    for (_, b), v in cells.items():
        k = np.array(v)
        if (len(k) >= 3 and np.median(most[k]) >= TILE_MIN_MOVE * np.median(base[k])
                and np.median(s["decode_ctx"][k]) >= TILE_MIN_CONTEXT * b):
            idx.append(k)
    if not idx:
        return None
    meas = np.array([np.median(s["step_s"][k]) for k in idx])

    def rms(f: np.ndarray) -> float:
        return float(np.sqrt(np.mean([(m - np.median(base[k] + cost[k] * (f[k] - 1))) ** 2
                                      for m, k in zip(meas, idx, strict=True)])))

    without = rms(np.ones(len(base)))
    best = min((rms(tile_factors(s, dec, kv_heads, sms, r)), r) for r in TILE_RHOS)
    if best[0] > (1 - TILE_MIN_GAIN) * without:
        return None
    return TileFit(rho=best[1], cells=len(idx), rms_without_s=without, rms_with_s=best[0])


def _decode_only(s: Samples) -> np.ndarray:
    """Steps without a prefill chunk or an image to encode: a full CUDA graph's replays."""
    out: np.ndarray = s["prefill_attn"] == 0
    if "encoder_tokens" in s:
        out &= s["encoder_tokens"] == 0
    return out


GRAPH_SCAN_MIN_STEPS = 8
"""Steps of one size a graph scan needs before its median stands for that size."""


GRAPH_SCAN_SPIKE = 1.25
"""A run of scanned sizes whose median step jumps this much over the size below and falls as
much again at a larger size (at the scan's short context) is a slow stretch of the engine,
not its graph: vLLM's FP8 stairs jump at most 15 % over the size below, and no larger graph
runs faster than a smaller one (docs/calibration.md)."""
GRAPH_SCAN_MAX_STRETCHES = 1
"""More such stretches than this and the scan ran at two speeds: its offsets are not used."""


def graph_scan_slow_stretches(points: list[dict[str, Any]]) -> list[str]:
    """The slow stretches of a graph scan (GraphScan.points) at its short context, each named
    by its first point (and its last, where longer than one size): a size GRAPH_SCAN_SPIKE
    times the size below's median step or more (or the first size), up to the size before
    one that is GRAPH_SCAN_SPIKE times faster than the size below it. A step up with no fall
    after it (a kernel's stair) is not one; a stretch with none before it starts at the
    first size. A host that ran the engine at two speeds leaves several (the H100's and the
    H200's draft-model scans, CPU-bound, did)."""
    short = sorted((p for p in points if p["point"].endswith(f"-c{GRAPH_SCAN_CONTEXT}")),
                   key=lambda p: p["size"])
    m = [p["measured_s"] for p in short]
    stretches: list[str] = []
    start: int | None = 0
    for i in range(1, len(m)):
        if m[i] >= GRAPH_SCAN_SPIKE * m[i - 1]:
            start = i
        elif GRAPH_SCAN_SPIKE * m[i] <= m[i - 1] and start is not None:
            first, last = short[start]["point"], short[i - 1]["point"]
            stretches.append(first if first == last else f"{first} to {last}")
            start = None
    return stretches


@dataclass
class EncoderScan:
    """What an encoder scan gives a profile (StepModel.encoder_token_s, encoder_token2_s,
    encoder_floor_s), and every point's median pass, measured and so priced, for
    provenance."""

    token_s: float
    token2_s: float
    floor_s: float
    points: list[dict[str, Any]]

    def pass_s(self, images: int, image_tokens: int) -> float:
        """A pass over `images` pictures of `image_tokens` each, as the profile prices it
        (steptime.py StepTimer.encoder_pass_s)."""
        work = encoder_work_s(images * image_tokens, images, self.token_s, self.token2_s)
        return max(float(work), self.floor_s)


def encoder_scan(df: pl.DataFrame) -> EncoderScan:
    """Fit an encoder-scan run (sweep.encoder_points; store.read_encoder_jsonl). vLLM runs
    the vision tower eagerly, every picture a step schedules in one call, so a pass costs
    the larger of the GPU's work and the CPU's launches of the tower's kernels: each picture
    `token_s` an image token plus `token2_s` a token squared (the attention over its
    patches), the pass at least `floor_s` (the launches, whatever the pictures). The three
    are fitted together, in relative error, to every point's median synchronised wall time
    (`wall_s`); a run whose points cannot tell them apart is refused."""
    med = (df.group_by("point", "images", "image_tokens")
           .agg(pl.col("wall_s").median(), pl.col("gpu_s").median(),
                pl.col("launch_s").median(), pl.col("tokens_out").first(),
                pl.col("inputs").first(), pl.len().alias("passes"))
           .sort("image_tokens", "images"))
    if med.height < 4 or med["image_tokens"].n_unique() < 2:
        raise CalibrationError(
            f"encoder scan: {med.height} points of {med['image_tokens'].n_unique()} picture "
            "sizes; the fit needs at least 4 points and 2 sizes (sweep.encoder_points)")
    n = med["images"].to_numpy().astype(float)
    t = med["image_tokens"].to_numpy().astype(float)
    y = med["wall_s"].to_numpy()

    def priced(x: np.ndarray) -> np.ndarray:  # x: floor in ms, per token in us, token^2 ns
        out: np.ndarray = np.maximum(encoder_work_s(n * t, n, x[1] * 1e-6, x[2] * 1e-9),
                                     x[0] * 1e-3)
        return out

    start = [float(y.min()) * 1e3, float(np.median(y / (n * t))) * 1e6, 0.0]
    fit = least_squares(lambda x: np.log(priced(x) / y), start,
                                 bounds=([0.0, 0.0, 0.0], [np.inf] * 3))
    floor_s, token_s, token2_s = fit.x[0] * 1e-3, fit.x[1] * 1e-6, fit.x[2] * 1e-9
    scan = EncoderScan(token_s, token2_s, floor_s, [])
    scan.points = [{"point": r["point"], "images": r["images"], "image_tokens": r["image_tokens"],
                    "passes": r["passes"], "inputs": r["inputs"], "tokens_out": r["tokens_out"],
                    "wall_ms": round(r["wall_s"] * 1e3, 3), "gpu_ms": round(r["gpu_s"] * 1e3, 3),
                    "launch_ms": round(r["launch_s"] * 1e3, 3),
                    "priced_ms": round(scan.pass_s(r["images"], r["image_tokens"]) * 1e3, 3)}
                   for r in med.iter_rows(named=True)]
    return scan


@dataclass
class PictureSteps:
    """What one encoder run's picture points give a profile: every measured step that
    encoded a picture, less its text-only twin's median step and the scan's pass, sorted
    (StepModel.encoder_step_draws_s pools them over the engine's runs, and their median is
    its `encoder_step_s`), and each point's figures, for provenance."""

    draws_s: list[float]
    points: list[dict[str, Any]]
    # each encoding step's start (the run's clock, s) and its figure, in time order
    sequence: list[tuple[float, float]]


def picture_and_twin(df: pl.DataFrame, pid: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A picture point's steps that encoded (`encoder_tokens`), and its text-only twin's
    prompt steps: the twin's prompts alone, not the prefill that set up its running decodes."""
    pic = df.filter((pl.col("point") == pid) & (pl.col("encoder_tokens") > 0))
    txt = df.filter((pl.col("point") == pid.replace("-i1", "-i0"))
                    & (pl.col("prefill_tokens") > 0) & (pl.col("prefill_seqs") == 1))
    if txt.is_empty():
        return pic, txt
    return pic, txt.filter(pl.col("prefill_tokens") == txt["prefill_tokens"].min())


def picture_steps(df: pl.DataFrame, scan: EncoderScan) -> PictureSteps | None:
    """What a step that encodes a picture costs beyond the encoder's pass, from an encoder
    engine's picture points (sweep.picture_points; store.read_runner_jsonl of its run): for
    each picture point, each of its steps that encoded (`encoder_tokens`) less its text-only
    twin's median prefill step, less the scan's pass (`scan.pass_s`). The cost is not one
    figure: on the H200 a 280-token picture's step ran ~35-60 or ~75-145 ms beyond its twin, in
    spells of several steps, alone and beside decodes, in calibration and in serving alike
    (docs/calibration.md, "A picture's step"), so the profile keeps every step's figure for
    the simulator to draw from, and their median. None without picture points."""
    df = df.filter(~pl.col("warmup"))
    if "encoder_tokens" not in df.columns:
        return None
    rows: list[dict[str, Any]] = []
    draws: list[float] = []
    sequence: list[tuple[float, float]] = []
    for pid in sorted(p for p in df["point"].unique() if p.startswith("picture-")
                      and "-i0" not in p):
        twin = pid.replace("-i1", "-i0")
        pic, txt = picture_and_twin(df, pid)
        if pic.is_empty() or txt.is_empty():
            continue
        tokens = int(pic["encoder_tokens"].median())  # type: ignore[arg-type]
        txt_s = float(txt["step_s"].median())  # type: ignore[arg-type]
        pass_s = scan.pass_s(1, tokens)
        beyond = pic["step_s"].to_numpy() - txt_s - pass_s
        draws += beyond.tolist()
        sequence += zip(pic["t_sched0"].to_list(), beyond.tolist(), strict=True)
        p10, p50, p90 = np.percentile(beyond, [10, 50, 90]) * 1e3
        rows.append({"point": pid, "twin": twin, "steps": pic.height,
                     "twin_steps": txt.height, "image_tokens": tokens,
                     "picture_ms": round(float(pic["step_s"].median()) * 1e3, 3),  # type: ignore[arg-type]
                     "twin_ms": round(txt_s * 1e3, 3), "pass_ms": round(pass_s * 1e3, 3),
                     "beyond_pass_ms": round(float(p50), 3),
                     "beyond_pass_p10_p90_ms": [round(float(p10), 3), round(float(p90), 3)]})
    if not rows:
        return None
    return PictureSteps(sorted(round(d, 5) for d in draws), rows, sorted(sequence))


SPELL_GAP_S = 10.0
"""Observations of a run's picture steps further apart than this say nothing of the spell
between them (another engine's points ran there)."""


def slow_above(draws: list[float]) -> float:
    """Where a sample of picture steps (StepModel.encoder_step_draws_s) splits into its fast
    and slow spells: the split of the sorted sample that leaves the least variance within
    the two sides (Otsu's threshold, in one dimension), halfway between them."""
    x = np.sort(np.asarray(draws, dtype=float))
    if len(x) < 2:
        return float("inf")
    cost = [x[:i].var() * i + x[i:].var() * (len(x) - i) for i in range(1, len(x))]
    i = int(np.argmin(cost)) + 1
    return float((x[i - 1] + x[i]) / 2)


def spell_lengths(sequences: list[list[tuple[float, float]]],
                  above: float) -> tuple[float, float]:
    """The mean length (s) of a slow spell and of a fast one, from runs' picture steps in
    time order (PictureSteps.sequence), a step slow past `above`: each state's time between
    consecutive steps over the times the state ended, as for a two-state Markov process
    observed at those instants (steps SPELL_GAP_S or more apart are not counted). 0, 0
    where no spell ended."""
    time = {True: 0.0, False: 0.0}
    ended = {True: 0, False: 0}
    for seq in sequences:
        for (t0, d0), (t1, d1) in pairwise(seq):
            if t1 - t0 >= SPELL_GAP_S:
                continue
            slow0, slow1 = d0 > above, d1 > above
            time[slow0] += t1 - t0
            ended[slow0] += slow0 != slow1
    if not ended[True] or not ended[False]:
        return 0.0, 0.0
    return time[True] / ended[True], time[False] / ended[False]


@dataclass
class GraphScan:
    """What a graph-scan run gives a profile (StepModel.graph_ctx_s, graph_window_s,
    graph_offset_s), and each point's median step, measured and by the linear terms, for
    provenance."""

    ctx_s: float
    offsets: dict[int, float]
    points: list[dict[str, Any]]
    window_ctx_s: float = 0.0  # a sliding-window model's StepModel.graph_window_s


def graph_scan(s: Samples, step: StepModel, sizes: list[int],
               ctx_floor_s: float = 0.0, window: int = 0,
               window_floor_s: float = 0.0, spec_k: int = 0) -> GraphScan | None:
    """Fit a graph-scan run (sweep.graph_points) on top of the linear terms of `step`, over
    each point's steady steps (all B requests decoding, no prefill): the decode-only
    context rate from the sizes scanned at two contexts (their residuals' change summed
    over the context tokens' change summed, so that the largest batches weigh most; at
    least `ctx_floor_s`, the KV read at the HBM's peak), then each size's offset, the
    median of its steps' residual once that rate replaces `decode_ctx_s`. None without a
    scan. A sliding-window model (`window` W > 0) reads its context in two kinds of layer,
    which two contexts cannot tell apart: it keeps its full-attention layers' rate
    (`decode_ctx_s`) and takes the sliding layers' decode-only rate (`graph_window_s`, at
    least `window_floor_s`) from the change, and its offsets from the points whose requests
    stay within the window. Under speculative decoding (`spec_k` = k) the linear terms
    include the drafter's and `sizes` are the graphs of multiples of 1 + k."""
    if window:
        s = attention_by_kind(s, window)
    linear = predict_steps(s, step.model_copy(update={"graph_offset_s": {}}), sizes, spec_k)
    t_pad = _pad(s["tokens"], sizes)
    resid = s["step_s"] - linear
    steady: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(s["point"]):
        if not name.startswith("graphs-"):
            continue
        b = int(name.split("-")[1][1:])
        k = ((s["point"] == name) & ~s["warmup"].astype(bool) & _decode_only(s)
             & (s["decode_seqs"] == b))
        if k.sum() >= GRAPH_SCAN_MIN_STEPS:
            steady[name] = k
    if not steady:
        return None
    # the rate: per size, (context tokens, median residual) at each context scanned
    ctx_col = "decode_ctx_window" if window else "decode_ctx"
    by_size: dict[int, list[tuple[float, float]]] = {}
    for k in steady.values():
        by_size.setdefault(int(t_pad[k][0]), []).append(
            (float(np.mean(s[ctx_col][k])), float(np.median(resid[k]))))
    pairs = [(hi[0] - lo[0], hi[1] - lo[1]) for pts in by_size.values() if len(pts) > 1
             for lo, hi in [(min(pts), max(pts))] if hi[0] > lo[0]]
    d_ctx = sum(p[0] for p in pairs)
    change = sum(p[1] for p in pairs) / d_ctx if d_ctx else 0.0
    window_s = 0.0
    if window:
        ctx_s = step.decode_ctx_s
        window_s = max(step.decode_window_s + change, window_floor_s) if d_ctx else 0.0
        if window_s:
            resid = resid - (window_s - step.decode_window_s) * s["decode_ctx_window"]
        steady = {n: k for n, k in steady.items() if int(n.rsplit("-c", 1)[1]) <= window}
    else:
        ctx_s = max(step.decode_ctx_s + change, ctx_floor_s)
        resid = resid - (ctx_s - step.decode_ctx_s) * s["decode_ctx"]
    groups: dict[int, list[float]] = {}
    points = []
    for name, k in steady.items():
        size = int(t_pad[k][0])
        groups.setdefault(size, []).extend(resid[k].tolist())
        points.append({"point": name, "size": size, "steps": int(k.sum()),
                       "measured_s": round(float(np.median(s["step_s"][k])), 6),
                       "linear_s": round(float(np.median(linear[k])), 6)})
    offsets = {size: round(float(np.median(r)), 7) for size, r in sorted(groups.items())}
    return GraphScan(ctx_s=round(ctx_s, 15), offsets=offsets, points=points,
                     window_ctx_s=round(window_s, 15))


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
