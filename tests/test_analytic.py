"""The analytic roofline profile: physically sane bounds, not calibrated figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capplan import analytic
from capplan.analytic import analytic_profile
from capplan.errors import ConfigError
from capplan.hardware import GPUS, Precision
from capplan.modelspec import load_model_spec
from capplan.pool import EngineConfig, SpeculativeConfig
from capplan.profile import Profile
from capplan.steptime import StepTimer

H200 = GPUS["h200"]
LLAMA8 = load_model_spec("llama-3.1-8b")
GEMMA = load_model_spec("gemma-4-31b")


def _timer(p: Profile) -> StepTimer:
    return StepTimer(p, max_num_seqs=1024, max_num_batched_tokens=8192)


def _prefill_s(p: Profile, tokens: int) -> float:
    """One step prefilling a fresh prompt of `tokens` tokens."""
    return _timer(p).step_time_s(tokens, 1, tokens * (tokens / 2), 0)


def test_profile_is_labelled_analytic_and_uncalibrated() -> None:
    """An analytic profile says so: source 'analytic' and a note 'not calibrated'."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    assert p.source == "analytic"
    assert "not calibrated" in p.provenance.note
    assert (p.gpu, p.model, p.precision, p.tp, p.vllm_version) == (
        "h200", "llama-3.1-8b", "bf16", 1, "0.26.0"
    )


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-32b", "gemma-4-31b"])
@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8, Precision.NVFP4])
def test_decode_step_at_batch_one_reads_every_weight(name: str, precision: Precision) -> None:
    """Roofline floor: a batch-1 decode step takes at least weight bytes / HBM bandwidth."""
    spec = load_model_spec(name)
    p = analytic_profile(spec, H200, precision)
    t = _timer(p).step_time_s(1, 1, 0, 100)
    assert t >= spec.linear_params * precision.weight_bytes_per_param / H200.hbm_bytes_per_s


def test_llama_8b_bf16_decode_floor() -> None:
    """Llama-3.1-8B BF16 batch-1 decode on H200 >= 16.06 GB / 4.8 TB/s = 3.35 ms."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    t = _timer(p).step_time_s(1, 1, 0, 100)
    assert t >= LLAMA8.weight_bytes(Precision.BF16) / H200.hbm_bytes_per_s
    assert t < 10e-3  # and not absurdly above it


def test_knee_is_where_weight_streaming_meets_compute() -> None:
    """At knee_tokens the GEMM compute time equals the weight-streaming time."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    streamed = (LLAMA8.linear_params * 2 + LLAMA8.vocab_size * LLAMA8.hidden_size * 2)
    floor_s = streamed / (H200.hbm_bytes_per_s * analytic.HBM_EFFICIENCY)
    assert p.step.per_token_s * p.step.knee_tokens == pytest.approx(floor_s)
    assert 50 < p.step.knee_tokens < 1000


@given(st.integers(1, 16_000), st.integers(1, 16_000))
def test_prefill_time_is_monotone_in_tokens(a: int, b: int) -> None:
    """More prompt tokens in a step never take less time."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    lo, hi = sorted((a, b))
    assert _prefill_s(p, lo) <= _prefill_s(p, hi)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-32b", "gemma-4-31b"])
def test_fp8_beats_bf16_at_large_prefill(name: str) -> None:
    """FP8 GEMMs run on the 1979 TFLOP/s path: an 8192-token prefill is faster than in BF16."""
    spec = load_model_spec(name)
    bf16 = analytic_profile(spec, H200, Precision.BF16)
    fp8 = analytic_profile(spec, H200, Precision.FP8)
    assert _prefill_s(fp8, 8192) < _prefill_s(bf16, 8192)


def test_decode_time_grows_with_context() -> None:
    """Decode attention reads the KV cache: more context, longer step."""
    t = _timer(analytic_profile(LLAMA8, H200, Precision.BF16))
    assert t.step_time_s(64, 64, 0, 64 * 100) < t.step_time_s(64, 64, 0, 64 * 8000)


def test_kv_bytes_per_token_and_fp8_kv() -> None:
    """KV bytes/token come from the spec (131,072 for Llama-3.1-8B); FP8 KV halves them and
    raises capacity."""
    bf16 = analytic_profile(LLAMA8, H200, Precision.BF16)
    kv8 = analytic_profile(LLAMA8, H200, Precision.BF16, kv_cache_dtype="fp8")
    assert bf16.kv.bytes_per_token == 131_072
    assert kv8.kv.bytes_per_token == 65_536
    assert kv8.kv_cache_dtype == "fp8" and kv8.key == "bf16-kvfp8"
    assert kv8.kv.tokens(0.9) > 1.9 * bf16.kv.tokens(0.9)


def test_kv_capacity_is_memory_left_after_weights() -> None:
    """Capacity at utilisation u lies between (u*M - weights - 8 GiB) and (u*M - weights),
    divided by KV bytes per token."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    free = 0.9 * H200.memory_bytes - LLAMA8.weight_bytes(Precision.BF16)
    tokens = p.kv.tokens(0.9)
    assert (free - 8 * 2**30) / 131_072 < tokens < free / 131_072


