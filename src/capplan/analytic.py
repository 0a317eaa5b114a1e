"""The analytic profile: a roofline from the GPU datasheet and the model spec, not a measurement.

Used until a measured profile exists for a configuration. Every efficiency factor is a named
constant below with the reason for its value; change one and the provenance note records it.
Mapping onto the step model of `capplan.profile`:

    weight floor  = streamed weight bytes / (HBM bandwidth x HBM_EFFICIENCY)
    per_token_s   = GEMM FLOPs per token / (peak x MFU) [+ sliding-window attention, all-reduce]
    knee_tokens   = weight floor / per_token_s  (below: a step streams weights; above: computes)
    fixed_s       = step overhead + per-layer kernel gaps [+ all-reduce latency]
    decode_ctx_s  = KV bytes per context token of full-attention layers / (bandwidth x efficiency)
    prefill_attn_s= attention FLOPs per (query x attended token) / (peak x ATTN_MFU)
    draft costs   = one extra layer (MTP/EAGLE) or the draft model's own weights, per draft pass
"""

from __future__ import annotations

import math

from capplan.errors import ConfigError
from capplan.hardware import GpuSpec, Precision
from capplan.kvlayout import derive_layout, max_in_flight_tokens
from capplan.modelspec import ModelSpec
from capplan.pool import EngineConfig
from capplan.profile import Box, KvCapacity, Profile, Provenance, StepModel

GiB = 2**30

# --- efficiency factors (fractions of the datasheet peak) -----------------------------------
HBM_EFFICIENCY = 0.80
"""Weight streaming in decode GEMMs reaches ~80 % of datasheet HBM bandwidth on H100/H200."""
KV_READ_EFFICIENCY = 0.60
"""Paged decode attention gathers 16-token blocks through a block table: lower than streaming."""
MFU: dict[Precision, float] = {
    Precision.BF16: 0.55,  # large cuBLAS/CUTLASS BF16 GEMMs on Hopper, end to end in a layer
    Precision.FP8: 0.45,  # dynamic per-token activation quantisation eats part of the 2x peak
    Precision.NVFP4: 0.40,  # weight-only FP4 (Marlin) dequantises in the mainloop on Hopper
    Precision.AWQ: 0.40,  # weight-only INT4 (Machete) pays the same dequantisation cost
}
"""Achievable fraction of the dense matmul peak at large token counts, per precision."""
ATTN_MFU = 0.40
"""FlashAttention-3 prefill forward on Hopper: ~40 % of BF16 peak once masking is counted."""

# --- fixed costs ----------------------------------------------------------------------------
STEP_OVERHEAD_S = 1.0e-3
"""Scheduler, input preparation and sampling launch per step that async scheduling cannot hide."""
LAYER_OVERHEAD_S = 12e-6
"""Gaps between a layer's small kernels (norms, rotary, activation) even inside a CUDA graph."""
PER_SEQ_S = 8e-6
"""Per-sequence input preparation, sampling and output bookkeeping."""
NVLINK_BYTES_PER_S = 450e9
"""Effective one-direction NVLink 4 bandwidth an all-reduce achieves (assumed, not measured)."""
ALLREDUCE_LATENCY_S = 10e-6
"""Latency of one small-message all-reduce (vLLM's custom all-reduce), paid twice per layer."""
DRAFT_PASS_OVERHEAD_S = 150e-6
"""Proposer bookkeeping and launch per draft pass (input ids, positions, slot mapping)."""
NGRAM_PASS_S = 50e-6
"""CPU n-gram lookup per draft pass; it reads no weights."""

# --- memory reservations ---------------------------------------------------------------------
NON_TORCH_BYTES = 1 * GiB
"""CUDA context and cuBLAS workspaces, outside torch's allocator but inside the utilisation."""
CUDAGRAPH_BYTES = GiB // 2
"""Private memory pools of the captured CUDA graphs."""
NCCL_BYTES = GiB // 2
"""NCCL and custom all-reduce buffers per GPU when TP > 1."""
ACTIVATION_BYTES_PER_TOKEN_FACTOR = 2
"""BF16 bytes per element of the profiling run's live activations (gate/up outputs, residuals)."""
SAMPLER_COPIES = 2
"""The dummy sampler run holds FP32 logits for max_num_seqs rows about twice (logits, probs)."""
VISION_ACT_BYTES_PER_IMAGE_TOKEN = 240_000
"""Encoder activation per soft image token: Gemma 4's tower has 9 patches per token, each
holding ~(2 x 4304 + 4 x 1152) BF16 values at its MLP peak (~26 KB x 9)."""

