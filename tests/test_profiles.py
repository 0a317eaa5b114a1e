"""Profile resolution: the measured profile when calibration has an exact match, else analytic."""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.analytic import analytic_profile
from capplan.errors import ConfigError
from capplan.hardware import GPUS, Precision
from capplan.modelspec import load_model_spec
from capplan.pool import EngineConfig, Pool, SpeculativeConfig
from capplan.profile import Profile, Provenance
from capplan.profiles import list_profiles, resolve_profile
from capplan.steptime import StepTimer

LLAMA8 = load_model_spec("llama-3.1-8b")


def _measured(tmp: Path, key: str = "bf16", **fields: object) -> Profile:
    """Write a 'measured' profile (analytic numbers relabelled) under the calibration layout."""
    base = analytic_profile(LLAMA8, GPUS["h200"], Precision.BF16)
    p = base.model_copy(
        update={"provenance": Provenance(source="measured", note="test fixture"), **fields}
    )
    folder = tmp / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / key
    folder.mkdir(parents=True)
    p.save(folder / "profile.json")
    return p


def _pool(**kw: object) -> Pool:
    return Pool.model_validate({"name": "chat", "model": "llama-3.1-8b", **kw})


@pytest.mark.parametrize("sub", ["missing", "empty"])
def test_no_calibration_falls_back_to_analytic(tmp_path: Path, sub: str) -> None:
    """A missing or empty calibration dir is tolerated: the analytic profile comes back."""
    cal = tmp_path / "cal"
    if sub == "empty":
        cal.mkdir()
    p = resolve_profile(_pool(), LLAMA8, calibration_dir=cal)
    assert p.source == "analytic"
    assert list_profiles(cal) == []


def test_exact_match_returns_the_measured_profile(tmp_path: Path) -> None:
    """When calibration holds the pool's (gpu, version, model, precision, kv, spec, tp), use it."""
    _measured(tmp_path)
    p = resolve_profile(_pool(), LLAMA8, calibration_dir=tmp_path)
    assert p.source == "measured"
    assert p.provenance.note == "test fixture"
    assert [q.key for q in list_profiles(tmp_path)] == ["bf16"]


def test_each_gpu_takes_its_own_shipped_profile() -> None:
    """The shipped calibration holds Llama-3.1-8B BF16 on the H200 and the H100: a pool takes
    its GPU's, never the other's, and a precision with no H100 profile (Qwen3-32B BF16; its
    FP8 has one) falls back to analytic there rather than borrowing the H200's."""
    for gpu in ("h200", "h100"):
        p = resolve_profile(_pool(gpu=gpu, precision="bf16"), LLAMA8)
        assert (p.source, p.gpu, p.precision) == ("measured", gpu, "bf16")
    h100 = resolve_profile(_pool(gpu="h100", precision="bf16"), LLAMA8)
    h200 = resolve_profile(_pool(gpu="h200", precision="bf16"), LLAMA8)
    # the H100 reads its KV more slowly (3.35 TB/s against 4.8) and holds half the tokens
    assert h100.step.decode_ctx_s > h200.step.decode_ctx_s
    assert h100.kv.tokens(0.9) < 0.6 * h200.kv.tokens(0.9)
    qwen = load_model_spec("qwen3-32b")
    p = resolve_profile(Pool.model_validate({"name": "q", "model": "qwen3-32b", "gpu": "h100",
                                             "precision": "bf16"}), qwen)
    assert (p.source, p.gpu) == ("analytic", "h100")
    p = resolve_profile(Pool.model_validate({"name": "q", "model": "qwen3-32b", "gpu": "h100",
                                             "precision": "fp8"}), qwen)
    assert (p.source, p.gpu, p.precision) == ("measured", "h100", "fp8")


