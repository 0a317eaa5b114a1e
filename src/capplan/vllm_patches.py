"""Work-arounds for vLLM 0.26.0 that both GPU runners apply before starting an engine.

Plain Python with no capplan imports: the runners run as scripts on the GPU host and read
this file by path (`runpy.run_path`), so nothing else of capplan, nor its dependencies,
needs to be there.
"""

import functools


def token_prompts_without_tokenizer():
    """vLLM 0.26.0's Gemma 4 asks the tokenizer for its chat template to choose
    add_special_tokens, even for token-id prompts (model_executor/models/gemma4_mm.py:
    Gemma4ProcessingInfo.get_default_tok_params), so it fails under skip_tokenizer_init.
    Token-id prompts are never tokenized, so the base class's parameters are the same."""
    try:
        from vllm.model_executor.models import gemma4_mm
        from vllm.multimodal.processing.context import BaseProcessingInfo
    except ImportError:
        return
    gemma4_mm.Gemma4ProcessingInfo.get_default_tok_params = (
        BaseProcessingInfo.get_default_tok_params)


class ConfigOverrides:
    """A dict of `hf_overrides` applied as vLLM applies it to the target's config: nested
    dicts update the sub-config of that name (vllm/config/model.py: _apply_dict_overrides).
    vLLM also calls such a callable on a bare placeholder config to learn the model type;
    a sub-config that is not there is left alone."""

    def __init__(self, overrides):
        self.overrides = overrides

    def __call__(self, config):
        for key, value in self.overrides.items():
            if isinstance(value, dict):
                sub = getattr(config, key, None)
                if sub is not None and not isinstance(sub, dict):
                    for k, v in value.items():
                        setattr(sub, k, v)
            else:
                setattr(config, key, value)
        return config

    def __repr__(self):
        return f"ConfigOverrides({self.overrides!r})"


def drafter_gets_target_overrides():
    """vLLM 0.26.0 applies a dict of `hf_overrides` to the target's config only
    (vllm/config/speculative.py: compose_draft_hf_overrides passes callables on, drops dicts).
    Gemma 4's MTP drafter (google/gemma-4-31B-it-assistant) loses `global_head_dim` and
    `num_global_key_value_heads` under transformers 5 just as the target does, and
    model_executor/models/gemma4_mtp.py reads both; the drafter's values are the target's.
    The target keeps its dict: with `quantization="fp8"` vLLM requires one
    (model_loader/weight_utils.py: get_quant_config)."""
    try:
        from vllm.config.speculative import SpeculativeConfig
    except ImportError:
        return
    compose = SpeculativeConfig.compose_draft_hf_overrides
    if getattr(compose, "capplan", False):
        return

    def compose_with_dicts(target_hf_overrides):
        if isinstance(target_hf_overrides, dict) and target_hf_overrides:
            return functools.partial(SpeculativeConfig._apply_composed_hf_override,
                                     ConfigOverrides(target_hf_overrides))
        return compose(target_hf_overrides)

    compose_with_dicts.capplan = True
    SpeculativeConfig.compose_draft_hf_overrides = staticmethod(compose_with_dicts)


def name_the_marlin_fp4_layer():
    """vLLM 0.26.0's NVFP4-through-Marlin path fails on Gemma 4 with a bare shape assertion
    (model_executor/layers/quantization/utils/marlin_utils_fp4.py: prepare_fp4_layer_for_marlin)
    that names no layer. Re-raise it with the layer's name and shapes; nothing else changes."""
    try:
        from vllm.model_executor.kernels.linear.nvfp4 import marlin
    except ImportError:
        return
    prepare = marlin.prepare_fp4_layer_for_marlin
    if getattr(prepare, "capplan", False):
        return

    def prepare_named(layer, *args, **kwargs):
        try:
            return prepare(layer, *args, **kwargs)
        except AssertionError as e:
            raise AssertionError(
                f"{getattr(layer, 'prefix', '?')}: weight {tuple(layer.weight.shape)}, "
                f"output_size_per_partition {layer.output_size_per_partition}, "
                f"input_size_per_partition {layer.input_size_per_partition}, "
                f"{type(layer).__name__}") from e

    prepare_named.capplan = True
    marlin.prepare_fp4_layer_for_marlin = prepare_named


def apply_all():
    token_prompts_without_tokenizer()
    drafter_gets_target_overrides()
    name_the_marlin_fp4_layer()
