"""What a pool is: a model on a GPU type with vLLM engine settings, N replicas behind a router.

Defaults are vLLM 0.26.0's for `vllm serve` on a GPU with >= 70 GiB (H100/H200):
`vllm/engine/arg_utils.py` (get_batch_defaults: OPENAI_API_SERVER → 8192 batched tokens,
1024 seqs), `vllm/config/cache.py` (gpu_memory_utilization 0.92, prefix caching on),
block size 16 (FlashAttention's), `vllm/config/scheduler.py` (fcfs, async scheduling on).

A traffic file may leave `gpu`, `precision`, `engine.speculative`, `engine.max_num_seqs` and
`engine.max_num_batched_tokens` open (`auto`) for `capplan size` to choose; an open `gpu`
takes its candidates and their prices from `price_per_gpu_hour`, given per GPU (`{h100: 2.9,
h200: 3.7}`). An open engine setting is not a value of its field: the field keeps its type
(an int, a SpeculativeConfig or None) and holds vLLM's default as a placeholder, the engine
remembers which settings are open (`EngineConfig.auto`) and dumps them as `auto`. Nothing
may simulate or deploy an engine with open settings (`profiles.resolve_profile` and deploy
refuse it); `EngineConfig.fixed` closes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from capplan._input import InputModel
from capplan.errors import ConfigError
from capplan.hardware import GPUS, Precision

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

AutoSetting = Literal["speculative", "max_num_seqs", "max_num_batched_tokens"]
PoolHost = Literal["median", "slowest", "fastest", "any"]
"""Whose engine core a pool is priced on (Pool.host): profile.HOSTS, or `any` of them."""
AUTO_SETTINGS: tuple[AutoSetting, ...] = ("speculative", "max_num_seqs", "max_num_batched_tokens")
"""Engine settings a traffic file may leave `auto` for `capplan size` to choose."""


def _or_auto(schema: dict[str, Any]) -> None:
    """The field's JSON schema with `auto` as one more alternative (before null)."""
    alts = schema.pop("anyOf", None)
    if alts is None:
        keep = ("default", "description", "title")
        alts = [{k: schema.pop(k) for k in list(schema) if k not in keep}]
    nulls = [a for a in alts if a.get("type") == "null"]
    schema["anyOf"] = [
        *(a for a in alts if a.get("type") != "null"), {"const": "auto", "type": "string"}, *nulls
    ]


def alpha_from_mean_length(length: float, k: int) -> float:
    """The per-position acceptance α that gives vLLM's logged "Mean acceptance length" at k
    drafts a step: L = 1 + α + α² + … + α^k (vllm/v1/spec_decode/metrics.py: 1 + accepted /
    drafts, the bonus token included). The simulator accepts each draft with probability α
    once every draft before it was accepted (sim/core.py update_from_output)."""
    if not 1 <= length < 1 + k:
        raise ValueError(
            f"mean acceptance length {length} must be at least 1 and below 1 + k = {1 + k}")
    if length == 1:
        return 0.0
    from scipy.optimize import brentq  # scipy.optimize imports slowly, and is rarely needed

    return float(brentq(lambda a: sum(a**i for i in range(1, k + 1)) - (length - 1), 0.0, 1.0,
                        xtol=1e-9))


