"""The scans beside a sweep, fitted once the step model's linear terms are: the graph scan's
offset per CUDA-graph size and decode-only context rate (`graph_scan`), FlashAttention's last
wave (`tile_rho`), the vision encoder's pass (`encoder_scan`) and a picture's step and its
draws (`picture_steps`, `slow_above`, `spell_lengths`). calibrate/build.py puts what they give
into the profile; docs/calibration.md says what each measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from capplan.calibrate.fit import (
    Samples,
    attention_by_kind,
    decode_only,
    padded,
    predict_steps,
    tile_factors,
)
from capplan.calibrate.sweep import GRAPH_SCAN_CONTEXT
from capplan.errors import CalibrationError
from capplan.profile import StepModel
from capplan.steptime import encoder_work_s

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
    dec = (decode_only(s) & (s["tokens"] <= max(sizes, default=0)) & (s["decode_seqs"] > 0)
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
    t_pad = padded(s["tokens"], sizes)
    resid = s["step_s"] - linear
    steady: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(s["point"]):
        if not name.startswith("graphs-"):
            continue
        b = int(name.split("-")[1][1:])
        k = ((s["point"] == name) & ~s["warmup"].astype(bool) & decode_only(s)
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
