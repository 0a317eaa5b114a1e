"""One calibration job = one engine configuration: its folder name, its model folder and
the runner's command line. Plain Python; nothing here imports vllm."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from capplan.calibrate.sweep import drain_traced
from capplan.errors import ConfigError
from capplan.hardware import Precision
from capplan.modelspec import ModelSpec

RUNNER = Path(__file__).with_name("runner.py")

# How a 4-bit checkpoint is emulated on dummy weights: a `quantization_config` in a copy
# of the BF16 config (../shared/gpu/README.md). FP8 is online: `quantization="fp8"`.
QUANT_CONFIGS: dict[Precision, dict[str, object]] = {
    # In a config.json `quantization_config` ModelOpt's exclusions are "ignore"
    # (vllm/model_executor/layers/quantization/modelopt.py: ModelOptQuantConfigBase.from_config;
    # "exclude_modules" is the key of the separate hf_quant_config.json only). Real checkpoints
    # keep the LM head in BF16; for Gemma 4 it is tied to the embedding and cannot be NVFP4.
    Precision.NVFP4: {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                      "kv_cache_quant_algo": None, "ignore": ["lm_head"]},
    Precision.AWQ: {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                    "version": "gemm"},
}
SPEC_METHODS = ("draft_model", "mtp", "ngram")
# Methods whose drafter is a separate checkpoint: `--spec-model` names its folder. For Gemma 4
# the MTP drafter is one (the "assistant", vllm/config/speculative.py: gemma4_assistant ->
# gemma4_mtp); models with MTP layers inside their own checkpoint need no folder.
SPEC_MODEL_NEEDED = ("draft_model",)


@dataclass(frozen=True)
class Job:
    """An engine configuration to calibrate."""

    spec: ModelSpec
    precision: Precision
    gpu_memory_utilization: float = 0.90
    kv_cache_dtype: str = "auto"
    spec_method: str | None = None
    spec_model: str | None = None
    spec_k: int = 0
    kv_only: bool = False
    prefix_cache: bool = False
    """An engine with prefix caching on that times only the cache points
    (sweep.cache_points); its run is analysed beside the profile, not fitted."""
    graph_scan: bool = False
    """An engine that times only a decode-only batch at every CUDA-graph size
    (sweep.graph_points); its run gives the profile's `graph_offset_s`."""
    core_scan: bool = False
    """An engine with prefix caching on that times only the core scan (sweep.core_points):
    the engine core's CPU time a step, for a profile whose own run did not record it."""
    mixlen_scan: bool = False
    """An engine that times only decode batches of unequal lengths beside their twins of one
    length (sweep.mixlen_points): a test of the step model's summed context, not fitted."""
    drain_scan: bool = False
    """An engine that times decode points' ends, their requests finishing 16 a step and all
    at once, with the engine core's calls traced (runner.py --trace-core), then runs two of
    them again under torch's profiler (sweep.drain_points, sweep.drain_traced): not fitted."""
    encoder_scan: bool = False
    """A multimodal model's engine with images allowed that times only its vision encoder
    (sweep.encoder_points); its run gives the profile's `encoder_token_s`."""
    repeat: int = 0
    """Run number N > 1 of a timed engine (`<model>--<key>--rN`), measured on a later lease:
    its steps join the main run's in the fit (build.Group.repeats)."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    limit_images: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.spec_k and self.spec_method not in SPEC_METHODS:
            raise ConfigError(
                f"speculative method {self.spec_method!r} is not supported; "
                f"use one of {', '.join(SPEC_METHODS)}"
            )
        if self.spec_k and self.spec_method in SPEC_MODEL_NEEDED and not self.spec_model:
            raise ConfigError(f"speculative method {self.spec_method!r} needs --spec-model, "
                              "the draft model's folder (models/<name>)")
        if not 0.1 <= self.gpu_memory_utilization <= 0.99:
            raise ConfigError(f"gpu_memory_utilization {self.gpu_memory_utilization} not in "
                              "[0.1, 0.99]")

    @property
    def key(self) -> str:
        """Profile folder name: precision[-kvfp8][-<method>K] (see Profile.key)."""
        key = self.precision.value
        if self.kv_cache_dtype == "fp8":
            key += "-kvfp8"
        if self.spec_k:
            key += f"-{self.spec_method}{self.spec_k}"
        return key

    @property
    def name(self) -> str:
        """Unique run name: model, key, the utilisation when it is not 0.90, and `--img` for
        a multimodal model's engine that keeps the image-encoder reservation (the others
        run text-only, `limit_mm_per_prompt={"image": 0}`)."""
        n = f"{self.spec.name}--{self.key}"
        if self.repeat:
            n += f"--r{self.repeat}"
        if abs(self.gpu_memory_utilization - 0.90) > 1e-9:
            n += f"--u{round(self.gpu_memory_utilization * 100):d}"
        if self.spec.vision_encoder_params and self.limit_images is None and not self.encoder_scan:
            n += "--img"
        if self.prefix_cache:
            n += "--cache"
        if self.graph_scan:
            n += "--graphs"
        if self.core_scan:
            n += "--core"
        if self.mixlen_scan:
            n += "--mixlen"
        if self.drain_scan:
            n += "--drain"
        if self.encoder_scan:
            n += "--encoder"
        return n

    def model_dir(self, root: Path) -> Path:
        """Folder with the config.json vLLM loads: the model's own, or a quantized copy."""
        src = self.spec.config_path
        if not src.exists():
            raise ConfigError("no config.json for dummy-weight calibration", file=str(src))
        if self.precision not in QUANT_CONFIGS:
            return src.parent
        out = root / f"{self.spec.name}-{self.precision.value}"
        out.mkdir(parents=True, exist_ok=True)
        cfg = json.loads(src.read_text())
        cfg["quantization_config"] = QUANT_CONFIGS[self.precision]
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        return out

    def runner_args(self, model_dir: str, plan: str | None, out: str, meta: str,
                    time_budget_s: float) -> list[str]:
        a = ["--model", model_dir, "--out", out, "--meta", meta,
             "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}",
             "--max-num-seqs", str(self.max_num_seqs),
             "--max-num-batched-tokens", str(self.max_num_batched_tokens),
             "--max-model-len", str(self.max_model_len),
             "--kv-cache-dtype", self.kv_cache_dtype,
             "--time-budget-s", f"{time_budget_s:.0f}"]
        if self.precision is Precision.FP8:
            a += ["--quantization", "fp8"]
        if self.spec_k:
            a += ["--spec-method", str(self.spec_method), "--spec-k", str(self.spec_k)]
            if self.spec_model:
                a += ["--spec-model", self.spec_model]
        if self.limit_images is not None:
            a += ["--limit-images", str(self.limit_images)]
        if self.spec.vllm_hf_overrides:  # compact JSON: one word in the queue's arg list
            a += ["--hf-overrides", json.dumps(self.spec.vllm_hf_overrides,
                                               separators=(",", ":"))]
        if self.prefix_cache or self.core_scan:  # the core scan's cache hits need it
            a.append("--prefix-caching")
        if self.kv_only or plan is None:
            a.append("--kv-only")
        else:
            a += ["--plan", plan]
        if self.drain_scan and plan is not None:
            # the core trace names the call a drain's launch waits in; the profiler, which
            # slows the host past the GPU, cannot see a wait (docs/calibration.md, "A point's
            # drain")
            a += ["--trace-points", ",".join(drain_traced()), "--trace-core"]
        return a


def copy_runner(dest: Path) -> Path:
    """The runner travels alone (it imports nothing from capplan)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RUNNER, dest)
    return dest