BOX_MAX_TOKENS = 65_536
BOX_MAX_SEQS = 4_096


def _kv_dtype_bytes(kv_cache_dtype: str) -> int:
    if kv_cache_dtype not in ("auto", "fp8"):
        raise ConfigError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; use 'auto' or 'fp8'")
    return 1 if kv_cache_dtype == "fp8" else 2


def _heads_per_gpu(heads: int, tp: int) -> int:
    """KV heads each GPU stores: split by TP, replicated once TP exceeds the head count."""
    return max(1, math.ceil(heads / tp))


def _layer_kv_bytes(spec: ModelSpec, tp: int, kvb: int) -> tuple[float, float]:
    """(full-attention, sliding-window) KV bytes per token on one GPU, summed over layers."""
    global_layers = spec.num_layers - spec.sliding_window_layers
    g_heads = _heads_per_gpu(spec.num_global_kv_heads or spec.num_kv_heads, tp)
    g_dim = spec.global_head_dim or spec.head_dim
    full = global_layers * 2 * g_heads * g_dim * kvb
    local = spec.sliding_window_layers * 2 * _heads_per_gpu(spec.num_kv_heads, tp) * spec.head_dim
    return float(full), float(local * kvb)


def _streamed_bytes(spec: ModelSpec, precision: Precision, tp: int) -> float:
    """Weight bytes one GPU reads per forward pass: the linears and the LM head (not the
    embedding table, of which a step reads only the looked-up rows)."""
    lm_head = spec.vocab_size * spec.hidden_size * 2
    return (spec.linear_params * precision.weight_bytes_per_param + lm_head) / tp


def _draft_costs(
    spec: ModelSpec,
    gpu: GpuSpec,
    precision: Precision,
    tp: int,
    method: str | None,
    k: int,
    draft: ModelSpec | None,
    kvb: int,
) -> tuple[float, float, float, float, str]:
    """(draft_pass_s, per-token cost of one draft pass, draft weight bytes per GPU, draft KV
    bytes per token per GPU, note) for the speculative method. The per-token cost prices both
    the first pass's tokens (`draft_token_s`) and the later passes' one token a request
    (`draft_seq_s`): the same forward pass through the drafter."""
    if not k:
        return 0.0, 0.0, 0.0, 0.0, ""
    bw = gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    lm_head = spec.vocab_size * spec.hidden_size * 2
    if method in ("mtp", "eagle", "eagle3"):
        # one extra decoder layer of the target's shape plus the (shared) LM head
        layer_bytes = spec.layer_params * precision.weight_bytes_per_param
        pass_s = (layer_bytes + lm_head) / tp / bw + DRAFT_PASS_OVERHEAD_S + LAYER_OVERHEAD_S
        flops = 2.0 * (spec.layer_params + spec.vocab_size * spec.hidden_size) / tp
        token_s = flops / (gpu.matmul_flops(precision) * MFU[precision])
        kv = 2 * _heads_per_gpu(spec.num_kv_heads, tp) * spec.head_dim * kvb
        return pass_s, token_s, layer_bytes / tp, float(kv), f"{method}: one extra layer per pass"
    if method == "draft_model":
        if draft is None:
            raise ConfigError("spec_method 'draft_model' needs a draft model spec (draft=...)")
        d_bytes = _streamed_bytes(draft, Precision.BF16, tp)
        pass_s = d_bytes / bw + DRAFT_PASS_OVERHEAD_S + draft.num_layers * LAYER_OVERHEAD_S
        token_s = draft.flops_per_token() / tp / (gpu.bf16_flops * MFU[Precision.BF16])
        d_kv = sum(_layer_kv_bytes(draft, tp, kvb))
        note = f"draft_model: {draft.name} in BF16 per pass"
        return pass_s, token_s, draft.weight_bytes(Precision.BF16) / tp, d_kv, note
    if method == "ngram":
        return NGRAM_PASS_S, 0.0, 0.0, 0.0, "ngram: CPU lookup, no weights"
    raise ConfigError(
        f"unknown speculative method {method!r}; known: mtp, eagle, eagle3, draft_model, ngram"
    )


