"""The figures of docs/calibration.md: the profile table, each profile against the physics
of its GPU, the steps just past the largest CUDA graph, the floor under them, the MTP
drafter's cost and the stairs of its verify steps.

    python scripts/calibration_analysis.py [table|sanity|graph|floor|drafter|stairs|...]
    (also: repeats, cached, decode, firstuse, finishes, graphs, idle, mixlen, specgraphs,
     encoder, pictures, probe, kvstarts, starts, drain, eagerlaunch)
    python scripts/calibration_analysis.py points MODEL/KEY   # e.g. gemma-4-31b/fp8
    python scripts/calibration_analysis.py composition MODEL/KEY  # each run's own steps
    python scripts/calibration_analysis.py speeds [MODEL/KEY]  # two runs: steps vs scheduler
    python scripts/calibration_analysis.py byrun MODEL/KEY  # held-out error run by run
    python scripts/calibration_analysis.py steadiness MODEL/KEY...  # what the steps leave a fit
    python scripts/calibration_analysis.py mixedsteps [MODEL/KEY]  # chunk steps vs the fit
    python scripts/calibration_analysis.py ragged [MODEL/KEY]  # token counts off 256's multiples
    python scripts/calibration_analysis.py holes [MODEL/KEY]  # the lone-prompt scans, priced
    python scripts/calibration_analysis.py launches [MODEL/KEY]  # each run's CPU launches
    python scripts/calibration_analysis.py decodetail [MODEL/KEY]  # decode steps' slow tail
    python scripts/calibration_analysis.py gcpasses [MODEL/KEY [POINT]]  # slow launches, GC

With no argument it prints sanity and graph.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import polars as pl

from capplan.calibrate import build, store
from capplan.calibrate import fit as F
from capplan.calibrate import scans
from capplan.calibrate.build import LONE_SCAN
from capplan.calibrate.store import CALIBRATION_DIR
from capplan.errors import CalibrationError
from capplan.hardware import GPUS, Precision
from capplan.modelspec import load_model_spec
from capplan.profile import Profile
from capplan.steptime import StepTimer, cudagraph_capture_sizes, eager_threshold, row_holes
from capplan.tiles import kv_blocks, splits, tail_factor

PROFILES = Path(os.environ.get("CAPPLAN_PROFILES") or CALIBRATION_DIR / "h200" / "vllm-0.26.0")
RAW = store.raw_dir(CALIBRATION_DIR, PROFILES.parent.name)
"""The raw runs of the GPU whose profiles PROFILES holds (store.raw_dir: the H100's under
calibration/_raw/h100)."""


def _prefill_flops(model: str, chunk: int, chunks: int) -> float:
    """FLOPs of `chunks` prefill chunks of `chunk` tokens, chunk i over i x chunk tokens of
    context: the linears and LM head, plus attention (full layers over the whole context,
    sliding-window layers over their window)."""
    spec = load_model_spec(model)
    full = spec.num_layers - spec.sliding_window_layers
    pairs_full = sum(chunk * (i * chunk + chunk / 2) for i in range(chunks))
    pairs_window = chunk * chunks * (spec.sliding_window or 0)
    attention = 4 * spec.num_attention_heads * (
        full * (spec.global_head_dim or spec.head_dim) * pairs_full
        + spec.sliding_window_layers * spec.head_dim * pairs_window)
    return spec.flops_per_token() * chunk * chunks + attention


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def table() -> None:
    """One row per shipped profile: sweep coverage, every fit-error figure its provenance
    stores, KV capacity per utilisation (* derived) and GPU-minutes."""
    print("| profile | timed by | sweep points measured | units train/test "
          "| held-out median / p95 | held-out, as shipped "
          "| as shipped: designed steps / drains (units) "
          "| 5-fold CV median / p95 (units) "
          "| leave-one-point-out median / p95 (points) | single-step median / p95 "
          "| the engine against itself: run 2's same steps, median / p95 "
          "| KV tokens @0.85 / 0.90 / 0.95 | GPU-min: main run / all engines |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for prov_path in sorted(PROFILES.glob("*/*/provenance.json")):
        d = prov_path.parent
        prov = json.loads(prov_path.read_text())
        if "fit" not in prov:
            continue  # KV-only folders
        q, f = Profile.load(d).fit, prov["fit"]
        measured = [p for p in prov["points_measured"] if not p.startswith("warmup")]
        planned = prov.get("points_planned") or len(measured) + len(prov.get("points_skipped", []))
        kv = " / ".join(f"{int(k['tokens']):,}" + ("*" if k["derived"] else "")
                        for k in prov["kv_points"])
        clock = "GPU, steps" if f["unit"].startswith("one engine step") else "CPU, 4-step windows"
        apart = _apart(_same_steps(pl.read_parquet(d / "samples.parquet"), 2))
        itself = (f"{np.median(apart):.1%} / {np.percentile(apart, 95):.1%} ({len(apart)})"
                  if len(apart) else "–")
        print(f"| {d.parent.name}/{d.name} | {clock} | {len(measured)} of {planned} "
              f"| {q.n_train}/{q.n_test} | {_pct(q.median_ape)} / {_pct(q.p95_ape)} "
              f"| {_pct(f.get('heldout_shipped_median_ape'))} / "
              f"{_pct(f.get('heldout_shipped_p95_ape'))} "
              f"| {_pct(f.get('designed_shipped_median_ape'))} / "
              f"{_pct(f.get('designed_shipped_p95_ape'))} ({f.get('designed_units', 0)}); "
              f"{_pct(f.get('drain_shipped_median_ape'))} / "
              f"{_pct(f.get('drain_shipped_p95_ape'))} ({f.get('drain_units', 0)}) "
              f"| {_pct(f['cv5_median_ape'])} / {_pct(f['cv5_p95_ape'])} ({f['cv5_windows']}) "
              f"| {_pct(f.get('point_cv_median_ape'))} / {_pct(f.get('point_cv_p95_ape'))} "
              f"({f.get('point_cv_points', 0)}) "
              f"| {_pct(f['single_step_median_ape'])} / {_pct(f['single_step_p95_ape'])} "
              f"| {itself} | {kv} | {prov.get('main_run_gpu_minutes', 0):.1f}"
              + (f" ({prov['main_run_calls']} calls)" if prov.get("main_run_calls", 1) > 1 else "")
              + f" / {prov['gpu_minutes']:.1f} |")


def _same_steps(df: pl.DataFrame, run: int) -> pl.DataFrame:
    """Run 1's and `run`'s timings of the same step of the same point (`step_s`,
    `step_s_2`; warm-up points left out): empty where the profile has no such run or it
    shares no step with run 1, as a lone-prompt scan's."""
    cols = ("point", "step", "step_s", "tokens")
    if "run" not in df.columns:
        return pl.DataFrame(schema={c: df.schema[c] for c in cols})
    return (df.filter(pl.col("run") == 1).select(*cols)
            .join(df.filter(pl.col("run") == run).select(*cols), on=["point", "step"],
                  suffix="_2")
            .filter((pl.col("tokens") == pl.col("tokens_2"))
                    & ~pl.col("point").str.starts_with("warmup")))


def _apart(j: pl.DataFrame) -> np.ndarray:
    """|run's / run 1's - 1| of each step `_same_steps` paired."""
    out: np.ndarray = (j["step_s_2"] / j["step_s"] - 1).abs().to_numpy()
    return out


def _tbs(profiles: Path) -> str:
    """The HBM bandwidth of the GPU whose profiles `profiles` holds, in TB/s, for a header."""
    return f"{GPUS[profiles.parent.name].hbm_bytes_per_s / 1e12:g}"


def sanity() -> None:
    """Decode at batch 1 against the weight-streaming bound; three 8192-token prefill chunks
    against the matrix units' peak (weight-only 4-bit runs its MMA in BF16)."""
    print(f"| profile | decode b=1 step (ms) | weights ÷ {_tbs(PROFILES)} TB/s (ms) | of bound "
          "| prefill 3 × 8192 chunks, ctx 0–24k (ms) | FLOPs ÷ peak (ms) | of peak |")
    print("|---|---|---|---|---|---|---|")
    for folder in sorted(PROFILES.glob("*/*/samples.parquet")):
        d = folder.parent
        prof = Profile.load(d)
        if prof.spec_k or prof.kv_cache_dtype != "auto":
            continue
        s = pl.read_parquet(folder).filter(~pl.col("warmup"))
        if "run" in s.columns:  # the main run's steps (a profile may fit repeat runs too)
            s = s.filter(pl.col("run") == 1)
        dec = s.filter((pl.col("point") == "decode-b1-c512") & (pl.col("prefill_tokens") == 0))
        pre = s.filter(pl.col("point") == "prefill-p8192-x3")
        if dec.is_empty() or pre.height != 3:
            continue
        precision = Precision(prof.precision)
        spec = load_model_spec(prof.model)
        decode_ms = float(dec["step_s"].median()) * 1e3  # type: ignore[arg-type]
        gpu = GPUS[prof.gpu]  # the datasheet's bandwidth and peak of the profile's GPU
        bound_ms = spec.weight_bytes(precision) / gpu.hbm_bytes_per_s * 1e3
        prefill_ms = float(pre["step_s"].sum()) * 1e3
        peak = gpu.matmul_flops(precision)
        flops_ms = _prefill_flops(prof.model, 8192, 3) / peak * 1e3
        print(f"| {prof.model}/{prof.key} | {decode_ms:.2f} | {bound_ms:.2f} | "
              f"{bound_ms / decode_ms:.0%} | {prefill_ms:.0f} | {flops_ms:.0f} "
              f"({peak / 1e12:.0f} TFLOP/s) | {flops_ms / prefill_ms:.0%} |")


def graph() -> None:
    """The step past the largest CUDA graph (512 tokens), on the profiles the GPU timed step
    by step: prefill-only steps of 512, 1024 and 2048 tokens at prior context up to 4k
    (medians), the straight line through 1024 and 2048 taken back to 512, and how far the
    512-token step sits below it: what `eager_step_s` stands for."""
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        df = pl.read_parquet(d)
        if "gpu_clock" not in df.columns or not df["gpu_clock"].all():
            continue
        prof = Profile.load(d.parent)
        med = {}
        for chunk in (512, 1024, 2048):
            g = df.filter(pl.col("point").str.starts_with(f"prefill-p{chunk}-")
                          & (pl.col("max_ctx") <= 4096 + chunk))
            if len(g):
                med[chunk] = float(g["step_s"].median()) * 1e3  # type: ignore[arg-type]
        if len(med) < 3:
            continue
        line = med[1024] - (med[2048] - med[1024]) / 2
        print(f"  {prof.model}/{prof.key}: 512 / 1024 / 2048 tokens {med[512]:.1f} / "
              f"{med[1024]:.1f} / {med[2048]:.1f} ms; the line through 1024 and 2048 gives "
              f"{line:.1f} ms at 512 ({med[512] - line:+.1f} ms); eager_step_s "
              f"{prof.step.eager_step_s * 1e3:.1f} ms")


def points(profile: str, only: str | None = None) -> None:
    """Each sweep point of one profile: its steps' time, measured and by the fit, summed over
    the point (a single CPU-stamped step can land a step late; the sum telescopes); with a
    point's name, that point's steps one by one, in the order they ran."""
    prof, s, sizes = _fit_inputs(PROFILES / profile)
    pred = _predicted(prof, s, sizes)
    keep = ~s["warmup"]
    point = s["point"][keep]
    for name in dict.fromkeys(point):
        if only is not None and name != only:
            continue
        m = point == name
        took, fit = s["step_s"][keep][m].sum(), pred[keep][m].sum()
        print(f"  {name:28s} {int(m.sum()):4d} steps {took * 1e3:9.1f} ms measured, "
              f"{fit * 1e3:9.1f} ms by the fit ({fit / took - 1:+.0%})")
        if only is not None:
            print("    each step, ms (measured / by the fit): " + ", ".join(
                f"{a * 1e3:.1f}/{b * 1e3:.1f}"
                for a, b in zip(s["step_s"][keep][m], pred[keep][m], strict=True)))


def _fit_inputs(d: Path) -> tuple[Profile, dict[str, np.ndarray], list[int]]:
    prof = Profile.load(d)
    s = store.samples_of(store.read_samples(d), window_tokens=prof.step.window_tokens)
    sizes = cudagraph_capture_sizes(int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                                    int(prof.engine["max_num_batched_tokens"]),  # type: ignore[call-overload]
                                    prof.spec_k)
    return prof, s, sizes