class SpeculativeConfig(InputModel):
    """`--speculative-config '{"method": ..., "num_speculative_tokens": k}'`."""

    model_config = _FROZEN
    method: Literal["mtp", "eagle", "eagle3", "draft_model", "ngram"] = "mtp"
    num_speculative_tokens: int = Field(ge=1, le=8)
    acceptance: float = Field(
        default=0.7, ge=0, lt=1,
        description="P(a draft token is accepted, given the drafts before it were): the "
        "per-position conditional rate, unless a workload says",
    )
    mean_acceptance_length: float | None = Field(
        default=None, ge=1,
        description="instead of acceptance: vLLM's logged \"Mean acceptance length\" at this "
        "k (1 + accepted drafts a step), from which acceptance is solved",
    )

    @model_validator(mode="after")
    def _from_mean_length(self) -> SpeculativeConfig:
        if self.mean_acceptance_length is None:
            return self
        try:
            alpha = alpha_from_mean_length(self.mean_acceptance_length,
                                           self.num_speculative_tokens)
        except ValueError as e:
            raise ValueError(f"mean_acceptance_length: {e}") from None
        # (a dumped config carries both, the one solved from the other)
        if "acceptance" in self.model_fields_set and abs(self.acceptance - alpha) > 1e-6:
            raise ValueError("give acceptance or mean_acceptance_length, not both")
        object.__setattr__(self, "acceptance", alpha)
        return self


