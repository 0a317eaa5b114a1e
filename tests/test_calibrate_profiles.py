"""The shipped H200 profiles: they load, say where they came from, and re-fit from their
own raw samples to the same coefficients."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from capplan.calibrate import fit as F
from capplan.calibrate import scans, store
from capplan.calibrate.store import CALIBRATION_DIR
from capplan.hardware import GPUS, Precision
from capplan.modelspec import load_model_spec
from capplan.profile import Profile
from capplan.steptime import StepTimer, cudagraph_capture_sizes, graph_offset

PROFILES = store.shipped_profiles()
IDS = [str(p.relative_to(store.CALIBRATION_DIR)) for p in PROFILES]


def test_profiles_are_shipped() -> None:
    """The simulator's defaults exist: at least the 8B and 32B BF16 profiles."""
    keys = {(p.parent.name, p.name) for p in PROFILES}
    assert {("llama-3.1-8b", "bf16"), ("qwen3-32b", "bf16")} <= keys


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_profile_loads_with_complete_provenance(d: Path) -> None:
    """Every profile validates and carries GPU, driver, versions, date, command, commit,
    engine settings and GPU-minutes."""
    prof = Profile.load(d)
    assert prof.source == "measured" and prof.fit is not None and prof.fit.n_test > 0
    assert d.name == prof.key and d.parent.name == prof.model
    prov = json.loads((d / "provenance.json").read_text())
    missing = [k for k in store.PROVENANCE_KEYS if prov.get(k) in (None, "", {})]
    assert not missing, f"provenance lacks {missing}"
    assert prov["vllm"] == prof.vllm_version == "0.26.0"
    for key in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                "block_size", "async_scheduling", "enable_prefix_caching"):
        assert key in prof.engine
    assert {p["gpu_memory_utilization"] for p in prof.kv.measured} == {0.85, 0.9, 0.95}
    # the points measured are among those planned, over every run fitted (a repeat's plan
    # may hold points the main run's has not)
    measured = [p for p in prov["points_measured"] if not p.startswith("warmup")]
    assert prov["points_planned"] is None or len(measured) <= prov["points_planned"]


ENCODER = ("encoder_token_s", "encoder_token2_s", "encoder_floor_s", "encoder_step_s",
           "encoder_step_draws_s", "encoder_slow_above_s", "encoder_slow_spell_s",
           "encoder_fast_spell_s")


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_refit_from_samples_gives_same_coefficients(d: Path) -> None:
    """Re-fitting samples.parquet with the recorded seed and fixed terms reproduces the
    shipped coefficients: the profile is a function of its data (the terms from other runs,
    the scans' and the serving core traces', are checked beside them)."""
    prof = Profile.load(d)
    prov = json.loads((d / "provenance.json").read_text())
    window = prof.step.window_tokens
    s = store.samples_of(store.read_samples(d), window_tokens=window)
    res = F.fit_step_model(s, max_num_seqs=int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                           max_num_batched_tokens=int(prof.engine["max_num_batched_tokens"]),  # type: ignore[call-overload]
                           spec_k=prof.spec_k, fixed=prov["fit"]["fixed_coefficients"],
                           seed=prov["fit"]["seed"], floors=prov["fit"]["floors"],
                           window=window)
    for k, v in prof.step.model_dump(exclude={"shared_ctx_saving", "graph_ctx_s",
                                              "graph_window_s", "graph_offset_s",
                                              "eager_offset_s", "core_graph_s", "core_piecewise_s",
                                              "core_graph_sigma", "core_piecewise_sigma",
                                              "core_eager_s", "eager_gpu_s",
                                              "eager_sigma", "draft_serving_scale", "draft_sigma",
                                              "tile_rho", "tile_kv_heads", "tile_sms",
                                              *ENCODER}).items():
        assert getattr(res.step, k) == pytest.approx(v, rel=1e-6, abs=1e-15), k
    scan = prov.get("encoder_scan", {})
    for k in ENCODER:  # the encoder scan's (calibrate/build.py encoder_time), else none
        assert getattr(prof.step, k) == scan.get(k, [] if k.endswith("draws_s") else 0.0), k
    assert res.quality == prof.fit.model_copy(update={"shipped_median_ape": None,
                                                      "shipped_p95_ape": None})


