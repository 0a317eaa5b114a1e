"""Fitting the step-time and KV-capacity models (pure numpy/scipy, synthetic data)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.calibrate import fit as F
from capplan.calibrate import scans
from capplan.calibrate.sweep import GRAPH_SCAN_CONTEXT
from capplan.errors import CalibrationError
from capplan.profile import Profile, StepModel
from capplan.steptime import StepTimer, cudagraph_capture_sizes, row_holes

TRUE = {"fixed_s": 4e-3, "per_token_s": 2e-5, "knee_tokens": 64.0, "prefill_attn_s": 1e-9,
        "decode_ctx_s": 3e-8, "per_seq_s": 5e-6, "eager_step_s": 2e-3}


def _synthetic(seed: int = 0, n_points: int = 30, steps: int = 24) -> dict[str, np.ndarray]:
    """Steps of random compositions, timed exactly by the model, stamped back to back."""
    rng = np.random.default_rng(seed)
    sizes = cudagraph_capture_sizes(256, 8192)
    rows: dict[str, list[float]] = {k: [] for k in ("tokens", "seqs", "decode_ctx",
                                                    "prefill_attn", "drafting_seqs")}
    point, step_s = [], []
    for p in range(n_points):
        for _ in range(steps):
            dec = int(rng.integers(0, 256))
            chunk = int(rng.choice([0, 0, 128, 512, 2048, 8000 - dec]))
            ctx = int(rng.integers(0, 16384))
            tokens = max(dec + chunk, 1)
            seqs = dec + (1 if chunk else 0) or 1
            pa = chunk * (ctx + chunk / 2)
            dctx = dec * int(rng.integers(100, 8000))
            t_pad = tokens if tokens > sizes[-1] else min(s for s in sizes if s >= tokens)
            t = (TRUE["fixed_s"] + TRUE["per_token_s"] * max(t_pad, TRUE["knee_tokens"])
                 + TRUE["prefill_attn_s"] * pa + TRUE["decode_ctx_s"] * dctx
                 + TRUE["per_seq_s"] * seqs
                 + TRUE["eager_step_s"] * (tokens > sizes[-1]))
            for k, v in zip(rows, (tokens, seqs, dctx, pa, 0), strict=True):
                rows[k].append(v)
            point.append(f"p{p}")
            step_s.append(t)
    s = {k: np.array(v) for k, v in rows.items()}
    s["tokens"] = s["tokens"].astype(int)
    s["point"] = np.array(point)
    s["step_s"] = np.array(step_s)
    s["warmup"] = np.zeros(len(point), dtype=bool)
    return s


def _timer(step: StepModel, **profile: object) -> StepTimer:
    """StepTimer of a profile holding `step` (and nothing the timer reads besides, but the
    `profile` fields given, e.g. spec_method and spec_k)."""
    prof = Profile.model_validate({
        "gpu": "h200", "model": "m", "precision": "bf16", "step": step.model_dump(),
        "kv": {"bytes_per_token": 1, "slope_tokens": 1.0, "intercept_tokens": 0.0},
        "box": {"max_tokens": 10**6, "max_seqs": 10**6, "max_context_tokens": 10**6},
        "provenance": {"source": "measured"}, **profile})
    return StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)


def test_fit_recovers_known_coefficients() -> None:
    """Noise-free steps from known coefficients give those coefficients back."""
    res = F.fit_step_model(_synthetic(), max_num_seqs=256, max_num_batched_tokens=8192)
    for k, v in TRUE.items():
        assert getattr(res.step, k) == pytest.approx(v, rel=1e-6), k
    assert res.quality.median_ape < 1e-9 and res.quality.n_test > 0


def test_fit_is_evaluated_by_step_timer() -> None:
    """A fitted StepModel gives the same step time through StepTimer as the fit's own model."""
    s = _synthetic(1)
    res = F.fit_step_model(s, max_num_seqs=256, max_num_batched_tokens=8192)
    timer = _timer(res.step)
    for i in range(0, len(s["step_s"]), 37):
        got = timer.step_time_s(int(s["tokens"][i]), int(s["seqs"][i]), s["prefill_attn"][i],
                                int(s["decode_ctx"][i]))
        assert got == pytest.approx(s["step_s"][i], rel=1e-6)