def test_a_shared_prefix_priced_in_full_says_so() -> None:
    """A pool whose requests hit the prefix cache, on a measured profile no prefix-cache
    engine measured (the H200's Llama-3.1-8B BF16 with an FP8 KV cache: shared_ctx_saving 0),
    is told that the context they read in common is priced in full; one that measured it
    (the H200's and, since the thirty-fourth session, the H100's BF16) is not, nor is a pool
    with no hits."""
    from capplan.sim.run import _source

    kvfp8 = resolve_profile(_pool(gpu="h200", precision="bf16",
                                  engine={"kv_cache_dtype": "fp8"}), LLAMA8)
    assert (kvfp8.source, kvfp8.step.shared_ctx_saving) == ("measured", 0)
    assert _source(kvfp8, text_only=True, shared=True) == (
        "measured (shared-prefix saving: not measured, none assumed)")
    assert _source(kvfp8, text_only=True, shared=False) == "measured"
    for gpu in ("h200", "h100"):
        p = resolve_profile(_pool(gpu=gpu, precision="bf16"), LLAMA8)
        assert p.step.shared_ctx_saving > 0
        assert _source(p, text_only=True, shared=True) == "measured"


@pytest.mark.parametrize(
    "pool_kw",
    [
        {"precision": "fp8"},
        {"tp": 2},
        {"engine": {"kv_cache_dtype": "fp8"}},
        {"engine": {"speculative": {"method": "ngram", "num_speculative_tokens": 4}}},
    ],
)
def test_any_mismatch_falls_back_to_analytic(tmp_path: Path, pool_kw: dict[str, object]) -> None:
    """A measured profile for another precision, TP, KV dtype or spec config is never borrowed."""
    _measured(tmp_path)
    p = resolve_profile(_pool(**pool_kw), LLAMA8, calibration_dir=tmp_path)
    assert p.source == "analytic"


def test_spec_decode_profile_matches_method_and_k(tmp_path: Path) -> None:
    """A measured `bf16-ngram4` profile serves a pool with ngram k=4, not one with k=2."""
    _measured(tmp_path, key="bf16-ngram4", spec_method="ngram", spec_k=4)
    four = _pool(engine=EngineConfig(speculative=SpeculativeConfig(method="ngram",
                                                                    num_speculative_tokens=4)))
    two = _pool(engine=EngineConfig(speculative=SpeculativeConfig(method="ngram",
                                                                   num_speculative_tokens=2)))
    assert resolve_profile(four, LLAMA8, calibration_dir=tmp_path).source == "measured"
    other = resolve_profile(two, LLAMA8, calibration_dir=tmp_path)
    assert other.source == "analytic" and other.spec_k == 2


def test_pool_profile_folder_is_used_as_given(tmp_path: Path) -> None:
    """`pool.profile` names a folder relative to the calibration dir; it wins over matching."""
    _measured(tmp_path, key="bf16-custom")
    pool = _pool(profile="h200/vllm-0.26.0/llama-3.1-8b/bf16-custom")
    assert resolve_profile(pool, LLAMA8, calibration_dir=tmp_path).source == "measured"


def test_auto_precision_must_be_chosen_first(tmp_path: Path) -> None:
    """precision 'auto' is the solver's to pick; resolving it directly is a ConfigError."""
    with pytest.raises(ConfigError, match="auto"):
        resolve_profile(_pool(precision="auto"), LLAMA8, calibration_dir=tmp_path)


def test_spec_must_be_the_pools_model(tmp_path: Path) -> None:
    """Passing another model's spec for a pool is a ConfigError naming both."""
    with pytest.raises(ConfigError, match="qwen3-32b"):
        resolve_profile(_pool(), load_model_spec("qwen3-32b"), calibration_dir=tmp_path)