TILED = [d for d in PROFILES if Profile.load(d).step.tile_rho]


def test_the_validated_fp8_engines_price_flashattentions_last_wave() -> None:
    """The profiles whose sweeps hold enough long decodes of a few sequences fit tile_rho
    (calibrate/scans.py tile_rho): the H100's Llama-3.1-8B and Qwen3-32B, the H200's Llama FP8."""
    assert {f"{d.parents[2].name}/{d.parent.name}/{d.name}" for d in TILED} >= {
        "h100/llama-3.1-8b/fp8", "h100/qwen3-32b/fp8", "h200/llama-3.1-8b/fp8"}


@pytest.mark.parametrize("d", TILED, ids=[f"{d.parents[2].name}/{d.parent.name}/{d.name}"
                                          for d in TILED])
def test_tile_rho_refits_from_the_samples(d: Path) -> None:
    """tile_rho is the fit's choice over the shipped samples once the other terms are in
    (calibrate/build.py after the graph scan), with the model's KV heads and the GPU's SMs,
    and it prices the cells it was fitted on better by at least TILE_MIN_GAIN."""
    prof = Profile.load(d)
    step = prof.step
    s = store.samples_of(store.read_samples(d))
    sizes = cudagraph_capture_sizes(int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                                    int(prof.engine["max_num_batched_tokens"]), prof.spec_k)  # type: ignore[call-overload]
    heads = load_model_spec(prof.model).num_kv_heads
    assert (step.tile_kv_heads, step.tile_sms) == (heads, GPUS[prof.gpu].sms)
    fit = scans.tile_rho(s, step.model_copy(update={"tile_rho": 0.0}), sizes, prof.spec_k, heads,
                     GPUS[prof.gpu].sms)
    assert fit is not None and fit.rho == step.tile_rho
    assert fit.rms_with_s <= (1 - scans.TILE_MIN_GAIN) * fit.rms_without_s
    assert f"tile_rho {fit.rho:.1f}" in prof.provenance.note


SHARED = [d for d in PROFILES if "shared_ctx" in json.loads((d / "provenance.json").read_text())]


def test_shared_prefix_saving_was_measured_for_the_validated_prefix_engines() -> None:
    """The four engines whose shared-prefix serving docs/validation.md compares carry the
    saving their prefix-cache engine measured; a profile without such a run saves nothing."""
    assert {f"{d.parent.name}/{d.name}" for d in SHARED} >= {
        "llama-3.1-8b/bf16", "llama-3.1-8b/fp8", "qwen3-32b/bf16", "qwen3-32b/fp8"}
    for d in PROFILES:
        prof = Profile.load(d)
        if d not in SHARED and not prof.spec_k:
            assert prof.step.shared_ctx_saving == 0.0, d


@pytest.mark.parametrize("d", SHARED, ids=[f"{d.parent.name}/{d.name}" for d in SHARED])
def test_shared_prefix_saving_refits_from_its_cache_run(d: Path) -> None:
    """shared_ctx_saving is the median of the cache run's shared/unshared decode pairs,
    recomputed from the shipped raw run; each pair saved a real part of the decode attention
    (between 20 % and 70 % of it: neither nothing nor more than the reads cost)."""
    prof = Profile.load(d)
    prov = json.loads((d / "provenance.json").read_text())
    raw = store.runner_jsonl(store.raw_dir(CALIBRATION_DIR, prof.gpu), prov["shared_ctx"]["run"])
    assert raw is not None
    df = store.read_runner_jsonl(raw).filter(~pl.col("warmup"))
    saving, pairs = F.shared_ctx_saving(store.samples_of(df), prof.step.decode_ctx_s)
    assert saving == prof.step.shared_ctx_saving
    assert pairs == prov["shared_ctx"]["pairs"] and len(pairs) >= 4
    assert all(0.2 < q["saving"] < 0.7 for q in pairs)