def analytic_profile(
    spec: ModelSpec,
    gpu: GpuSpec,
    precision: Precision,
    *,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    spec_method: str | None = None,
    spec_k: int = 0,
    engine: EngineConfig | None = None,
    draft: ModelSpec | None = None,
) -> Profile:
    """A `source: analytic` profile for (gpu, model, precision, TP, KV dtype, spec decode)."""
    if not isinstance(precision, Precision):
        raise ConfigError(f"precision {precision!r} must be concrete (bf16, fp8, nvfp4, awq)")
    if tp < 1 or spec.num_attention_heads % tp:
        raise ConfigError(
            f"tp={tp} does not divide {spec.name}'s {spec.num_attention_heads} attention heads"
        )
    kvb = _kv_dtype_bytes(kv_cache_dtype)
    if engine is None:
        engine = EngineConfig(kv_cache_dtype="fp8" if kvb == 1 else "auto")
    elif kvb == 2 and engine.kv_cache_dtype == "fp8":
        kvb = 1  # the engine's setting wins over the default argument
    if spec_method is None and not spec_k and engine.speculative is not None:
        spec_method = engine.speculative.method
        spec_k = engine.speculative.num_speculative_tokens
    if spec_k and spec_method is None:
        raise ConfigError(f"spec_k={spec_k} needs a spec_method")
    if not spec_k:
        spec_method = None

    bw = gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    kv_bw = gpu.hbm_bytes_per_s * KV_READ_EFFICIENCY
    peak = gpu.matmul_flops(precision) * MFU[precision]
    attn_peak = gpu.bf16_flops * ATTN_MFU  # attention runs in BF16 whatever the weights

    # GEMMs: weight floor below the knee, compute above it
    weight_floor_s = _streamed_bytes(spec, precision, tp) / bw
    gemm_token_s = spec.flops_per_token() / tp / peak
    heads = spec.num_attention_heads // tp
    global_layers = spec.num_layers - spec.sliding_window_layers
    g_dim = spec.global_head_dim or spec.head_dim
    # sliding-window layers attend at most `window` tokens: a per-token cost, not a context one
    window = spec.sliding_window or 0
    swa_token_s = 4.0 * heads * spec.head_dim * window * spec.sliding_window_layers / attn_peak
    allreduce_token_s = 0.0
    fixed_s = STEP_OVERHEAD_S + spec.num_layers * LAYER_OVERHEAD_S
    if tp > 1:
        ring = 2 * (tp - 1) / tp  # bytes each GPU moves per byte reduced (ring all-reduce)
        allreduce_token_s = 2 * spec.num_layers * ring * spec.hidden_size * 2 / NVLINK_BYTES_PER_S
        fixed_s += 2 * spec.num_layers * ALLREDUCE_LATENCY_S
    per_token_s = gemm_token_s + swa_token_s + allreduce_token_s
    knee_tokens = weight_floor_s / per_token_s

    # attention: full layers scale with context; sliding layers' KV read is capped per sequence
    if spec.sliding_window_layers:
        pair_flops = 4.0 * heads * g_dim * global_layers
    else:
        pair_flops = spec.attention_flops(1, 1) / tp
    full_kv, local_kv = _layer_kv_bytes(spec, tp, kvb)
    per_seq_s = PER_SEQ_S + local_kv * window / kv_bw

    d_pass, d_token, d_weights, d_kv, d_note = _draft_costs(
        spec, gpu, precision, tp, spec_method, spec_k, draft, kvb
    )
    step = StepModel(
        fixed_s=fixed_s,
        per_token_s=per_token_s,
        knee_tokens=knee_tokens,
        prefill_attn_s=pair_flops / attn_peak,
        decode_ctx_s=full_kv / kv_bw,
        per_seq_s=per_seq_s,
        draft_pass_s=d_pass,
        draft_token_s=d_token,
        draft_seq_s=d_token,
        # the ViT runs on every patch of an image token, in BF16, unsharded by TP here
        encoder_token_s=spec.encoder_flops_per_image_token()
        / (gpu.bf16_flops * MFU[Precision.BF16]),
    )

    kv = _kv_capacity(spec, gpu, precision, tp, engine, full_kv, local_kv, d_weights, d_kv)
    max_model_len = engine.max_model_len or spec.max_position_embeddings
    note = (
        f"analytic: not calibrated; roofline from '{gpu.source}' and models/{spec.name}; "
        f"HBM x{HBM_EFFICIENCY}, KV read x{KV_READ_EFFICIENCY}, MFU x{MFU[precision]}, "
        f"attention x{ATTN_MFU}, step overhead {STEP_OVERHEAD_S * 1e3:.1f} ms"
    )
    if tp > 1:
        note += f"; TP={tp} all-reduce at an assumed {NVLINK_BYTES_PER_S / 1e9:.0f} GB/s NVLink"
    if d_note:
        note += f"; {d_note}"
    if kv.pooled:
        note += ("; KV as vLLM lays it out: one pool shared by the full-attention and "
                 "sliding-window groups (a sliding group holds only its window)")
    return Profile(
        gpu=gpu.name,
        model=spec.name,
        precision=precision.value,
        tp=tp,
        kv_cache_dtype="fp8" if kvb == 1 else "auto",
        spec_method=spec_method,
        spec_k=spec_k,
        step=step,
        kv=kv,
        box=Box(
            max_tokens=BOX_MAX_TOKENS, max_seqs=BOX_MAX_SEQS, max_context_tokens=max_model_len
        ),
        provenance=Provenance(source="analytic", note=note),
        engine=engine.model_dump(mode="json"),
    )