def _predicted(prof: Profile, s: dict[str, np.ndarray], sizes: list[int]) -> np.ndarray:
    """Each step's time by the profile's fit, as the fit computes it."""
    if prof.step.window_tokens:
        s = F.attention_by_kind(s, prof.step.window_tokens)
    s = {**s, "eager_step": (s["tokens"] > eager_threshold(256, 8192)).astype(float)}
    return F.predict_steps(s, prof.step, sizes, prof.spec_k)


def floor() -> None:
    """Graph-less steps of 513-1,100 tokens on the GPU-timed profiles (the step a chat
    prompt makes beside running decodes): measured, by the additive terms alone, and with
    the profile's `eager_floor_s` (medians per point)."""
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        df = pl.read_parquet(d)
        if "gpu_clock" not in df.columns or not df["gpu_clock"].all():
            continue
        prof, s, sizes = _fit_inputs(d.parent)
        pred = _predicted(prof, s, sizes)
        additive = _predicted(prof.model_copy(update={"step": prof.step.model_copy(
            update={"eager_floor_s": 0.0})}), s, sizes)
        m = ~s["warmup"] & (s["tokens"] > 512) & (s["tokens"] <= 1100)
        cells = []
        for name in dict.fromkeys(s["point"][m]):
            k = m & (s["point"] == name)
            cells.append(f"{int(np.median(s['tokens'][k]))} tokens "
                         f"{np.median(s['step_s'][k]) * 1e3:.1f} ms "
                         f"(terms {np.median(additive[k]) * 1e3:.1f}, with the floor "
                         f"{np.median(pred[k]) * 1e3:.1f})")
        print(f"  {prof.model}/{prof.key}: eager_floor_s {prof.step.eager_floor_s * 1e3:.1f} ms; "
              + "; ".join(cells))
        # the steps the floor prices (the additive terms below it): how far they spread
        at_floor = ~s["warmup"] & (s["tokens"] > 512) & (additive < pred)
        if at_floor.sum() >= 5:
            r = s["step_s"][at_floor] / pred[at_floor]
            print(f"    {at_floor.sum()} steps priced at the floor: measured / floor at "
                  "p10 / p50 / p90 / p99 " + " / ".join(
                      f"{x:.2f}" for x in np.percentile(r, [10, 50, 90, 99])))


def eagerlaunch() -> None:
    """Whose the eager floor is: each profile's graph-less steps of 513-1,100 tokens, their
    step time and the CPU's launch (`cpu_launch_s`, runners since the fourteenth session) at
    the median, beside the fitted floor: a floor near the launch is the CPU's, one well above
    it the GPU's (docs/calibration.md, "A step past the largest CUDA graph")."""
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        df = pl.read_parquet(d)
        if "cpu_launch_s" not in df.columns:
            continue
        x = df.filter(~pl.col("warmup") & (pl.col("prefill_seqs") > 0)
                      & (pl.col("tokens") > 512) & (pl.col("tokens") <= 1100)
                      & pl.col("cpu_launch_s").is_not_null())
        if x.is_empty():
            continue
        prof = Profile.load(d.parent)
        print(f"  {prof.model}/{prof.key}: {len(x)} steps, step {np.median(x['step_s']) * 1e3:.1f}"
              f" ms, launch {np.median(x['cpu_launch_s']) * 1e3:.1f} ms; eager_floor_s "
              f"{prof.step.eager_floor_s * 1e3:.1f} ms, eager_gpu_s "
              f"{prof.step.eager_gpu_s * 1e3:.1f}, core_eager_s {prof.step.core_eager_s * 1e3:.1f}")


def _point_mean_ms(key: str, point: str) -> float:
    df = pl.read_parquet(PROFILES / "gemma-4-31b" / key / "samples.parquet")
    g = df.filter(pl.col("point") == point)["step_s"]
    return float(g.sum()) / len(g) * 1e3 if len(g) else float("nan")


def firstuse() -> None:
    """The draft-model runs' steps past 0.5 s (warm-up ones included) and each run's
    decode-b1-c512 decode steps: the first uses of vLLM's spec-decode kernels, and what the
    batch-1 warm-up (sweep._WARMUP) took from the batch-1 point."""
    raw = CALIBRATION_DIR / "_raw"
    for name in ("llama-3.1-8b--bf16-draft_model2", "llama-3.1-8b--bf16-draft_model2--r2"):
        path = store.runner_jsonl(raw, name)
        if path is None:
            continue
        df = store.read_runner_jsonl(path)
        slow = df.filter(pl.col("step_s") > 0.5)
        print(f"  {name}: steps past 0.5 s: " + ", ".join(
            f"{r['point']} step {r['step']} ({r['seqs']} requests) {r['step_s'] * 1e3:.0f} ms"
            for r in slow.iter_rows(named=True)))
        b1 = df.filter((pl.col("point") == "decode-b1-c512") & (pl.col("decode_seqs") == 1))
        print(f"  {name}: decode-b1-c512 decode steps (ms): "
              + " ".join(f"{x * 1e3:.1f}" for x in b1["step_s"].to_list()))


def drafter() -> None:
    """Gemma 4 31B FP8 without and with its MTP drafter (k = 2, 4): each point's mean step
    (its setup steps included), decodes at context 512 and prefill chunks."""
    for point in ("decode-b1-c512", "decode-b8-c512", "decode-b32-c512", "decode-b128-c512",
                  "prefill-p1024-x17", "prefill-p8192-x3"):
        base, k2, k4 = (_point_mean_ms(k, point) for k in ("fp8", "fp8-mtp2", "fp8-mtp4"))
        print(f"  {point:20s} FP8 {base:6.1f} ms, MTP k=2 {k2:6.1f} ({k2 - base:+.1f}), "
              f"k=4 {k4:6.1f} ({k4 - base:+.1f})")


def stairs() -> None:
    """MTP verify steps (decode-only) by their sequences, median ms, at two context bands:
    flat between 128 and 256 verify tokens ((1 + k) x sequences), jumps at them."""
    for key in ("fp8-mtp2", "fp8-mtp4"):
        df = pl.read_parquet(PROFILES / "gemma-4-31b" / key / "samples.parquet").filter(
            ~pl.col("warmup") & (pl.col("prefill_tokens") == 0)).with_columns(
            (pl.col("decode_ctx") / pl.col("seqs")).alias("ctx"))
        for lo, hi in ((0, 1200), (1500, 3000)):
            g = df.filter((pl.col("ctx") > lo) & (pl.col("ctx") < hi)).group_by("seqs").agg(
                (pl.col("step_s").median() * 1e3).round(1).alias("ms")).sort("seqs")
            print(f"  {key} context {lo}-{hi}: " + " ".join(
                f"{r['seqs']}:{r['ms']}" for r in g.iter_rows(named=True)))


def finishes() -> None:
    """Steps after requests finished in the step before, on the GPU-timed profiles: the
    residual by how many finished, and the held-out error with the steps after nine or more
    left out of the test split."""
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        df = pl.read_parquet(d)
        if "gpu_clock" not in df.columns or not df["gpu_clock"].all():
            continue
        prof, s, sizes = _fit_inputs(d.parent)
        res = (s["step_s"] - _predicted(prof, s, sizes)) * 1e3
        seqs = s["seqs"]
        same = np.r_[False, s["point"][1:] == s["point"][:-1]]
        fin = np.where(same, np.maximum(np.r_[0, seqs[:-1]] - seqs, 0), 0)
        ok = ~s["warmup"] & same
        cells = []
        for lo, hi in ((0, 0), (1, 4), (9, 256)):
            m = ok & (fin >= lo) & (fin <= hi)
            if m.any():
                cells.append(f"{lo}-{hi} finished: {m.sum()} steps, residual median "
                             f"{np.median(res[m]):+.2f} ms")
        win = F.windows(s, 0)
        test = np.random.default_rng(1).random(len(win)) < 0.2
        ape = np.abs(_predicted(prof, s, sizes)[win[test][:, 0]] / s["step_s"][win[test][:, 0]] - 1)
        keep = fin[win[test][:, 0]] < 9
        print(f"  {prof.model}/{prof.key}: " + "; ".join(cells)
              + f"; held-out p95 {np.percentile(ape, 95):.1%}, "
              f"{np.percentile(ape[keep], 95):.1%} without the {int((~keep).sum())} steps "
              "after nine or more finished")


def repeats() -> None:
    """The engines measured in more than one run (calibration/_raw/<model>--<key>--r<N>,
    fitted together, build._samples): the same step of the same point in run 1 and each
    other run, each point's sum, KV blocks, and the shipped fit scored on each run."""
    raw = RAW
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        df = pl.read_parquet(d)
        if "run" not in df.columns or df["run"].n_unique() < 2:
            continue
        prof, s, sizes = _fit_inputs(d.parent)
        ape_all = np.abs(_predicted(prof, s, sizes) / s["step_s"] - 1)
        g = build.groups(raw)[(prof.model, prof.key)]
        names = [g.main, *g.repeats]  # `run` numbers them from 1 (build._samples)
        for run in range(2, len(names) + 1):
            j = _same_steps(df, run)
            if j.is_empty():
                print(f"  {prof.model}/{prof.key}, run {run} ({names[run - 1]}): no step in "
                      "common with run 1 (a scan of other points)")
                continue
            step = _apart(j)
            pts = j.group_by("point").agg(pl.col("step_s").sum(), pl.col("step_s_2").sum())
            pt = (pts["step_s_2"] / pts["step_s"] - 1).abs().to_numpy()
            blocks = [json.loads((raw / f"{n}.meta.json").read_text())["kv"]["num_gpu_blocks"]
                      for n in (names[0], names[run - 1])]
            fit = [ape_all[(df["run"].to_numpy() == r) & ~s["warmup"]] for r in (1, run)]
            print(f"  {prof.model}/{prof.key}, run 1 and run {run}: same step median "
                  f"{np.median(step):.1%}, p95 {np.percentile(step, 95):.1%} ({len(step)} "
                  f"steps); point sums median {np.median(pt):.1%}, max {pt.max():.1%}; KV "
                  f"blocks {blocks[0]:,} and {blocks[1]:,}; the fit (both runs) on each run's "
                  f"steps: median {np.median(fit[0]):.1%} / {np.median(fit[1]):.1%}, p95 "
                  f"{np.percentile(fit[0], 95):.1%} / {np.percentile(fit[1], 95):.1%}")


def gcpasses(profile: str = "llama-3.1-8b/fp8", point: str = "prefill-p128-x129") -> None:
    """The launch-bound steps that run slow, run by run (sixty-second session): in each run of
    the profile (its main run, its repeats and its core scan, calibration/_raw), `point`'s
    steps 1.3x or more the point's median step, how many, the gap
    between one and the next that recurs most, their median step and CPU launch
    (`cpu_launch_s`) against the other steps', and, in runs whose runner timed Python's
    garbage collector in each launch (`gc_launch_s`, runner.py GcClock, from the
    sixty-second session's runner on), how many of the slow steps held a collection and
    for how long at the median."""
    model, key = profile.split("/")
    g = build.groups(RAW)[(model, key)]
    names = [g.main, *g.repeats, f"{model}--{key}--core"]  # a core scan is read beside
    for name in names:
        path = store.runner_jsonl(RAW, name)
        if path is None:
            continue
        every = store.read_runner_jsonl(path).filter(~pl.col("warmup"))
        r = every.filter(pl.col("point") == point).sort("step")
        if r.is_empty():
            continue
        run = name.removeprefix(f"{model}--{key}").removeprefix("--") or "main"
        timed = "gc_launch_s" in r.columns
        step = r["step_s"].to_numpy()
        launch = (r["cpu_launch_s"].cast(pl.Float64).to_numpy() if "cpu_launch_s" in r.columns
                  else np.full(len(r), np.nan))
        slow = step >= 1.3 * np.median(step)
        rest = ~slow
        rest[0] = False  # the point's first step began on an idle GPU
        gaps = Counter(np.diff(np.flatnonzero(slow)).tolist())
        cells = [f"run {run}: {slow.sum()} of {len(step)} steps 1.3x the median or more"]
        if slow.sum() > 1:
            gap, n = gaps.most_common(1)[0]
            cells.append(f"{n} of them {gap} step(s) after the last")
        if slow.any():
            cells.append(f"median {np.median(step[slow]) * 1e3:.2f} ms against "
                         f"{np.median(step[rest]) * 1e3:.2f}")
            if not np.isnan(launch).all():
                cells.append(f"launch {np.nanmedian(launch[slow]) * 1e3:.2f} ms against "
                             f"{np.nanmedian(launch[rest]) * 1e3:.2f}")
        if timed:
            whole = every["gc_launch_s"].fill_null(0.0)
            cells.append(f"over the run's {len(every)} steps the collector in "
                         f"{(whole > 0).sum()} launches, {whole.sum() * 1e3:.1f} ms of "
                         f"{every['cpu_launch_s'].sum():.2f} s")
            gcs = r["gc_launch_s"].fill_null(0.0).to_numpy()
            held = slow & (gcs > 0)
            cells.append(f"{held.sum()} slow steps with a collection"
                         + (f" ({np.median(gcs[held]) * 1e3:.2f} ms at the median)"
                            if held.any() else "")
                         + f", {(gcs[rest] > 0).sum()} others")
        else:
            cells.append("the collector not timed")
        print(f"  {profile} {point} " + "; ".join(cells))