SCANNED = [d for d in PROFILES if "graph_scan" in json.loads((d / "provenance.json").read_text())]


@pytest.mark.parametrize("d", SCANNED, ids=[f"{d.parent.name}/{d.name}" for d in SCANNED])
def test_graph_terms_refit_from_their_graph_scan(d: Path) -> None:
    """graph_ctx_s and graph_offset_s come from the graph-scan run on top of the profile's
    linear terms, recomputed from the shipped raw run: every CUDA-graph size a decode-only
    batch of up to 256 requests can take has its offset (B (1 + k) tokens under speculative
    decoding), no size of the scan is a slow stretch of the engine
    (scans.graph_scan_slow_stretches), and the decode-only KV read is no faster than the
    HBM's peak bandwidth allows (a sliding-window model's offsets from the points within its
    window; its full-attention rate its fitted one, its sliding layers' from the scan)."""
    prof = Profile.load(d)
    prov = json.loads((d / "provenance.json").read_text())
    raw = store.runner_jsonl(store.raw_dir(CALIBRATION_DIR, prof.gpu), prov["graph_scan"]["run"])
    assert raw is not None
    sizes = cudagraph_capture_sizes(256, 8192, prof.spec_k)
    scan = scans.graph_scan(store.samples_of(store.read_runner_jsonl(raw)),
                        prof.step.model_copy(update={"graph_offset_s": {}}), sizes,
                        prov["fit"]["floors"]["decode_ctx_s"], prof.step.window_tokens,
                        prov["fit"]["floors"].get("decode_window_s", 0.0), spec_k=prof.spec_k)
    assert scan is not None
    assert len(scans.graph_scan_slow_stretches(scan.points)) <= scans.GRAPH_SCAN_MAX_STRETCHES
    assert scan.offsets == prof.step.graph_offset_s
    assert scan.ctx_s == prof.step.graph_ctx_s >= prov["fit"]["floors"]["decode_ctx_s"]
    assert scan.window_ctx_s == prof.step.graph_window_s
    if prof.step.window_tokens:  # the sliding layers' decode-only rate, at the HBM's peak or under
        assert prof.step.graph_window_s >= prov["fit"]["floors"]["decode_window_s"]
    assert scan.points == prov["graph_scan"]["points"]
    # under speculative decoding a size is B (1 + k) tokens, B at most 256 requests; a scan
    # whose budget ran out before its last sizes names them, and they keep the linear terms:
    # the largest sizes only, and fewer than it reached (the H100's Qwen3-32B NVFP4 scan, whose
    # 60 s reached 24 of 35 sizes in the fifty-third session, before it ran whole in the
    # fifty-fifth: calibration/_raw/h100/superseded-s55/)
    missed = prov["graph_scan"].get("sizes_not_reached", [])
    assert sorted([*scan.offsets, *missed]) == [s for s in sizes if s // (1 + prof.spec_k) <= 256]
    assert len(missed) < len(scan.offsets) and all(m > max(scan.offsets) for m in missed)
    assert all(graph_offset(prof.step.graph_offset_s, m) == 0.0 for m in missed)
    if missed:
        assert "not reached before the scan's budget ran out" in prov["note"]


def test_the_validated_bf16_and_fp8_engines_have_a_graph_scan() -> None:
    """The four engines whose serving docs/validation.md compares at every concurrency were
    scanned; a profile without a scan keeps neither term."""
    assert {f"{d.parent.name}/{d.name}" for d in SCANNED} >= {
        "llama-3.1-8b/bf16", "llama-3.1-8b/fp8", "qwen3-32b/bf16", "qwen3-32b/fp8"}
    for d in set(PROFILES) - set(SCANNED):
        step = Profile.load(d).step
        assert not step.graph_offset_s and step.graph_ctx_s == 0.0, d


@pytest.mark.parametrize(("key", "holes_cost"), [("fp8", True), ("awq", False)])
def test_a_half_empty_row_of_tiles_is_priced_as_the_scan_ran_it(key: str,
                                                                 holes_cost: bool) -> None:
    """The H100's lone-prompt scans (calibration/_plans/h100/queue-s51.txt): on Qwen3-32B
    FP8 a prompt whose last row of 256 tokens is half empty or more (1,920, 2,049) ran longer
    than the full row past it (2,048, 2,304), and its profile prices it so; on AWQ it ran
    shorter, and its profile has no such term (steptime.py, gemm_holes_s)."""
    d = CALIBRATION_DIR / "h100" / "vllm-0.26.0" / "qwen3-32b" / key
    s = pl.read_parquet(d / "samples.parquet")
    prof = Profile.load(d)
    timer = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
    assert (prof.step.gemm_holes_s > 0) is holes_cost
    for holed, full in ((1920, 2048), (2049, 2304)):
        ran = {n: s.filter(pl.col("point").str.starts_with(f"lone-p{n}-"))["step_s"].median()
               for n in (holed, full)}
        priced = {n: timer.step_time_s(n, 1, n * n / 2, 0) for n in (holed, full)}
        assert (ran[holed] > ran[full]) is holes_cost, ran
        assert (priced[holed] > priced[full]) is holes_cost, priced


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_eager_offsets_refit_from_the_lone_prompt_scan(d: Path) -> None:
    """eager_offset_s is a function of the profile's own samples: the FP8 profiles whose runs
    hold the lone-prompt scan get it back from fit.eager_offsets (the shipped step without
    it, the recorded seed); every other profile has none (calibrate/build.py)."""
    prof = Profile.load(d)
    s = store.samples_of(store.read_samples(d), window_tokens=prof.step.window_tokens)
    lone = (np.char.startswith(np.asarray(s["point"]).astype(str), "lone-p")
            & (s["decode_seqs"] == 0))
    if prof.precision != "fp8" or prof.spec_k or not lone.any():
        assert not prof.step.eager_offset_s
        return
    eng = prof.engine
    sizes = cudagraph_capture_sizes(int(eng["max_num_seqs"]),  # type: ignore[call-overload]
                                    int(eng["max_num_batched_tokens"]))  # type: ignore[call-overload]
    step = prof.step.model_copy(update={"eager_offset_s": {}})
    seed = json.loads((d / "provenance.json").read_text())["fit"]["seed"]
    got = F.eager_offsets(s, step, sizes, lone=lone, seed=seed,
                          above_s=max(step.eager_floor_s, step.eager_gpu_s))
    assert got == pytest.approx(prof.step.eager_offset_s, abs=1e-9)


def test_a_full_row_count_is_priced_as_the_scan_ran_it() -> None:
    """The H100's lone-prompt scans: 2,032-2,048 tokens ran cheaper than the rows and holes
    price them (Qwen3-32B FP8 129.5 ms at 2,048 where they give 137.3), and the profile now
    prices those counts within 2 % of the scan; 2,049, whose last row is nearly empty, keeps
    the holes' price (steptime.py, eager_offset_s)."""
    d = CALIBRATION_DIR / "h100" / "vllm-0.26.0" / "qwen3-32b" / "fp8"
    s = pl.read_parquet(d / "samples.parquet")
    prof = Profile.load(d)
    timer = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
    bare = StepTimer(prof.model_copy(update={"step": prof.step.model_copy(
        update={"eager_offset_s": {}})}), max_num_seqs=256, max_num_batched_tokens=8192)
    for n in (2032, 2040, 2047, 2048):
        ran = s.filter(pl.col("point").str.starts_with(f"lone-p{n}-"))["step_s"].median()
        priced = timer.step_time_s(n, 1, n * n / 2, 0)
        assert priced == pytest.approx(ran, rel=0.02), n
        assert bare.step_time_s(n, 1, n * n / 2, 0) > 1.04 * ran, n  # type: ignore[operator]
    assert timer.step_time_s(2049, 1, 2049 * 2049 / 2, 0) == bare.step_time_s(
        2049, 1, 2049 * 2049 / 2, 0)


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_kv_line_meets_measured_point(d: Path) -> None:
    """The capacity line passes within 1 % of the engine's own 0.90 figure: the points are
    different engine starts, whose memory outside the cache differs (Gemma 4 MTP k = 2's 0.95
    engine held 1.8 GB less than its 0.85 and 0.90 ones, docs/calibration.md)."""
    prof = Profile.load(d)
    at90 = next(p for p in prof.kv.measured if p["gpu_memory_utilization"] == 0.9)
    assert at90["derived"] == 0.0
    assert prof.kv.tokens(0.9) == pytest.approx(at90["tokens"], rel=1e-2)


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_decode_step_respects_weight_streaming_bound(d: Path) -> None:
    """Physics: a batch-1 decode step cannot beat weights / HBM bandwidth, and vLLM gets
    at least a third of the bound (k draft passes come on top for spec decode)."""
    prof = Profile.load(d)
    spec = load_model_spec(prof.model)
    bound = spec.weight_bytes(Precision(prof.precision)) / GPUS[prof.gpu].hbm_bytes_per_s
    timer = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
    k, st = prof.spec_k, prof.step
    t = timer.step_time_s(1 + k, 1, 0.0, 512)
    assert bound < t
    draft = (k * st.draft_pass_s + st.draft_token_s * timer.pad(1 + k)
             + max(k - 1, 0) * st.draft_seq_s) if k else 0.0
    assert t - draft < 3 * bound + 0.002


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_step_times_come_from_the_gpu_stamps_where_recorded(d: Path) -> None:
    """Samples measured with the GPU's own stamps are timed by them, step by step: the
    stored step time is the one `step_times_gpu_s` gives, every step is a fitting unit, and
    the provenance says so; older samples keep the CPU stamps and windows of four."""
    df = store.read_samples(d)
    prov = json.loads((d / "provenance.json").read_text())
    if "gpu_t1" not in df.columns or df["gpu_t1"].null_count():
        assert not df["gpu_clock"].any() if "gpu_clock" in df.columns else True
        assert "window of 4" in prov["fit"]["unit"]
        return
    assert df["gpu_clock"].all()
    point = df["point"].to_numpy()
    want = F.step_times_gpu_s(point, df["pipelined"].to_numpy(), df["gpu_t0"].to_numpy(),
                              df["gpu_t1"].to_numpy())
    assert df["step_s"].to_numpy() == pytest.approx(want, rel=1e-12)
    assert (want > 0).all()
    assert prov["fit"]["unit"].startswith("one engine step")


def test_remeasured_profiles_carry_gpu_stamps() -> None:
    """The profiles measured again on 2026-11-30 with the GPU's stamps have them."""
    root = store.CALIBRATION_DIR / "h200" / "vllm-0.26.0"
    for key in ("llama-3.1-8b/bf16", "llama-3.1-8b/fp8", "qwen3-32b/bf16", "qwen3-32b/fp8",
                "qwen3-32b/awq", "qwen3-32b/nvfp4", "gemma-4-31b/fp8", "gemma-4-31b/nvfp4"):
        assert store.read_samples(root / key)["gpu_clock"].all(), key


def test_repeat_runs_are_fitted_together() -> None:
    """A profile whose engine was measured again (`<model>--<key>--r<N>` in
    calibration/_raw) fits every run's steps, numbered by `run`, and its provenance lists
    the runs."""
    found = 0
    for d in PROFILES:
        runs = json.loads((d / "provenance.json").read_text()).get("repeat_runs")
        if not runs:
            continue
        found += 1
        df = store.read_samples(d)
        assert sorted(df["run"].unique().to_list()) == list(range(1, len(runs) + 2)), d
        for r in runs:
            assert (df["run"] == r["run"]).sum() == r["steps"], (d, r)
    assert found >= 4


def test_a_repeat_run_joins_its_engine_not_the_kv_points(tmp_path: Path) -> None:
    """build.groups: `--r2` is a further run of the main engine, `--u85` a KV-only engine."""
    from capplan.calibrate.build import groups

    for name in ("m--fp8", "m--fp8--r2", "m--fp8--u85"):
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"kv": {}}))
    for name in ("m--fp8", "m--fp8--r2"):
        (tmp_path / f"{name}.jsonl").write_text("")
    g = groups(tmp_path)[("m", "fp8")]
    assert (g.main, g.repeats, len(g.metas)) == ("m--fp8", ["m--fp8--r2"], 2)


