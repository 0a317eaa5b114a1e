"""Builders shared by the tests."""

from __future__ import annotations

from capplan.profile import Box, KvCapacity, Profile, Provenance, StepModel


def constant_profile(step_s: float = 0.01) -> Profile:
    """Every step costs step_s seconds whatever the batch; KV is plentiful."""
    return Profile(
        gpu="h200",
        model="llama-3.1-8b",
        precision="bf16",
        step=StepModel(fixed_s=step_s, per_token_s=0.0, knee_tokens=0.0, prefill_attn_s=0.0,
                       decode_ctx_s=0.0, per_seq_s=0.0),
        kv=KvCapacity(bytes_per_token=1, slope_tokens=1 << 20, intercept_tokens=0.0),
        box=Box(max_tokens=1 << 20, max_seqs=1 << 16, max_context_tokens=1 << 24),
        provenance=Provenance(source="analytic", note="test: constant step time"),
    )
