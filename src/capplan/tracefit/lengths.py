"""Token-length distributions fitted from a histogram of observed lengths.

The input is the exact histogram (`value -> count`, what a streaming `group_by` returns), so
a 10 M-row trace costs one small table. A lognormal is fitted by moments (mean, variance)
and clipped at the observed p99.9; when its Kolmogorov-Smirnov distance from the data
exceeds `KS_MAX` the fit falls back to an empirical histogram of `EMPIRICAL_BINS` bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from capplan.distributions import Constant, Empirical, LengthDist, LogNormal

__all__ = ["EMPIRICAL_BINS", "KS_MAX", "LengthFit", "fit_lengths", "histogram_dist"]

KS_MAX = 0.05
"""Largest KS distance at which the lognormal is kept: an effect size, not a p-value (with
millions of rows every parametric fit is 'significantly' wrong)."""

EMPIRICAL_BINS = 64
"""Equal-probability bins of an empirical fit; each keeps its bin's mean, so the mean holds."""


@dataclass(frozen=True)
class LengthFit:
    """A fitted length distribution and the numbers that justify it."""

    dist: LengthDist
    mean: float
    p50: int
    p99: int
    p999: int
    max: int
    ks: float | None  # KS distance of the lognormal fit (None: constant data)
    how: str  # one phrase for the YAML header, e.g. "lognormal (KS 0.012)"


def _quantile(values: np.ndarray, cdf: np.ndarray, q: float) -> int:
    return int(values[min(int(np.searchsorted(cdf, q - 1e-12)), len(values) - 1)])


def lognormal_cdf(x: np.ndarray, mean: float, sigma: float, max_tokens: int) -> np.ndarray:
    """P(X <= x) for `LogNormal(mean, sigma, min=1, max)`: rint of a lognormal, clipped."""
    mu = math.log(mean) - sigma**2 / 2
    with np.errstate(divide="ignore"):
        z = (np.log(np.asarray(x, dtype=float) + 0.5) - mu) / sigma
    cdf = ndtr(z)
    return np.where(np.asarray(x) >= max_tokens, 1.0, cdf)


def clipped_mean(mean: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for a lognormal X of the given mean and log-sigma."""
    mu = math.log(mean) - sigma**2 / 2
    z = (math.log(cap) - mu) / sigma
    return float(mean * ndtr(z - sigma) + cap * (1 - ndtr(z)))


def _unclipped_mean(target: float, sigma: float, cap: float) -> float:
    """The lognormal mean whose clip at `cap` has mean `target` (moments are matched
    after clipping, so the fitted mean is the observed one)."""
    m = target
    for _ in range(50):
        step = target / clipped_mean(m, sigma, cap)
        m *= step
        if abs(step - 1) < 1e-6:
            break
    return m


def fit_lengths(values: np.ndarray, counts: np.ndarray, *, ks_max: float = KS_MAX) -> LengthFit:
    """Fit lengths whose histogram is `values` (>= 1) with `counts`."""
    order = np.argsort(values)
    v = np.asarray(values, dtype=np.int64)[order]
    c = np.asarray(counts, dtype=np.float64)[order]
    if len(v) == 0 or c.sum() <= 0:
        raise ValueError("no lengths to fit")
    if v[0] < 1:
        raise ValueError(f"lengths must be >= 1, found {v[0]}")
    p = c / c.sum()
    cdf = np.cumsum(p)
    mean = float(np.dot(v, p))
    var = float(np.dot((v - mean) ** 2, p))
    stats = {
        "p50": _quantile(v, cdf, 0.5),
        "p99": _quantile(v, cdf, 0.99),
        "p999": _quantile(v, cdf, 0.999),
        "max": int(v[-1]),
    }
    if len(v) == 1 or var == 0:
        return LengthFit(Constant(value=int(v[0])), mean, ks=None, how="constant", **stats)
    sigma = round(math.sqrt(math.log1p(var / mean**2)), 4)
    cap = max(stats["p999"], 2)
    mean_tokens = round(_unclipped_mean(mean, sigma, cap), 1)
    logn = LogNormal(mean_tokens=mean_tokens, sigma=sigma, min_tokens=1, max_tokens=cap)
    fitted = lognormal_cdf(v, logn.mean_tokens, logn.sigma, cap)
    left = np.concatenate(([0.0], cdf[:-1]))
    fitted_left = lognormal_cdf(v - 1, logn.mean_tokens, logn.sigma, cap)
    ks = float(max(np.max(np.abs(cdf - fitted)), np.max(np.abs(left - fitted_left))))
    if ks <= ks_max:
        how = f"lognormal by moments, clipped at p99.9 (KS {ks:.3f} <= {ks_max})"
        return LengthFit(logn, mean, ks=ks, how=how, **stats)
    how = f"empirical, {EMPIRICAL_BINS} bins (lognormal KS {ks:.3f} > {ks_max})"
    return LengthFit(histogram_dist(v, c), mean, ks=ks, how=how, **stats)


def histogram_dist(values: np.ndarray, counts: np.ndarray, bins: int = EMPIRICAL_BINS) -> Empirical:
    """An `Empirical` of at most `bins` equal-probability bins, each at its (rounded) mean."""
    order = np.argsort(values)
    v = np.asarray(values, dtype=np.float64)[order]
    c = np.asarray(counts, dtype=np.float64)[order]
    keep = c > 0
    v, c = v[keep], c[keep]
    if len(v) <= bins:
        return Empirical(values=[int(x) for x in v], weights=_shares(c))
    # bin index of each distinct value: by the cumulative share *before* it
    share = (np.cumsum(c) - c) / c.sum()
    idx = np.minimum((share * bins).astype(np.int64), bins - 1)
    weight = np.bincount(idx, weights=c, minlength=bins)
    total = np.bincount(idx, weights=c * v, minlength=bins)
    used = weight > 0
    mids = np.maximum(np.rint(total[used] / weight[used]), 1).astype(np.int64)
    merged: dict[int, float] = {}
    for value, w in zip(mids.tolist(), weight[used].tolist(), strict=True):
        merged[value] = merged.get(value, 0.0) + w
    return Empirical(values=list(merged), weights=_shares(np.array(list(merged.values()))))


def _shares(counts: np.ndarray) -> list[float]:
    """Weights as shares rounded to 6 digits (readable YAML; sampling normalises them)."""
    return [round(float(x), 6) for x in counts / counts.sum()]