def test_repeat_runs_take_the_slowest_runs_launch_terms() -> None:
    """The terms that price the CPU's launches (build.LAUNCH_COEFS) come from the slowest
    of the runs' own fits, each run refitted alone here from the shipped samples; the other
    terms are fitted on every run with them fixed (docs/calibration.md, "Repeat runs and
    the CPU's launches"). Llama-3.1-8B BF16's run 2 launched faster than run 1; its run 3, a
    lone-prompt scan, takes no part."""
    from capplan.calibrate.build import LAUNCH_COEFS

    d = CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / "bf16"
    prof = Profile.load(d)
    prov = json.loads((d / "provenance.json").read_text())
    df = store.read_samples(d)
    # (the attention rate is fixed after the vote: fit.attention_rate)
    fixed = {k: v for k, v in prov["fit"]["fixed_coefficients"].items()
             if k not in (*LAUNCH_COEFS, "prefill_attn_s")}
    own = [F.fit_step_model(store.samples_of(df.filter(pl.col("run") == run)),
                            max_num_seqs=int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                            max_num_batched_tokens=int(prof.engine["max_num_batched_tokens"]),  # type: ignore[call-overload]
                            fixed=fixed, seed=prov["fit"]["seed"],
                            floors=prov["fit"]["floors"]).step for run in (1, 2, 3)]
    assert own[1].eager_floor_s < 0.8 * own[0].eager_floor_s  # run 2's CPU was faster
    # run 3 is the lone-prompt scan (sixty-first session): an idle engine's first steps set
    # its floor, slower than either sweep's, and it has no vote
    lone = df.filter((pl.col("run") == 3) & ~pl.col("warmup"))["point"]
    assert lone.str.starts_with("lone-p").all()
    assert own[2].eager_floor_s > 1.2 * own[0].eager_floor_s
    assert "the lone-prompt scans' runs not among them" in prof.provenance.note
    for c in LAUNCH_COEFS:
        assert getattr(prof.step, c) == pytest.approx(max(getattr(r, c) for r in own[:2])), c
        assert prov["fit"]["fixed_coefficients"][c] == getattr(prof.step, c)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_graph_scan_that_ran_at_two_speeds_is_not_used(gpu: str) -> None:
    """The draft-model engine's graph scan took 21-24 ms at batch 1, 16 and 28 where their
    neighbours took 14 ms on the H200, and about 27 ms against 16 in stretches of neighbouring
    sizes on the H100 (the engine's two speeds, docs/calibration.md): more slow stretches
    than GRAPH_SCAN_MAX_STRETCHES, so its profile keeps the linear terms and says why."""
    d = CALIBRATION_DIR / gpu / "vllm-0.26.0" / "llama-3.1-8b" / "bf16-draft_model4"
    raw = store.runner_jsonl(store.raw_dir(CALIBRATION_DIR, gpu),
                             "llama-3.1-8b--bf16-draft_model4--graphs")
    assert raw is not None
    prof = Profile.load(d)
    scan = scans.graph_scan(store.samples_of(store.read_runner_jsonl(raw)), prof.step,
                        cudagraph_capture_sizes(256, 8192, 4), spec_k=4)
    assert scan is not None
    assert len(scans.graph_scan_slow_stretches(scan.points)) > scans.GRAPH_SCAN_MAX_STRETCHES
    assert not prof.step.graph_offset_s
    assert "graph scan llama-3.1-8b--bf16-draft_model4--graphs not used" in prof.provenance.note


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_heldout_error_as_shipped_recomputes(d: Path) -> None:
    """The held-out figures of the profile as shipped (its scan terms included) are the fit's
    own held-out steps priced by the shipped StepModel, recomputed from samples.parquet, and
    so are their split into the points' designed steps and drains."""
    prof = Profile.load(d)
    fit = json.loads((d / "provenance.json").read_text())["fit"]
    s = store.samples_of(store.read_samples(d), window_tokens=prof.step.window_tokens)
    ape = F.heldout_ape(s, prof.step, max_num_seqs=int(prof.engine["max_num_seqs"]),  # type: ignore[call-overload]
                        max_num_batched_tokens=int(prof.engine["max_num_batched_tokens"]),  # type: ignore[call-overload]
                        spec_k=prof.spec_k, seed=fit["seed"], window=prof.step.window_tokens)
    assert len(ape) == prof.fit.n_test
    assert round(float(np.median(ape)), 5) == fit["heldout_shipped_median_ape"]
    assert round(float(np.percentile(ape, 95)), 5) == fit["heldout_shipped_p95_ape"]
    # the same units split into a point's designed steps and its drain (fit.drain_steps):
    # their counts add up, and each side's median and p95 are the provenance's
    drained = F.heldout_in_drain(s, seed=fit["seed"])
    assert fit["designed_units"] + fit["drain_units"] == prof.fit.n_test
    for side, part in (("designed", ape[~drained]), ("drain", ape[drained])):
        assert fit[f"{side}_units"] == len(part)
        if len(part):
            assert round(float(np.median(part)), 5) == fit[f"{side}_shipped_median_ape"]
            assert round(float(np.percentile(part, 95)), 5) == fit[f"{side}_shipped_p95_ape"]


