"""Token-length distributions, each carrying its analytic mean (Ciw's habit).

Samples are integers >= 1; `rng` is always injected.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from capplan._input import InputModel


class _Dist(InputModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def mean(self) -> float:
        raise NotImplementedError

    @property
    def max(self) -> int:
        """The largest value it can produce (a cap, for max_model_len checks)."""
        raise NotImplementedError


class Constant(_Dist):
    kind: Literal["constant"] = "constant"
    value: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def max(self) -> int:
        return self.value


class Uniform(_Dist):
    """Integers uniform on [low, high]."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, n, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def max(self) -> int:
        return self.high


class _Clipped(_Dist):
    """A continuous shape around a mean, rounded to tokens and clipped to [min, max]; the
    mean it reports is the clipped one's (estimated from a fixed-seed sample)."""

    mean_tokens: float = Field(gt=0, alias="mean")
    min_tokens: int = Field(default=1, ge=1, alias="min")
    max_tokens: int = Field(ge=1, alias="max")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True,
                              allow_inf_nan=False)

    @model_validator(mode="after")
    def _order(self) -> _Clipped:
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max ({self.max_tokens}) must be >= min ({self.min_tokens})")
        if not self.min_tokens <= self.mean_tokens <= self.max_tokens:
            raise ValueError(f"mean ({self.mean_tokens:g}) must lie within [min, max] "
                             f"([{self.min_tokens}, {self.max_tokens}])")
        return self

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x: np.ndarray = np.clip(np.rint(self._draw(rng, n)), self.min_tokens, self.max_tokens)
        return x.astype(np.int64)

    @property
    def mean(self) -> float:
        return _sample_mean(self)

    @property
    def max(self) -> int:
        return self.max_tokens


@functools.lru_cache(maxsize=1024)
def _sample_mean(dist: _Clipped) -> float:
    """A clipped distribution's mean, from a fixed-seed sample: the same for equal ones, so
    drawn once each (sizing asks for it dozens of times a pool)."""
    return float(dist.sample(np.random.default_rng(0), 200_000).mean())


class Normal(_Clipped):
    """Rounded normal, clipped to [min, max]."""

    kind: Literal["normal"] = "normal"
    std: float = Field(ge=0)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(self.mean_tokens, self.std, n)

    @property
    def mean(self) -> float:
        if self.std == 0:
            return float(np.clip(round(self.mean_tokens), self.min_tokens, self.max_tokens))
        return super().mean


class LogNormal(_Clipped):
    """Lognormal with the given mean (not median) and sigma of log, clipped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    sigma: float = Field(gt=0)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(math.log(self.mean_tokens) - self.sigma**2 / 2, self.sigma, n)


class Empirical(_Dist):
    """A histogram: `values[i]` drawn with weight `weights[i]`."""

    kind: Literal["empirical"] = "empirical"
    values: list[int] = Field(min_length=1)
    weights: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Empirical:
        if len(self.values) != len(self.weights):
            raise ValueError("values and weights must have the same length")
        if min(self.values) < 1:
            raise ValueError("values must be >= 1")
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        return self

    def _p(self) -> np.ndarray:
        w = np.asarray(self.weights, dtype=float)
        p: np.ndarray = w / w.sum()
        return p

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=self._p())

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, self._p()))

    @property
    def max(self) -> int:
        return max(self.values)


LengthDist = Annotated[
    Constant | Uniform | Normal | LogNormal | Empirical, Field(discriminator="kind")
]