def test_late_stamp_does_not_move_the_fit() -> None:
    """A completion stamped a step late (one step reads long, the next short) telescopes
    away inside a window: the fit is unchanged."""
    s = _synthetic(2)
    t_done = np.cumsum(s["step_s"])
    late = t_done.copy()
    for i in range(5, len(late) - 2, 24):  # inside windows: stamps 1..24 of each point
        if i % 4 != 0:
            late[i] = late[i + 1] - 1e-5
    points = s["point"]
    clean = dict(s, step_s=F.step_times_s(points, t_done - s["step_s"], t_done))
    noisy = dict(s, step_s=F.step_times_s(points, t_done - s["step_s"], late))
    a = F.fit_step_model(clean, max_num_seqs=256, max_num_batched_tokens=8192)
    b = F.fit_step_model(noisy, max_num_seqs=256, max_num_batched_tokens=8192)
    assert b.step.per_token_s == pytest.approx(a.step.per_token_s, rel=1e-3)
    assert b.quality.median_ape < 0.01


def test_leave_one_point_out_scores_every_measured_point() -> None:
    """Every non-warm-up point is scored once, by a fit that saw none of its windows; on
    noise-free steps each prediction is exact, and a point whose steps run slower than the
    model (here the third, 30 % slower) shows as that point's error."""
    s = _synthetic(3, n_points=12)
    s["warmup"][:24] = True  # the first point is a warm-up
    assert len(F.point_spans(s)) == 11
    res = F.fit_step_model(s, max_num_seqs=256, max_num_batched_tokens=8192)
    assert len(res.point_ape) == 11 and res.point_ape.max() < 1e-6
    slow = dict(s, step_s=np.where(s["point"] == "p3", 1.3 * s["step_s"], s["step_s"]))
    ape = F.fit_step_model(slow, max_num_seqs=256, max_num_batched_tokens=8192).point_ape
    assert ape[2] == pytest.approx(1 - 1 / 1.3, rel=0.05)
    assert np.median(ape) < 0.05


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-4, 1.0), min_size=2, max_size=40))
def test_step_times_telescope(gaps: list[float]) -> None:
    """Within a point, step times sum to the span from the first completion to the last."""
    t_done = np.cumsum(gaps)
    point = np.array(["a"] * len(gaps))
    t_sched0 = np.r_[0.0, t_done[:-1]] - 1e-6  # each step queued before the last one ended
    dt = F.step_times_s(point, t_sched0, t_done)
    assert dt[1:].sum() == pytest.approx(t_done[-1] - t_done[0], rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-4, 1.0), min_size=2, max_size=40),
       st.lists(st.floats(0.0, 1e-2), min_size=40, max_size=40))
def test_gpu_step_times_telescope(busy: list[float], waits: list[float]) -> None:
    """By the GPU's stamps, a point's steps sum to the span from the stream reaching its
    first step to the end of its last, waits for the CPU's launches included."""
    g0, g1, t = [], [], 0.0
    for b, w in zip(busy, waits, strict=False):
        t += w
        g0.append(t)
        t += b
        g1.append(t)
    point = np.array(["a"] * len(busy))
    pipelined = np.r_[False, np.ones(len(busy) - 1, dtype=bool)]
    dt = F.step_times_gpu_s(point, pipelined, np.array(g0), np.array(g1))
    assert dt.sum() == pytest.approx(g1[-1] - g0[0], rel=1e-9)
    assert dt[0] == pytest.approx(busy[0])


def test_gpu_timed_samples_are_fitted_step_by_step() -> None:
    """Steps the GPU timed are fitting units on their own; CPU-stamped ones come in
    windows of four."""
    s = _synthetic(4, n_points=3)
    assert F.unit_width(s) == F.WINDOW
    assert set(np.diff(F.windows(s, 0), axis=1).ravel()) == {F.WINDOW}
    s["gpu_clock"] = np.ones(len(s["step_s"]), dtype=bool)
    assert F.unit_width(s) == 1
    assert set(np.diff(F.windows(s, 0), axis=1).ravel()) == {1}