@pytest.mark.parametrize("d", PROFILES, ids=IDS)
def test_points_named_beyond_kv_are(d: Path) -> None:
    """A point the provenance says needs more KV than the engine holds does: its plan's KV
    tokens pass 0.9 of the engine's cache at utilisation 0.90, as the runner skips it."""
    prov = json.loads((d / "provenance.json").read_text())
    head = prov["note"].split(";")[1] if prov["note"].startswith("sweep incomplete") else ""
    if "more KV than the engine holds" not in head:
        return
    named = head.split(" need")[0].strip().split(", ")
    plan = Path(prov["command"].split("--plan ")[1].split()[0])
    kv = {q["id"]: q.get("kv_tokens", 0)  # the main run's plan and its repeats' (`--rN`)
          for f in [plan, *plan.parent.glob(f"{plan.stem}--r*.json")]
          for q in json.loads(f.read_text())["points"]}
    cap = next(k["tokens"] for k in prov["kv_points"] if k["gpu_memory_utilization"] == 0.9)
    assert named and all(kv[q] > 0.9 * cap for q in named), (named, cap)


def test_the_attention_rate_is_the_dies_not_the_precisions() -> None:
    """prefill_attn_s comes from the steps where a prompt's attention weighs
    (fit.attention_rate): FlashAttention's prefill on 16-bit KV is the same kernel on the
    same die whatever the GEMMs' precision, and the four Llama-3.1-8B profiles of the H200
    and H100 (one die, GH100) agree within 6 % where their joint fits, confounding it with
    the per-token and row terms across the short steps, ranged 4.5-7.0e-10 s a pair."""
    rates = {}
    for gpu in ("h200", "h100"):
        for prec in ("bf16", "fp8"):
            d = CALIBRATION_DIR / gpu / "vllm-0.26.0" / "llama-3.1-8b" / prec
            prof = Profile.load(d)
            prov = json.loads((d / "provenance.json").read_text())
            assert prov["fit"]["fixed_coefficients"]["prefill_attn_s"] == prof.step.prefill_attn_s
            assert "prefill_attn_s" in prof.provenance.note
            rates[(gpu, prec)] = prof.step.prefill_attn_s
    assert max(rates.values()) < 1.06 * min(rates.values()), rates
