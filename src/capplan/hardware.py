"""GPU datasheets and precisions: the physical constants the analytic profile starts from.

Figures are the vendor's dense (no sparsity) peaks; they bound, they do not predict.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Precision(StrEnum):
    """Weight/activation formats vLLM 0.26.0 runs; `auto` lets the solver choose."""

    BF16 = "bf16"
    FP8 = "fp8"  # dynamic W8A8 (vLLM `quantization="fp8"`)
    NVFP4 = "nvfp4"  # weight-only FP4 through Marlin on Hopper
    AWQ = "awq"  # 4-bit weight-only through Machete on Hopper

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes a weight occupies, including per-group scales (16 per FP8 scale, 128 per AWQ)."""
        return {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16, "awq": 0.5 + 4 / 128}[self.value]


class GpuSpec(BaseModel):
    """One GPU's datasheet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float | None  # None: no FP4 tensor cores (4-bit runs weight-only)
    sms: int  # streaming multiprocessors: FlashAttention's persistent thread blocks (tiles.py)
    source: str

    def matmul_flops(self, precision: Precision) -> float:
        """Peak dense matmul rate the precision's GEMMs run at on this GPU."""
        if precision is Precision.FP8:
            return self.fp8_flops
        if precision is Precision.NVFP4 and self.fp4_flops is not None:
            return self.fp4_flops
        return self.bf16_flops  # weight-only 4-bit dequantises to BF16 before the MMA


GPUS: dict[str, GpuSpec] = {
    "h200": GpuSpec(
        name="h200",
        memory_bytes=143_771 * 2**20,  # as nvidia-smi reports the lent H200
        hbm_bytes_per_s=4.8e12,
        bf16_flops=989e12,
        fp8_flops=1979e12,
        fp4_flops=None,
        sms=132,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM), dense figures; SMs as the H100 "
        "SXM5's, the same GH100 die",
    ),
    "h100": GpuSpec(
        name="h100",
        memory_bytes=81_559 * 2**20,
        hbm_bytes_per_s=3.35e12,
        bf16_flops=989e12,
        fp8_flops=1979e12,
        fp4_flops=None,
        sms=132,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM), dense figures; 132 SMs (NVIDIA "
        "H100 Tensor Core GPU Architecture whitepaper, H100 SXM5)",
    ),
}
