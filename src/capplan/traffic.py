"""What a workload is: its arrivals, prompt and output lengths, prompt structure, SLOs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from capplan._input import InputModel
from capplan.distributions import LengthDist
from capplan.pool import SpeculativeConfig, alpha_from_mean_length

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class PoissonArrival(InputModel):
    """Open loop, exponential gaps (`vllm bench serve --request-rate R`)."""

    model_config = _FROZEN
    kind: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0)


class GammaArrival(InputModel):
    """Open loop, gamma gaps with coefficient of variation `cv` (cv > 1: bursty)."""

    model_config = _FROZEN
    kind: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0)
    cv: float = Field(gt=0)


class ClosedLoop(InputModel):
    """Closed loop: `concurrency` users, each sending the next request when the last ends
    (`vllm bench serve --max-concurrency C` with an unbounded request rate)."""

    model_config = _FROZEN
    kind: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1)
    think_time_s: float = Field(default=0.0, ge=0)


class DailyArrival(InputModel):
    """A peak rate and 24 hourly fractions of it. Simulation and sizing run at the peak hour;
    the profile sets the average rate that cost figures use."""

    model_config = _FROZEN
    kind: Literal["daily"] = "daily"
    peak_rate_rps: float = Field(gt=0)
    hourly_fraction: list[float] = Field(min_length=24, max_length=24)
    cv: float = Field(default=1.0, gt=0, description="burstiness within the hour (1 = Poisson)")

    @model_validator(mode="after")
    def _check(self) -> DailyArrival:
        if not all(0 <= f <= 1 for f in self.hourly_fraction) or max(self.hourly_fraction) != 1:
            raise ValueError("hourly_fraction values must lie in [0, 1] and the peak hour be 1.0")
        return self


class ReplayArrival(InputModel):
    """Exact replay of recorded requests from a CSV or JSONL file with columns
    `arrival_s, input_tokens, output_tokens[, prefix_group, prefix_tokens]`."""

    model_config = _FROZEN
    kind: Literal["replay"] = "replay"
    path: Path
    time_scale: float = Field(default=1.0, gt=0, description="> 1 replays faster (more load)")
    loop: bool = Field(default=False, description="repeat the trace to fill the duration")


Arrival = Annotated[
    PoissonArrival | GammaArrival | ClosedLoop | DailyArrival | ReplayArrival,
    Field(discriminator="kind"),
]


class PrefixSpec(InputModel):
    """Prompt structure for prefix caching: each prompt starts with one of `groups` distinct
    shared prefixes; the rest of it is unique. The hit rate emerges from the simulated cache.
    Alternatively `target_hit_rate` fixes the cached fraction of every prompt."""

    model_config = _FROZEN
    shared_tokens: int | None = Field(default=None, ge=1)
    shared_fraction: float | None = Field(default=None, gt=0, le=1)
    groups: int = Field(default=1, ge=1)
    zipf_s: float = Field(default=0.0, ge=0, description="popularity skew of groups (0: uniform)")
    target_hit_rate: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one_way(self) -> PrefixSpec:
        given = [
            x is not None for x in (self.shared_tokens, self.shared_fraction, self.target_hit_rate)
        ]
        if sum(given) != 1:
            raise ValueError("give exactly one of shared_tokens, shared_fraction, target_hit_rate")
        return self


class ImageSpec(InputModel):
    """Multimodal requests: images per request and the tokens each image becomes."""

    model_config = _FROZEN
    images_per_request: int = Field(default=1, ge=1)
    tokens_per_image: int = Field(ge=1)


_SLO_KEY = re.compile(r"^(ttft|itl|tpot|e2e)_p(\d{1,2}(?:\.\d+)?)_s$")
_SLO_SHAPE = re.compile(r"^(ttft|itl|tpot|e2e)_p\d+(?:\.\d+)?_s$")
"""A key of the right shape whose percentile is not below 100."""


def slo_percentile(key: str) -> float | None:
    """The percentile of an SLO key (`itl_p99.9_s` -> 99.9), None for another string."""
    m = _SLO_KEY.match(key)
    return float(m[2]) if m else None


def slo_allowed_share(key: str) -> float | None:
    """The share of observations an SLO key lets past its limit (`itl_p99_s` -> 0.01)."""
    q = slo_percentile(key)
    return None if q is None else 1.0 - q / 100.0


class SloTarget(InputModel):
    """One latency target: `metric` at `percentile` must be <= `limit_s`."""

    model_config = _FROZEN
    metric: Literal["ttft", "itl", "tpot", "e2e"]
    percentile: float = Field(gt=0, lt=100)
    limit_s: float = Field(gt=0)

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.percentile:g}_s"


class Slo(InputModel):
    """SLOs as written in YAML: `{ttft_p99_s: 0.5, itl_p99_s: 0.05, e2e_p90_s: 20}`."""

    model_config = _FROZEN
    targets: tuple[SloTarget, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if isinstance(data, list | tuple):
            raise ValueError("write SLOs as a mapping of key to seconds, such as "
                             "{ttft_p99_s: 0.5, itl_p99_s: 0.05}, not a list")
        if isinstance(data, dict) and "targets" not in data:
            targets = []
            for key, value in data.items():
                m = _SLO_KEY.match(str(key))
                if m is not None and float(m[2]) == 0:
                    m = None  # p0: of the right shape, outside (0, 100)
                if m is None and _SLO_SHAPE.match(str(key)):
                    raise ValueError(
                        f"SLO key {key!r}: the percentile must lie between 0 and 100 "
                        "(exclusive), e.g. p99 or p99.9"
                    )
                if m is None:
                    raise ValueError(
                        f"unknown SLO key {key!r}; write <ttft|itl|tpot|e2e>_p<percentile>_s, "
                        "e.g. ttft_p99_s"
                    )
                if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                    raise ValueError(f"SLO {key} must be a positive number of seconds")
                targets.append(
                    {"metric": m[1], "percentile": float(m[2]), "limit_s": float(value)}
                )
            return {"targets": targets}
        return data


class Workload(InputModel):
    """One class of requests and the latency it is promised."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    pool: str
    arrival: Arrival
    input_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    prefix: PrefixSpec | None = None
    image: ImageSpec | None = None
    priority: int = Field(default=0, description="lower runs first under priority scheduling")
    slo: Slo = Field(default_factory=Slo)
    spec_acceptance: float | None = Field(
        default=None, ge=0, lt=1,
        description="P(a draft token is accepted, given the drafts before it were); default "
        "from the pool",
    )
    spec_mean_acceptance_length: float | None = Field(
        default=None, ge=1,
        description="instead of spec_acceptance: vLLM's logged \"Mean acceptance length\" "
        "at the pool's k (needs a fixed engine.speculative)",
    )

    def acceptance(self, spec: SpeculativeConfig) -> float:
        """The per-position draft acceptance this workload meets on `spec`'s engine."""
        if self.spec_acceptance is not None:
            return self.spec_acceptance
        if self.spec_mean_acceptance_length is not None:
            return alpha_from_mean_length(self.spec_mean_acceptance_length,
                                          spec.num_speculative_tokens)
        return spec.acceptance

    @model_validator(mode="after")
    def _lengths(self) -> Workload:
        if self.spec_acceptance is not None and self.spec_mean_acceptance_length is not None:
            raise ValueError("give spec_acceptance or spec_mean_acceptance_length, not both")
        if not isinstance(self.arrival, ReplayArrival) and (
            self.input_tokens is None or self.output_tokens is None
        ):
            raise ValueError("input_tokens and output_tokens are required unless arrival is replay")
        shared = self.prefix.shared_tokens if self.prefix else None
        if shared and self.input_tokens and shared >= self.input_tokens.max:
            raise ValueError("prefix.shared_tokens must be below the largest input length")
        return self

    @property
    def mean_input_tokens(self) -> float:
        assert self.input_tokens is not None
        extra = self.image.images_per_request * self.image.tokens_per_image if self.image else 0
        return self.input_tokens.mean + extra

    @property
    def mean_output_tokens(self) -> float:
        assert self.output_tokens is not None
        return self.output_tokens.mean