def _scan_runs(suffix: str, flag: str
               ) -> Iterator[tuple[Profile, dict[str, np.ndarray], np.ndarray]]:
    """Each scan run `calibration/_raw/<model>--<key>--<suffix>.jsonl[.xz]` (warm-up points
    left out): the profile of its key, its samples, and their steps by that profile."""
    raw = RAW
    runs = sorted({*raw.glob(f"*--{suffix}.jsonl"), *raw.glob(f"*--{suffix}.jsonl.xz")})
    if not runs:
        print(f"  no {suffix} runs yet (capplan calibrate {flag})")
    for path in runs:
        model, key = path.name.split(".jsonl")[0].removesuffix(f"--{suffix}").split("--")
        prof, _, sizes = _fit_inputs(PROFILES / model / key)
        df = store.read_runner_jsonl(path).filter(~pl.col("warmup"))
        s = store.samples_of(df, window_tokens=prof.step.window_tokens)
        yield prof, s, _predicted(prof, s, sizes)


def cached() -> None:
    """Runs of engines with prefix caching on (`capplan calibrate --prefix-cache`,
    calibration/_raw/<model>--<key>--cache.jsonl[.xz]): each cache point's tail steps (the
    prefix's own prefill left out), measured and by the profile of the same key."""
    for prof, s, pred in _scan_runs("cache", "--prefix-cache"):
        for name in dict.fromkeys(s["point"]):
            k = np.flatnonzero(s["point"] == name)
            if name.startswith(("shared-", "decode-")):
                # the batch's decode steps only (its prefill, and the prefix's, left out)
                b = int(name.split("-b")[1].split("-")[0])
                k = k[(s["decode_seqs"][k] == b) & (s["prefill_tokens"][k] == 0)]
            elif not name.startswith("cached-c0-"):
                k = k[1:]  # the prefix's own prefill (one step: it fits the token budget)
            print(f"  {prof.model}/{prof.key} {name}: "
                  f"{np.median(s['step_s'][k]) * 1e3:.2f} ms measured, "
                  f"{np.median(pred[k]) * 1e3:.2f} ms by the profile ({len(k)} steps)")
        # each shared point against its unshared twin, as the profile's build reads them
        saving, pairs = F.shared_ctx_saving(s, prof.step.decode_ctx_s)
        for q in pairs:
            print(f"  {prof.model}/{prof.key} {q['point']}: {q['shared_s'] * 1e3:.2f} ms against "
                  f"{q['unshared_s'] * 1e3:.2f} ms unshared; saves {q['saving']:.0%} of "
                  f"decode_ctx_s ({prof.step.decode_ctx_s * 1e9:.1f} ns) per later reader's "
                  "prefix token")
        if pairs:
            print(f"  {prof.model}/{prof.key}: shared_ctx_saving {saving:.1%} (the median)")


def _priced(names: list[str]) -> Iterator[tuple[str, dict[str, np.ndarray], np.ndarray, int]]:
    """Each shipped profile of `names` (of the GPU CAPPLAN_PROFILES holds): its name, its
    samples, each step by its fit, and the largest CUDA graph's tokens (past it, graph-less)."""
    for name in names:
        if not (PROFILES / name / "profile.json").exists():
            continue
        prof, s, sizes = _fit_inputs(PROFILES / name)
        above = eager_threshold(int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                                int(prof.engine["max_num_batched_tokens"]))  # type: ignore[call-overload]
        yield name, s, _predicted(prof, s, sizes), above


def _ratio_cell(label: str, r: np.ndarray) -> str:
    """`label N, median (p25-p75)` of measured / fit ratios."""
    return (f"{label} {len(r)}, {np.median(r):.3f} "
            f"({np.percentile(r, 25):.3f}-{np.percentile(r, 75):.3f})")


def mixedsteps(profile: str | None = None) -> None:
    """Steps with a prompt chunk, each against its price by the profile's fit, by how the
    engine ran them (piecewise within the largest CUDA graph, graph-less up to 2,304 tokens,
    the size of a chat prompt beside the decodes, or graph-less past it) and by how many
    decodes ran beside the chunk: the median of measured / fit over every calibration run
    of the profile (docs/validation-log.md, forty-seventh session). With no PROFILE, Qwen3-32B
    FP8 and AWQ and Llama-3.1-8B FP8 of the GPU (CAPPLAN_PROFILES)."""
    names = [profile] if profile else ["qwen3-32b/fp8", "qwen3-32b/awq", "llama-3.1-8b/fp8"]
    for name, s, pred, above in _priced(names):
        tok, ds = s["tokens"], s["decode_seqs"]
        chunk = ~s["warmup"] & (s["prefill_tokens"] > 0)
        print(f"  {PROFILES.parent.name}/{name} (largest graph {above} tokens): steps, "
              "measured / fit median (p25-p75)")
        for kind, k in (("piecewise", tok <= above),
                        ("graph-less to 2,304", (tok > above) & (tok <= 2304)),
                        ("graph-less past it", tok > 2304)):
            cells = []
            for span, lo, hi in (("0", 0, 0), ("1-15", 1, 15), ("16-40", 16, 40),
                                 ("41-90", 41, 90), ("91+", 91, np.inf)):
                m = chunk & k & (ds >= lo) & (ds <= hi)
                if m.sum() < 3:
                    continue
                cells.append(_ratio_cell(f"{span} decodes", s["step_s"][m] / pred[m]))
            print(f"    {kind:20s} " + "; ".join(cells))


def holes(profile: str | None = None) -> None:
    """The lone-prompt scans (calibration/_plans/h100/queue-s48.txt and queue-s51.txt: lone
    prompts at 44 token counts, no decode beside them): each count's measured step (median
    over the fitted runs) against its price by the profile's fit, with the tokens its last
    row of 256 leaves empty; then, on the scan's steps past 512 tokens alone, a line in T
    and the rows of tiles with and without a cost for a half-empty last row (row_holes): that
    cost in ms and the median / p95 of each line's error (and 2,048 tokens' own); then the
    same with a cost a started block of 1,024 and of 2,048 tokens besides (the counts just
    under 2,048 and 4,096 run cheap, those just past dear). A profile with eager_offset_s
    shows each count's price without it too, in brackets. With no PROFILE, Qwen3-32B FP8 and
    AWQ and Llama-3.1-8B FP8 and BF16 (CAPPLAN_PROFILES; the scans ran on the H100)."""
    names = ([profile] if profile else
             ["qwen3-32b/fp8", "qwen3-32b/awq", "llama-3.1-8b/fp8", "llama-3.1-8b/bf16"])
    for name, s, pred, _ in _priced(names):
        lone = np.char.startswith(s["point"].astype(str), LONE_SCAN) & (s["decode_seqs"] == 0)
        if not lone.any():
            continue
        tok = s["tokens"][lone]
        counts = np.unique(tok)
        ran = np.array([np.median(s["step_s"][lone][tok == n]) for n in counts]) * 1e3
        priced = np.array([np.median(pred[lone][tok == n]) for n in counts]) * 1e3
        prof = Profile.load(PROFILES / name)
        step = prof.step
        bare = _predicted(prof.model_copy(update={"step": step.model_copy(
            update={"eager_offset_s": {}})}), s, _fit_inputs(PROFILES / name)[2])
        terms = np.array([np.median(bare[lone][tok == n]) for n in counts]) * 1e3
        print(f"  {PROFILES.parent.name}/{name} (gemm_holes_s {step.gemm_holes_s * 1e3:.2f} ms): "
              "lone prompts, tokens (empty of the last row): ms measured / priced"
              + (" [by the terms without eager_offset_s]" if step.eager_offset_s else ""))
        cells = [f"{n} ({-n % 256}): {a:.1f} / {b:.1f} ({b / a - 1:+.1%})"
                 + (f" [{c:.1f}, {c / a - 1:+.1%}]" if step.eager_offset_s else "")
                 for n, a, b, c in zip(counts, ran, priced, terms, strict=True)]
        for i in range(0, len(cells), 4):
            print("    " + "; ".join(cells[i:i + 4]))
        big = counts > 512
        n, y = counts[big].astype(float), ran[big]
        base = np.column_stack([np.ones(len(n)), n, np.ceil(n / 256)])
        with_holes = np.column_stack([base, [row_holes(int(c)) for c in counts[big]]])
        with_blocks = np.column_stack([with_holes, np.ceil(n / 1024), np.ceil(n / 2048)])
        fits = []
        at_2048 = counts[big] == 2048
        for x in (base, with_holes, with_blocks):
            beta = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)[0]
            err = np.abs(x @ beta / y - 1)
            fits.append((beta, np.median(err), np.percentile(err, 95),
                         float((x @ beta / y - 1)[at_2048][0]) if at_2048.any() else np.nan))
        print(f"    the scan alone ({big.sum()} counts past 512): a row half empty costs "
              f"{fits[1][0][3]:.2f} ms; error median / p95 {fits[0][1]:.1%} / {fits[0][2]:.1%} "
              f"without that cost, {fits[1][1]:.1%} / {fits[1][2]:.1%} with it (2,048 tokens "
              f"{fits[1][3]:+.1%})")
        print(f"    with a cost a started block of 1,024 tokens ({fits[2][0][4]:.2f} ms) and of "
              f"2,048 ({fits[2][0][5]:.2f} ms) besides (sixtieth session): {fits[2][1]:.1%} / "
              f"{fits[2][2]:.1%} (2,048 tokens {fits[2][3]:+.1%})")


def ragged(profile: str | None = None) -> None:
    """Graph-less steps with a prompt chunk by whether their token count is a multiple of
    1,024 or not, each against its price by the profile's fit: the median of measured / fit
    (p25-p75), and the lone prompts' (no decode beside them, at most 300 tokens of prior
    context) median microseconds a token, in the profile's fitted runs and then in every run
    and scan of its engine (the prefix-cache scan's lone prompts of 922, 1,843 and 3,686
    tokens among them). The forty-eighth session split at multiples of 256 (every GEMM row
    of tiles full: scaled_mm_sm90_fp8_dispatch.cuh runs clusters of two 128-row tiles past
    128 tokens); the graph scans' lone prompt of 3,328 tokens, 13 x 256, costs what the
    counts off the multiples cost on every engine that has one, BF16 (cuBLAS) among them,
    so the forty-ninth split at 1,024, the largest stride the steps had not refuted
    (3,072, 5,120, 6,144 and 7,168 run as cheap as 4,096); the fifty-first session's scan
    (`holes`) showed the multiples of 256 cheap after all, and a half-empty last row dear.
    The sweep's graph-less prompt steps are such multiples but for its 768-token ones and a
    few chunks beside decodes; a serving engine's nearly never are. With no PROFILE,
    Qwen3-32B FP8 and AWQ and Llama-3.1-8B FP8 and BF16 of the GPU (CAPPLAN_PROFILES)."""
    names = ([profile] if profile else
             ["qwen3-32b/fp8", "qwen3-32b/awq", "llama-3.1-8b/fp8", "llama-3.1-8b/bf16"])
    for name, s, pred, above in _priced(names):
        tok, ds, pt = s["tokens"], s["decode_seqs"], s["prefill_tokens"]
        chunk = ~s["warmup"] & (pt > 0) & (tok > above) & (s["spec_tokens"] == 0)
        full = tok % 1024 == 0
        print(f"  {PROFILES.parent.name}/{name}: graph-less prompt steps, measured / fit "
              "median (p25-p75); lone prompts' us a token")
        for label, k in (("multiple of 1,024", full), ("not a multiple", ~full)):
            cells = []
            for span, m in (("no decodes", chunk & k & (ds == 0)),
                            ("with decodes", chunk & k & (ds > 0))):
                if m.sum() < 1:
                    continue
                cells.append(_ratio_cell(span, s["step_s"][m] / pred[m]))
            print(f"    {label:17s} " + "; ".join(cells))
        off = Counter(tok[chunk & ~full & (ds == 0)].tolist()).most_common()
        print("    not a multiple, no decodes, steps by token count: "
              + (", ".join(f"{c} x{k}" for c, k in off) or "-"))
        by: dict[int, list[float]] = {}
        _lone_prompts(s, above, by)
        print("    lone (* a multiple of 1,024, + of 256 only): " + _per_token(by))
        # every run of the engine, its prefix-cache and graph scans too (not fitted with it)
        model, key = name.split("/")
        repeats = {n for n in (p.name.split(".jsonl")[0]
                               for p in RAW.glob(f"{model}--{key}--r*.jsonl*"))
                   if n.removeprefix(f"{model}--{key}--r").isdigit()}  # not --r2--drain
        runs = [f"{model}--{key}", *sorted(repeats), f"{model}--{key}--cache",
                f"{model}--{key}--graphs"]
        every: dict[int, list[float]] = {}
        for path in filter(None, (store.runner_jsonl(RAW, run) for run in runs)):
            _lone_prompts(store.samples_of(store.read_runner_jsonl(path)), above, every)
        print("    lone, every run and scan: " + _per_token(every))


