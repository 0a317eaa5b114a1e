"""Engine settings measured to run out of GPU memory under load, and the pools that use them.

vLLM sizes its KV cache to `gpu_memory_utilization` x the GPU's memory, less the weights,
the profiled peak activation and the non-torch memory (vLLM 0.26.0
`vllm/v1/worker/gpu_worker.py`, `determine_available_memory`); the CUDA graphs it captures
afterwards (`gpu_model_runner.py`, `capture_model`), the API process's own CUDA context and
the allocator's slack must then fit in what the utilisation leaves. On an 80 GB H100 at 0.95
that is 3.96 GiB, and Qwen3-32B FP8 ran out of it under load, twice on one host (graphs 1.79
GiB, 590 MiB free when its MLP asked for 800 MiB), where the same engine served at 0.85,
0.90 and 0.92. What the leftover must hold depends on the model, the GPU and the host, so
capplan does not guess it: each failure measured is stored, with its logs, in
`calibration/<gpu>/vllm-<version>/out-of-memory.json`, and a pool of the same model,
precision and KV dtype at that utilisation or above (with as large a token budget or
larger) gets a `memory` advice in its plan, naming the highest utilisation measured to serve.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from capplan.errors import CalibrationError
from capplan.pool import Pool
from capplan.profile import Profile
from capplan.profiles import CALIBRATION_DIR

FILE = "out-of-memory.json"


class OutOfMemory(BaseModel):
    """One engine configuration measured to run out of GPU memory while serving."""

    model_config = ConfigDict(frozen=True, extra="allow")
    model: str
    precision: str
    kv_cache_dtype: str = "auto"
    tp: int = 1
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    engine: str
    measured: str
    logs: tuple[str, ...]
    error: str
    served_at: tuple[float, ...] = ()


class _File(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    runs: tuple[OutOfMemory, ...]


@cache
def measured_failures(gpu: str, vllm_version: str = "0.26.0",
                      calibration_dir: Path = CALIBRATION_DIR) -> tuple[OutOfMemory, ...]:
    """The out-of-memory runs stored for `gpu` (none where the file is absent)."""
    path = calibration_dir / gpu / f"vllm-{vllm_version}" / FILE
    if not path.exists():
        return ()
    try:
        return _File.model_validate(json.loads(path.read_text())).runs
    except ValidationError as e:
        first = e.errors()[0]
        where, why = ".".join(str(x) for x in first["loc"]), first["msg"]
    except ValueError as e:  # not JSON
        where, why = "the file", str(e)
    raise CalibrationError(f"{path}: {where}: {why}; fix the entry or restore the file from git")


def failure_for(pool: Pool, profile: Profile,
                calibration_dir: Path = CALIBRATION_DIR) -> OutOfMemory | None:
    """The stored failure this pool's engine settings reach, if any: the same model,
    precision, KV dtype and TP on the profile's GPU, at the failure's utilisation or above,
    with its token budget or a larger one (a larger step's activations only need more)."""
    eng = pool.engine
    for run in measured_failures(profile.gpu, profile.vllm_version, calibration_dir):
        if (run.model == profile.model and run.precision == profile.precision
                and run.kv_cache_dtype == profile.kv_cache_dtype and run.tp == pool.tp
                and eng.gpu_memory_utilization >= run.gpu_memory_utilization
                and eng.max_num_batched_tokens >= run.max_num_batched_tokens):
            return run
    return None
