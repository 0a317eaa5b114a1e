"""Work-arounds for vLLM 0.26.0 that both GPU runners apply before starting an engine.

Plain Python with no capplan imports: the runners run as scripts on the GPU host and read
this file by path (`runpy.run_path`), so nothing else of capplan, nor its dependencies,
needs to be there.
"""


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
    """`hf_overrides` as a callable, so that they reach a separate drafter's config too.

    vLLM 0.26.0 applies a dict of overrides to the target's config only; a callable it also
    composes into the draft model's (vllm/config/speculative.py: compose_draft_hf_overrides).
    Gemma 4's MTP drafter (google/gemma-4-31B-it-assistant) loses `global_head_dim` and
    `num_global_key_value_heads` under transformers 5 just as the target does, and
    model_executor/models/gemma4_mtp.py reads both. Nested dicts update the sub-config of that
    name where the config has one (vllm/config/model.py: _apply_dict_overrides); vLLM also
    calls this on a bare placeholder config to learn the model type, which is left as is."""

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


def apply_all():
    token_prompts_without_tokenizer()