def _lone_prompts(s: dict[str, np.ndarray], above: int, by: dict[int, list[float]]) -> None:
    """Add to `by`, under each step's token count, the time of every lone prompt step of `s`
    past `above` tokens: a prompt chunk with no decode beside it and at most 300 tokens of
    prior context (warm-ups and speculative steps left out)."""
    pt = s["prefill_tokens"]
    m = (~s["warmup"] & (pt > 0) & (s["decode_seqs"] == 0) & (s["spec_tokens"] == 0)
         & (s["tokens"] > above) & (s["prefill_attn"] <= pt * (300 + pt / 2)))
    for t, x in zip(s["tokens"][m], s["step_s"][m], strict=True):
        by.setdefault(int(t), []).append(float(x))


def _per_token(by: dict[int, list[float]]) -> str:
    """`tokens[*+] us-a-token (n=N)` for each token count, the median step over it (* a
    multiple of 1,024, + of 256 only)."""
    return ", ".join(f"{t}{'*' if t % 1024 == 0 else '+' if t % 256 == 0 else ''} "
                     f"{np.median(v) / t * 1e6:.0f}"
                     + (f" (n={len(v)})" if len(v) > 1 else "") for t, v in sorted(by.items()))


def decode() -> None:
    """Decode-only steps (every request decoding, no prefill chunk) of the main sweeps'
    batch-16 to -256 points and of the prefix-cache engines' unshared twins: median
    measured against the profile (docs/validation.md: ITL p50 at high concurrency)."""
    raw = RAW
    for d in (PROFILES / "llama-3.1-8b/bf16", PROFILES / "llama-3.1-8b/fp8",
              PROFILES / "qwen3-32b/bf16", PROFILES / "qwen3-32b/fp8"):
        prof, _, sizes = _fit_inputs(d)
        cache = store.runner_jsonl(raw, f"{d.parent.name}--{d.name}--cache")
        frames = [("sweep", store.read_samples(d))]
        if cache is not None:
            frames.append(("cache engine", store.read_runner_jsonl(cache)))
        for label, df in frames:
            s = store.samples_of(df.filter(~pl.col("warmup")))
            pred = _predicted(prof, s, sizes)
            cells = []
            for name in sorted({p for p in s["point"] if p.startswith("decode-")},
                               key=lambda p: [int(x[1:]) for x in p.split("-")[1:]]):
                b = int(name.split("-")[1][1:])
                k = (s["point"] == name) & (s["decode_seqs"] == b) & (s["prefill_tokens"] == 0)
                if b < 16 or k.sum() < 3:
                    continue
                m, q = np.median(s["step_s"][k]), np.median(pred[k])
                cells.append(f"{name[7:]} {m * 1e3:.2f}/{q * 1e3:.2f} ({(q - m) / m:+.0%})")
            print(f"  {d.parent.name}/{d.name} {label} (measured/profile ms): " + ", ".join(cells))


def graphs() -> None:
    """Each profile's graph scan (`<model>--<key>--graphs`): per CUDA-graph size, the
    median decode-only step measured, by the linear terms, and the offset the profile keeps
    (steptime.py: graph_offset_s); the long-context points beside the short ones."""
    for d in sorted(PROFILES.glob("*/*")):
        prov = d / "provenance.json"
        if not prov.exists():
            continue
        scan = json.loads(prov.read_text()).get("graph_scan")
        if not scan:
            continue
        prof = Profile.load(d)
        print(f"  {d.parent.name}/{d.name} ({scan['run']}): size measured/linear ms (offset)")
        for ctx in sorted({int(p["point"].rsplit("-c", 1)[1]) for p in scan["points"]}):
            cells = [f"{p['size']}: {p['measured_s'] * 1e3:.2f}/{p['linear_s'] * 1e3:.2f} "
                     f"({(p['measured_s'] - p['linear_s']) * 1e3:+.2f})"
                     for p in scan["points"] if p["point"].endswith(f"-c{ctx}")]
            print(f"    context {ctx}: " + ", ".join(cells))
        # each size timed at two contexts: its own decode-only KV-read rate (the profile
        # keeps one rate for all sizes, graph_ctx_s; docs/validation.md says why)
        by_size: dict[int, list[tuple[int, float]]] = {}
        for p in scan["points"]:
            ctx = int(p["point"].rsplit("-c", 1)[1])
            by_size.setdefault(p["size"], []).append((ctx, p["measured_s"] - p["linear_s"]))
        d_ctx = prof.step.decode_ctx_s
        rates = [f"{b}: {(d_ctx + (hi[1] - lo[1]) / (b * (hi[0] - lo[0]))) * 1e9:.1f}"
                 for b, pts in sorted(by_size.items()) if len(pts) > 1
                 for lo, hi in [(min(pts), max(pts))]]
        print(f"    KV read by size, ns a token: {', '.join(rates)}; kept "
              f"{prof.step.graph_ctx_s * 1e9:.1f}")
        span = prof.step.graph_offset_s.values()
        print(f"    kept: {len(prof.step.graph_offset_s)} sizes, "
              f"{min(span) * 1e3:+.2f} to {max(span) * 1e3:+.2f} ms")
        if prof.step.window_tokens:
            _window_points(prof, scan["run"])


def _window_points(prof: Profile, run: str) -> None:
    """A sliding-window profile's scan points past its window (not among its offsets'):
    each one's median step, measured and priced by the profile, with its sliding layers'
    fitted rate (decode_window_s) and with the scanned one (graph_window_s)."""
    raw = store.runner_jsonl(RAW, run)
    if raw is None:
        return
    df = store.read_runner_jsonl(raw).filter(
        ~pl.col("warmup") & pl.col("point").str.starts_with("graphs-")
        & (pl.col("prefill_tokens") == 0))
    eng = prof.engine
    timers = [StepTimer(q, max_num_seqs=int(eng["max_num_seqs"]),  # type: ignore[call-overload]
                        max_num_batched_tokens=int(eng["max_num_batched_tokens"]))  # type: ignore[call-overload]
              for q in (prof.model_copy(update={"step": prof.step.model_copy(
                  update={"graph_window_s": 0.0})}), prof)]
    cells = []
    for name in sorted(set(df["point"]), key=lambda n: int(n.split("-")[1][1:])):
        b, ctx = int(name.split("-")[1][1:]), int(name.rsplit("-c", 1)[1])
        steps = df.filter((pl.col("point") == name) & (pl.col("decode_seqs") == b))
        if ctx <= prof.step.window_tokens or len(steps) < scans.GRAPH_SCAN_MIN_STEPS:
            continue
        measured = float(np.median(steps["step_s"]))
        context = int(np.median(steps["decode_ctx"]))
        fitted, scanned = (t.step_time_s(b, b, 0.0, context) / measured - 1 for t in timers)
        cells.append(f"{b}: {measured * 1e3:.2f} ms ({fitted:+.1%} / {scanned:+.1%})")
    print(f"    past the {prof.step.window_tokens}-token window, measured (priced with the "
          f"fitted / the scanned sliding rate, {prof.step.decode_window_s * 1e9:.1f} / "
          f"{prof.step.graph_window_s * 1e9:.1f} ns a token): " + ", ".join(cells))


def idle() -> None:
    """Each shipped profile's fit on its measured steps (warm-up points left out), split into
    the steps that queued behind another (pipelined) and those that began on an idle GPU, a
    point's first: median and p95 absolute error of each, and of the steps the fit misses by
    more than 8 %, the share that began on an idle GPU (docs/calibration.md)."""
    for d in sorted(PROFILES.glob("*/*/samples.parquet")):
        prof, s, sizes = _fit_inputs(d.parent)
        ape = np.abs(_predicted(prof, s, sizes) / s["step_s"] - 1)
        keep = ~s["warmup"]
        piped = pl.read_parquet(d)["pipelined"].to_numpy().astype(bool)
        a, b = ape[keep & piped], ape[keep & ~piped]
        over = keep & (ape > 0.08)
        print(f"  {prof.model}/{prof.key}: pipelined {len(a)} steps, median {np.median(a):.1%}, "
              f"p95 {np.percentile(a, 95):.1%}; from idle {len(b)}, median {np.median(b):.1%}, "
              f"p95 {np.percentile(b, 95):.1%}; over 8 %: {over.sum()} steps, "
              f"{(over & ~piped).sum() / max(over.sum(), 1):.0%} of them from idle")


def specgraphs() -> None:
    """The speculative profiles' own sweep steps priced with and without their graph scan's
    offsets (`capplan calibrate --graph-scan` with --spec-tokens, sixteenth session): the
    median and p95 absolute error of the decode-only steps and of every step."""
    for key in ("gemma-4-31b/fp8-mtp2", "gemma-4-31b/fp8-mtp4",
                "llama-3.1-8b/bf16-draft_model2", "llama-3.1-8b/bf16-draft_model4"):
        prof, s, sizes = _fit_inputs(PROFILES / key)
        if not prof.step.graph_offset_s:
            why = next((x for x in prof.provenance.note.split("; ")
                        if x.startswith("graph scan")), "no graph scan")
            print(f"  {key}: no offsets ({why})")
            continue
        keep = ~s["warmup"].astype(bool)
        s = {c: v[keep] for c, v in s.items()}
        linear = prof.model_copy(update={"step": prof.step.model_copy(
            update={"graph_offset_s": {}})})
        with_, without = _predicted(prof, s, sizes), _predicted(linear, s, sizes)
        dec = (s["prefill_tokens"] == 0) & (s["decode_seqs"] > 0)
        for label, k in (("decode-only steps", dec), ("all steps", np.ones_like(dec))):
            e0 = np.abs(without[k] / s["step_s"][k] - 1)
            e1 = np.abs(with_[k] / s["step_s"][k] - 1)
            print(f"  {key} {label} ({k.sum()}): median {np.median(e0):.1%} -> "
                  f"{np.median(e1):.1%}, p95 {np.percentile(e0, 95):.1%} -> "
                  f"{np.percentile(e1, 95):.1%} (without -> with the offsets)")


