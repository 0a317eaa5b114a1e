"""What a pool is: a model on a GPU type with vLLM engine settings, N replicas behind a router.

Defaults are vLLM 0.26.0's for `vllm serve` on a GPU with >= 70 GiB (H100/H200):
`vllm/engine/arg_utils.py` (get_batch_defaults: OPENAI_API_SERVER → 8192 batched tokens,
1024 seqs), `vllm/config/cache.py` (gpu_memory_utilization 0.92, prefix caching on),
block size 16 (FlashAttention's), `vllm/config/scheduler.py` (fcfs, async scheduling on).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capplan.hardware import GPUS, Precision

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SpeculativeConfig(BaseModel):
    """`--speculative-config '{"method": ..., "num_speculative_tokens": k}'`."""

    model_config = _FROZEN
    method: Literal["mtp", "eagle", "eagle3", "draft_model", "ngram"] = "mtp"
    num_speculative_tokens: int = Field(ge=1, le=8)
    acceptance: float = Field(
        default=0.7, ge=0, lt=1, description="P(draft token accepted) unless a workload says"
    )


class EngineConfig(BaseModel):
    """The vLLM engine settings that change capacity or latency."""

    model_config = _FROZEN
    max_num_seqs: int = Field(default=1024, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=16)
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=16, description="None: the model's")
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    speculative: SpeculativeConfig | None = None
    limit_mm_per_prompt: dict[str, int] | None = Field(
        default=None, description='{"image": 0} frees the vision encoder reservation'
    )
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    async_scheduling: bool = True

    @property
    def text_only(self) -> bool:
        return self.limit_mm_per_prompt is not None and self.limit_mm_per_prompt.get("image") == 0


class Pool(BaseModel):
    """A set of identical vLLM replicas; the router spreads the pool's workloads over them."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str
    gpu: str = "h200"
    precision: Precision | Literal["auto"] = Precision.BF16
    tp: int = Field(default=1, ge=1)
    router: Literal["round_robin", "least_outstanding", "prefix_affinity"] = "least_outstanding"
    price_per_gpu_hour: float = Field(default=3.5, ge=0, description="USD per GPU-hour")
    max_replicas: int = Field(default=64, ge=1, description="search cap when sizing")
    profile: str | None = Field(default=None, description="profile folder; default: best match")
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="after")
    def _gpu_known(self) -> Pool:
        if self.gpu not in GPUS:
            raise ValueError(f"unknown gpu {self.gpu!r}; known: {', '.join(sorted(GPUS))}")
        return self