def test_sliding_window_terms_are_recovered() -> None:
    """A sliding-window model's steps, its sliding layers reading at most W tokens of context
    each, give back both attention kinds' coefficients; StepTimer charges them the same."""
    w = 1024
    s = _synthetic(5)
    rng = np.random.default_rng(5)
    dec = np.maximum(s["seqs"] - (s["prefill_attn"] > 0), 0)
    s["decode_seqs"] = dec
    # decode context at one mean per step (as the calibration's points have it)
    mean = rng.choice([256, 900, 2048, 8000], len(dec))
    s["decode_ctx"] = (dec * mean).astype(int)
    s["prefill_attn_window"] = np.minimum(s["prefill_attn"], 0.5 * s["prefill_attn"] + 1e5)
    d_win, p_win = 2e-7, 3e-10
    sizes = cudagraph_capture_sizes(256, 8192)
    beta = np.array([TRUE.get(c, 0.0) for c in F.COEFS])
    base = F.design(s, TRUE["knee_tokens"], sizes, 0) @ beta
    s["step_s"] = (base + d_win * dec * np.minimum(mean, w)
                   + p_win * s["prefill_attn_window"])
    res = F.fit_step_model(s, max_num_seqs=256, max_num_batched_tokens=8192, window=w)
    assert res.step.window_tokens == w
    assert res.step.decode_window_s == pytest.approx(d_win, rel=1e-5)
    assert res.step.prefill_window_s == pytest.approx(p_win, rel=1e-5)
    assert res.step.decode_ctx_s == pytest.approx(TRUE["decode_ctx_s"], rel=1e-5)
    timer = _timer(res.step)
    for i in range(0, len(s["step_s"]), 41):
        got = timer.step_time_s(int(s["tokens"][i]), int(s["seqs"][i]), s["prefill_attn"][i],
                                int(s["decode_ctx"][i]), decode_seqs=int(dec[i]),
                                prefill_attn_window=float(s["prefill_attn_window"][i]))
        assert got == pytest.approx(s["step_s"][i], rel=1e-5)


def test_fit_finds_the_eager_floor() -> None:
    """GPU-timed steps past the largest CUDA graph that cost at least a floor (the CPU's
    launches) give a floor near it back, and the fit with it beats the fit without."""
    s = _synthetic(2)
    eager = s["tokens"] > max(cudagraph_capture_sizes(256, 8192))
    floor_s = 0.05
    s["step_s"] = np.where(eager, np.maximum(s["step_s"], floor_s), s["step_s"])
    s["gpu_clock"] = np.ones(len(s["step_s"]), dtype=bool)
    assert (eager & (s["step_s"] == floor_s)).sum() > 20  # the floor binds somewhere
    kw = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    res = F.fit_step_model(s, **kw)
    without = F.fit_step_model(s, fixed={"eager_floor_s": 0.0}, **kw)
    assert res.step.eager_floor_s == pytest.approx(floor_s, rel=0.15)
    assert without.step.eager_floor_s == 0.0
    sizes = cudagraph_capture_sizes(256, 8192)
    pred = F.predict_steps({**s, "eager_step": eager.astype(float)}, res.step, sizes, 0)
    pred0 = F.predict_steps({**s, "eager_step": eager.astype(float)}, without.step, sizes, 0)
    bound = eager & (s["step_s"] == floor_s)
    assert (np.median(np.abs(pred[bound] / floor_s - 1))
            < 0.5 * np.median(np.abs(pred0[bound] / floor_s - 1)))
    timer = _timer(res.step)  # StepTimer applies the floor as the fit scored it
    for i in np.flatnonzero(eager)[:40]:
        got = timer.step_time_s(int(s["tokens"][i]), int(s["seqs"][i]), s["prefill_attn"][i],
                                int(s["decode_ctx"][i]))
        assert got == pytest.approx(pred[i], rel=1e-9)


def test_eager_floor_binds_only_past_the_graphs_and_below_the_drafter() -> None:
    """The floor lifts a graph-less step's target pass; graphed steps and the drafter's
    terms, which come on top, are untouched."""
    step = StepModel(fixed_s=1e-3, per_token_s=1e-5, knee_tokens=0, prefill_attn_s=0,
                     decode_ctx_s=0, per_seq_s=0, eager_floor_s=0.05, draft_pass_s=2e-3)
    t = _timer(step)
    assert t.step_time_s(512, 1, 0.0, 0) == pytest.approx(1e-3 + 512e-5)
    assert t.step_time_s(600, 1, 0.0, 0) == pytest.approx(0.05)
    ts = _timer(step, spec_method="mtp", spec_k=2)
    assert ts.step_time_s(600, 1, 0.0, 0) == pytest.approx(0.05 + 2 * 2e-3)