def mixlen() -> None:
    """Runs of mixlen-scan engines (`capplan calibrate --mixlen-scan`,
    calibration/_raw/<model>--<key>--mixlen.jsonl[.xz]): each decode batch of unequal lengths
    beside its twin of one length (sweep.mixlen_points), over the steps where the whole batch
    decodes: measured, and by the profile without FlashAttention's last wave (its summed
    context's price) and with it, F from the point's own lengths (the plan's groups, grown by
    the steps decoded: tiles.tail_factor); then the unequal one against its twin."""
    for prof, s, _ in _scan_runs("mixlen", "--mixlen-scan"):
        step = prof.step
        plan_dir = CALIBRATION_DIR / "_plans" / ("h100" if PROFILES.parent.name == "h100" else "")
        plan = {q["id"]: q for q in json.loads(
            (plan_dir / f"{prof.model}--{prof.key}--mixlen.json").read_text())["points"]}
        sizes = cudagraph_capture_sizes(256, 8192, prof.spec_k)
        flat = F.predict_steps(s, step.model_copy(update={"tile_rho": 0.0}), sizes,
                               prof.spec_k)
        twin: tuple[float, float, float] | None = None
        mixed0: str | None = None  # the first mixed point: the others' reference
        for name in dict.fromkeys(s["point"]):
            k = np.flatnonzero(s["point"] == name)
            b = (int(name.split("-b")[1].split("-")[0]) if name.startswith(("decode-", "mixed-"))
                 else sum(int(g.split("c")[0]) for g in name.removeprefix("decmix-b")
                          .split("-b")))
            # a mixed point's steps of all its decodes beside one chunk; the others' decode-only
            k = k[(s["decode_seqs"][k] == b) & ((s["prefill_seqs"][k] == 1)
                                                if name.startswith("mixed-")
                                                else (s["prefill_tokens"][k] == 0))]
            if not len(k):
                continue
            meas, flat_s = float(np.median(s["step_s"][k])), float(np.median(flat[k]))
            ctx = float(np.median(s["decode_ctx"][k]))
            by = flat_s
            if step.tile_rho and not name.startswith("mixed-"):
                q = plan[name]
                groups = q.get("groups") or [[q["batch"], q["context"]]]
                grown = (ctx - sum(n * c for n, c in groups)) / b  # tokens decoded since
                blocks = [kv_blocks(int(c + grown)) for n, c in groups for _ in range(n)]
                f = tail_factor(blocks, step.tile_kv_heads, step.tile_sms, step.tile_rho)
                by = flat_s + step.graph_ctx_s * ctx * (f - 1)
            line = (f"  {prof.model}/{prof.key} {name:26s} {b:4d} seqs, context {ctx:9,.0f}: "
                    f"{meas * 1e3:6.2f} ms measured, {flat_s * 1e3:6.2f} by the summed context "
                    f"({meas / flat_s - 1:+.1%}), {by * 1e3:6.2f} with the last wave "
                    f"({meas / by - 1:+.1%}; {len(k)} steps)")
            if name.startswith("decode-") or (name.startswith("mixed-") and mixed0 is None):
                twin = (meas, flat_s, by)
                mixed0 = name if name.startswith("mixed-") else None
            elif twin is not None:
                line += (f"; against its twin {meas / twin[0] - 1:+.1%} measured, "
                         f"{by / twin[2] - 1:+.1%} priced")
            print(line)


