"""Model architecture specs, kept as data under `models/<name>/spec.yaml`.

A spec holds what sizing needs: parameter counts per precision (weight bytes) and KV bytes
per token. `models/<name>/config.json` beside it is the Hugging Face config vLLM loads
with dummy weights during calibration.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capplan._yaml import load_model, read_mapping
from capplan.errors import ConfigError
from capplan.hardware import Precision

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


class MtpDrafter(BaseModel):
    """A multi-token-prediction drafter that ships as its own checkpoint (Gemma 4's
    "assistant"); vLLM 0.26.0 runs it with `--speculative-config '{"method": "mtp",
    "model": ...}'` (vllm/config/speculative.py: gemma4_assistant -> gemma4_mtp)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hf_id: str = Field(description="the drafter's Hugging Face id, for `vllm serve`")
    config: str = Field(description="models/<folder> holding its config.json, for dummy weights")
    source: str = Field(description="where the config's figures came from")

    @property
    def config_dir(self) -> Path:
        return MODELS_DIR / self.config


class ModelSpec(BaseModel):
    """A dense decoder's shape; weight and KV sizes follow from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    name: str
    hf_id: str
    source: str = Field(description="where the figures came from (the config.json's origin)")
    architecture: str
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(gt=0)
    sliding_window: int | None = Field(default=None, gt=0)
    sliding_window_layers: int = Field(default=0, ge=0, description="layers with local attention")
    num_global_kv_heads: int | None = Field(
        default=None, gt=0, description="KV heads of global layers, where they differ"
    )
    global_head_dim: int | None = Field(default=None, gt=0)
    vision_encoder_params: int = Field(default=0, ge=0)
    image_tokens_per_image: int = Field(default=0, ge=0)
    vision_patches_per_token: int = Field(
        default=1, gt=0, description="encoder patches pooled into one image token"
    )
    vision_layers: int = Field(default=0, ge=0, description="the vision encoder's layers")
    vision_hidden_size: int = Field(default=0, ge=0, description="the vision encoder's width")
    images_whole: bool = Field(
        default=False,
        description="vLLM schedules a picture's tokens in one step (disable_chunked_mm_input, "
        "forced for models with bidirectional attention within a picture)",
    )
    vllm_hf_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM `hf_overrides` this config needs to build (calibration, validation)",
    )
    mtp_drafter: MtpDrafter | None = Field(
        default=None, description="the separate MTP drafter, where the model has one"
    )

    @cached_property
    def layer_params(self) -> int:
        """Linear-layer parameters of one decoder layer (attention + gated MLP)."""
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q + kv + o + mlp

    @cached_property
    def global_layer_params(self) -> int:
        """Linear parameters of one global (full-attention) layer, whose heads may be wider."""
        g_heads = self.num_global_kv_heads or self.num_kv_heads
        g_dim = self.global_head_dim or self.head_dim
        q = o = self.hidden_size * self.num_attention_heads * g_dim
        kv = 2 * self.hidden_size * g_heads * g_dim  # counts V even where K doubles as V
        return q + kv + o + 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def linear_params(self) -> int:
        """Parameters that quantisation shrinks: every decoder layer's linears."""
        global_layers = self.num_layers - self.sliding_window_layers
        local = self.sliding_window_layers * self.layer_params
        return local + global_layers * self.global_layer_params

    @cached_property
    def embedding_params(self) -> int:
        """Embedding plus LM head; vLLM keeps both in BF16 under every precision here."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def weight_bytes(self, precision: Precision) -> int:
        """Bytes of weights one GPU holds at TP=1 (vision encoder in BF16)."""
        linear = self.linear_params * precision.weight_bytes_per_param
        return int(linear + 2 * (self.embedding_params + self.vision_encoder_params))

    def encoder_flops_per_image_token(self) -> float:
        """FLOPs the vision encoder spends on one image token at `image_tokens_per_image` a
        picture: it runs on `vision_patches_per_token` patches per token (2 FLOPs a parameter
        each), and each layer's attention runs over all the picture's patches (4 x width
        FLOPs a patch pair: scores and values)."""
        ppt = self.vision_patches_per_token
        patches = self.image_tokens_per_image * ppt
        attention = 4 * self.vision_layers * self.vision_hidden_size * patches
        return float(ppt * (2 * self.vision_encoder_params + attention))

    def kv_bytes_per_layer_token(self, kv_dtype_bytes: int = 2) -> int:
        """KV bytes one token takes in one full-attention layer (K and V)."""
        g_heads = self.num_global_kv_heads or self.num_kv_heads
        return 2 * g_heads * (self.global_head_dim or self.head_dim) * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        """KV bytes one token takes across all layers (K and V)."""
        global_layers = self.num_layers - self.sliding_window_layers
        per_local = 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes
        return (global_layers * self.kv_bytes_per_layer_token(kv_dtype_bytes)
                + self.sliding_window_layers * per_local)

    def flops_per_token(self) -> float:
        """Matmul FLOPs per token through the linears and LM head (2 per multiply-add)."""
        return 2.0 * (self.linear_params + self.vocab_size * self.hidden_size)

    def attention_flops(self, query_tokens: int, context_tokens: int) -> float:
        """FLOPs of QK^T and PV for `query_tokens` attending over `context_tokens`."""
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * (
            query_tokens * context_tokens
        )

    @property
    def config_path(self) -> Path:
        return MODELS_DIR / self.name / "config.json"


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A spec by name (`models/<name>/spec.yaml`) or by path to a spec file or its folder."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "spec.yaml"
    elif p.suffix not in (".yaml", ".yml", ".json"):  # a bare name; "llama-3.1-8b" has a "suffix"
        p = MODELS_DIR / str(name_or_path) / "spec.yaml"
    if not p.exists():
        known = sorted(d.name for d in MODELS_DIR.iterdir() if (d / "spec.yaml").exists())
        raise ConfigError(
            f"unknown model {name_or_path!r}; known: {', '.join(known)}", file=str(p)
        )
    return load_model(ModelSpec, read_mapping(p), file=str(p))