def test_core_eager_time_sets_the_launch_and_leaves_the_floor_to_the_gpu() -> None:
    """With the serving core's own time for a graph-less step (core_eager_s), that is the
    core's hold, and the floor bounds the step's GPU span instead: a step of less work than
    the floor still takes the floor, a run of such steps as long as before, but the core is
    free earlier; without it, the floor is both (StepTimer.step_times)."""
    base = StepModel(fixed_s=1e-3, per_token_s=1e-5, knee_tokens=0, prefill_attn_s=0,
                     decode_ctx_s=0, per_seq_s=0, eager_floor_s=0.05)
    work, launch = _timer(base).step_times(600, 1, 0.0, 0)
    assert (work, launch) == (pytest.approx(1e-3 + 600e-5), pytest.approx(0.05))
    split = _timer(base.model_copy(update={"core_eager_s": 0.03}))
    assert split.step_times(600, 1, 0.0, 0) == (pytest.approx(0.05), pytest.approx(0.03))
    assert split.step_times(9000, 1, 0.0, 0)[0] == pytest.approx(1e-3 + 9000e-5)
    assert split.step_time_s(600, 1, 0.0, 0) == pytest.approx(0.05)
    assert split.step_times(512, 1, 0.0, 0) == _timer(base).step_times(512, 1, 0.0, 0)
    # where the serving traces measured the GPU's own span of such a step (a CPU-bound
    # calibration's floor is its launch, longer than the GPU's span), that bounds the work
    gpu = _timer(base.model_copy(update={"core_eager_s": 0.03, "eager_gpu_s": 0.02}))
    assert gpu.step_times(600, 1, 0.0, 0) == (pytest.approx(0.02), pytest.approx(0.03))
    assert gpu.step_time_s(600, 1, 0.0, 0) == pytest.approx(0.03)


def test_gemm_stairs_jump_past_128_tokens_and_every_256() -> None:
    """The quantized GEMM's tile stairs (steptime.py): one jump past 128 padded tokens, one
    more per further 256, nothing in between; and a fit recovers them from steps that
    climb them."""
    step = StepModel(fixed_s=1e-3, per_token_s=0, knee_tokens=0, prefill_attn_s=0,
                     decode_ctx_s=0, per_seq_s=0, gemm_switch_s=5e-3, gemm_rows_s=1e-2)
    t = _timer(step)
    at = {n: t.step_time_s(n, n, 0.0, 0) for n in (128, 129, 256, 257, 500)}
    assert at[128] == pytest.approx(1e-3)
    assert at[129] == at[256] == pytest.approx(6e-3)
    assert at[257] == at[500] == pytest.approx(16e-3)
    s = _synthetic(3)
    s["gpu_clock"] = np.ones(len(s["step_s"]), dtype=bool)
    pad = np.array([t.pad(int(n)) for n in s["tokens"]])
    s["step_s"] = s["step_s"] + 5e-3 * (pad > 128) + 1e-2 * np.maximum(np.ceil(pad / 256) - 1, 0)
    res = F.fit_step_model(s, max_num_seqs=256, max_num_batched_tokens=8192)
    assert res.step.gemm_switch_s == pytest.approx(5e-3, rel=0.1)
    assert res.step.gemm_rows_s == pytest.approx(1e-2, rel=0.1)


def test_gemm_holes_price_a_graphless_steps_emptier_last_row() -> None:
    """Past the largest CUDA graph a step whose last row of 256 tokens is half empty or more
    pays gemm_holes_s, less in proportion below half, a full row nothing (steptime.py); within
    the graphs nothing; and a fit recovers the term from steps that have it."""
    step = StepModel(fixed_s=1e-3, per_token_s=0, knee_tokens=0, prefill_attn_s=0,
                     decode_ctx_s=0, per_seq_s=0, gemm_holes_s=8e-3)
    t = _timer(step)
    at = {n: t.step_time_s(n, n, 0.0, 0) for n in (136, 2048, 2049, 2176, 2240, 2288, 2304)}
    assert at[136] == at[2048] == at[2304] == pytest.approx(1e-3)
    assert at[2049] == at[2176] == pytest.approx(9e-3)
    assert at[2240] == pytest.approx(5e-3)
    assert at[2288] == pytest.approx(2e-3)
    s = _synthetic(4)
    s["gpu_clock"] = np.ones(len(s["step_s"]), dtype=bool)
    holes = np.array([row_holes(int(n)) if n > 512 else 0.0 for n in s["tokens"]])
    s["step_s"] = s["step_s"] + 8e-3 * holes
    res = F.fit_step_model(s, max_num_seqs=256, max_num_batched_tokens=8192)
    assert res.step.gemm_holes_s == pytest.approx(8e-3, rel=0.1)