def composition(profile: str) -> None:
    """Each sweep point of one profile by its own steps: those of the composition it was
    built to time (the point's most common token and sequence count, its setup steps left
    out), the median of each run's and the fit's price (docs/calibration.md, "Repeat runs
    and the CPU's launches"), and where run 1 timed the core's CPU a step (`cpu_launch_s`)
    its median share of run 1's step."""
    prof, s, sizes = _fit_inputs(PROFILES / profile)
    pred = _predicted(prof, s, sizes)
    raw = store.read_samples(PROFILES / profile)
    run = raw["run"].to_numpy() if "run" in raw.columns else np.ones(len(pred), int)
    launch = (raw["cpu_launch_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
              if "cpu_launch_s" in raw.columns else np.full(len(pred), np.nan))
    df = pl.DataFrame({"point": s["point"], "run": run,
                       "tokens": s["tokens"], "seqs": s["seqs"], "step_s": s["step_s"],
                       "fit_s": pred, "warmup": s["warmup"],
                       "launch": launch / s["step_s"]}).filter(~pl.col("warmup"))
    runs = sorted(df["run"].unique().to_list())
    for name in dict.fromkeys(df["point"].to_list()):
        d = df.filter(pl.col("point") == name)
        # the commonest composition; of two as common, the larger (a mixed point's
        # chunk-carrying steps, not its decode-only ones): deterministic
        top = (d.group_by("tokens", "seqs").len()
               .sort("len", "tokens", "seqs", descending=True).row(0))
        d = d.filter((pl.col("tokens") == top[0]) & (pl.col("seqs") == top[1]))
        by_run = "  ".join(
            f"run {r} {x['step_s'].median() * 1e3:7.2f}" if (x := d.filter(
                pl.col("run") == r)).height else f"run {r}       -" for r in runs)
        share = d.filter((pl.col("run") == runs[0]) & pl.col("launch").is_not_nan())["launch"]
        print(f"  {name:28s} {top[0]:5d} tokens {top[1]:4d} seqs: {by_run} ms; "
              f"fit {d['fit_s'].median() * 1e3:7.2f} ms"
              + (f"; launch {share.median():.0%} of run {runs[0]}'s step" if len(share) else ""))


def encoder() -> None:
    """The encoder scan behind every Gemma 4 profile (calibrate/build.py encoder_time): each
    point's median pass, measured and as the profile prices it, and the fitted terms."""
    prov = json.loads((CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "gemma-4-31b" / "fp8"
                       / "provenance.json").read_text())["encoder_scan"]
    print(f"== encoder ({', '.join(prov.get('runs', [prov['run']]))}; each point from its "
          f"quickest run): floor {prov['encoder_floor_s'] * 1e3:.1f} ms, "
          f"{prov['encoder_token_s'] * 1e6:.1f} us an image token, "
          f"{prov['encoder_token2_s'] * 1e9:.1f} ns a token squared a picture")
    for q in prov["points"]:
        print(f"  {q['images']} x {q['image_tokens']:5d} tokens: measured {q['wall_ms']:7.1f} ms,"
              f" priced {q['priced_ms']:7.1f} ({q['priced_ms'] / q['wall_ms'] - 1:+.1%}; "
              f"{q['passes']} passes, inputs {q['inputs'].split(' ')[0]})")


SLOW_SPELL_MS = 65.0
"""A picture's step this much longer than its text twin's is in a slow spell (the steps ran
~35-60 or ~75-145 ms beyond their twins, nothing between)."""


def pictures() -> None:
    """Each Gemma 4 encoder run's lone 280-token pass and picture points (calibrate/build.py
    encoder_time): each point's text twin, its picture steps beyond the twin (p10/p50/p90)
    and, step by step, which ran in a slow spell (S); then the profile's pooled draws."""
    raw = CALIBRATION_DIR / "_raw"
    prof = Profile.load(PROFILES / "gemma-4-31b" / "fp8" / "profile.json")
    timer = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
    pass_ms = timer.encoder_pass_s(280, 1) * 1e3
    prov = json.loads((PROFILES / "gemma-4-31b" / "fp8" / "provenance.json").read_text())
    for run in prov["encoder_scan"]["runs"]:
        path = store.runner_jsonl(raw, run)
        assert path is not None
        scan = store.read_encoder_jsonl(path).filter(pl.col("point") == "encoder-i1-t280")
        print(f"== {run}: a lone 280-token picture's pass {scan['wall_s'].median() * 1e3:.1f} ms "
              f"(median of {scan.height})")
        try:
            df = store.read_runner_jsonl(path).filter(~pl.col("warmup"))
        except CalibrationError:  # a scan from before the picture points
            df = pl.DataFrame()
        if "encoder_tokens" not in df.columns:
            print("  no picture points")
            continue
        slow = steps = 0
        for pid in sorted(p for p in df["point"].unique() if p.startswith("picture-")
                          and "-i0" not in p):
            pic, txt = scans.picture_and_twin(df, pid)
            twin = float(txt["step_s"].median()) * 1e3  # type: ignore[arg-type]
            beyond = pic.sort("step")["step_s"].to_numpy() * 1e3 - twin
            slow, steps = slow + int((beyond > SLOW_SPELL_MS).sum()), steps + len(beyond)
            q = np.percentile(beyond, [10, 50, 90])
            print(f"  {pid:20s} twin {twin:5.1f} ms; picture beyond it "
                  + "/".join(f"{x:.1f}" for x in q) + " ms (p10/p50/p90), "
                  + "".join("S" if b > SLOW_SPELL_MS else "." for b in beyond))
            launches = _neighbour_launches(df.filter(pl.col("point") == pid))
            if launches is not None:
                print("  " + " " * 20 + " " + launches)
        print(f"  in the slow spell: {slow} of the run's {steps} picture steps "
              f"({slow / steps:.0%})")
    d = np.array(prof.step.encoder_step_draws_s) * 1e3
    st = prof.step
    print(f"== the profile: a pass of {pass_ms:.1f} ms, and around it {len(d)} draws, median "
          f"{st.encoder_step_s * 1e3:.1f} ms; beyond the text twin "
          + "/".join(f"{x:.1f}" for x in np.percentile(d + pass_ms, [10, 50, 90]))
          + f" ms (p10/p50/p90), {np.mean(d + pass_ms > SLOW_SPELL_MS):.0%} in a slow spell; "
          f"split past {st.encoder_slow_above_s * 1e3:.1f} ms beyond the pass "
          f"({np.sum(d > st.encoder_slow_above_s * 1e3)} slow), spells of "
          f"{st.encoder_slow_spell_s:.2f} s slow and {st.encoder_fast_spell_s:.2f} s fast")


def _neighbour_launches(steps: pl.DataFrame, around: int = 3) -> str | None:
    """A picture point with running decodes: the core's launch of its decode-only steps
    within `around` steps of each picture step, beside the picture step's own launch, split
    at the picture steps' median. Where the neighbours launch slower beside a slow picture
    step, the spell is not the encoder's alone."""
    st = steps.sort("step")
    pic = st["encoder_tokens"].fill_null(0).to_numpy() > 0
    decode = ~pic & (st["prefill_seqs"].to_numpy() == 0)
    launch = st["cpu_launch_s"].to_numpy() * 1e3
    pairs = []
    for i in np.flatnonzero(pic):
        near = [j for j in range(max(0, i - around), min(len(st), i + around + 1)) if decode[j]]
        if near:
            pairs.append((launch[i], float(np.median(launch[near]))))
    if len(pairs) < 5:
        return None
    a = np.array(pairs)
    slow = a[:, 0] > np.median(a[:, 0])
    return (f"launches: the picture step {np.median(a[slow, 0]):.1f} / {np.median(a[~slow, 0]):.1f}"
            f" ms (slower / quicker half), the decode-only steps around it "
            f"{np.median(a[slow, 1]):.2f} / {np.median(a[~slow, 1]):.2f} ms, correlation "
            f"{np.corrcoef(a[:, 0], a[:, 1])[0, 1]:+.2f}")


def probe() -> None:
    """Each encoder run measured with scripts/cpu_probe.py beside it (since the twenty-first
    session): the probe's pure-Python loop over the run, its two speeds and how fast they
    alternate, and the loop's time while each picture step ran, for the slower and the
    quicker half of the picture steps. One clock (perf_counter) stamps both."""
    raw = CALIBRATION_DIR / "_raw"
    for record in sorted(raw.glob("logs-s*/*.cpuprobe.jsonl.gz")):
        _probe(raw, record, record.name.removesuffix(".cpuprobe.jsonl.gz"))


def _probe(raw: Path, record: Path, run: str) -> None:
    pr = pl.read_ndjson(record)
    t, loop = pr["t"].to_numpy(), pr["loop_ms"].to_numpy()
    df = store.read_runner_jsonl(store.runner_jsonl(raw, run)).filter(~pl.col("warmup"))
    inside = (t >= df["t_sched0"].min()) & (t <= df["t_done"].max())
    print(f"{run}: the probe's loop while the engine's points ran, {inside.sum()} samples: "
          + _two_speeds(t[inside], loop[inside]))
    stat = pr.filter(pl.col("stat").is_not_null())["stat"].to_list()
    ticks = np.array(stat).sum(axis=0)
    print(f"  the host's CPU time over the probe's record: {ticks[2] / ticks.sum():.0%} idle, "
          f"steal {ticks[6] / ticks.sum():.2%}")
    points = df["point"].unique()
    for pid in sorted(p for p in points if p.startswith("picture-") and "-i0" not in p):
        pic = df.filter((pl.col("point") == pid) & (pl.col("encoder_tokens").fill_null(0) > 0))
        took = pic["cpu_launch_s"].to_numpy() * 1e3
        at = [np.median(loop[(t >= a - 0.3) & (t <= b + 0.3)]) for a, b in
              zip(pic["t_sched0"].to_numpy(), pic["t_done"].to_numpy(), strict=True)]
        at = np.array(at)
        slow = took > np.median(took)
        print(f"  {pid:20s} picture steps {np.median(took[slow]):.1f} / "
              f"{np.median(took[~slow]):.1f} ms (slower / quicker half); the probe's loop "
              f"meanwhile {np.median(at[slow]):.2f} / "
              f"{np.median(at[~slow]):.2f} ms, correlation {np.corrcoef(took, at)[0, 1]:+.2f}")


def _two_speeds(t: np.ndarray, loop: np.ndarray, split_ms: float = 2.4) -> str:
    """A probe record's two speeds (split at `split_ms`): each one's median, the slow share,
    and the mean length of each speed's unbroken stretches."""
    slow = loop > split_ms
    edges = np.flatnonzero(np.diff(slow.astype(int))) + 1
    spans = {True: [], False: []}
    for a, b in pairwise([0, *edges, len(t)]):
        spans[bool(slow[a])].append(t[b - 1] - t[a] + 0.05)
    return (f"{np.median(loop[~slow]):.2f} / {np.median(loop[slow]):.2f} ms (quick / slow, "
            f"{np.median(loop[slow]) / np.median(loop[~slow]):.2f}x), slow {slow.mean():.0%} of "
            f"samples, stretches of {np.mean(spans[False]):.2f} s quick and "
            f"{np.mean(spans[True]):.2f} s slow")


def kvstarts() -> None:
    """Each measured KV point of the speculative profiles with its engine's bytes for the
    cache, against 0.05 x the GPU's memory between neighbouring utilisations: where one
    engine start held more outside the cache than another."""
    total = 143771 * 2**20  # MiB of the H200, nvidia-smi
    for key in ("gemma-4-31b--fp8-mtp2", "llama-3.1-8b--bf16-draft_model2",
                "llama-3.1-8b--bf16-draft_model4"):
        rows = []
        for suffix, u in (("--u85", 0.85), ("", 0.90), ("--u95", 0.95)):
            path = CALIBRATION_DIR / "_raw" / f"{key}{suffix}.meta.json"
            if path.exists():
                kv = json.loads(path.read_text())["kv"]
                rows.append((u, kv["kv_tokens"], kv["available_kv_bytes"]))
        print(f"== {key}")
        for (u0, _, b0), (u1, t1, b1) in pairwise(rows):
            print(f"  {u0:.2f} -> {u1:.2f}: cache +{(b1 - b0) / 1e9:.2f} GB, "
                  f"{(u1 - u0) * total / 1e9:.2f} GB expected ({t1:,} tokens at {u1:.2f})")


def starts() -> None:
    """Each model's engine starts (`engine_start_s` of every stored run) by speculative
    method: the shortest (a warm compile cache) and the longest (a cold one), which
    `capplan calibrate --emit-queue` allows a queued engine (cli.measured_start_s)."""
    from capplan.calibrate.cli import START_MARGIN, spec_method_of

    by: dict[tuple[str, str], list[float]] = {}
    for meta in sorted((CALIBRATION_DIR / "_raw").glob("*.meta.json")):
        run = meta.name.removesuffix(".meta.json")
        model, method = run.split("--")[0], spec_method_of(run) or "none"
        start = json.loads(meta.read_text()).get("engine_start_s")
        if start:
            by.setdefault((model, method), []).append(float(start))
    for (model, method), xs in sorted(by.items()):
        print(f"  {model:14s} {method:12s} {len(xs):3d} starts, {min(xs):6.1f}-{max(xs):6.1f} s; "
              f"a queued engine is allowed {START_MARGIN * max(xs):.0f} s")


def speeds(profile: str = "llama-3.1-8b/bf16-draft_model2") -> None:
    """A profile measured in two runs (two hosts): per sweep point, run 2's median step over
    run 1's, beside run 2's median scheduler time (the engine core's own CPU work, `t_sched1
    - t_sched0`) over run 1's, and how far the one follows the other over the points: where
    the steps are the host's launches, a slower host's scheduler and steps slow together."""
    _, s, _ = _fit_inputs(PROFILES / profile)
    raw = store.read_samples(PROFILES / profile)
    sched = (raw["t_sched1"] - raw["t_sched0"]).to_numpy()
    runs, keep, step = raw["run"].to_numpy(), ~s["warmup"], s["step_s"]
    xs, ys = [], []
    for name in dict.fromkeys(s["point"][keep]):
        both = [(keep & (s["point"] == name) & (runs == r)) for r in (1, 2)]
        if min(m.sum() for m in both) < 5:
            continue
        a, b = (np.median(step[m]) for m in both)
        c, d = (np.median(sched[m]) for m in both)
        xs.append(np.log(d / c))
        ys.append(np.log(b / a))
        print(f"  {name:28s} step run 2 / run 1 {b / a:5.2f}, scheduler {d / c:5.2f}")
    if len(xs) > 2:
        print(f"  {profile}: {len(xs)} points in both runs; log step ratio against log scheduler "
              f"ratio, correlation {np.corrcoef(xs, ys)[0, 1]:+.2f}")


def drain() -> None:
    """A point's drain (fit.drain_steps): per profile, its drain steps priced by the profile
    as shipped against its designed steps' held-out error, and every point that shrinks
    priced by how many of its requests finish at once; Qwen3-32B BF16's drains step by
    step beside the same batches held steady; and, on every traced serving engine
    (validation steps.parquet, vLLM's iteration details), a decode-only step after requests
    finished against a steady one of the same size (the median, over sizes, of the ratio of
    their medians, each size weighted by its steps after a finish)."""
    for d in sorted(p.parent for p in PROFILES.glob("*/*/samples.parquet")):
        prof = Profile.load(d)
        f = json.loads((d / "provenance.json").read_text()).get("fit", {})
        print(f"  {d.parent.name}/{d.name}: held-out as shipped, median / p95: all "
              f"{_pct(f.get('heldout_shipped_median_ape'))} / "
              f"{_pct(f.get('heldout_shipped_p95_ape'))}; designed steps "
              f"{_pct(f.get('designed_shipped_median_ape'))} / "
              f"{_pct(f.get('designed_shipped_p95_ape'))} ({f.get('designed_units', 0)} units); "
              f"drains {_pct(f.get('drain_shipped_median_ape'))} / "
              f"{_pct(f.get('drain_shipped_p95_ape'))} ({f.get('drain_units', 0)})")
        df = pl.read_parquet(d / "samples.parquet")
        w = prof.step.window_tokens or 0
        s = store.samples_of(df, w)
        eng, k = prof.engine, prof.spec_k
        # the same held-out units split by whether they hold a stalled drain step
        seed = f.get("seed", 0)
        ape = F.heldout_ape(s, prof.step, max_num_seqs=eng["max_num_seqs"],
                            max_num_batched_tokens=eng["max_num_batched_tokens"], spec_k=k,
                            seed=seed, window=w)
        held = F.heldout_holding(s, F.stalled_steps(s), seed=seed)
        busy = ape[~held]
        print(f"    held-out units without a stalled drain step: {np.median(busy):.1%} / "
              f"{np.percentile(busy, 95):.1%} ({len(busy)} units); with one: "
              + (f"median {np.median(ape[held]):.1%} ({held.sum()})" if held.any() else "none"))
        if w:
            s = F.attention_by_kind(s, w)
        sizes = cudagraph_capture_sizes(eng["max_num_seqs"], eng["max_num_batched_tokens"], k)
        s = {**s, "eager_step": (s["tokens"] > eager_threshold(
            eng["max_num_seqs"], eng["max_num_batched_tokens"])).astype(float)}
        priced = F.predict_steps(s, prof.step, sizes, k)
        # every point that shrinks at all, from its first decode-only step with fewer
        # requests than the step before to its end, by how many finished at that step:
        # the median over such points of their steps' median error, priced against measured
        err = priced / s["step_s"] - 1
        by_drop: dict[str, list[float]] = {}
        bounds = np.flatnonzero(np.r_[True, s["point"][1:] != s["point"][:-1], True])
        only = F.decode_only(s)
        for a, b in pairwise(bounds):
            drop = s["seqs"][a:b - 1] - s["seqs"][a + 1:b]
            first = np.flatnonzero(only[a + 1:b] & (drop > 0))
            if len(first) and not s["warmup"][a]:
                n = int(drop[first[0]])
                key = "1" if n == 1 else "2-7" if n < F.DRAIN_FINISHED else "8+"
                by_drop.setdefault(key, []).append(float(np.median(err[a + 1 + first[0]:b])))
        print("    points that shrink, by the requests finishing at their first shrinking "
              "step: " + ", ".join(f"{key} a step: {len(v)} points, priced "
                                   f"{np.median(v):+.1%}" for key, v in sorted(by_drop.items())))
        # the drain's steps split by whether the GPU idled before them (fit.stalled_steps):
        # measured less priced, the idle time, and the GPU's own span less priced
        drained, stalled = F.drain_steps(s) & only, F.stalled_steps(s) & only
        flowing = drained & ~stalled
        span = (df["gpu_t1"] - df["gpu_t0"]).to_numpy()
        gap = s["gpu_gap_s"]

        def ms(x: np.ndarray) -> str:
            return f"{np.median(x) * 1e3:+.2f}" if len(x) else "-"

        line = (f"    drain steps, decode-only: {stalled.sum()} of {drained.sum()} began after "
                f"the GPU idled (median {ms(gap[stalled])[1:]} ms): measured - priced "
                f"{ms((s['step_s'] - priced)[stalled])} ms, the GPU's span - priced "
                f"{ms((span - priced)[stalled])}; the {flowing.sum()} that kept it busy: "
                f"{ms((s['step_s'] - priced)[flowing])} ms")
        steady = (only & ~F.drain_steps(s) & ~s["warmup"].astype(bool)
                  & (df["step"].to_numpy() > 0))
        outside = ~F.drain_steps(s) & ~s["warmup"].astype(bool)
        line += (f"; steady decode-only steps after an idle: {(steady & (gap >= F.STALL_S)).sum()}"
                 f" of {steady.sum()}; outside the drains the stream idled "
                 f"{gap[outside].sum() / s['step_s'][outside].sum():.2%} of the time")
        if "cpu_launch_s" in df.columns:
            # the core's CPU time in execute_model + sample_tokens (runner.py): a drain's
            # stalls follow a launch that lasted about as long as its step's GPU work
            launch = df["cpu_launch_s"].fill_null(np.nan).to_numpy()
            before = np.r_[stalled[1:], False]  # the step before each stalled one
            line += (f"; the core's launch of the step before a stall "
                     f"{np.nanmedian(launch[before]) * 1e3:.1f} ms (its GPU span "
                     f"{np.median(span[before]) * 1e3:.1f}), of a steady decode-only step "
                     f"{np.nanmedian(launch[steady]) * 1e3:.1f} ms")
        print(line)
        if f"{d.parent.name}/{d.name}" == "qwen3-32b/fp8" and "cpu_launch_s" in df.columns:
            # one point whole: its admission (16 prompts a step) and its drain, step by step
            k = np.flatnonzero((s["point"] == "decode-b256-c512") & (df["run"] == 1).to_numpy())
            print("    decode-b256-c512 run 1, requests/prompt tokens: measured, GPU idle "
                  "before, core's launch ms: " + ", ".join(
                      f"{s['seqs'][i]}/{s['prefill_tokens'][i]}: {s['step_s'][i] * 1e3:.1f}, "
                      f"{gap[i] * 1e3:.1f}, {launch[i] * 1e3:.1f}" for i in k))
        if f"{d.parent.name}/{d.name}" != "qwen3-32b/bf16":
            continue
        drained = F.drain_steps(s)
        run = df["run"].to_numpy()
        for point in ("decode-b64-c512", "decode-b128-c512", "decode-b256-c512"):
            for r in sorted(set(run[s["point"] == point])):
                k = np.flatnonzero((s["point"] == point) & (run == r) & drained)
                steady = np.flatnonzero((s["point"] == point) & (run == r) & ~drained
                                        & (s["prefill_attn"] == 0))
                cells = [f"{s['seqs'][i]} {s['step_s'][i] * 1e3:.1f}/{priced[i] * 1e3:.1f}/"
                         f"{span[i] * 1e3:.1f}/{gap[i] * 1e3:.1f}" for i in k]
                print(f"    {point} run {r}: steady {s['seqs'][steady[0]]} requests "
                      f"{np.median(s['step_s'][steady]) * 1e3:.1f} ms; drain, requests "
                      f"measured/priced/GPU span/GPU idle before ms: " + ", ".join(cells))
    root = CALIBRATION_DIR / "h200" / "vllm-0.26.0"
    by_finished: dict[int, list[float]] = {}
    for path in sorted(root.glob("*/validation/*/steps.parquet")):
        steps = pl.read_parquet(path)
        for run_name in sorted(set(steps["run"].to_list())):
            g = steps.filter(pl.col("run") == run_name).sort("step")
            dt = np.diff(g["t"].to_numpy(), prepend=np.nan)
            dec, pre = g["decode_reqs"].to_numpy(), g["prefill_reqs"].to_numpy()
            follows = np.r_[False, np.diff(g["step"].to_numpy()) == 1]
            before = np.r_[-1, (dec + pre)[:-1]]
            only = (pre == 0) & follows & (dt < 0.2)
            after, steady = only & (dec < before), only & (dec == before)
            ratios: list[float] = []
            for b in np.unique(dec[after]):
                x, y = dt[after & (dec == b)], dt[steady & (dec == b)]
                if len(x) >= 3 and len(y) >= 3:
                    ratios += [float(np.median(x) / np.median(y))] * len(x)
            for i in np.flatnonzero(after):  # each step by how many finished before it
                y = dt[steady & (dec == dec[i])]
                if len(y) >= 3:
                    by_finished.setdefault(int(before[i] - dec[i]), []).append(
                        float(dt[i] / np.median(y)))
            if len(ratios) >= 20:
                print(f"  served {path.parent.name} {run_name}: {after.sum()} decode-only steps "
                      f"after a finish, {steady.sum()} steady; after / steady at one size: "
                      f"{np.median(ratios):.3f}")
    print("  served, every traced engine: decode-only steps by the requests that finished "
          "just before, each against the median steady step of its size: "
          + ", ".join(f"{k} finished: {len(v)} steps, {np.median(v):.3f}"
                      for k, v in sorted(by_finished.items())))


def _raw_folders() -> list[Path]:
    """calibration/_raw and each other GPU's raw folder under it (store.raw_dir), the
    superseded runs' folders left out."""
    top = CALIBRATION_DIR / "_raw"
    return [top, *sorted(p for p in top.iterdir() if (p / "rc.txt").exists()
                         and not p.name.startswith("superseded"))]


def drainscan() -> None:
    """The drain scans (`capplan calibrate --drain-scan`, sweep.drain_points): per point, how
    many of its decode-only steps began after the GPU idled and the core's launch of the
    step before each; then, per point the runner traced (`--trace-points`), the host's calls
    of 2 ms or more by name (count, median, longest) and where the longest blocking call (a
    CUDA runtime call or an aten op) was made from, and how long the GPU idled before the
    traced pass's decode-only steps (the profiler's own cost on the host)."""
    import lzma

    folders = _raw_folders()
    runs = [(folder, path) for folder in folders for path in sorted(folder.glob("*--drain.jsonl*"))]
    if not runs:
        print(f"  no drain scans in {', '.join(map(str, folders))}")
    for raw, path in runs:
        name = path.name.split(".jsonl")[0]
        df = store.read_runner_jsonl(path)
        s = store.samples_of(df)
        only, gap = F.decode_only(s), s["gpu_gap_s"]
        launch = (df["cpu_launch_s"].fill_null(np.nan).to_numpy() if "cpu_launch_s" in df.columns
                  else np.full(len(df), np.nan))
        def ms(x: np.ndarray) -> str:
            x = x[np.isfinite(x)]
            return f"{np.median(x) * 1e3:.1f} ms" if len(x) else "-"

        for point in dict.fromkeys(s["point"].tolist()):
            k = (s["point"] == point) & only
            if str(point).startswith("warmup") or not k.any():
                continue
            idle = k & (gap >= F.STALL_S)
            before = np.r_[idle[1:], False]
            print(f"  {name} {point}: {k.sum()} decode-only steps, {idle.sum()} after the GPU "
                  f"idled ({ms(gap[idle])} median); the core's launch of the step before "
                  f"each {ms(launch[before])}, of the others {ms(launch[k & ~before])}")
        for calls_path in sorted((raw / f"{name}.traces").glob("*.calls.json*")):
            opener = lzma.open if calls_path.suffix == ".xz" else open
            with opener(calls_path, "rt") as f:
                calls = json.load(f)
            by: dict[str, list[float]] = {}
            for c in calls:
                by.setdefault(c["name"], []).append(c["ms"])
            top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:8]
            print(f"    traced {calls_path.name.split('.calls')[0]}: " + ", ".join(
                f"{n} {len(v)}x (median {np.median(v):.1f} ms, longest {max(v):.1f})"
                for n, v in top))
            blocking = [c for c in calls if c["name"].startswith(("cuda", "aten::"))]
            if blocking:
                worst = max(blocking, key=lambda c: c["ms"])
                print(f"      longest blocking call: {worst['name']} {worst['ms']:.1f} ms, from "
                      + " <- ".join(worst["stack"][:4]))
            steps_path = next(iter(sorted((raw / f"{name}.traces").glob(
                calls_path.name.split(".calls")[0] + ".steps.jsonl*"))), None)
            if steps_path is not None:
                with (lzma.open if steps_path.suffix == ".xz" else open)(steps_path, "rt") as f:
                    recs = [r for r in map(json.loads, f) if r.get("kind") == "step"]
                # the GPU's idle before each decode-only step of the traced pass
                idle_ms = np.array([(b["gpu_t0"] - a["gpu_t1"]) * 1e3 for a, b in pairwise(recs)
                                    if b["prefill_tokens"] == 0])
                long = idle_ms[idle_ms >= 10]
                print(f"      under the profiler the GPU idled 10 ms or more before {len(long)} "
                      f"of the pass's {len(idle_ms)} decode-only steps"
                      + (f" ({long.min():.1f}-{long.max():.1f} ms)" if len(long) else ""))
        _drain_core_trace(raw, name, df, s, only)


