"""The profile: what one (GPU, model, precision, TP, vLLM version) can do, as data.

A profile file (`profile.json`) holds the fitted step-time model, the KV capacity as a
function of gpu_memory_utilization, the box the fit was calibrated on, the fit's held-out
error and the provenance. Measured profiles live under
`calibration/<gpu>/vllm-<version>/<model>/<precision>[-kvfp8][-<method>K]/`; the analytic
roofline profile (`source: analytic`) is built from datasheets when none was measured.

How a step's time follows from the coefficients (`StepModel`), and the simulator's fast
evaluation of it (`StepTimer`), are in capplan/steptime.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from capplan.errors import ConfigError
from capplan.kvlayout import KvLayout
from capplan.pool import PoolHost

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_POOL_KEYS = ("layout", "slope_blocks", "intercept_blocks", "image_reservation_blocks")


class StepModel(BaseModel):
    """Coefficients of the step-time model (capplan/steptime.py; all in seconds)."""

    model_config = _FROZEN
    fixed_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    knee_tokens: float = Field(ge=0)
    prefill_attn_s: float = Field(ge=0, description="per token x attended token")
    decode_ctx_s: float = Field(ge=0, description="per context token of a decode sequence")
    per_seq_s: float = Field(ge=0)
    draft_pass_s: float = Field(default=0.0, ge=0, description="per draft pass (k a step)")
    draft_token_s: float = Field(
        default=0.0, ge=0,
        description="per token of the drafter's first pass, which runs over every token the "
        "step scheduled",
    )
    draft_seq_s: float = Field(
        default=0.0, ge=0, description="per request in each of the k - 1 later draft passes"
    )
    draft_serving_scale: float = Field(
        default=1.0, gt=0,
        description="the scale of the drafter's three terms that puts a step of one request "
        "(k drafts) at the median core step of the model's traced draft-model serving "
        "engines on this GPU (core-launch/drafter/, calibrate/build.py _serving_drafter): "
        "the serving hosts' pace, where the fit has the calibration engine's; the simulator "
        "applies it, the fit's error does not",
    )
    draft_sigma: float = Field(
        default=0.0, ge=0,
        description="the spread of a draft model's pass from step to step on the serving "
        "engines' core (sigma of its logarithm at concurrency 1, the median over the traced "
        "draft-model engines, core-launch/drafter/): the simulator draws the drafter's time "
        "on every step as its median x exp(draft_sigma z) (0: the median)",
    )
    encoder_token_s: float = Field(default=0.0, ge=0, description="per image token encoded")
    encoder_token2_s: float = Field(
        default=0.0, ge=0,
        description="per picture, per its image tokens squared: the vision tower's attention "
        "over the picture's patches",
    )
    encoder_floor_s: float = Field(
        default=0.0, ge=0,
        description="a step's encoder pass at least: the CPU's launches of the vision tower, "
        "which vLLM runs eagerly (vllm/config/compilation.py: compile_mm_encoder and "
        "cudagraph_mm_encoder default to off)",
    )
    encoder_step_s: float = Field(
        default=0.0, ge=0,
        description="a step that encodes pictures, beyond the encoder's pass and the "
        "decoder's terms: what the engine does around the pass (the request's multimodal "
        "input to the GPU, the image tokens' embeddings merged, the decoder's attention over "
        "them with their bidirectional mask: vllm/v1/attention/backends/flash_attn.py "
        "mm_prefix_range_tensor), from the encoder engine's picture points (sweep.picture_points): "
        "the median of `encoder_step_draws_s`",
    )
    encoder_step_draws_s: list[float] = Field(
        default_factory=list,
        description="every measured step that encoded a picture, beyond its text-only twin's "
        "step and the encoder's pass (scans.picture_steps; may be negative): the simulator "
        "draws one for each step that encodes (sim/replica.py PictureDraws), since such a "
        "step took ~35-60 or ~75-145 ms beyond its twin on the H200, in spells; empty: "
        "every such step pays `encoder_step_s`",
    )
    encoder_slow_above_s: float = Field(
        default=0.0,
        description="where `encoder_step_draws_s` splits into the fast spell's and the slow "
        "spell's (scans.slow_above)",
    )
    encoder_slow_spell_s: float = Field(
        default=0.0, ge=0,
        description="how long a slow spell of picture steps lasts, on average "
        "(scans.spell_lengths: the picture points' steps in time order); 0: each step is drawn "
        "on its own",
    )
    encoder_fast_spell_s: float = Field(
        default=0.0, ge=0, description="how long a fast spell lasts, on average",
    )
    prefill_step_s: float = Field(
        default=0.0, ge=0,
        description="per step holding a prefill chunk: vLLM replays full CUDA graphs only "
        "for decode-only batches (FULL_AND_PIECEWISE), others run attention outside them",
    )
    gemm_switch_s: float = Field(
        default=0.0, ge=0,
        description="per step of more than GEMM_SWITCH_TOKENS (padded) tokens: a quantized "
        "GEMM's largest-tile config (see the module docstring)",
    )
    gemm_rows_s: float = Field(
        default=0.0, ge=0,
        description="per further GEMM_ROW_TOKENS tokens past the first: one more row of "
        "tile clusters",
    )
    gemm_holes_s: float = Field(
        default=0.0, ge=0,
        description="per step past the largest CUDA graph whose last row of tiles is half "
        "empty or more, in proportion below that (row_holes; FP8's GEMMs only, see the "
        "module docstring)",
    )
    shared_ctx_saving: float = Field(
        default=0.0, ge=0, le=1,
        description="fraction of decode_ctx_s saved per context token a decode sequence reads "
        "in common with another running request (one prefix-cache block read by both); from a "
        "prefix-cache engine's `shared` points against their unshared twins (0: not measured)",
    )
    graph_ctx_s: float = Field(
        default=0.0, ge=0,
        description="per context token of a decode-only step, in place of decode_ctx_s, "
        "where a graph-scan run measured it (with graph_offset_s)",
    )
    graph_window_s: float = Field(
        default=0.0, ge=0,
        description="per context token within the window of a decode-only step, in place "
        "of decode_window_s, where a graph-scan run measured it (sliding-window models; "
        "0: decode_window_s)",
    )
    tile_rho: float = Field(
        default=0.0, ge=0,
        description="how many times one SM's share of the memory bandwidth a lone attention "
        "tile streams at, in FlashAttention 3's last, partly empty wave of a decode-only "
        "step (tiles.py); fitted on the decode-only steps (0: the tail is not priced)",
    )
    tile_kv_heads: int = Field(
        default=0, ge=0,
        description="KV heads a GPU holds, the tiles of one split (tiles.py; with tile_rho)",
    )
    tile_sms: int = Field(
        default=0, ge=0,
        description="the GPU's SMs: FlashAttention's persistent thread blocks (with tile_rho)",
    )
    eager_offset_s: dict[int, float] = Field(
        default_factory=dict,
        description="a step past the largest CUDA graph's offset at its token count T (FP8 "
        "profiles with a lone-prompt scan: calibrate/fit.py eager_offsets): at each scanned "
        "count whose last row of tiles is at least 7/8 full and whose prompt's attention is "
        "at most a tenth of its step, the scan's median step less the terms above without "
        "the floor; between two such counts in one row of tiles the line between them, "
        "elsewhere none (`eager_offset`)",
    )
    graph_offset_s: dict[int, float] = Field(
        default_factory=dict,
        description="per CUDA-graph size (padded tokens) of a decode-only step: its measured "
        "median time less the terms above, from a graph-scan run (calibrate --graph-scan); "
        "sizes between those scanned are interpolated (empty: none measured)",
    )
    eager_floor_s: float = Field(
        default=0.0, ge=0,
        description="least time of a step past the largest CUDA graph, drafter aside: the "
        "CPU's launches of its kernels (0: no floor fitted)",
    )
    core_graph_s: float = Field(
        default=0.0, ge=0,
        description="the serving engine core's own time for a decode-only step (one full "
        "CUDA graph): scheduling, launching, sampling, processing the step before; measured "
        "by a core trace of a serving engine of the model, validate/corelaunch.py (0: not "
        "measured)",
    )
    core_piecewise_s: float = Field(
        default=0.0, ge=0,
        description="the same for a step with a prefill chunk within the largest CUDA graph, "
        "which runs piecewise graphs and launches its attention layer by layer (0: not "
        "measured)",
    )
    core_eager_s: float = Field(
        default=0.0, ge=0,
        description="the serving engine core's own time for a step past the largest CUDA "
        "graph, which launches every kernel itself, where serving core traces of the model "
        "on this GPU measured it (the median over its traced engines of their chat-sized "
        "such steps after a decode-only one, scripts/core_launch.py); the step's GPU span is "
        "then at least eager_gpu_s (else eager_floor_s), and the core's time on each such step "
        "is drawn, core_eager_s x exp(eager_sigma z) (sim/replica.py; 0: not measured, and "
        "eager_floor_s is the core's time as well)",
    )
    eager_gpu_s: float = Field(
        default=0.0, ge=0,
        description="the GPU's own span of a chat-sized step past the largest CUDA graph, "
        "where serving core traces of the model in this precision on this GPU measured it "
        "beside core_eager_s (scripts/core_launch.py): with core_eager_s, such a step's work "
        "is at least this (0: at least eager_floor_s, the calibration's least such step, "
        "which is the GPU's span where its launch was shorter)",
    )
    core_graph_sigma: float = Field(
        default=0.0, ge=0,
        description="spread of the serving core's time on a decode-only step: the sigma of "
        "its logarithm, ln(p90 / p10) / 2.563 over the traced steps (validate/corelaunch.py "
        "summary; 0: none measured). The simulator draws each step's core time as "
        "core_graph_s x exp(sigma z) (simulation.core_spread)",
    )
    core_piecewise_sigma: float = Field(
        default=0.0, ge=0, description="the same for a step with a prefill chunk within the "
        "largest CUDA graph",
    )
    eager_sigma: float = Field(
        default=0.0, ge=0, description="the same for a step past the largest CUDA graph: "
        "about core_eager_s where that is measured (drawn on every such step), else about "
        "eager_floor_s (with simulation.core_spread)",
    )
    eager_step_s: float = Field(
        default=0.0, ge=0,
        description="per step of more tokens than the largest CUDA graph: vLLM runs it "
        "without one (vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch gives "
        "CUDAGraphMode.NONE when num_tokens > max_cudagraph_capture_size), so "
        "the CPU launches every kernel; measured on the H200 as a jump in step time just "
        "past the largest graph, on top of the per-token slope",
    )

    window_tokens: int = Field(
        default=0, ge=0,
        description="sliding window W of the sliding-window layers' terms (0: every layer "
        "attends the whole context); see the module docstring",
    )
    decode_window_s: float = Field(default=0.0, ge=0,
                                   description="per context token within the window")
    prefill_window_s: float = Field(default=0.0, ge=0,
                                    description="per token x attended token within the window")


class KvCapacity(BaseModel):
    """KV capacity in tokens: measured points and the line through them,
    tokens = slope_tokens * gpu_memory_utilization - intercept_tokens.

    The tokens are vLLM's "GPU KV cache size" (vllm/v1/core/kv_cache_utils.py
    get_kv_cache_capacity): blocks x block size for a model with one KV-cache group. A model
    with sliding-window layers (Gemma 4) has several groups sharing one pool of blocks
    (kvlayout.py), and vLLM's tokens count each request at the engine's max_model_len; its
    profile also carries the pool itself, in blocks of `layout.block_bytes` bytes,
    blocks = slope_blocks * gpu_memory_utilization - intercept_blocks, and the layout the
    simulator follows (profiles without them, every one-group profile, keep the tokens)."""

    model_config = _FROZEN
    bytes_per_token: int = Field(gt=0)
    slope_tokens: float = Field(gt=0)
    intercept_tokens: float
    image_reservation_tokens: float = Field(
        default=0.0, ge=0, description="KV tokens the vision encoder's profiling reserves"
    )
    measured: list[dict[str, float]] = Field(default_factory=list)
    layout: KvLayout | None = Field(
        default=None, description="KV-cache groups (kvlayout.py) of a sliding-window model"
    )
    slope_blocks: float | None = Field(default=None, gt=0)
    intercept_blocks: float | None = None
    image_reservation_blocks: float = Field(
        default=0.0, ge=0, description="pool blocks the vision encoder's profiling reserves"
    )

    def tokens(self, gpu_memory_utilization: float, *, text_only: bool = True) -> int:
        t = self.slope_tokens * gpu_memory_utilization - self.intercept_tokens
        if not text_only:
            t -= self.image_reservation_tokens
        return max(0, int(t))

    @property
    def pooled(self) -> bool:
        """The capacity is a pool of blocks shared by sliding-window and full groups."""
        return (self.layout is not None and self.layout.hybrid
                and self.slope_blocks is not None and self.intercept_blocks is not None)

    def blocks(self, gpu_memory_utilization: float, *, text_only: bool = True) -> int:
        """The pool's blocks (vLLM's num_gpu_blocks, the null block included) of a pooled
        capacity (`pooled`)."""
        if self.slope_blocks is None or self.intercept_blocks is None:
            raise ValueError("this KV capacity has no block pool")
        b = self.slope_blocks * gpu_memory_utilization - self.intercept_blocks
        if not text_only:
            b -= self.image_reservation_blocks
        return max(0, int(b))


class Box(BaseModel):
    """The batch compositions a fit was calibrated on; beyond it, results are flagged."""

    model_config = _FROZEN
    max_tokens: int = Field(gt=0)
    max_seqs: int = Field(gt=0)
    max_context_tokens: int = Field(gt=0)


class FitQuality(BaseModel):
    """Held-out absolute percentage error of step time: by the fit's own terms, and by the
    profile as shipped (`shipped_*`: the same held-out steps, with the terms fitted after
    the linear fit, a graph scan's, included; calibrate/fit.py heldout_ape)."""

    model_config = _FROZEN
    n_train: int
    n_test: int
    median_ape: float
    p95_ape: float
    shipped_median_ape: float | None = None
    shipped_p95_ape: float | None = None


class HostCore(BaseModel):
    """One traced serving host's engine core: its own times where the profile's are the
    median over the model's traced hosts on this GPU (scripts/core_launch.py,
    `raw/core-launch/eager/<model>.json`'s engines). The host sets them, not the model: a
    graph-less step took the core 11.9-33.8 ms on six H100 hosts serving Llama-3.1-8B."""

    model_config = _FROZEN
    engine: str = Field(description="the validation engine whose core trace measured it")
    core_graph_s: float = Field(ge=0, description="median core time of a decode-only step")
    core_eager_s: float = Field(ge=0, description="median core time of a graph-less step "
                                "after a decode-only one")
    eager_sigma: float = Field(default=0.0, ge=0, description="that time's spread")
    core_piecewise_s: float | None = Field(
        default=None, ge=0, description="median core time of a piecewise step, where the "
        "trace held enough of them (else the profile's is kept)")


class DrafterHost(BaseModel):
    """One traced draft-model serving engine's drafter pace: the scale of the drafter's terms
    that puts the profile's step of one request at that engine's core step
    (StepModel.draft_serving_scale is the median engine's; core-launch/drafter/). The host
    sets it: a lone request's core step took 12.5-24.3 ms on ten H200 engines."""

    model_config = _FROZEN
    engine: str = Field(description="the validation engine whose core trace measured it")
    step_s: float = Field(gt=0, description="its core's median step of one request")
    draft_serving_scale: float = Field(gt=0)


HOSTS: tuple[str, ...] = tuple(h for h in get_args(PoolHost) if h != "any")
"""The engine-core hosts a profile prices a step on (Profile.on_host: median, slowest,
fastest); a pool's `host: any` is sized on each of them (solve/choose.py `_Option`)."""


class Provenance(BaseModel):
    """Where a profile's numbers came from."""

    model_config = ConfigDict(frozen=True, extra="allow")
    source: Literal["measured", "analytic"]
    note: str = ""
    analytic_terms: tuple[str, ...] = Field(
        default=(), description="terms of a measured profile filled in by the analytic model "
        "because calibration did not measure them (profiles.py: _with_encoder)")


class Profile(BaseModel):
    """One calibrated (or analytic) engine configuration."""

    model_config = _FROZEN
    schema_version: Literal[1] = 1
    gpu: str
    model: str
    precision: str
    tp: int = 1
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    spec_method: str | None = None
    spec_k: int = Field(default=0, ge=0)
    vllm_version: str = "0.26.0"
    step: StepModel
    kv: KvCapacity
    box: Box
    fit: FitQuality | None = None
    provenance: Provenance
    engine: dict[str, object] = Field(
        default_factory=dict, description="engine settings the calibration ran with"
    )
    hosts: tuple[HostCore, ...] = Field(
        default=(), description="the model's traced serving hosts on this GPU, each with its "
        "own core times, whose median the step's graph-less core time is (calibrate/build.py "
        "core_eager); `on_host` takes one end's")
    drafter_hosts: tuple[DrafterHost, ...] = Field(
        default=(), description="a draft-model profile's traced serving engines, each with its "
        "drafter's pace (calibrate/build.py _serving_drafter); `on_host` takes one end's")

    @property
    def source(self) -> str:
        return self.provenance.source

    @property
    def key(self) -> str:
        """Folder-style name: precision[-kvfp8][-<method>K]."""
        key = self.precision
        if self.kv_cache_dtype == "fp8":
            key += "-kvfp8"
        if self.spec_k:
            key += f"-{self.spec_method}{self.spec_k}"
        return key

    def traced_host(self, host: str) -> HostCore | None:
        """The traced host at one end (`host` "slowest" or "fastest"), by the core's time on a
        graph-less step (the figure that varies most from host to host); None for "median"
        or where none was traced."""
        if host == "slowest":
            return max(self.hosts, key=lambda h: h.core_eager_s, default=None)
        if host == "fastest":
            return min(self.hosts, key=lambda h: h.core_eager_s, default=None)
        return None

    def on_host(self, host: str) -> Profile:
        """This profile with the engine core of `host` (HOSTS): "median" as shipped, the
        median of the model's traced hosts on this GPU; "slowest" or "fastest" with that
        traced host's own core times (decode-only, graph-less with its spread, and piecewise
        where its trace held enough such steps), and where a graph-less step's GPU span is the
        launches' shadow, that span at the host's pace (`_eager_shadow`). Measured on the slow
        host's own traffic, those times bring its prediction to the measurement
        (docs/validation.md, "Three more H100 leases"). A profile with no traced host is
        returned as it is."""
        if host not in HOSTS:
            raise ValueError(f"unknown host {host!r}; known: {', '.join(HOSTS)}")
        end, drafter = self.traced_host(host), self.traced_drafter(host)
        upd: dict[str, float] = {}
        if end is not None:
            upd |= {"core_graph_s": end.core_graph_s, "core_eager_s": end.core_eager_s}
            if end.eager_sigma:
                upd["eager_sigma"] = end.eager_sigma
            if end.core_piecewise_s is not None:
                upd["core_piecewise_s"] = end.core_piecewise_s
            upd |= self._eager_shadow(end)
        if drafter is not None:  # a draft model's passes: that end's pace too
            upd["draft_serving_scale"] = drafter.draft_serving_scale
        if not upd:
            return self
        return self.model_copy(update={"step": self.step.model_copy(update=upd)})

    def _eager_shadow(self, end: HostCore) -> dict[str, float]:
        """A graph-less step's GPU terms on host `end`, where the profile's are the launches'
        shadow: when the median host's core takes longer over such a step than the GPU spans
        it (`core_eager_s` > `eager_gpu_s`: Llama-3.1-8B on an H100, 20.9 against 19.4 ms), the
        GPU waits on each kernel's launch, and its span moves with the host's pace (the
        traced FP8 chat hosts' spans 0.77-0.80 of their core's time, 17.2-26.0 ms). So the span
        (`eager_gpu_s`) and the jump the calibration engines measured just past the largest
        graph (`eager_step_s`) take the ratio of that host's core time to the median's.
        Where the GPU's span is the longer (Qwen3-32B FP8: 61.3 against 31.8 ms), the step
        is the GPU's on any host and nothing moves."""
        s = self.step
        if not (s.core_eager_s and end.core_eager_s and 0 < s.eager_gpu_s < s.core_eager_s):
            return {}
        ratio = end.core_eager_s / s.core_eager_s
        return {"eager_gpu_s": s.eager_gpu_s * ratio, "eager_step_s": s.eager_step_s * ratio}

    def traced_drafter(self, host: str) -> DrafterHost | None:
        """The traced draft-model engine at one end (`host` "slowest" or "fastest"), by its
        core's step of one request; None for "median" or where none was traced."""
        if host == "slowest":
            return max(self.drafter_hosts, key=lambda h: h.step_s, default=None)
        if host == "fastest":
            return min(self.drafter_hosts, key=lambda h: h.step_s, default=None)
        return None

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        if p.is_dir():
            p = p / "profile.json"
        try:
            return cls.model_validate_json(p.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read profile ({e.strerror})", file=str(p)) from e
        except ValueError as e:
            raise ConfigError(f"not a valid profile: {str(e).splitlines()[0]}", file=str(p)) from e

    def to_json(self) -> dict[str, object]:
        """The profile as JSON data; a one-group capacity leaves out the pool's keys, so
        such profiles read as they did before pools were recorded."""
        data = self.model_dump(mode="json")
        if not self.kv.pooled:
            for key in _POOL_KEYS:
                data["kv"].pop(key, None)
        return data

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")