def test_eager_offsets_apply_past_the_largest_graph_within_a_row() -> None:
    """A step past the largest CUDA graph takes the measured offset at its count, the line
    between two measured counts of its own row of 256 tokens, and nothing across rows or
    outside the counts; a step within the graphs takes none (profile.eager_offset)."""
    step = StepModel(fixed_s=1e-2, per_token_s=0, knee_tokens=0, prefill_attn_s=0,
                     decode_ctx_s=0, per_seq_s=0,
                     eager_offset_s={2032: -4e-3, 2048: -8e-3, 2304: 2e-3})
    t = _timer(step)
    at = {n: t.step_time_s(n, n, 0.0, 0) for n in (300, 2000, 2032, 2040, 2048, 2100, 2304, 4096)}
    assert at[2032] == pytest.approx(6e-3) and at[2048] == pytest.approx(2e-3)
    assert at[2040] == pytest.approx(4e-3)  # the line within the row 1,793-2,048
    assert at[2100] == at[2000] == at[4096] == at[300] == pytest.approx(1e-2)
    assert at[2304] == pytest.approx(1.2e-2)


def test_eager_offsets_take_full_rows_with_little_attention() -> None:
    """fit.eager_offsets: the lone steps' median less the price at a count whose last row is
    (nearly) full and whose attention is a small share; none at a half-empty row, where the
    prompt's attention dominates, or under the floor."""
    sizes = cudagraph_capture_sizes(256, 8192)
    counts = np.repeat([600, 1920, 2048, 4096, 8192], 5)
    step = StepModel(fixed_s=0, per_token_s=5e-5, knee_tokens=0, prefill_attn_s=2e-9,
                     decode_ctx_s=0, per_seq_s=0)
    n = len(counts)
    s = {"tokens": counts, "seqs": np.ones(n), "decode_seqs": np.zeros(n, dtype=int),
         "decode_ctx": np.zeros(n), "prefill_attn": counts * counts / 2.0,
         "spec_tokens": np.zeros(n), "drafting_seqs": np.zeros(n),
         "point": np.array([f"lone-p{c}-a" for c in counts]),
         "warmup": np.zeros(n, dtype=bool)}
    s["step_s"] = F.predict_steps(s, step, sizes, 0) - 3e-3
    got = F.eager_offsets(s, step, sizes, lone=np.ones(n, dtype=bool), above_s=0.04,
                          test_fraction=0.0)
    # 600 tokens: under the floor; 1,920: half a row empty; 8,192: attention 67 of 477 ms
    assert set(got) == {2048, 4096}
    assert all(v == pytest.approx(-3e-3) for v in got.values())


def test_fixed_coefficients_are_kept() -> None:
    """Coefficients passed as fixed come back unchanged; only the rest are fitted."""
    res = F.fit_step_model(_synthetic(), max_num_seqs=256, max_num_batched_tokens=8192,
                           fixed={"decode_ctx_s": 5e-8})
    assert res.step.decode_ctx_s == 5e-8


def test_too_few_steps_is_a_calibration_error() -> None:
    """A run with almost nothing measured fails with a clear CalibrationError."""
    with pytest.raises(CalibrationError, match="usable step windows"):
        F.fit_step_model(_synthetic(n_points=1, steps=5), max_num_seqs=256,
                         max_num_batched_tokens=8192)


def test_unknown_fixed_coefficient_is_rejected() -> None:
    with pytest.raises(CalibrationError, match="unknown coefficient"):
        F.fit_step_model(_synthetic(), max_num_seqs=256, max_num_batched_tokens=8192,
                         fixed={"bogus_s": 1.0})


def test_kv_line_through_points() -> None:
    """Capacity is linear in utilisation: the line passes through exact points."""
    pts = [{"gpu_memory_utilization": u, "tokens": 1e6 * u - 1e5} for u in (0.85, 0.9, 0.95)]
    kv = F.fit_kv_capacity(pts, bytes_per_token=131072)
    assert kv.tokens(0.9) == pytest.approx(800_000, abs=1)
    with pytest.raises(CalibrationError):
        F.fit_kv_capacity(pts[:1], bytes_per_token=1)