def test_broken_profile_file_names_the_file(tmp_path: Path) -> None:
    """A corrupt profile.json is an error that names the file, never silently skipped."""
    bad = tmp_path / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / "bf16"
    bad.mkdir(parents=True)
    (bad / "profile.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"profile\.json"):
        resolve_profile(_pool(), LLAMA8, calibration_dir=tmp_path)


def test_draft_model_pool_defaults_to_the_shipped_draft(tmp_path: Path) -> None:
    """A Llama draft_model pool without a measured profile gets analytic costs from
    llama-3.2-1b; a model with another vocabulary must name its draft."""
    eng = EngineConfig(speculative=SpeculativeConfig(method="draft_model",
                                                     num_speculative_tokens=3))
    p = resolve_profile(_pool(engine=eng), LLAMA8, calibration_dir=tmp_path)
    assert p.source == "analytic" and "llama-3.2-1b" in p.provenance.note
    gemma_pool = Pool(name="g", model="gemma-4-31b", engine=eng)
    with pytest.raises(ConfigError, match="draft"):
        resolve_profile(gemma_pool, load_model_spec("gemma-4-31b"), calibration_dir=tmp_path)


def test_text_only_multimodal_profile_takes_the_measured_encoder() -> None:
    """Gemma 4's shipped profiles were timed text-only, and every precision carries the one
    encoder scan (the vision tower stays BF16): a pool that sends images resolves to the
    measured profile unchanged where its image KV reservation was measured too (FP8), and
    takes only the reservation's share of the cache from the analytic model where it was
    not (BF16), named in `analytic_terms` and in the plan's profile source."""
    from capplan.sim.run import _source

    gemma = load_model_spec("gemma-4-31b")
    root = Path(__file__).resolve().parents[1] / "calibration" / "h200" / "vllm-0.26.0"
    fp8 = Profile.load(root / "gemma-4-31b" / "fp8" / "profile.json")
    for prec, reservation_measured in (("fp8", True), ("bf16", False)):
        pool = Pool.model_validate({"name": "vision", "model": "gemma-4-31b", "precision": prec,
                                    "engine": {"limit_mm_per_prompt": {"image": 1}}})
        p = resolve_profile(pool, gemma)
        shipped = Profile.load(root / "gemma-4-31b" / prec / "profile.json")
        assert p.source == "measured" and p.step == shipped.step
        for k in ("encoder_token_s", "encoder_token2_s", "encoder_floor_s"):
            assert getattr(p.step, k) == getattr(fp8.step, k) > 0, k
        a = analytic_profile(gemma, GPUS["h200"], Precision(prec))
        # a lone picture: the measured pass's floor, over five times the analytic figure
        assert p.step.encoder_floor_s > 5 * a.step.encoder_token_s * 280
        assert p.kv.image_reservation_tokens > 0
        assert p.kv.tokens(0.9) == shipped.kv.tokens(0.9)
        # Gemma 4's engine core was traced in serving (calibration/_raw/core-launch)
        assert shipped.step.core_graph_s > 0 and shipped.step.core_piecewise_s > 0
        assert _source(p, text_only=True) == "measured"  # uses neither
        assert _source(shipped, text_only=False) == "measured"
        if reservation_measured:
            assert p is shipped or p == shipped
            assert p.provenance.analytic_terms == ()
            assert _source(p, text_only=False) == "measured"
        else:
            assert shipped.kv.image_reservation_tokens == 0
            assert p.provenance.analytic_terms == ("image KV reservation",)
            assert "analytic model (not measured)" in p.provenance.note
            assert _source(p, text_only=False) == ("measured (image KV reservation: "
                                                   "analytic)")
        # a measured profile without the core's time says so
        bare = p.model_copy(update={"step": p.step.model_copy(
            update={"core_graph_s": 0.0, "core_piecewise_s": 0.0})})
        assert _source(bare, text_only=True) == "measured (engine core's time: not measured)"


def test_a_draft_models_passes_hold_the_engine_core() -> None:
    """vLLM runs the drafter inside the step's sample_tokens (gpu_model_runner.py
    propose_draft_token_ids): a draft model's passes, a 1B model launched layer by layer,
    keep the core as long as the GPU (traced: the core's step 14-26 ms, its drafter 10-19,
    validation-log.md twenty-eighth session), so they are in the step's launch; an MTP module's
    are not (no trace says they hold it)."""
    root = Path(__file__).resolve().parents[1] / "calibration" / "h200" / "vllm-0.26.0"
    for key, holds in (("llama-3.1-8b/bf16-draft_model4", True),
                       ("gemma-4-31b/fp8-mtp4", False)):
        prof = Profile.load(root / key / "profile.json")
        t = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
        s = prof.step
        drafter = (4 * s.draft_pass_s + s.draft_token_s * t.pad(5)
                   + 3 * s.draft_seq_s) * s.draft_serving_scale
        work, launch = t.step_times(5, 1, 0.0, 600)
        assert drafter > 0
        assert launch == pytest.approx(s.core_graph_s + drafter if holds else s.core_graph_s)
        assert work > launch, key