def _kv_capacity(
    spec: ModelSpec,
    gpu: GpuSpec,
    precision: Precision,
    tp: int,
    engine: EngineConfig,
    full_kv: float,
    local_kv: float,
    draft_weight_bytes: float,
    draft_kv: float,
) -> KvCapacity:
    """tokens = (util x GPU memory - weights - reservations) / KV bytes per token, per GPU.

    A model with sliding-window layers gets vLLM's layout instead (kvlayout.py, the same the
    measured profiles record): a pool of blocks, blocks = (util x memory - weights -
    reservations) / bytes per block, and the tokens vLLM would report for it, requests at
    max_model_len (kv_cache_utils.py get_kv_cache_capacity). The drafter's KV is not added
    there: Gemma 4's MTP engines measured the same bytes per block as the target alone."""
    max_model_len = engine.max_model_len or spec.max_position_embeddings
    kvb = 1 if engine.kv_cache_dtype == "fp8" else 2
    layout = (derive_layout(spec, block_size=engine.block_size, kv_dtype_bytes=kvb, tp=tp)
              if spec.sliding_window_layers and spec.sliding_window else None)
    if layout is not None and layout.hybrid:
        per_req = layout.max_blocks_per_request(
            max_model_len,
            max_in_flight_tokens(engine.max_num_batched_tokens, engine.async_scheduling))
        # a block's bytes per vLLM token (requests at max_model_len)
        per_gpu = layout.block_bytes * per_req / max_model_len
    else:
        layout = None
        window = spec.sliding_window or 0
        local_share = min(1.0, (window + engine.block_size) / max_model_len) if window else 1.0
        per_gpu = full_kv + local_kv * local_share + draft_kv
    weights = spec.weight_bytes(precision) / tp + draft_weight_bytes
    activation = (
        engine.max_num_batched_tokens
        * (2 * spec.intermediate_size / tp + 4 * spec.hidden_size)
        * ACTIVATION_BYTES_PER_TOKEN_FACTOR
    )
    sampler = engine.max_num_seqs * spec.vocab_size * 4 * SAMPLER_COPIES
    reserve = NON_TORCH_BYTES + CUDAGRAPH_BYTES + max(activation, sampler)
    if tp > 1:
        reserve += NCCL_BYTES
    image_tokens = 0.0
    if spec.vision_encoder_params:
        # vllm/v1/core/encoder_cache_manager.py (compute_encoder_budget): the profiling run
        # encodes max(max_num_batched_tokens, tokens of one image) image tokens and keeps them
        budget = max(engine.max_num_batched_tokens, spec.image_tokens_per_image)
        image_bytes = budget * (VISION_ACT_BYTES_PER_IMAGE_TOKEN + spec.hidden_size * 2)
        image_tokens = image_bytes / per_gpu
    pool: dict[str, object] = {}
    if layout is not None:
        block = layout.block_bytes
        pool = {"layout": layout, "slope_blocks": gpu.memory_bytes / block,
                "intercept_blocks": (weights + reserve) / block,
                "image_reservation_blocks": image_tokens * per_gpu / block}
    return KvCapacity(
        bytes_per_token=max(1, round(per_gpu * tp)),
        slope_tokens=gpu.memory_bytes / per_gpu,
        intercept_tokens=(weights + reserve) / per_gpu,
        image_reservation_tokens=image_tokens,
        **pool,
    )
