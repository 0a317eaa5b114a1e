"""Raw runner output → shipped profiles: one folder per engine configuration.

A raw folder holds, per run `<model>--<key>[--u<NN>]`, the runner's `<run>.meta.json` and
(unless it only read KV capacity) `<run>.jsonl`, plus `rc.txt` (`<run> rc=.. s=..`: the
wall seconds each run held the GPU). Runs with the same model and key form one profile:
the 0.90 run gives the step samples, runs at other utilisations add measured KV points.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from capplan.analytic import analytic_profile
from capplan.calibrate import fit as F
from capplan.calibrate import scans, store
from capplan.errors import CalibrationError
from capplan.hardware import GPUS, Precision
from capplan.kvlayout import derive_layout, max_in_flight_tokens
from capplan.modelspec import load_model_spec
from capplan.profile import Box, DrafterHost, HostCore, Profile, StepModel
from capplan.steptime import StepTimer, cudagraph_capture_sizes

UTILS = (0.85, 0.90, 0.95)
LONE_SCAN = "lone-p"
"""The lone-prompt scan's points (calibration/_plans/h100/qwen3-32b--fp8--r8.json): prompts at
44 token counts, alone, which measure a row of tiles' holes (`gemm_holes_s`)."""
BASE_COEFS = ("fixed_s", "per_token_s", "knee_tokens", "prefill_attn_s", "decode_ctx_s",
              "per_seq_s", "prefill_step_s", "eager_step_s", "decode_window_s",
              "prefill_window_s", "eager_floor_s", "gemm_switch_s", "gemm_rows_s",
              "gemm_holes_s")
# Decode attention reads BF16 KV through the same FlashAttention-3 kernel whatever the
# weights' format, so a profile whose sweep never reached long decode contexts borrows
# the term from the same model's BF16 profile rather than extrapolating its own.
MIN_DECODE_CONTEXT = 2048
# A speculative sweep of fewer points than this cannot tell the drafter's first pass (over
# every scheduled token) from its later ones (over the requests): its decode points' tokens
# are (1 + k) x its requests, and its prefills are a few setup steps. Such a profile takes
# `draft_token_s` from the analytic model and says so.
MIN_DRAFT_POINTS = 8
# The step model's terms that price the CPU launching a step rather than the GPU running it
# (steptime.py): the floor under a graph-less step, a graph-less step's own cost and a
# piecewise step's (its attention launched layer by layer)
LAUNCH_COEFS = ("eager_floor_s", "eager_step_s", "prefill_step_s")
_NAME = re.compile(
    r"^(?P<model>[^-].*?)--(?P<key>[a-z0-9_-]+?)(?:--r(?P<r>\d+))?(?:--u(?P<u>\d+))?"
    r"(?P<img>--img)?(?P<cache>--cache)?(?P<graphs>--graphs)?(?P<core>--core)?(?P<mixlen>--mixlen)?"
    r"(?P<drain>--drain)?(?P<encoder>--encoder)?$")
_KEY = re.compile(r"^(?P<prec>bf16|fp8|nvfp4|awq)(?P<kv>-kvfp8)?(?:-(?P<m>[a-z_]+?)(?P<k>\d+))?$")


@dataclass
class Group:
    model: str
    key: str
    metas: list[dict[str, Any]] = field(default_factory=list)
    """Text-only engines (every engine of a model without images)."""
    image_metas: list[dict[str, Any]] = field(default_factory=list)
    """KV-only engines that kept the image-encoder reservation (`--img`)."""
    main: str | None = None
    repeats: list[str] = field(default_factory=list)
    """Further runs of the main engine (`<model>--<key>--r<N>`): their steps join the fit."""
    seconds: float = 0.0
    run_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds each of the profile's engines held the GPU, by run name (rc.txt)."""

    @property
    def parts(self) -> re.Match[str]:
        m = _KEY.match(self.key)
        if m is None:
            raise CalibrationError(f"cannot parse profile key {self.key!r}")
        return m