def test_graph_scan_gives_each_size_its_offset_and_the_decode_only_context_rate() -> None:
    """A graph scan's steady decode-only steps give the decode-only context rate (from the
    sizes scanned at two contexts) and each size's offset over the linear terms; its ramp-up
    steps (a prefill beside them) give neither. StepTimer then adds both to a decode-only
    step (between two scanned sizes, the line between their offsets), never to a step
    holding a prefill chunk."""
    step = StepModel(**TRUE)
    sizes = cudagraph_capture_sizes(256, 8192)
    true = {16: -4e-4, 32: 1.2e-3, 64: 2e-4}
    graph_ctx = 2.5e-8  # TRUE's decode_ctx_s is 3e-8
    rows: dict[str, list] = {k: [] for k in ("point", "tokens", "seqs", "decode_seqs",
                                             "decode_ctx", "prefill_attn", "step_s")}
    for b, ctx in [(16, 128), (32, 128), (64, 128), (32, 2048), (64, 2048)]:
        for i in range(12):
            ramp = i < 2  # two steps of prefill beside the first decodes
            tokens, pa = (b + 64, 64 * 64 / 2) if ramp else (b, 0.0)
            t = _timer(step).step_time_s(tokens, b + ramp, pa, b * ctx)
            if not ramp:
                t += true[b] + (graph_ctx - TRUE["decode_ctx_s"]) * b * ctx
            for k, v in zip(rows, (f"graphs-b{b}-c{ctx}", tokens, b + ramp, b, b * ctx, pa, t),
                            strict=True):
                rows[k].append(v)
    s = {k: np.array(v) for k, v in rows.items()}
    s["warmup"] = np.zeros(len(s["point"]), dtype=bool)
    scan = scans.graph_scan(s, step, sizes)
    assert scan is not None
    assert scan.ctx_s == pytest.approx(graph_ctx)
    assert scan.offsets == pytest.approx(true, abs=1e-9)
    assert [p["steps"] for p in scan.points] == [10] * 5
    assert scans.graph_scan(s, step, sizes, ctx_floor_s=2.8e-8).ctx_s == 2.8e-8  # type: ignore[union-attr]
    # a sliding-window model keeps its rate and takes the offsets within the window alone
    windowed = scans.graph_scan(s, step, sizes, window=1024)
    assert windowed is not None and windowed.ctx_s == TRUE["decode_ctx_s"]
    assert [p["point"] for p in windowed.points] == [f"graphs-b{b}-c128" for b in (16, 32, 64)]
    fitted = step.model_copy(update={"graph_offset_s": scan.offsets, "graph_ctx_s": scan.ctx_s})
    with_scan, plain = _timer(fitted), _timer(step)
    gain = graph_ctx - TRUE["decode_ctx_s"]
    assert with_scan.step_time_s(32, 32, 0.0, 4096) - plain.step_time_s(32, 32, 0.0, 4096) \
        == pytest.approx(1.2e-3 + gain * 4096)
    # 20 sequences pad to the 24-token graph: halfway from 16 to 32
    assert with_scan.step_time_s(20, 20, 0.0, 2560) - plain.step_time_s(20, 20, 0.0, 2560) \
        == pytest.approx(-4e-4 + (1.2e-3 + 4e-4) / 2 + gain * 2560)
    # past the scanned sizes: the context rate, no offset; with a prefill chunk: neither
    assert with_scan.step_time_s(128, 128, 0.0, 1000) - plain.step_time_s(128, 128, 0.0, 1000) \
        == pytest.approx(gain * 1000)
    assert with_scan.step_time_s(96, 33, 4096.0, 4096) == plain.step_time_s(96, 33, 4096.0, 4096)
    # the fit's own prediction of a step agrees with the timer's
    dec = s["prefill_attn"] == 0
    got = F.predict_steps(s, fitted, sizes, 0)
    assert got[dec] == pytest.approx(s["step_s"][dec])