@given(st.floats(0.5, 0.99), st.floats(0.5, 0.99))
def test_kv_capacity_rises_with_memory_utilisation(u1: float, u2: float) -> None:
    """gpu_memory_utilization only moves KV capacity, and never downwards as it grows."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    lo, hi = sorted((u1, u2))
    assert p.kv.tokens(lo) <= p.kv.tokens(hi)


def test_vision_encoder_reserves_kv_only_for_multimodal_models() -> None:
    """Gemma 4's vision encoder profiling takes KV tokens unless the pool is text-only;
    a text model reserves nothing."""
    g = analytic_profile(GEMMA, H200, Precision.BF16)
    assert g.kv.image_reservation_tokens > 0
    assert g.kv.tokens(0.9, text_only=True) > g.kv.tokens(0.9, text_only=False)
    assert analytic_profile(LLAMA8, H200, Precision.BF16).kv.image_reservation_tokens == 0


def test_vision_encoder_runs_on_every_patch_of_an_image_token() -> None:
    """Gemma 4 pools 3 x 3 patches into one image token, and its encoder's layers run on
    every patch: a 280-token picture costs at least its 2,520 patches' linear FLOPs at the
    matmul peak (2.8 ms on the H200), not one token's (0.3 ms)."""
    p = analytic_profile(GEMMA, H200, Precision.FP8)
    tower = 27 * (4 * 1152**2 + 3 * 1152 * 4304)  # vision_config: layers x (attention + MLP)
    floor = 2 * tower * 280 * 9 / H200.bf16_flops
    assert p.step.encoder_token_s * 280 > floor > 2.5e-3
    assert p.step.encoder_token_s * 280 < 4 * floor  # and within the MFU's reach of it


def test_sliding_window_layers_cost_less_at_long_max_model_len() -> None:
    """Sliding-window layers keep only the window: per-token KV (vLLM's tokens: requests at
    max_model_len) falls as max_model_len grows past the window plus the tokens in flight
    (below that, vLLM reserves a sliding group as much as a full one, plus a block)."""
    short = analytic_profile(GEMMA, H200, Precision.BF16,
                             engine=EngineConfig(max_model_len=32768))
    long = analytic_profile(GEMMA, H200, Precision.BF16, engine=EngineConfig(max_model_len=131072))
    assert long.kv.bytes_per_token < short.kv.bytes_per_token < GEMMA.kv_bytes_per_token(2)


def test_box_is_generous_and_bounded_by_the_model() -> None:
    """The analytic box is wide (no calibration) and its context is the model's maximum."""
    p = analytic_profile(LLAMA8, H200, Precision.BF16)
    assert p.box.max_tokens >= 65_536 and p.box.max_seqs >= 4096
    assert p.box.max_context_tokens == LLAMA8.max_position_embeddings