CORE_CALLS = ("execute_model", "prepare_inputs", "run_fullgraph", "sample_tokens", "sample",
              "compute_logits", "Sampler", "postprocess_sampled")
"""The calls of a drain scan's core trace (runner.py --trace-core) that drainscan prints."""


def _drain_core_trace(raw: Path, name: str, df: pl.DataFrame, s: dict, only: np.ndarray) -> None:
    """A drain scan's core trace: each call's time in each step's window (from its schedule
    to the engine's update with its output, which with async scheduling holds the launch of
    the step after it), the median over the decode-only steps of the points' drains
    (fit.drain_steps, each a batch size the engine had not run) against the others; and
    torch's caching-allocator counters (`alloc_counts`: retries, cudaMallocs, cudaFrees)
    over the scan."""
    import lzma

    paths = sorted((raw / f"{name}.traces" / "coretrace").glob("core-*.jsonl*"))
    if not paths:
        return
    spans = []
    for path in paths:
        with (lzma.open if path.suffix == ".xz" else open)(path, "rt") as f:
            spans += [x for x in map(json.loads, f) if x[1] != "gpu"]
    lo, hi = df["t_sched1"].to_numpy(), df["t_done"].to_numpy()
    per = {n: np.zeros(len(df)) for n in CORE_CALLS}
    for call, _, t0, t1 in spans:
        i = np.searchsorted(lo, t0, side="right") - 1
        if call in per and i >= 0 and t0 <= hi[i]:
            per[call][i] += t1 - t0
    drained = only & F.drain_steps(s)
    rest = only & ~drained
    long = {n: v >= 5e-3 for n, v in per.items()}
    print(f"    core trace, {drained.sum()} decode-only drain steps / {rest.sum()} others: "
          "median ms, steps of 5 ms or more: " + ", ".join(
              f"{n} {np.median(v[drained]) * 1e3:.1f} / {np.median(v[rest]) * 1e3:.1f} ms, "
              f"{(long[n] & drained).sum()} / {(long[n] & rest).sum()}"
              for n, v in per.items() if v.any()))
    k = drained & long["compute_logits"]
    if k.any():
        logits, gpu = per["compute_logits"][k], s["step_s"][k]
        print(f"      compute_logits of 5 ms or more: {logits.min() * 1e3:.1f}-"
              f"{logits.max() * 1e3:.1f} ms ({np.median(logits) * 1e3:.1f} at the median), for "
              f"steps whose GPU took {np.median(gpu) * 1e3:.1f} ms; the requests of those "
              "steps: " + ", ".join(map(str, s["seqs"][k])))
    if "alloc_counts" in df.columns:
        counts = np.array([c for c in df["alloc_counts"].to_list() if c is not None])
        if len(counts):
            moved = counts.max(axis=0) - counts.min(axis=0)
            print(f"    allocator over the scan's steps: {moved[0]} retries, {moved[1]} "
                  f"cudaMallocs, {moved[2]} cudaFrees")


def newsizes() -> None:
    """First uses of a batch size (fit.after_new_size). Over every run of a timed or scan
    engine stored under calibration/_raw (another GPU's folder too): its decode-only steps
    that began after the GPU idled (fit.STALL_S), split by whether they follow a first use.
    Then, per shipped profile, the held-out units of its designed steps (less its drains,
    fit.heldout_in_drain) split by whether they hold a step that follows a first use."""
    total = {True: [0, 0], False: [0, 0]}
    for folder in _raw_folders():
        for meta in sorted(folder.glob("*.meta.json")):
            name = meta.name.removesuffix(".meta.json")
            path = store.runner_jsonl(folder, name)
            if path is None or "--graphs" in name or "--encoder" in name:
                continue
            s = store.samples_of(store.read_runner_jsonl(path))
            only = F.decode_only(s)
            stalled, after = only & (s["gpu_gap_s"] >= F.STALL_S), only & F.after_new_size(s)
            # engines whose launches are slow on every step (docs/calibration.md, "A point's
            # drain"): the draft model's and MTP k = 2's
            drafted = "draft_model" in name or "mtp2" in name
            if not drafted:
                for k in (True, False):
                    m = after if k else only & ~after
                    total[k][0] += int((stalled & m).sum())
                    total[k][1] += int(m.sum())
            print(f"  {folder.name}/{name}: stalled after a first use {(stalled & after).sum()} "
                  f"of {after.sum()}, after a size run before {(stalled & ~after).sum()} of "
                  f"{(only & ~after).sum()}" + (" (slow launches: not in the total)"
                                                 if drafted else ""))
    for k, label in ((True, "after a first use"), (False, "after a size run before")):
        n, of = total[k]
        print(f"  all but the draft-model and MTP k = 2 engines, {label}: {n} of {of} stalled "
              f"({n / of:.1%})")
    for d in sorted(CALIBRATION_DIR.glob("*/vllm-0.26.0/*/*/samples.parquet")):
        d = d.parent
        prof = Profile.load(d)
        f = json.loads((d / "provenance.json").read_text()).get("fit", {})
        df = pl.read_parquet(d / "samples.parquet")
        w = prof.step.window_tokens or 0
        s = store.samples_of(df, w)
        eng, seed = prof.engine, f.get("seed", 0)
        ape = F.heldout_ape(s, prof.step, max_num_seqs=eng["max_num_seqs"],
                            max_num_batched_tokens=eng["max_num_batched_tokens"],
                            spec_k=prof.spec_k, seed=seed, window=w)
        run = df["run"].to_numpy() if "run" in df.columns else None
        designed = ~F.heldout_in_drain(s, seed=seed)
        new = F.heldout_holding(s, F.after_new_size(s, run), seed=seed)
        rest, firsts = ape[designed & ~new], ape[designed & new]
        print(f"  {d.parts[-4]}/{d.parent.name}/{d.name}: designed steps "
              f"{np.median(ape[designed]):.1%} / {np.percentile(ape[designed], 95):.1%} "
              f"({designed.sum()} units); less those after a first use {np.median(rest):.1%} / "
              f"{np.percentile(rest, 95):.1%} ({len(rest)}); those "
              + (f"{np.median(firsts):.1%} / {np.percentile(firsts, 95):.1%} ({len(firsts)})"
                 if len(firsts) else "none"))


def byrun(profile: str, top: int = 8) -> None:
    """Where one profile's held-out error comes from, run by run: its held-out units as
    shipped (fit.heldout_ape's seeded split), the points with the largest share of units
    more than 8 % off, and each point's median signed error (predicted / measured - 1) in
    each calibration run. A point off in one run and not in another is that run's, not the
    model's."""
    d = PROFILES / profile
    prof, s, sizes = _fit_inputs(d)
    run = pl.read_parquet(d / "samples.parquet")["run"].to_numpy()
    s = {**s, "eager_step": (s["tokens"] > eager_threshold(
        int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
        int(prof.engine["max_num_batched_tokens"]))).astype(float)}  # type: ignore[call-overload]
    win = F._heldout(s, 0, 0.2)
    err = (F._window_sum(F.predict_steps(s, prof.step, sizes, prof.spec_k), win)
           / F._window_sum(s["step_s"], win) - 1)
    unit_run, point = run[win[:, 0]], s["point"][win[:, 0]]
    runs = sorted(set(unit_run.tolist()))
    print(f"  {profile}: {len(err)} held-out units, median {np.median(np.abs(err)):.1%}, p95 "
          f"{np.percentile(np.abs(err), 95):.1%}; "
          + ", ".join(f"run {r} p95 {np.percentile(np.abs(err[unit_run == r]), 95):.1%}"
                      for r in runs))
    rows = []
    for p in sorted(set(point.tolist())):
        m = point == p
        by_run = [f"{np.median(err[m & (unit_run == r)]):+.1%}" if (m & (unit_run == r)).any()
                  else "-" for r in runs]
        rows.append((float(np.mean(np.abs(err[m]) > 0.08)), int(m.sum()), p, by_run))
    rows.sort(key=lambda r: (-r[0], r[2]))
    for share, n, p, by_run in rows[:top]:
        print(f"  {p:30s} {share:4.0%} of {n:3d} units past 8 %; median by run: "
              + ", ".join(by_run))