def _rc_seconds(raw: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, s in _rc_lines(raw):
        out[name] = out.get(name, 0.0) + s
    return out


def _rc_lines(raw: Path) -> list[tuple[str, float]]:
    """(run, seconds) of every line of rc.txt: a run resumed in a later call has one a call."""
    rc = raw / "rc.txt"
    out = []
    if rc.exists():
        for line in rc.read_text().splitlines():
            name, *kv = line.split()
            fields = dict(x.split("=", 1) for x in kv)
            out.append((name, float(fields.get("s", 0))))
    return out


def groups(raw: Path) -> dict[tuple[str, str], Group]:
    secs = _rc_seconds(raw)
    out: dict[tuple[str, str], Group] = {}
    for meta_path in sorted(raw.glob("*.meta.json")):
        name = meta_path.name.removesuffix(".meta.json")
        m = _NAME.match(name)
        if (m is None or m["cache"] or m["graphs"] or m["core"] or m["mixlen"]
                or m["drain"] or m["encoder"]):
            # not a run; or an engine with prefix caching on, a graph scan, a core scan, a
            # mixlen scan, a drain scan or an encoder scan (each read beside its profile's
            # fit, not fitted with it)
            continue
        meta = json.loads(meta_path.read_text())
        if "kv" not in meta:
            continue  # the engine never started: nothing measured
        g = out.setdefault((m["model"], m["key"]), Group(m["model"], m["key"]))
        g.seconds += secs.get(name, 0.0)
        g.run_seconds[name] = secs.get(name, 0.0)
        if m["r"] is not None:
            if store.runner_jsonl(raw, name) is not None:
                g.repeats.append(name)
            continue
        (g.image_metas if m["img"] else g.metas).append(meta)
        if m["u"] is None and not m["img"] and store.runner_jsonl(raw, name) is not None:
            g.main = name
    return out


def _spread_ms(values: list[float]) -> str:
    p10, p90 = np.percentile(values, [10, 90]) * 1e3
    return f"{p10:.1f} / {p90:.1f}"


def _quickest_passes(runs: list[pl.DataFrame]) -> pl.DataFrame:
    """Each encoder point's passes from the run whose median pass was quickest. A lone
    picture's pass ran either ~33 or ~70 ms, the same in all 12 passes of a point, from one
    run to the next (docs/calibration.md, "A picture's step"); the pass is what the encoder
    takes outside such a spell, and the spells are in the picture points' steps, which are
    priced beyond this pass (scans.picture_steps)."""
    if len(runs) == 1:
        return runs[0]
    tagged = pl.concat([r.with_columns(pl.lit(i).alias("_run")) for i, r in enumerate(runs)])
    best = (tagged.group_by("point", "_run").agg(pl.col("wall_s").median())
            .sort("wall_s").group_by("point").first().select("point", "_run"))
    return tagged.join(best, on=["point", "_run"]).drop("_run")


def encoder_time(raw: Path, g: Group) -> tuple[dict[str, Any] | None, str]:
    """The vision encoder's time (scans.encoder_scan), from the encoder scans of this
    profile's engine (`<model>--<key>--encoder`, and its repeats `<model>--<key>--rN--encoder`),
    else of any engine of the same model: vLLM 0.26.0 leaves Gemma 4's vision tower
    unquantized under FP8, AWQ and NVFP4 alike (gemma4_mm.py quantizes a tower only where its
    widths divide by 64, and 4,304 does not), so every precision runs the same BF16 encoder.
    Every run of the engine counts: the scan is fitted to each point's quickest run
    (`_quickest_passes`), and the picture points' steps of each run, against that run's own
    text twins and that pass, are pooled, the slow spells with them. None without
    a scan (the profile then takes the analytic figure, profiles.py `_with_encoder`)."""
    encoder_runs = sorted(p.name.removesuffix(".meta.json")
                   for p in raw.glob(f"{g.model}--*--encoder.meta.json")
                   if store.runner_jsonl(raw, p.name.removesuffix(".meta.json")))
    keys = sorted({m["key"] for r in encoder_runs if (m := _NAME.match(r))})

    def runs_of(key: str) -> list[str]:
        return [r for r in encoder_runs if (m := _NAME.match(r)) and m["key"] == key]

    # the engine's runs, else those of the first other engine of the model that has some
    runs = runs_of(g.key) or next((runs_of(k) for k in keys), [])
    if not runs:
        return None, ""
    paths = [store.runner_jsonl(raw, r) for r in runs]
    size = load_model_spec(g.model).image_tokens_per_image
    fitted = scans.encoder_scan(
        _quickest_passes([store.read_encoder_jsonl(p) for p in paths if p]))
    seconds = [_rc_seconds(raw).get(r) for r in runs]
    secs = sum(x for x in seconds if x) or None
    draws: list[float] = []
    points: list[dict[str, Any]] = []
    sequences: list[list[tuple[float, float]]] = []
    for run, path in zip(runs, paths, strict=True):
        assert path is not None
        try:  # the picture points' steps (scans from the nineteenth session on)
            pictures = scans.picture_steps(store.read_runner_jsonl(path), fitted)
        except CalibrationError:
            pictures = None
        if pictures:
            draws += pictures.draws_s
            points += [{"run": run, **p} for p in pictures.points]
            sequences.append(pictures.sequence)
    out = {"run": runs[0], "runs": runs, "encoder_token_s": fitted.token_s,
           "encoder_token2_s": fitted.token2_s, "encoder_floor_s": fitted.floor_s,
           "gpu_seconds": secs, "points": fitted.points}
    step_s = max(0.0, float(np.median(draws))) if draws else 0.0
    spells = ""
    if draws:
        above = scans.slow_above(draws)
        slow_s, fast_s = scans.spell_lengths(sequences, above)
        out |= {"encoder_step_s": step_s, "encoder_step_draws_s": sorted(draws),
                "picture_points": points}
        if slow_s:
            out |= {"encoder_slow_above_s": round(above, 5),
                    "encoder_slow_spell_s": round(slow_s, 4),
                    "encoder_fast_spell_s": round(fast_s, 4)}
            slow = sum(d > above for d in draws)
            spells = (f"; {slow} of them, past {above * 1e3:.1f} ms, in slow spells of "
                      f"{slow_s:.2f} s on average, between fast ones of {fast_s:.2f} s")
    note = (f"vision encoder {fitted.token_s * 1e6:.1f} us an image token + "
            f"{fitted.token2_s * 1e9:.1f} ns a token squared a picture, a pass at least "
            f"{fitted.floor_s * 1e3:.1f} ms ({fitted.pass_s(1, size) * 1e3:.1f} ms for one "
            f"picture of {size} image tokens, {fitted.pass_s(8, size) * 1e3 / 8:.1f} ms a "
            f"picture in eights)"
            + (f"; a step that encodes one {step_s * 1e3:.1f} ms more (median; "
               f"{_spread_ms(draws)} ms p10 / p90, drawn a step at a time from its "
               f"{len(draws)} steps{spells}), from its picture points against their text "
               "twins" if draws else "")
            + " from " + (runs[0] if len(runs) == 1 else
                          f"{', '.join(runs[:-1])} and {runs[-1]}")
            + (f" ({secs / 60:.1f} GPU-minutes more, engine start included)" if secs else ""))
    return out, note


def _samples(raw: Path, g: Group) -> pl.DataFrame:
    """The main run's step records, then each repeat's, numbered by `run` (1: main). Every
    run of an engine counts: CPU-bound steps of the same composition ran 30-50 % apart from
    one run to the next (docs/calibration.md, "The engine does not repeat itself"), and a fit
    to one run would take that run's luck for the engine's."""
    frames = []
    for i, name in enumerate([g.main, *g.repeats], 1):
        path = store.runner_jsonl(raw, name) if name else None
        assert path is not None
        frames.append(store.read_runner_jsonl(path).with_columns(pl.lit(i).alias("run")))
    return pl.concat(frames, how="diagonal_relaxed")


def image_reservation(text: list[dict[str, Any]], images: list[dict[str, Any]], *,
                      blocks: bool = False) -> float | None:
    """KV tokens the image-encoder reservation costs: a text-only engine's capacity minus
    that of an engine with images at the same utilisation (vLLM profiles the encoder's
    peak memory, gpu_model_runner.py profile_run, and takes it from KV); None without one.
    In the unit of the profile's token line (store.kv_tokens: vLLM's "GPU KV cache size"),
    or with `blocks=True` in pool blocks (num_gpu_blocks).
    An engine with images that carries `paired_text_kv` (the text-only engine started on
    the same host in the same session) is compared with that one: KV capacity moves by up
    to 0.4 % between hosts (Qwen3-32B FP8: 23,530 and 23,614 blocks), far more than the
    reservation itself."""
    of = store.pool_blocks if blocks else store.kv_tokens
    by_util = {round(m["kv"]["gpu_memory_utilization"], 4): of(m["kv"]) for m in text}
    diffs = []
    for m in images:
        if "paired_text_kv" in m:
            base = of(m["paired_text_kv"]["kv"])
        elif (u := round(m["kv"]["gpu_memory_utilization"], 4)) in by_util:
            base = by_util[u]
        else:
            continue
        diffs.append(base - of(m["kv"]))
    return float(max(diffs[0], 0)) if diffs else None


def pool_capacity(model: str, kv_meta: dict[str, Any], eng: dict[str, Any], kv_dtype: str,
                  points: list[dict[str, float]]) -> dict[str, Any]:
    """A sliding-window model's KV pool: its layout derived from the model spec
    (kvlayout.py), checked against what the engine measured (groups, bytes per block and
    vLLM's "GPU KV cache size"), and the line through the measured blocks."""
    spec = load_model_spec(model)
    layout = derive_layout(spec, block_size=int(kv_meta["block_size"]),
                           kv_dtype_bytes=1 if kv_dtype == "fp8" else 2)
    blocks = store.pool_blocks(kv_meta)
    per_block = kv_meta["kv_tensor_bytes"] / blocks
    in_flight = max_in_flight_tokens(eng["max_num_batched_tokens"], eng["async_scheduling"])
    checks = [
        ("KV cache groups", layout.num_groups, kv_meta["kv_cache_groups"]),
        ("bytes per block", layout.block_bytes, per_block),
    ]
    if kv_meta.get("vllm_kv_tokens"):
        checks.append(("GPU KV cache size",
                       layout.vllm_kv_tokens(blocks, eng["max_model_len"], in_flight),
                       kv_meta["vllm_kv_tokens"]))
    for what, derived, measured in checks:
        if derived != measured:
            raise CalibrationError(f"{model}: the KV layout derived from the model spec gives "
                                   f"{what} {derived}, the engine measured {measured}")
    u = np.array([p["gpu_memory_utilization"] for p in points], dtype=float)
    b = np.array([p["blocks"] for p in points], dtype=float)
    slope, offset = np.polyfit(u, b, 1)
    return {"layout": layout, "slope_blocks": round(float(slope), 2),
            "intercept_blocks": round(float(-offset), 2)}


def _box(df: pl.DataFrame) -> Box:
    return Box(max_tokens=int(df["tokens"].max()),  # type: ignore[arg-type]
               max_seqs=int(df["seqs"].max()),  # type: ignore[arg-type]
               max_context_tokens=int(df["max_ctx"].max()))  # type: ignore[arg-type]


def _max_decode_context(df: pl.DataFrame) -> float:
    dec = df.filter(pl.col("decode_seqs") > 0)
    if dec.is_empty():
        return 0.0
    return float((dec["decode_ctx"] / dec["decode_seqs"]).max())  # type: ignore[arg-type]


def _plan_file(name: str | None, raw: Path) -> Path | None:
    """The sweep plan an engine ran: the runner records its path as given, absolute or
    relative to the repository root (`calibration/_plans/...`, two levels above `_raw`)."""
    if not name:
        return None
    for path in (Path(name), raw.resolve().parent.parent / name):
        if path.is_file():
            return path
    return None


def _context_kv_bytes(model: str, kv_meta: dict[str, Any], kv_dtype: str) -> tuple[float, float]:
    """KV bytes a decode reads per token of its context, (full-attention layers, sliding
    layers within their window): every layer's in the first with one KV cache group; with
    sliding-window groups each kind's, from the model spec (steptime.py: a term per kind)."""
    if kv_meta.get("kv_cache_groups", 1) <= 1:
        return float(kv_meta["kv_tensor_bytes"]) / float(kv_meta["kv_tokens"]), 0.0
    spec = load_model_spec(model)
    full = spec.num_layers - spec.sliding_window_layers
    dim = spec.global_head_dim or spec.head_dim
    heads = spec.num_global_kv_heads or spec.num_kv_heads
    per = 2 * (1 if kv_dtype == "fp8" else 2)
    return (float(full * heads * dim * per),
            float(spec.sliding_window_layers * spec.num_kv_heads * spec.head_dim * per))


def core_launch(raw: Path, model: str) -> dict[str, Any] | None:
    """The serving engine core's measured time a step for `model`
    (`raw/core-launch/<model>.json`, written by scripts/core_launch.py from a validation
    engine's core trace, validate/corelaunch.py): every profile of the model takes it, as
    the host's and vLLM's, not the precision's (Llama-3.1-8B's BF16 and FP8 engines on one
    host: 2.28 and 2.02 ms a decode step, 8.3 and 8.1 ms a piecewise one). None if absent."""
    return _json_or_none(raw / "core-launch" / f"{model}.json")


def core_eager(raw: Path, model: str) -> dict[str, Any] | None:
    """The serving core's own time on a step past the largest CUDA graph for `model`, its
    spread and drift (`raw/core-launch/eager/<model>.json`, written by scripts/core_launch.py
    from the model's traced serving engines on this GPU, validate/corelaunch.py lone_eager):
    every profile of the model takes it, as `core_launch`'s. None if absent."""
    return _json_or_none(raw / "core-launch" / "eager" / f"{model}.json")


def core_drafter(raw: Path, model: str) -> dict[str, Any] | None:
    """A draft model's pass a step on the serving engine's core at concurrency 1, the median
    over the model's traced draft-model engines on this GPU (`raw/core-launch/drafter/
    <model>.json`, written by scripts/core_launch.py): each draft-model profile of the
    model prices its drafter at it (StepModel.draft_serving_scale). None if absent."""
    return _json_or_none(raw / "core-launch" / "drafter" / f"{model}.json")


def _json_or_none(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    out: dict[str, Any] = json.loads(path.read_text())
    return out


def calibration_core(df: pl.DataFrame, eng: dict[str, Any]) -> dict[str, Any] | None:
    """The engine core's own time a step as the calibration engine measured it (runner.py:
    scheduling + `cpu_launch_s` + `cpu_update_s`, what the serving core's loop spends on a
    step, vllm/v1/engine/core.py step_with_batch_queue), summarised as the serving traces
    are (validate/corelaunch.summary): the median decode-only step ("graph"), and the median
    step with a prefill chunk within the largest CUDA graph ("piecewise"). None when the run
    did not record it (runners before the fourteenth session) or has neither kind."""
    from capplan.validate.corelaunch import summary  # polars + numpy only

    if "cpu_launch_s" not in df.columns:
        return None
    x = df.filter(~pl.col("warmup") & pl.col("cpu_launch_s").is_not_null()
                  & pl.col("cpu_update_s").is_not_null())
    if x.is_empty():
        return None
    largest = cudagraph_capture_sizes(eng["max_num_seqs"], eng["max_num_batched_tokens"])[-1]
    x = x.with_columns(
        core_s=pl.col("t_sched1") - pl.col("t_sched0") + pl.col("cpu_launch_s")
        + pl.col("cpu_update_s"),
        kind=pl.when(pl.col("prefill_seqs") == 0).then(pl.lit("graph"))
        .when(pl.col("tokens") <= largest).then(pl.lit("piecewise"))
        .otherwise(pl.lit("eager")))
    out = summary(x)
    if "core_graph_s" not in out or "core_piecewise_s" not in out:
        return None
    return out


def core_time(raw: Path, g: Group, df: pl.DataFrame,
              eng: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The engine core's own time a step for the profile, and the provenance note: the
    model's serving core trace (`core_launch`), else what this engine's calibration measured
    (its own run, else its core scan `<model>--<key>--core`; `calibration_core`), recorded
    beside the serving figures when both exist. The calibration engine runs in-process,
    without the serving core's input and output threads: on one host it measured 0.77x and
    0.64x of Llama-3.1-8B's serving figures (docs/calibration.md, "The engine core's own time
    a step")."""
    timed, timed_run = calibration_core(df, eng), g.main
    if timed is not None:  # named by the runs that recorded it (runners since 64a61b4)
        # and hold steps of either kind (a lone-prompt scan's are all past the largest graph)
        names = [g.main, *g.repeats]
        largest = cudagraph_capture_sizes(eng["max_num_seqs"], eng["max_num_batched_tokens"])[-1]
        recorded = df.filter(pl.col("cpu_launch_s").is_not_null() & ~pl.col("warmup")
                             & (pl.col("tokens") <= largest))["run"].unique().sort()
        timed_run = ", ".join(names[i - 1] for i in recorded)
    scan = f"{g.model}--{g.key}--core"
    scan_path = store.runner_jsonl(raw, scan)
    if timed is None and scan_path is not None:
        timed, timed_run = calibration_core(store.read_runner_jsonl(scan_path), eng), scan
    if timed is not None:
        timed["run"] = timed_run
    served = core_launch(raw, g.model)
    if served is not None:
        note = (f"core_graph_s {served['core_graph_s'] * 1e3:.2f} ms and core_piecewise_s "
                f"{served['core_piecewise_s'] * 1e3:.2f} ms: the serving engine core's own "
                f"time a step, from the core trace of {served['engine']} "
                f"(core-launch/{g.model}.json)")
        return ({**served, "calibration": timed} if timed is not None else served), note
    if timed is not None:
        return timed, (f"core_graph_s {timed['core_graph_s'] * 1e3:.2f} ms and core_piecewise_s "
                       f"{timed['core_piecewise_s'] * 1e3:.2f} ms: the engine core's own time a "
                       f"step as the in-process calibration engine measured it ({timed_run}; "
                       "no serving core trace of this model)")
    return None, ""


def _lone_floors(df: pl.DataFrame, voting: list[int], runs: int, fixed: dict[str, float],
                 fit_args: dict[str, Any]) -> str:
    """The provenance note's words on the lone-prompt scans' runs left out of the launch
    terms' vote, with the floor each would have brought."""
    lone = [i for i in range(1, runs + 1) if i not in voting]
    if not lone:
        return ""
    own = [F.fit_step_model(store.samples_of(df.filter(pl.col("run") == i)),
                            fixed={k: v for k, v in fixed.items() if k not in LAUNCH_COEFS},
                            **fit_args).step.eager_floor_s for i in lone]
    return ("; the lone-prompt scans' runs not among them (eager_floor_s "
            + ", ".join(f"{f * 1e3:.2f}" for f in own) + " ms)")


def _fixed_terms(g: Group, df: pl.DataFrame, meta: dict[str, Any],
                 done: dict[tuple[str, str], Profile], gpu: str
                 ) -> tuple[dict[str, float], list[str], list[str]]:
    """The terms a profile takes as given rather than fitting: a speculative profile's
    base terms from its precision's, the tile terms its kernels lack, a short sweep's
    context rate from BF16's. Returns them, the provenance's notes on them and the
    terms taken from the analytic profile."""
    parts = g.parts
    prec, method, k = parts["prec"], parts["m"], int(parts["k"] or 0)
    fixed: dict[str, float] = {}
    notes: list[str] = []
    analytic_terms: list[str] = []
    base = done.get((g.model, "bf16"))
    if k:
        own = done.get((g.model, prec))
        if own is None:
            raise CalibrationError(f"{g.model}/{g.key}: fit {prec} without spec decode first")
        fixed = {c: getattr(own.step, c) for c in BASE_COEFS}
        notes.append(f"base terms fixed from {g.model}/{prec}; only draft terms fitted")
        points = df.filter(~pl.col("warmup"))["point"].n_unique()
        if points < MIN_DRAFT_POINTS:
            draft = meta["args"].get("spec_model")
            ana = analytic_profile(load_model_spec(g.model), GPUS[gpu], Precision(prec),
                                   spec_method=method, spec_k=k,
                                   draft=load_model_spec(Path(draft).name)
                                   if draft else None)
            fixed["draft_token_s"] = ana.step.draft_token_s
            analytic_terms.append("draft_token_s")
            notes.append(f"draft_token_s analytic ({ana.step.draft_token_s:.3g} s a token): "
                         f"{points} sweep points cannot separate the drafter's first pass "
                         "from its later ones")
    else:
        if prec == "bf16":
            # cuBLAS's BF16 GEMMs have no tile stairs to fit (steptime.py, module docstring)
            fixed.update(gemm_switch_s=0.0, gemm_rows_s=0.0, gemm_holes_s=0.0)
        elif prec != "fp8":
            # the 4-bit kernels (Machete, Marlin) cost a whole row of tiles however empty
            # its last is (steptime.py, module docstring)
            fixed["gemm_holes_s"] = 0.0
        elif not df["point"].str.starts_with(LONE_SCAN).any():
            # the sweep's graph-less steps alone do not tell a row's holes from the floor
            # under the small ones (eager_floor_s): fitted on them, the term takes the floor's
            # place (docs/calibration.md, "A row's holes")
            fixed["gemm_holes_s"] = 0.0
            notes.append("gemm_holes_s 0: no lone-prompt scan among the runs")
        if _max_decode_context(df) < MIN_DECODE_CONTEXT and base is not None:
            fixed["decode_ctx_s"] = base.step.decode_ctx_s
            notes.append(f"decode_ctx_s from {g.model}/bf16 (sweep reached decode context "
                         f"{_max_decode_context(df):.0f} < {MIN_DECODE_CONTEXT})")
    return fixed, notes, analytic_terms


def _coverage(g: Group, raw: Path, meta: dict[str, Any], df: pl.DataFrame
              ) -> tuple[list[str], list[str]]:
    """The points planned for every run of the engine, and a note where the sweep is
    incomplete."""
    notes: list[str] = []
    # the points every run of this engine was sent (a repeat's plan may hold points the
    # main run's has not), so that "measured of planned" counts the same points; the runner
    # skips a point whose KV tokens pass 0.9 of the engine's cache (runner.py, main): such a
    # point is beyond this engine, not left undone
    planned: list[str] = []
    beyond_kv: set[str] = set()
    for run_meta in [meta, *(json.loads((raw / f"{n}.meta.json").read_text())
                             for n in g.repeats)]:
        plan = _plan_file(run_meta.get("args", {}).get("plan"), raw)
        if plan is not None:
            cap = run_meta["kv"]["kv_tokens"]
            for q in json.loads(plan.read_text())["points"]:
                if q.get("warmup"):
                    continue
                if q["id"] not in planned:
                    planned.append(q["id"])
                if q.get("kv_tokens", 0) > 0.9 * cap:
                    beyond_kv.add(q["id"])
    if planned:
        measured = set(df["point"].to_list())
        left = [q for q in planned if q not in measured]
        if left:
            big = [q for q in left if q in beyond_kv]
            undone = [q for q in left if q not in beyond_kv]
            why = []
            if big:
                why.append(f"{', '.join(big)} need{'s' if len(big) == 1 else ''} more KV "
                           "than the engine holds")
            if undone:
                why.append(f"the runner stopped before {undone[0]}")
            notes.append(f"sweep incomplete: {len(planned) - len(left)} of {len(planned)} "
                         f"points measured; {' and '.join(why)}")
    return planned, notes


def _graph_terms(g: Group, raw: Path, s: F.Samples, step: StepModel, *, sizes: list[int],
                 floors: dict[str, float], window: int, eng: dict[str, Any], kv_dtype: str,
                 gpu: str) -> tuple[StepModel, dict[str, Any] | None, list[str]]:
    """The decode-only steps' terms from the engine's graph scan, where it has one: each
    CUDA-graph size's offset and the context rate (scans.graph_scan), then
    FlashAttention's last wave (scans.tile_rho). Returns the step model with them, the
    scan's points for the provenance and the notes."""
    k = int(g.parts["k"] or 0)
    notes: list[str] = []
    graph_run = f"{g.model}--{g.key}--graphs"
    graph_path = store.runner_jsonl(raw, graph_run)
    graphs: dict[str, Any] | None = None  # the points behind graph_offset_s, for provenance
    if graph_path is not None:
        scan = store.samples_of(store.read_runner_jsonl(graph_path))
        fitted = scans.graph_scan(scan, step, sizes, floors.get("decode_ctx_s", 0.0), window,
                              floors.get("decode_window_s", 0.0), spec_k=k)
        slow = scans.graph_scan_slow_stretches(fitted.points) if fitted is not None else []
        if len(slow) > scans.GRAPH_SCAN_MAX_STRETCHES:
            notes.append(f"graph scan {graph_run} not used: {len(slow)} stretches of "
                         f"sizes ({', '.join(slow)}) took {scans.GRAPH_SCAN_SPIKE:.2f}x or more "
                         "of the sizes' step on both sides, the engine running at two speeds; "
                         "decode-only steps keep the linear terms")
            fitted = None
        if fitted is not None:
            step = step.model_copy(update={"graph_offset_s": fitted.offsets,
                                           "graph_ctx_s": fitted.ctx_s,
                                           "graph_window_s": fitted.window_ctx_s})
            scan_meta = json.loads((raw / f"{graph_run}.meta.json").read_text())
            graphs = {"run": graph_run, "gpu_seconds": _rc_seconds(raw).get(graph_run),
                      "runner_commit": scan_meta.get("runner_commit"),
                      "started": datetime.fromtimestamp(scan_meta["started_unix"], UTC)
                      .isoformat(timespec="seconds"),
                      "points": fitted.points}
            # a scan its time budget cut short leaves its last sizes to the linear terms
            # (profile.graph_offset: 0 outside the sizes scanned); the provenance names them
            missed = [z for z in sizes if z // (1 + k) <= eng["max_num_seqs"]
                      and z not in fitted.offsets]
            if missed:
                graphs["sizes_not_reached"] = missed
            span = [v * 1e3 for v in fitted.offsets.values()]
            secs = graphs["gpu_seconds"]
            notes.append(f"graph_offset_s at {len(span)} CUDA-graph sizes "
                         f"({min(span):+.2f} to {max(span):+.2f} ms) and "
                         + (f"graph_window_s {fitted.window_ctx_s * 1e9:.1f} ns"
                            if fitted.window_ctx_s else
                            f"graph_ctx_s {fitted.ctx_s * 1e9:.1f} ns")
                         + f" a token from {graph_run}"
                         + (f" ({secs / 60:.1f} GPU-minutes more, engine start included)"
                            if secs else "")
                         + (f"; size{'s' if len(missed) > 1 else ''} "
                            f"{', '.join(map(str, missed))} not reached before the scan's "
                            "budget ran out, priced by the linear terms" if missed else ""))
    if graphs is not None and not k and kv_dtype == "auto" and not window:
        # FlashAttention's last wave on a decode-only step (tiles.py): 16-bit KV's tiles,
        # one token a sequence, full attention only (the cases its rule was measured on)
        heads = load_model_spec(g.model).num_kv_heads
        tiles = scans.tile_rho(s, step, sizes, k, heads, GPUS[gpu].sms)
        if tiles is not None:
            step = step.model_copy(update={"tile_rho": tiles.rho, "tile_kv_heads": heads,
                                           "tile_sms": GPUS[gpu].sms})
            notes.append(f"tile_rho {tiles.rho:.1f}: FlashAttention's last wave on a "
                         f"decode-only step ({heads} KV heads, {GPUS[gpu].sms} SMs), fitted on "
                         f"{tiles.cells} decode-only cells, their RMS error "
                         f"{tiles.rms_without_s * 1e3:.3f} ms without it, "
                         f"{tiles.rms_with_s * 1e3:.3f} ms with it")
    return step, graphs, notes


def _heldout_figures(s: F.Samples, step: StepModel, res: F.FitResult, *, eng: dict[str, Any],
                     k: int, seed: int, window: int, fixed: dict[str, float],
                     floors: dict[str, float]) -> dict[str, Any]:
    """The fit's figures for the provenance: the held-out error of the profile as shipped
    (all units, and split into a point's designed steps and its drain), single steps,
    5-fold and leave-one-point-out cross-validation, and what was fixed."""
    shipped = F.heldout_ape(s, step, max_num_seqs=eng["max_num_seqs"],
                            max_num_batched_tokens=eng["max_num_batched_tokens"], spec_k=k,
                            seed=seed, window=window)
    drained = F.heldout_in_drain(s, seed=seed)
    designed, drain = shipped[~drained], shipped[drained]
    return {"heldout_shipped_median_ape": round(float(np.median(shipped)), 5),
            "heldout_shipped_p95_ape": round(float(np.percentile(shipped, 95)), 5),
            "unit": ("one engine step, timed by the GPU's own stamps"
                     if F.unit_width(s) == 1 else
                     f"window of {F.WINDOW} consecutive engine steps (CPU stamps)"),
            "single_step_median_ape": round(float(np.median(res.single_step_ape)), 5),
            "single_step_p95_ape": round(float(np.percentile(res.single_step_ape, 95)), 5),
            "cv5_windows": len(res.cv_ape),
            "cv5_median_ape": round(float(np.median(res.cv_ape)), 5),
            "cv5_p95_ape": round(float(np.percentile(res.cv_ape, 95)), 5),
            "point_cv_points": len(res.point_ape),
            "point_cv_median_ape": (round(float(np.median(res.point_ape)), 5)
                                    if len(res.point_ape) else None),
            "point_cv_p95_ape": (round(float(np.percentile(res.point_ape, 95)), 5)
                                 if len(res.point_ape) else None),
            # the same held-out units, split: a point's designed steps and its drain
            # (fit.drain_steps, docs/calibration.md "A point's drain")
            "designed_units": len(designed),
            "designed_shipped_median_ape": (round(float(np.median(designed)), 5)
                                            if len(designed) else None),
            "designed_shipped_p95_ape": (round(float(np.percentile(designed, 95)), 5)
                                         if len(designed) else None),
            "drain_units": len(drain),
            "drain_shipped_median_ape": (round(float(np.median(drain)), 5)
                                         if len(drain) else None),
            "drain_shipped_p95_ape": (round(float(np.percentile(drain, 95)), 5)
                                      if len(drain) else None),
            "trimmed_train_windows": res.trimmed, "seed": seed, "floors": floors,
            "fixed_coefficients": fixed}


def build_profile(g: Group, raw: Path, done: dict[tuple[str, str], Profile], *,
                  gpu: str, git_commit: str, seed: int = 0) -> tuple[Profile, dict[str, Any],
                                                                      pl.DataFrame]:
    """Fit one profile; `done` holds profiles built before it (BF16 bases come first)."""
    if g.main is None:
        raise CalibrationError(f"{g.model}/{g.key}: no step samples, only KV capacity")
    parts = g.parts
    prec, kv_dtype = parts["prec"], "fp8" if parts["kv"] else "auto"
    method, k = parts["m"], int(parts["k"] or 0)
    meta = next(m for m in g.metas if m["args"]["gpu_memory_utilization"] == 0.90)
    eng = meta["engine"]
    df = _samples(raw, g)
    s = store.samples_of(df)
    fixed, notes, analytic_terms = _fixed_terms(g, df, meta, done, gpu)
    planned, more = _coverage(g, raw, meta, df)
    notes += more
    if meta.get("points_hung"):
        notes.append(f"vLLM hung in {', '.join(meta['points_hung'])} (the runner's watchdog "
                     "ended the run; the point is left out)")
    kv_meta = meta["kv"]
    kv_bytes = round(kv_meta["kv_tensor_bytes"] / store.kv_tokens(kv_meta))
    pooled = kv_meta.get("kv_cache_groups", 1) > 1
    kvs = store.kv_points(g.metas, UTILS, with_blocks=pooled)
    kv = F.fit_kv_capacity(kvs, bytes_per_token=kv_bytes)
    if pooled:
        kv = kv.model_copy(update=pool_capacity(g.model, kv_meta, eng, kv_dtype, kvs))
    # a sliding-window model gets a term per attention kind (steptime.py)
    window = 0
    if kv.layout is not None and kv.layout.hybrid:
        window = kv.layout.sliding_window
        s = store.samples_of(df, window_tokens=window)
    full_bytes, window_bytes = _context_kv_bytes(g.model, kv_meta, kv_dtype)
    floors = F.physical_floors(full_bytes, GPUS[gpu].hbm_bytes_per_s, window_bytes)
    fit_args = {"max_num_seqs": eng["max_num_seqs"],
                "max_num_batched_tokens": eng["max_num_batched_tokens"], "spec_k": k,
                "seed": seed, "floors": floors, "window": window}
    launch = [c for c in LAUNCH_COEFS if c not in fixed]
    # A lone-prompt scan (every point `lone-p*`: one prompt a step on an idle engine) has no
    # launch terms of a working engine to give: its floor is an idle engine's first step
    # after a pause (33.3 ms on the H200's Llama-3.1-8B BF16 scan against 24.7 and 16.0 on
    # the sweeps), which the serving model prices apart (core_eager_s); its steps join the
    # joint fit below all the same.
    voting = [i for i in range(1, len(g.repeats) + 2)
              if not df.filter((pl.col("run") == i) & ~pl.col("warmup"))["point"]
              .str.starts_with(LONE_SCAN).all()]
    if len(voting) > 1 and launch:
        # The terms that price the CPU's launches: a calibration run's in-process engine
        # launches faster than a serving engine does (0.64-0.87x of its core time,
        # core_time above), by as much as its run's luck (30-50 % apart run to run): of the
        # runs' own fits, the slowest is the nearest to serving's; the other terms are
        # fitted on every run's steps with them (docs/calibration.md, "Repeat runs and the
        # CPU's launches").
        per_run = [F.fit_step_model(store.samples_of(df.filter(pl.col("run") == i)),
                                    fixed=fixed, **fit_args).step
                   for i in voting]
        # (only where every run alone finds a floor: one that does not prices its graph-less
        # steps by eager_step_s instead, and its terms do not compare; the joint fit stays)
        if min(r.eager_floor_s for r in per_run) > 0:
            fixed = {**fixed, **{c: max(getattr(r, c) for r in per_run) for c in launch}}
            notes.append("the CPU's launch terms the slowest of the runs' own (" + "; ".join(
                f"{c} " + ", ".join(f"{getattr(r, c) * 1e3:.2f}" for r in per_run) + " ms"
                for c in launch) + ")" + _lone_floors(df, voting, len(g.repeats) + 1, fixed,
                                                     fit_args))
    res = F.fit_step_model(s, fixed=fixed, **fit_args)
    # the CUDA-graph sizes every term below prices by
    sizes = cudagraph_capture_sizes(eng["max_num_seqs"], eng["max_num_batched_tokens"], k)
    if "prefill_attn_s" not in fixed and not window:
        # the attention rate from the steps where attention weighs, the rest fitted with it
        # (fit.attention_rate; docs/calibration.md, "The attention rate")
        attn = F.attention_rate(s, res.step, sizes, k, seed=seed)
        if attn is not None:
            fixed = {**fixed, "prefill_attn_s": attn.rate}
            res = F.fit_step_model(s, fixed=fixed, **fit_args)
            notes.append(f"prefill_attn_s {attn.rate * 1e10:.2f}e-10 s a pair from the "
                         f"{attn.steps} steps whose prompt attention is at least "
                         f"{F.ATTN_MIN_SHARE:.0%} of the joint fit's price (the joint fit's "
                         f"{attn.joint * 1e10:.2f}e-10), the other terms fitted with it")
    step = res.step
    cache_run = f"{g.model}--{g.key}--cache"
    cache_path = store.runner_jsonl(raw, cache_run)
    shared: dict[str, Any] | None = None  # the pairs behind shared_ctx_saving, for provenance
    if k:
        # a drafter changes nothing in how the target reads its KV
        base_step = done[(g.model, prec)].step
        step = step.model_copy(update={"shared_ctx_saving": base_step.shared_ctx_saving})
    elif cache_path is not None:
        cached = store.read_runner_jsonl(cache_path).filter(~pl.col("warmup"))
        saving, pairs = F.shared_ctx_saving(store.samples_of(cached), step.decode_ctx_s)
        if pairs:
            step = step.model_copy(update={"shared_ctx_saving": saving})
            shared = {"run": cache_run, "pairs": pairs}
            notes.append(f"shared_ctx_saving {saving:.0%}: the median of {len(pairs)} "
                         f"shared-prefix decode points against their unshared twins "
                         f"({cache_run})")
    step, graphs, more = _graph_terms(g, raw, s, step, sizes=sizes, floors=floors,
                                      window=window, eng=eng, kv_dtype=kv_dtype,
                                      gpu=gpu)
    notes += more
    encoder, note = encoder_time(raw, g)
    if encoder is not None:
        step = step.model_copy(update={k: encoder[k] for k in (
            "encoder_token_s", "encoder_token2_s", "encoder_floor_s", "encoder_step_s",
            "encoder_step_draws_s", "encoder_slow_above_s", "encoder_slow_spell_s",
            "encoder_fast_spell_s") if k in encoder})
        notes.append(note)
    core, note = core_time(raw, g, df, eng)
    if core is not None:
        step = step.model_copy(update={"core_graph_s": core["core_graph_s"],
                                       "core_piecewise_s": core["core_piecewise_s"]})
        if "spread" in core:  # a serving trace's: how the core's time varies step to step
            step = step.model_copy(update={
                "core_graph_sigma": core["spread"]["graph"],
                "core_piecewise_sigma": core["spread"]["piecewise"],
                "eager_sigma": core["spread"]["eager"]})
        notes.append(note)
    eager = core_eager(raw, g.model)
    if eager is not None:
        step = step.model_copy(update={k: eager[k] for k in ("core_eager_s", "eager_sigma")} | {
            "eager_gpu_s": eager["gpu_eager_s"].get(prec, 0.0)})
        notes.append(f"core_eager_s {eager['core_eager_s'] * 1e3:.1f} ms (sigma "
                     f"{eager['eager_sigma']}): the serving engine "
                     "core's own time on a step past the largest CUDA graph after a "
                     "decode-only one, the median over "
                     + ", ".join(e["engine"] for e in eager["engines"])
                     + f" (core-launch/eager/{g.model}.json)"
                     + (f"; eager_gpu_s {eager['gpu_eager_s'][prec] * 1e3:.1f} ms, the GPU's "
                        f"span of those steps in the {prec} engines"
                        if prec in eager["gpu_eager_s"] else ""))
    if prec == "fp8" and not k and df["point"].str.starts_with(LONE_SCAN).any():
        # what the rows leave at the counts the lone-prompt scan timed (fit.eager_offsets:
        # 2,032-2,048 tokens ran 5-10 % under the terms on both FP8 models the H100 scanned)
        lone = (np.char.startswith(np.asarray(s["point"]).astype(str), LONE_SCAN)
                & (s["decode_seqs"] == 0))
        offsets = F.eager_offsets(s, step, sizes, lone=lone, seed=seed,
                                  above_s=max(step.eager_floor_s, step.eager_gpu_s))
        if offsets:
            step = step.model_copy(update={"eager_offset_s": offsets})
            span = [v * 1e3 for v in offsets.values()]
            notes.append(f"eager_offset_s at {len(offsets)} lone-prompt counts "
                         f"({min(offsets)}-{max(offsets)} tokens, {min(span):+.2f} to "
                         f"{max(span):+.2f} ms): the scan's steps less the terms' price "
                         "where the last row of tiles is full and attention a small share")
    reserved = image_reservation(g.metas, g.image_metas)
    if reserved is not None:
        kv = kv.model_copy(update={"image_reservation_tokens": reserved})
        notes.append(f"image-encoder reservation {reserved:,.0f} KV tokens (measured at "
                     "the same utilisation with and without images)")
        if pooled:
            blocks = image_reservation(g.metas, g.image_metas, blocks=True)
            kv = kv.model_copy(update={"image_reservation_blocks": blocks})
    derived = [p["gpu_memory_utilization"] for p in kvs if p["derived"]]
    if derived:
        notes.append("KV at util " + ", ".join(f"{u:.2f}" for u in derived)
                     + " derived from vLLM's memory profile of the 0.90 engine")
    extra = {
        "fit": _heldout_figures(s, step, res, eng=eng, k=k, seed=seed, window=window,
                                fixed=fixed, floors=floors),
        "points_measured": sorted(set(df["point"].to_list())),
        "points_planned": len(planned) or None,
        "points_skipped": meta.get("points_skipped", []),
        "points_hung": meta.get("points_hung", []),
        "kv_points": kvs,
    }
    if shared is not None:
        extra["shared_ctx"] = shared
    if core is not None:
        extra["core_launch"] = core
    if eager is not None:
        extra["core_eager"] = eager
    if graphs is not None:
        extra["graph_scan"] = graphs
    if encoder is not None:
        extra["encoder_scan"] = encoder
    if g.repeats:
        extra["repeat_runs"] = [{"run": i, "name": name, "steps": int((df["run"] == i).sum())}
                                for i, name in enumerate(g.repeats, 2)]
        notes.append(f"steps of {1 + len(g.repeats)} runs of this engine fitted together "
                     f"(run 1: {g.main}; " + ", ".join(
                         f"run {i}: {n}" for i, n in enumerate(g.repeats, 2)) + ")")
    # the commit of the runner that measured this run: its own record when the run has one
    # (a later runner than the folder's), else the folder's RUNNER_COMMIT
    runner_commit = raw / "RUNNER_COMMIT"
    if "runner_commit" in meta:
        extra["runner_commit"] = meta["runner_commit"]
    elif runner_commit.exists():
        extra["runner_commit"] = runner_commit.read_text().strip()
    if "extra_packages" in meta:
        extra["extra_packages"] = meta["extra_packages"]
    # the budget is per engine run: the timed run alone (engine start included),
    # beside the total of every engine the profile draws on (gpu_minutes)
    if g.main is not None and g.run_seconds.get(g.main):
        extra["main_run_gpu_minutes"] = round(g.run_seconds[g.main] / 60, 2)
        extra["main_run_calls"] = sum(1 for n, _ in _rc_lines(raw) if n == g.main)
    extra["gpu_minutes_by_run"] = {n: round(x / 60, 2) for n, x in sorted(g.run_seconds.items())}
    prov = store.provenance(meta, git_commit=git_commit, gpu_seconds=g.seconds,
                            note="; ".join(notes), extra=extra)
    profile = Profile(
        gpu=gpu, model=g.model, precision=prec, kv_cache_dtype=kv_dtype,
        spec_method=method, spec_k=k, vllm_version=str(meta["versions"].get("vllm")),
        step=step, kv=kv, box=_box(df),
        fit=res.quality.model_copy(update={
            "shipped_median_ape": extra["fit"]["heldout_shipped_median_ape"],
            "shipped_p95_ape": extra["fit"]["heldout_shipped_p95_ape"]}),
        provenance={"source": "measured", "note": prov["note"],
                    "gpu_minutes": prov["gpu_minutes"], "git_commit": git_commit,
                    "runner_commit": extra.get("runner_commit"), "date": prov["date"],
                    "analytic_terms": tuple(analytic_terms)},
        engine={k2: eng[k2] for k2 in ("max_num_seqs", "max_num_batched_tokens",
                                       "gpu_memory_utilization", "max_model_len",
                                       "block_size", "async_scheduling", "cudagraph_mode",
                                       "enable_prefix_caching", "kv_cache_dtype",
                                       "quantization")},
        hosts=_hosts(eager),
    )
    drafter = core_drafter(raw, g.model) if method == "draft_model" else None
    if drafter is not None and k in drafter["k"]:
        profile, note, drafter = _serving_drafter(profile, drafter)
        prov = {**prov, "note": f"{prov['note']}; {note}", "drafter_serving": drafter}
        profile = profile.model_copy(update={"provenance": profile.provenance.model_copy(
            update={"note": prov["note"]})})
    return profile, prov, df


DRAFT_CONTEXT = 576
"""A chat request's mean decode context (512-token prompt, 128 out) for `_serving_drafter`."""


def _serving_drafter(profile: Profile, drafter: dict[str, Any]
                     ) -> tuple[Profile, str, dict[str, Any]]:
    """A draft-model profile priced at the serving engines' pace: the core's median step at
    concurrency 1 on the traced serving engines (`core_drafter`), whose drafter's launches
    hold it, against the profile's own such step (a decode of one request with k drafts),
    the difference put on the drafter's terms (StepModel.draft_serving_scale). The drafter
    is what varies: its pass took 9.3-18.0 ms of the core on ten H200 engines where the
    target's forward took 6.4-7.8 ms of GPU (docs/validation-log.md, twenty-seventh session)."""
    eng = profile.engine
    timer = StepTimer(profile, max_num_seqs=int(eng["max_num_seqs"]),  # type: ignore[call-overload]
                      max_num_batched_tokens=int(eng["max_num_batched_tokens"]))  # type: ignore[call-overload]
    k, step = profile.spec_k, profile.step
    priced = timer.step_time_s(1 + k, 1, 0.0, DRAFT_CONTEXT)
    # the drafter's share of that step (steptime.py StepTimer.step_times, unscaled)
    extra = (k * step.draft_pass_s + step.draft_token_s * timer.pad(1 + k)
             + (k - 1) * step.draft_seq_s)

    def scale_for(step_s: float) -> float:
        return round(max(1 + (step_s - priced) / extra, 0.1), 4)

    scale = scale_for(drafter["step_s"])
    hosts = tuple(DrafterHost(engine=e["engine"], step_s=e["step_s"],
                              draft_serving_scale=scale_for(e["step_s"]))
                  for e in drafter["engines"])
    out = profile.model_copy(update={"step": step.model_copy(
        update={"draft_serving_scale": scale, "draft_sigma": drafter["pass_sigma"]}),
        "drafter_hosts": hosts})
    note = (f"draft_serving_scale {scale}: a step of one request on the serving engines' core "
            f"{drafter['step_s'] * 1e3:.2f} ms (the median over "
            + ", ".join(e["engine"] for e in drafter["engines"])
            + f", core-launch/drafter/{profile.model}.json) against {priced * 1e3:.2f} ms as "
            f"fitted, its drafter's {extra * 1e3:.2f} ms scaled to take the difference, and "
            f"drawn every step with the engines' median spread, sigma {drafter['pass_sigma']}")
    return out, note, {**drafter, "priced_step_s": round(priced, 6),
                       "priced_drafter_s": round(extra, 6), "scale": scale}


def _hosts(eager: dict[str, Any] | None) -> tuple[HostCore, ...]:
    """Each traced host's own core times (`core_eager`'s engines), for a pool sized on one
    end of them (Profile.on_host)."""
    keys = ("engine", "core_graph_s", "core_eager_s", "eager_sigma", "core_piecewise_s")
    return tuple(HostCore(**{k: e[k] for k in keys if k in e})
                 for e in (eager or {}).get("engines", []))


def _check_gpu(raw: Path, order: list[Group], gpu: str) -> None:
    """Refuse runs measured on another GPU than the one whose profiles they would replace: the
    H100's raw folder refitted without `--gpu h100` wrote H100 coefficients over the H200's
    profiles. The runner records the device's name (`versions.gpu_name`, "NVIDIA H100 80GB
    HBM3"); a run without it is taken as it is."""
    names = {str(name) for g in order for meta in g.metas
             if (name := (meta.get("versions") or {}).get("gpu_name"))}
    other = sorted(n for n in names if gpu.lower() not in n.lower().replace(" ", ""))
    if other:
        keys = {k for n in other for k in GPUS if k in n.lower().replace(" ", "")}
        theirs = keys.pop() if len(keys) == 1 else "<gpu>"
        raise CalibrationError(
            f"{raw}: runs measured on {', '.join(other)}, not an {gpu.upper()}; pass --gpu "
            f"{theirs}, so that their profiles go under calibration/{theirs}/ and not over the "
            f"{gpu.upper()}'s")


def build_all(raw: Path, out_root: Path, *, gpu: str = "h200", git_commit: str = "",
              seed: int = 0,
              on_profile: Callable[[str, int, int], None] | None = None) -> list[Path]:
    """Every profile the raw folder supports, BF16 bases first; `on_profile(name, i, n)` is
    called before fitting the i-th of n (0-based), for progress."""
    gs = groups(raw)
    order = sorted(gs.values(), key=lambda g: (g.parts["m"] is not None, g.parts["kv"] is not None,
                                               g.parts["prec"] != "bf16", g.model, g.key))
    order = [g for g in order if g.main is not None]
    if not order:
        raise CalibrationError(
            f"{raw}: no measured run to fit (a run is NAME.meta.json beside NAME.jsonl or "
            "NAME.jsonl.xz, as the runner writes them); give the folder `capplan calibrate "
            "--raw` wrote, such as calibration/_raw or calibration/_raw/h100")
    _check_gpu(raw, order, gpu)
    done: dict[tuple[str, str], Profile] = {}
    written = []
    by_model: defaultdict[str, int] = defaultdict(int)
    for i, g in enumerate(order):
        if on_profile is not None:
            on_profile(f"{g.model}/{g.key}", i, len(order))
        profile, prov, df = build_profile(g, raw, done, gpu=gpu, git_commit=git_commit,
                                          seed=seed)
        done[(g.model, g.key)] = profile
        d = store.profile_dir(out_root, gpu, profile.vllm_version, g.model, g.key)
        store.write_profile_dir(d, profile.to_json(), prov, df)
        written.append(d)
        by_model[g.model] += 1
    return written
