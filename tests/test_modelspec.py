"""Model specs under models/: shapes, weight bytes and KV bytes per token."""

from __future__ import annotations

import json

import pytest

from capplan.errors import ConfigError
from capplan.hardware import Precision
from capplan.modelspec import MODELS_DIR, load_model_spec

SHIPPED = ["llama-3.1-8b", "llama-3.3-70b", "qwen3-32b", "gemma-4-31b", "llama-3.2-1b"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_spec_loads_and_agrees_with_its_config(name: str) -> None:
    """A spec's shapes are the Hugging Face config's, and the config keeps bf16 and its arch."""
    spec = load_model_spec(name)
    cfg = json.loads(spec.config_path.read_text())
    text = cfg.get("text_config", cfg)
    assert cfg["architectures"] == [spec.architecture]
    assert cfg["torch_dtype"] == "bfloat16"
    assert text["hidden_size"] == spec.hidden_size
    assert text["num_hidden_layers"] == spec.num_layers
    assert text["num_attention_heads"] == spec.num_attention_heads
    assert text["num_key_value_heads"] == spec.num_kv_heads
    assert text["intermediate_size"] == spec.intermediate_size
    assert text["vocab_size"] == spec.vocab_size
    assert text["max_position_embeddings"] == spec.max_position_embeddings
    assert text.get("head_dim", spec.hidden_size // spec.num_attention_heads) == spec.head_dim
    assert spec.source.strip(), "every spec says where its figures came from"


def test_llama_8b_bf16_weight_bytes() -> None:
    """Llama-3.1-8B holds 8.03 B parameters: 16.06 GB in BF16, within 2 %."""
    spec = load_model_spec("llama-3.1-8b")
    assert spec.weight_bytes(Precision.BF16) == pytest.approx(16.06e9, rel=0.02)


def test_llama_8b_kv_bytes_per_token() -> None:
    """KV per token = layers x 2 (K, V) x KV heads x head dim x dtype: 131,072 B in BF16."""
    spec = load_model_spec("llama-3.1-8b")
    assert spec.kv_bytes_per_token(2) == 131_072
    assert spec.kv_bytes_per_token(1) == 65_536


@pytest.mark.parametrize(
    ("name", "params_b"),
    [("llama-3.3-70b", 70.55), ("qwen3-32b", 32.76), ("llama-3.2-1b", 1.24), ("gemma-4-31b", 30.7)],
)
def test_parameter_counts_match_the_published_sizes(name: str, params_b: float) -> None:
    """Linear + embedding parameters land within 1 % of each model's published size."""
    spec = load_model_spec(name)
    total = spec.linear_params + spec.embedding_params
    assert total / 1e9 == pytest.approx(params_b, rel=0.01)


def test_gemma_global_layers_use_their_own_heads() -> None:
    """Gemma 4 31B: 50 sliding layers (16 x 256 KV) and 10 global ones (4 x 512 KV)."""
    spec = load_model_spec("gemma-4-31b")
    assert spec.kv_bytes_per_token(2) == 50 * 2 * 16 * 256 * 2 + 10 * 2 * 4 * 512 * 2
    assert spec.global_layer_params > spec.layer_params  # q and o are twice as wide
    assert spec.vision_encoder_params > 0 and spec.image_tokens_per_image == 280


def test_fp8_halves_linear_weights() -> None:
    """FP8 stores each linear weight in one byte; embeddings stay BF16."""
    spec = load_model_spec("qwen3-32b")
    saved = spec.weight_bytes(Precision.BF16) - spec.weight_bytes(Precision.FP8)
    assert saved == spec.linear_params


def test_unknown_model_names_the_known_ones() -> None:
    """An unknown model name is a ConfigError that lists the models capplan knows."""
    with pytest.raises(ConfigError) as e:
        load_model_spec("llama-9-900b")
    for name in SHIPPED:
        assert name in str(e.value)


def test_typo_in_a_spec_key_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A misspelt key in spec.yaml is rejected, naming the key and the file."""
    text = (MODELS_DIR / "llama-3.1-8b" / "spec.yaml").read_text()
    bad = tmp_path / "spec.yaml"
    bad.write_text(text.replace("num_kv_heads", "num_kv_head"))
    with pytest.raises(ConfigError, match="num_kv_head") as e:
        load_model_spec(bad)
    assert str(bad) in str(e.value)


def test_gemma_mtp_drafter_fits_its_target() -> None:
    """The Gemma 4 drafter reads the target's KV (every layer KV-shared) and its hidden state:
    its attention shapes, vocabulary and backbone width must be the target's, and its config
    must pass what transformers' Gemma4AssistantConfig validates."""
    spec = load_model_spec("gemma-4-31b")
    assert spec.mtp_drafter is not None and spec.mtp_drafter.hf_id.endswith("-assistant")
    cfg = json.loads((spec.mtp_drafter.config_dir / "config.json").read_text())
    text = cfg["text_config"]
    assert cfg["model_type"] == "gemma4_assistant"
    assert cfg["backbone_hidden_size"] == spec.hidden_size
    assert text["vocab_size"] == spec.vocab_size
    assert (text["head_dim"], text["num_key_value_heads"]) == (spec.head_dim, spec.num_kv_heads)
    assert (text["global_head_dim"], text["num_global_key_value_heads"]) == (
        spec.global_head_dim, spec.num_global_kv_heads)
    assert text["num_kv_shared_layers"] == text["num_hidden_layers"]
    assert text["layer_types"][-1] == "full_attention"
    assert text["hidden_size_per_layer_input"] == text["vocab_size_per_layer_input"] == 0
    assert (spec.mtp_drafter.config_dir / "provenance.md").exists()