def steadiness(profile: str) -> None:
    """How much of one profile's held-out error the steps leave to a model: its held-out
    p95 as shipped (every run's steps, one fit), with each run fitted alone on its own
    seeded split, and against no model at all: each held-out step against the median of its
    neighbours of the same composition (same point and run, within six steps, the same
    tokens and sequences and a prefill attention within 25 %), where it has two or more.
    A fit can come no closer than that last figure; the gap between it and a run's own fit
    is a point's drift over the minutes it ran, which `byrun` shows moving from run to run."""
    d = PROFILES / profile
    prof, s, sizes = _fit_inputs(d)
    df = pl.read_parquet(d / "samples.parquet")
    run = df["run"].to_numpy()
    mns = int(prof.engine["max_num_seqs"])  # type: ignore[call-overload]
    mbt = int(prof.engine["max_num_batched_tokens"])  # type: ignore[call-overload]
    s = {**s, "eager_step": (s["tokens"] > eager_threshold(mns, mbt)).astype(float)}
    win = F._heldout(s, 0, 0.2)
    shipped = (F._window_sum(F.predict_steps(s, prof.step, sizes, prof.spec_k), win)
               / F._window_sum(s["step_s"], win) - 1)
    own = []
    for r in sorted(set(run.tolist())):
        alone = store.samples_of(df.filter(pl.col("run") == r),
                                 window_tokens=prof.step.window_tokens)
        own.append(F.fit_step_model(alone, max_num_seqs=mns, max_num_batched_tokens=mbt,
                                    spec_k=prof.spec_k).test_ape)
    y, point, tokens, seqs, attn = (s["step_s"], s["point"], s["tokens"], s["seqs"],
                                    s["prefill_attn"])
    near = []  # (GPU-timed profiles only: a CPU-timed unit is a window of steps)
    for a in win[:, 0] if F.unit_width(s) == 1 else []:
        twins = [j for j in range(max(a - 6, 0), min(a + 7, len(y)))
                 if j != a and point[j] == point[a] and run[j] == run[a]
                 and not s["warmup"][j] and tokens[j] == tokens[a] and seqs[j] == seqs[a]
                 and abs(attn[j] - attn[a]) <= 0.25 * max(attn[a], 1.0)]
        if len(twins) >= 2:
            near.append(abs(y[a] / np.median(y[twins]) - 1))
    own_all = np.concatenate(own)
    print(f"  {profile}: held-out p95 as shipped {np.percentile(np.abs(shipped), 95):.1%} "
          f"({len(shipped)} units); each run fitted alone {np.percentile(own_all, 95):.1%} ("
          + ", ".join(f"run {i + 1} {np.percentile(a, 95):.1%}" for i, a in enumerate(own))
          + "); against its same-composition neighbours "
          + (f"{np.percentile(near, 95):.1%} (median {np.median(near):.1%}; {len(near)} of "
             f"{len(win)} held-out steps have two)" if near else "- (not GPU-timed steps)"))


def launches(profile: str = "llama-3.1-8b/fp8", tokens: int = 768) -> None:
    """A profile's runs, one by one, as the CPU launched them (fifty-second session): each
    run's name, the median CPU launch and step of its lone-prompt scan's steps (where it has
    the scan) and of its `tokens`-token lone prompt, its sweep's `tokens`-token prompt steps
    (`prefill-p{tokens}-x*`), the launch terms its steps give fitted alone, as
    calibrate/build.py fits each run before it takes the slowest run's (or, where a run
    finds no floor, keeps the joint fit's), and how far its points' median steps lie from
    the other runs' medians of the same points (the GPU's side of a repeat)."""
    d = PROFILES / profile
    every = pl.read_parquet(d / "samples.parquet")
    df = every.filter(~pl.col("warmup"))
    prof = Profile.load(d)
    prov = json.loads((d / "provenance.json").read_text())
    names = {1: f"{prof.model}--{prof.key}",
             **{r["run"]: r["name"] for r in prov.get("repeat_runs", [])}}
    eng = prof.engine
    print(f"  {PROFILES.parent.name}/{profile}: eager_floor_s / eager_step_s / prefill_step_s "
          f"as shipped {prof.step.eager_floor_s * 1e3:.1f} / {prof.step.eager_step_s * 1e3:.1f}"
          f" / {prof.step.prefill_step_s * 1e3:.1f} ms")
    med = df.group_by("run", "point").agg(pl.col("step_s").median())
    for run in sorted(df["run"].unique().to_list()):
        r = df.filter(pl.col("run") == run)
        # the GPU's side: each point's median step against the other runs' medians of it
        dev = med.filter(pl.col("run") == run).join(
            med.filter(pl.col("run") != run).group_by("point").agg(
                pl.col("step_s").median().alias("others")), on="point").with_columns(
            (pl.col("step_s") / pl.col("others") - 1).abs().alias("dev")).sort("dev")
        lone = r.filter(pl.col("point").str.starts_with(LONE_SCAN))
        sweep = r.filter(pl.col("point").str.starts_with(f"prefill-p{tokens}-x"))
        cells = []
        if lone.height:
            at = lone.filter(pl.col("tokens") == tokens)
            cells.append(f"scan: launch {lone['cpu_launch_s'].median() * 1e3:.1f} ms, "
                         f"{tokens} tokens {at['step_s'].median() * 1e3:.1f} ms")
        if sweep.height:
            cells.append(f"sweep: {tokens} tokens {sweep['step_s'].median() * 1e3:.1f} ms")
        alone = F.fit_step_model(
            store.samples_of(every.filter(pl.col("run") == run)),
            max_num_seqs=int(eng["max_num_seqs"]),  # type: ignore[call-overload]
            max_num_batched_tokens=int(eng["max_num_batched_tokens"]),  # type: ignore[call-overload]
            spec_k=prof.spec_k).step
        cells.append(f"alone {alone.eager_floor_s * 1e3:.1f} / {alone.eager_step_s * 1e3:.1f}"
                     f" / {alone.prefill_step_s * 1e3:.1f} ms")
        if dev.height:
            cells.append(f"its {dev.height} points a median {dev['dev'].median():.1%} from the "
                         f"other runs' (most: {dev['point'][-1]} {dev['dev'][-1]:.0%})")
        print(f"    run {run} {names.get(run, '?')}: " + "; ".join(cells))


def decodetail(profile: str | None = None) -> None:
    """The calibration engine's counterpart of `validation_analysis.py hiccups` (fifty-fourth
    session): each profile's decode points' decode-only steps (warm-ups left out), each
    against the median of its point in its run: the share past 1.25x it and the p99 of the
    ratio. A serving engine's decode tail that its profile's own steps lack is its host's."""
    names = [profile] if profile else sorted(
        f"{d.parent.parent.name}/{d.parent.name}" for d in PROFILES.glob("*/*/samples.parquet"))
    for name in names:
        s = pl.read_parquet(PROFILES / name / "samples.parquet").filter(
            ~pl.col("warmup") & (pl.col("prefill_seqs") == 0)
            & pl.col("point").str.starts_with("decode-"))
        if not s.height:
            continue
        r = (s["step_s"] / s.select(pl.col("step_s").median().over("point", "run"))["step_s"]
             ).to_numpy()
        print(f"  {PROFILES.parent.name}/{name}: {len(r)} decode-only steps, "
              f"{np.mean(r > 1.25):.2%} past 1.25x their point's median, p99 "
              f"{np.percentile(r, 99):.2f}x")


def tiles(profile: str | None = None) -> None:
    """FlashAttention's last wave on the sweep's decode-only steps (fifty-fifth session): for
    each profile with `tile_rho` (or the one named), the cells `scans.tile_rho` fits on (a
    point's steps with one count of decoding sequences, TILE_MIN_CONTEXT tokens or more
    each), by that count: the tiles of equal lengths (tiles.splits), the median step
    measured, and by the profile without the last wave and with it."""
    dirs = [PROFILES / profile] if profile else sorted(p.parent for p in
                                                       PROFILES.glob("*/*/profile.json"))
    for d in dirs:
        prof, s, sizes = _fit_inputs(d)
        step = prof.step
        if not step.tile_rho:
            if profile:
                why = "its fit found none" if step.graph_offset_s else "no graph scan"
                print(f"  {prof.model}/{prof.key}: no tile_rho ({why})")
            continue
        heads, sms = step.tile_kv_heads, step.tile_sms
        flat = _predicted(prof.model_copy(update={"step": step.model_copy(
            update={"tile_rho": 0.0})}), s, sizes)
        full = _predicted(prof, s, sizes)
        dec = (s["prefill_attn"] == 0) & (s["tokens"] <= max(sizes)) & (s["decode_seqs"] > 0)
        dec &= ~s["warmup"].astype(bool)
        print(f"  {prof.model}/{prof.key}: tile_rho {step.tile_rho}, {heads} KV heads, "
              f"{sms} SMs; by decoding sequences (tiles): ms measured / without the last wave "
              "/ with it, the cells' medians")
        rows: dict[int, list[tuple[float, float, float]]] = {}
        for name in dict.fromkeys(s["point"][dec]):
            k = dec & (s["point"] == name)
            for b in sorted(set(s["decode_seqs"][k].astype(int))):
                kk = np.flatnonzero(k & (s["decode_seqs"] == b))
                ctx = float(np.median(s["decode_ctx"][kk]))
                if len(kk) < 3 or ctx < scans.TILE_MIN_CONTEXT * b:
                    continue
                rows.setdefault(b, []).append((float(np.median(s["step_s"][kk])),
                                               float(np.median(flat[kk])),
                                               float(np.median(full[kk]))))
        parts = []
        for b, cells in sorted(rows.items()):
            m, f0, f1 = (np.median([c[i] for c in cells]) for i in range(3))
            n_tiles = heads * sum(splits([kv_blocks(8192)] * b, heads, sms))
            parts.append(f"{b} ({n_tiles} at 8,192): {m * 1e3:.2f} / {f0 * 1e3:.2f} "
                         f"({m / f0 - 1:+.1%}) / {f1 * 1e3:.2f} ({m / f1 - 1:+.1%})")
        for i in range(0, len(parts), 3):
            print("    " + "; ".join(parts[i:i + 3]))
        err0 = [abs(c[0] / c[1] - 1) for cs in rows.values() for c in cs]
        err1 = [abs(c[0] / c[2] - 1) for cs in rows.values() for c in cs]
        print(f"    {len(err0)} cells: median / largest error {np.median(err0):.1%} / "
              f"{max(err0):.1%} without the last wave, {np.median(err1):.1%} / {max(err1):.1%} "
              "with it")


def main() -> None:
    what = sys.argv[1:] or ["sanity", "graph"]
    if what[0] == "points":
        points(*what[1:3])
        return
    if what[0] == "composition":
        composition(what[1])
        return
    if what[0] == "byrun":
        byrun(what[1])
        return
    if what[0] == "steadiness":
        for profile in what[1:]:
            steadiness(profile)
        return
    if what[0] == "gcpasses":
        gcpasses(*what[1:3])
        return
    optional_profile = {"speeds": speeds, "mixedsteps": mixedsteps, "ragged": ragged,
                        "holes": holes, "launches": launches,
                        "decodetail": decodetail, "tiles": tiles}  # each takes [MODEL/KEY]
    if what[0] in optional_profile:
        optional_profile[what[0]](*what[1:2])
        return
    commands = {"table": table, "sanity": sanity, "graph": graph, "finishes": finishes,
                "repeats": repeats, "cached": cached, "decode": decode, "firstuse": firstuse,
                "floor": floor, "eagerlaunch": eagerlaunch, "drafter": drafter,
                "stairs": stairs, "graphs": graphs,
                "idle": idle, "mixlen": mixlen, "specgraphs": specgraphs, "encoder": encoder,
                "kvstarts": kvstarts, "starts": starts, "pictures": pictures, "probe": probe,
                "drain": drain, "drainscan": drainscan, "newsizes": newsizes}
    unknown = [name for name in what if name not in commands]
    if unknown:
        sys.exit(f"calibration_analysis.py: no command {unknown[0]!r}; the commands: "
                 f"{', '.join(commands)}, points PROFILE [ONLY], composition PROFILE, "
                 "speeds [PROFILE], byrun PROFILE, steadiness PROFILE..., mixedsteps [PROFILE], "
                 "ragged [PROFILE], holes [PROFILE], launches [PROFILE], decodetail [PROFILE], "
                 "tiles [PROFILE]")
    for name in what:
        print(f"== {name}")
        commands[name]()


if __name__ == "__main__":
    main()
