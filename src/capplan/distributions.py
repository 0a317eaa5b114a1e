"""Token-length distributions, each carrying its analytic mean (Ciw's habit).

Samples are integers >= 1; `rng` is always injected.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Dist(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

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


class Normal(_Dist):
    """Rounded normal, clipped to [min, max]; the mean reported is the clipped one's."""

    kind: Literal["normal"] = "normal"
    mean_tokens: float = Field(gt=0, alias="mean")
    std: float = Field(ge=0)
    min_tokens: int = Field(default=1, ge=1, alias="min")
    max_tokens: int = Field(alias="max")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(rng.normal(self.mean_tokens, self.std, n))
        return np.clip(x, self.min_tokens, self.max_tokens).astype(np.int64)

    @property
    def mean(self) -> float:
        if self.std == 0:
            return float(np.clip(round(self.mean_tokens), self.min_tokens, self.max_tokens))
        return _clipped_mean(self.sample(np.random.default_rng(0), 200_000))

    @property
    def max(self) -> int:
        return self.max_tokens


class LogNormal(_Dist):
    """Lognormal with the given mean (not median) and sigma of log, clipped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    mean_tokens: float = Field(gt=0, alias="mean")
    sigma: float = Field(gt=0)
    min_tokens: int = Field(default=1, ge=1, alias="min")
    max_tokens: int = Field(alias="max")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean_tokens) - self.sigma**2 / 2
        x = np.rint(rng.lognormal(mu, self.sigma, n))
        return np.clip(x, self.min_tokens, self.max_tokens).astype(np.int64)

    @property
    def mean(self) -> float:
        return _clipped_mean(self.sample(np.random.default_rng(0), 200_000))

    @property
    def max(self) -> int:
        return self.max_tokens


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


def _clipped_mean(x: np.ndarray) -> float:
    return float(x.mean())


LengthDist = Annotated[
    Constant | Uniform | Normal | LogNormal | Empirical, Field(discriminator="kind")
]