class EngineConfig(InputModel):
    """The vLLM engine settings that change capacity or latency."""

    model_config = _FROZEN
    max_num_seqs: int = Field(
        default=1024, ge=1, json_schema_extra=_or_auto,
        description="auto: `capplan size` tries 64, 128, 256, 512 and 1024",
    )
    max_num_batched_tokens: int = Field(
        default=8192, ge=16, json_schema_extra=_or_auto,
        description="the scheduler's token budget a step, so the largest prefill chunk; auto: "
        "`capplan size` tries 512, 1024, 2048, 4096 and 8192",
    )
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=16, description="None: the model's")
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    speculative: SpeculativeConfig | None = Field(
        default=None, json_schema_extra=_or_auto,
        description="null: none; auto: `capplan size` tries none and every speculative "
        "configuration measured for the pool's model and precision",
    )
    limit_mm_per_prompt: dict[str, int] | None = Field(
        default=None, description='{"image": 0} frees the vision encoder reservation'
    )
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    async_scheduling: bool = True
    _auto: frozenset[AutoSetting] = PrivateAttr(default=frozenset())

    @model_validator(mode="wrap")
    @classmethod
    def _take_auto(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """`auto` marks the setting open and leaves the field at its default (a placeholder)."""
        auto: set[AutoSetting] = set()
        if isinstance(data, dict):
            auto = {k for k in AUTO_SETTINGS if data.get(k) == "auto"}
            data = {k: v for k, v in data.items() if k not in auto}
        engine = handler(data)
        if (not auto & {"max_num_seqs", "max_num_batched_tokens"}
                and engine.max_num_batched_tokens < engine.max_num_seqs):
            # vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len: the engine
            # refuses to start (`vllm serve` defaults max_num_seqs to 1024 on an H200)
            raise ValueError(
                f"max_num_batched_tokens {engine.max_num_batched_tokens} is below max_num_seqs "
                f"{engine.max_num_seqs}, which vLLM 0.26.0 refuses to start with; set "
                f"max_num_seqs to {engine.max_num_batched_tokens} or less (or auto), or raise "
                "max_num_batched_tokens")
        if auto:
            engine._auto = frozenset(auto)
        return engine

    @model_validator(mode="before")
    @classmethod
    def _ngram_runs_synchronously(cls, data: Any) -> Any:
        """vLLM 0.26.0 cannot schedule asynchronously with the n-gram drafter on the CPU
        (vllm/config/vllm.py, VllmConfig.__post_init__: asked for, it refuses to start; left
        unset, it turns it off), so neither does a pool that uses it."""
        if not isinstance(data, dict):
            return data
        spec = data.get("speculative")
        method = spec.get("method") if isinstance(spec, dict) else getattr(spec, "method", None)
        if method != "ngram":
            return data
        if data.get("async_scheduling") is True:
            raise ValueError("async_scheduling: vLLM 0.26.0 cannot schedule asynchronously "
                             "with the ngram drafter; set async_scheduling: false or leave "
                             "it out")
        return {**data, "async_scheduling": False}

    @field_validator("max_num_seqs", "max_num_batched_tokens", mode="before")
    @classmethod
    def _count_word(cls, v: Any) -> Any:
        if isinstance(v, str) and not v.isdigit():
            raise ValueError(f"expected a whole number or auto, got {v!r}")
        return v

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative_word(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(
                f"expected {{method: ..., num_speculative_tokens: k}}, null (none) or auto, "
                f"got {v!r}"
            )
        return v

    @model_serializer(mode="wrap")
    def _dump_auto(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for k in self._auto:
            data[k] = "auto"
        return data

    def __repr_args__(self) -> Any:
        for k, v in super().__repr_args__():
            yield k, "auto" if k in self._auto else v

    @property
    def max_num_scheduled_tokens(self) -> int:
        """The scheduler's token budget a step: `max_num_batched_tokens`, less the slots a
        draft model inserts when drafting, one a sequence (vllm/config/vllm.py:
        VllmConfig._set_max_num_scheduled_tokens, vllm/config/speculative.py:
        max_num_new_slots_for_drafting; MTP, EAGLE and n-gram insert none)."""
        drafts = self.speculative is not None and self.speculative.method == "draft_model"
        return self.max_num_batched_tokens - (self.max_num_seqs if drafts else 0)

    @property
    def auto(self) -> frozenset[AutoSetting]:
        """Settings left open for `capplan size`; their fields hold placeholders."""
        return self._auto

    def fixed(self, **values: Any) -> EngineConfig:
        """This engine with the open settings named in `values` set to them."""
        unknown = set(values) - set(AUTO_SETTINGS)
        if unknown:
            raise ValueError(f"not an open-able setting: {', '.join(sorted(unknown))}")
        return self.model_copy(update=values)

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self:
        """A copy; a setting given a value in `update` is no longer open."""
        out = super().model_copy(update=update, deep=deep)
        if update and self._auto & set(update):
            out._auto = frozenset(k for k in self._auto if k not in update)
        return out

    @property
    def text_only(self) -> bool:
        return self.limit_mm_per_prompt is not None and self.limit_mm_per_prompt.get("image") == 0


class Pool(InputModel):
    """A set of identical vLLM replicas; the router spreads the pool's workloads over them."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str
    gpu: str = Field(default="h200", description="h200 or h100; auto: `capplan size` tries "
                     "every GPU that price_per_gpu_hour prices")
    precision: Precision | Literal["auto"] = Precision.BF16
    tp: int = Field(default=1, ge=1, le=8, description="GPUs one replica's tensor "
                    "parallelism spans, within one 8-GPU node (capplan models no TP across "
                    "nodes)")
    router: Literal["round_robin", "least_outstanding", "prefix_affinity"] = "least_outstanding"
    price_per_gpu_hour: float | dict[str, float] = Field(
        default=3.5, description="USD per GPU-hour, or per GPU type ({h100: 2.9, h200: 3.7}): "
        "with gpu auto the GPUs to choose from, else the pool's gpu's price is taken")
    max_replicas: int = Field(default=64, ge=1, description="search cap when sizing")
    profile: str | None = Field(default=None, description="profile folder; default: best match")
    host: PoolHost = Field(
        default="median", description="whose engine core the replicas' steps are priced "
        "with: median, the median of the hosts the calibration traced serving the model on "
        "this GPU; slowest or fastest, that traced host's own core times (decode-only, "
        "graph-less, piecewise); any, sized on each of the three and the most GPUs kept, for "
        "hosts you do not choose (a slower core is not always the costlier: a faster one "
        "fills GPU-bound steps sooner and lengthens token gaps). A profile with no traced "
        "host prices them all the same")
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @field_validator("gpu")
    @classmethod
    def _gpu_known(cls, gpu: str) -> str:
        if gpu != "auto" and gpu not in GPUS:
            raise ValueError(f"unknown gpu {gpu!r}; known: {', '.join(sorted(GPUS))}, or auto")
        return gpu

    @model_validator(mode="after")
    def _one_price_per_gpu(self) -> Pool:
        """Prices per GPU type: each known and not negative; with `gpu: auto` they are the
        candidates, else the pool's gpu's price is the pool's (a float from here on)."""
        prices = self.price_per_gpu_hour
        if not isinstance(prices, dict):
            if prices < 0:
                raise ValueError(f"price_per_gpu_hour must be >= 0, got {prices}")
            if self.gpu == "auto":
                raise ValueError(
                    "gpu auto chooses among the GPUs price_per_gpu_hour prices: give it per GPU "
                    f"type, e.g. {{h100: 2.9, h200: 3.7}} (known: {', '.join(sorted(GPUS))})")
            return self
        if not prices:
            raise ValueError("price_per_gpu_hour per GPU type is empty: price at least one GPU")
        for gpu, price in prices.items():
            if gpu not in GPUS:
                raise ValueError(f"price_per_gpu_hour prices unknown gpu {gpu!r}; known: "
                                 f"{', '.join(sorted(GPUS))}")
            if price < 0:
                raise ValueError(f"price_per_gpu_hour.{gpu} must be >= 0, got {price}")
        if self.gpu == "auto":
            return self
        if self.gpu not in prices:
            raise ValueError(f"price_per_gpu_hour has no price for the pool's gpu {self.gpu!r}: "
                             f"add {self.gpu}: <USD per GPU-hour>, or set gpu auto")
        object.__setattr__(self, "price_per_gpu_hour", float(prices[self.gpu]))
        return self

    @property
    def gpu_prices(self) -> dict[str, float]:
        """USD per GPU-hour per GPU type the pool may run on: its gpu's, or with `gpu: auto`
        every GPU priced."""
        p = self.price_per_gpu_hour
        return dict(p) if isinstance(p, dict) else {self.gpu: p}

    @property
    def price(self) -> float:
        """USD per GPU-hour of a pool whose gpu is fixed."""
        p = self.price_per_gpu_hour
        if isinstance(p, dict):
            raise ValueError(f"pool {self.name!r} leaves gpu auto: it has no one price")
        return p

    @model_validator(mode="after")
    def _pinned_profile_is_fixed(self) -> Pool:
        # the caps change no step's time, so a pinned profile leaves them free
        opened = [f for f in self.open_settings
                  if f not in ("engine.max_num_seqs", "engine.max_num_batched_tokens")]
        if self.profile is not None and opened:
            raise ValueError(
                f"profile {self.profile!r} pins the step times of one GPU, precision and "
                f"drafter, so {opened[0]} cannot be auto; drop profile or set {opened[0]}"
            )
        return self

    @property
    def open_settings(self) -> list[str]:
        """Settings left `auto` for `capplan size`, as dotted field names."""
        out = ["gpu"] if self.gpu == "auto" else []
        out += ["precision"] if self.precision == "auto" else []
        return out + [f"engine.{k}" for k in AUTO_SETTINGS if k in self.engine.auto]


_HOW_TO_FIX = {
    "gpu": f"set one of {', '.join(sorted(GPUS))}",
    "precision": "set bf16, fp8, nvfp4 or awq",
    "engine.speculative": "set null (no speculative decoding) or {method: ..., "
    "num_speculative_tokens: k}",
    "engine.max_num_seqs": "set a number (vLLM 0.26.0's default on H200 is 1024)",
    "engine.max_num_batched_tokens": "set a number (vLLM 0.26.0's `vllm serve` default is 8192)",
}


def refuse_open(pool: Pool, *, file: str | None = None, where: str = "") -> None:
    """Raise when the pool leaves a setting `auto`: only `capplan size` chooses those, and
    nothing may simulate or deploy a placeholder. `where` prefixes the field (`pools.0.`)."""
    if not pool.open_settings:
        return
    field = pool.open_settings[0]
    raise ConfigError(
        f"pool {pool.name!r} leaves {field} auto, which `capplan size` chooses; to simulate "
        f"or deploy it, {_HOW_TO_FIX[field]} (or size the mix and deploy the plan)",
        file=file, field=where + field,
    )