def test_tensor_parallel_splits_work_and_flags_all_reduce() -> None:
    """TP=4 decodes a 70B step faster than TP=2, and the note flags the all-reduce assumption."""
    spec = load_model_spec("llama-3.3-70b")
    tp2 = analytic_profile(spec, H200, Precision.BF16, tp=2)
    tp4 = analytic_profile(spec, H200, Precision.BF16, tp=4)
    assert _timer(tp4).step_time_s(1, 1, 0, 100) < _timer(tp2).step_time_s(1, 1, 0, 100)
    assert "all-reduce" in tp4.provenance.note and "NVLink" in tp4.provenance.note
    assert tp4.kv.tokens(0.9) > tp2.kv.tokens(0.9)


def test_tp_must_divide_the_heads() -> None:
    """A TP size that does not divide the attention heads is a ConfigError."""
    with pytest.raises(ConfigError, match="tp=3"):
        analytic_profile(LLAMA8, H200, Precision.BF16, tp=3)


def test_mtp_adds_a_draft_pass_per_speculative_token() -> None:
    """MTP costs one extra layer per draft pass; the profile carries method and k."""
    p = analytic_profile(GEMMA, H200, Precision.BF16, spec_method="mtp", spec_k=4)
    assert p.key == "bf16-mtp4"
    layer_s = GEMMA.layer_params * 2 / H200.hbm_bytes_per_s
    assert p.step.draft_pass_s > layer_s
    base = analytic_profile(GEMMA, H200, Precision.BF16)
    t = StepTimer(p, max_num_seqs=64, max_num_batched_tokens=8192)
    t0 = StepTimer(base, max_num_seqs=64, max_num_batched_tokens=8192)
    assert t.step_time_s(5, 1, 0, 100) > t0.step_time_s(5, 1, 0, 100) + 4 * p.step.draft_pass_s


def test_speculative_settings_come_from_the_engine() -> None:
    """Without explicit arguments, the engine's speculative config sets method and k."""
    eng = EngineConfig(speculative=SpeculativeConfig(method="mtp", num_speculative_tokens=2))
    p = analytic_profile(GEMMA, H200, Precision.BF16, engine=eng)
    assert (p.spec_method, p.spec_k) == ("mtp", 2)


def test_draft_model_cost_follows_the_draft() -> None:
    """draft_model streams the draft's own weights; without a draft spec it is a ConfigError."""
    draft = load_model_spec("llama-3.2-1b")
    p = analytic_profile(
        LLAMA8, H200, Precision.BF16, spec_method="draft_model", spec_k=4, draft=draft
    )
    assert p.step.draft_pass_s >= draft.linear_params * 2 / H200.hbm_bytes_per_s
    with pytest.raises(ConfigError, match="draft"):
        analytic_profile(LLAMA8, H200, Precision.BF16, spec_method="draft_model", spec_k=4)


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8])
def test_sliding_window_model_gets_vllms_pool(precision: Precision) -> None:
    """Gemma 4 31B analytic: the same KV layout as its measured profile (one pool shared by a
    full-attention group and five sliding-window groups), the pool within 2 % of the blocks
    measured at 0.90, and vLLM's token figure for requests at max_model_len."""
    from pathlib import Path

    from capplan.kvlayout import max_in_flight_tokens
    from capplan.pool import EngineConfig
    from capplan.profile import Profile

    root = Path(__file__).resolve().parents[1] / "calibration" / "h200" / "vllm-0.26.0"
    measured = Profile.load(root / "gemma-4-31b" / precision.value)
    eng = EngineConfig(max_model_len=32768)
    a = analytic_profile(GEMMA, H200, precision, engine=eng)
    assert a.kv.pooled and a.kv.layout == measured.kv.layout
    assert a.kv.blocks(0.9) == pytest.approx(measured.kv.blocks(0.9), rel=0.02)
    per_req = a.kv.layout.max_blocks_per_request(32768, max_in_flight_tokens(8192, True))
    assert a.kv.tokens(0.9) == pytest.approx(a.kv.blocks(0.9) * 32768 / per_req, rel=1e-3)
    assert "one pool shared" in a.provenance.note
    assert not analytic_profile(LLAMA8, H200, precision).kv.pooled
