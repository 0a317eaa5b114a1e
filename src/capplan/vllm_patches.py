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


def apply_all():
    token_prompts_without_tokenizer()