def test_a_points_drain_starts_where_eight_or_more_requests_finish_in_one_step() -> None:
    """drain_steps: from the first decode-only step of a point with DRAIN_FINISHED or more
    requests fewer than the step before, to the point's end; a point whose requests finish
    a few a step, or that shrinks on a step with a prefill, has none."""
    seqs = {"a": [16, 128, 128, 112, 97, 81, 65],      # a 16-a-step drain from the fourth step
            "b": [200, 199, 199, 198, 190, 189],        # one or eight at a time
            "c": [64, 64, 40, 40]}                       # shrinks beside a prefill chunk
    prefill = {"a": [8192, 0, 0, 0, 0, 0, 0], "b": [0] * 6, "c": [0, 0, 512, 0]}
    s = {"point": np.array([p for p, v in seqs.items() for _ in v]),
         "seqs": np.array([x for v in seqs.values() for x in v]),
         "prefill_attn": np.array([float(x) for v in prefill.values() for x in v])}
    drain = F.drain_steps(s)
    assert drain.tolist() == [False, False, False, True, True, True, True,
                              False, False, False, False, True, True,
                              False, False, False, False]


def test_a_stall_is_a_drain_step_the_gpu_idled_before() -> None:
    """gpu_gap_s: how long the stream idled before each step of one point and run, where the
    step before was still queued when it was scheduled (0 across points and runs, and after
    an idle engine); stalled_steps: the drain steps after STALL_S or more of it."""
    import polars as pl

    from capplan.calibrate import store

    ms = 1e-3
    df = pl.DataFrame({
        "point": ["a"] * 6 + ["b"] * 2,
        "run": [1] * 6 + [1, 2],
        "seqs": [128, 128, 112, 96, 80, 64, 8, 8],
        "prefill_attn": [0.0] * 8,
        # a's steps 1-5 back to back but for 3 ms before step 3 (a drain step) and 2 ms
        # before step 1 (steady); b's two steps are different runs
        "gpu_t0": [0, 10, 18, 29, 37, 44, 0, 1],
        "gpu_t1": [8, 18, 26, 37, 44, 50, 5, 6],
        "pipelined": [False, True, True, True, True, True, False, True],
    }).with_columns((pl.col("gpu_t0") * ms), (pl.col("gpu_t1") * ms))
    gap = store.gpu_gap_s(df)
    assert gap == pytest.approx([0, 2 * ms, 0, 3 * ms, 0, 0, 0, 0])
    s = {"point": df["point"].to_numpy(), "seqs": df["seqs"].to_numpy(),
         "prefill_attn": df["prefill_attn"].to_numpy(), "gpu_gap_s": gap}
    assert F.drain_steps(s).tolist() == [False, False, True, True, True, True, False, False]
    assert F.stalled_steps(s).tolist() == [False, False, False, True, False, False, False,
                                           False]


def test_the_steps_after_a_first_use_of_a_batch_size_are_marked_per_engine() -> None:
    """after_new_size: the two steps after each step whose request count its engine had not
    run before; a size first run by one engine is new again to the next."""
    seqs = np.array([8, 8, 8, 128, 128, 128, 112, 128, 8, 8, 8])
    run = np.array([1] * 8 + [2] * 3)
    marked = F.after_new_size({"seqs": seqs}, run)
    #          8      8     8      128    128   128   112    128   | 8      8     8
    assert marked.tolist() == [False, True, True, False, True, True, False, True, True,
                               True, True]
    # one engine: the second engine's 8s were run before
    assert F.after_new_size({"seqs": seqs}).tolist()[8:] == [True, False, False]


def _scan_points(ms: list[float]) -> list[dict[str, object]]:
    """Graph-scan points at the short context, one per size, with these median steps (ms)."""
    return [{"point": f"graphs-b{i + 1}-c{GRAPH_SCAN_CONTEXT}", "size": i + 1,
             "measured_s": v / 1e3} for i, v in enumerate(ms)]


@pytest.mark.parametrize(("ms", "stretches"), [
    ([10, 10, 11.4, 11.5, 11.5], []),               # a kernel's stair: up, never down
    ([10, 13, 10, 10], ["graphs-b2-c128"]),          # one slow size
    ([13, 10, 10, 10], ["graphs-b1-c128"]),          # slow from the first size
    ([10, 13, 13, 13, 10, 13, 10], ["graphs-b2-c128 to graphs-b4-c128", "graphs-b6-c128"]),
])
def test_graph_scan_slow_stretches(ms: list[float], stretches: list[str]) -> None:
    """A host running the engine at two speeds leaves runs of sizes 1.25x slower than the
    sizes on both sides (the H100's draft-model scan, s40, had five, none a lone size); a
    step up with no fall after it is a stair of the kernels and stays."""
    assert scans.graph_scan_slow_stretches(_scan_points(ms)) == stretches
