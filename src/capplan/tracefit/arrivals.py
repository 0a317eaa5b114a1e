"""Arrival processes fitted from timestamps: rate at the peak hour, burstiness, daily shape.

Sizing runs at the peak, so the rate is the busiest clock hour's (the whole trace when it
spans an hour or less). Burstiness is the coefficient of variation (CV) of inter-arrival
gaps within that window: a Poisson process has CV 1; a CV outside the sampling tolerance
becomes a gamma process with that CV. A trace spanning a day or more becomes `daily`, with
each clock hour's mean rate as a fraction of the busiest one's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from capplan.traffic import Arrival, DailyArrival, GammaArrival, PoissonArrival

__all__ = ["DAY_S", "HOUR_S", "ArrivalFit", "fit_arrivals", "poisson_tolerance"]

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
_MIN_COVER_S = 1800.0  # a clock hour must be at least half inside the trace to be the peak
_MIN_WINDOW_REQUESTS = 10  # a sparser peak hour says nothing: use the whole trace
_MIN_CV = 0.01  # perfectly regular arrivals: a gamma this smooth (cv 0 is not a process)


@dataclass(frozen=True)
class Span:
    """First and last arrival of one workload and its request count."""

    t0_s: float
    t1_s: float
    requests: int


@dataclass(frozen=True)
class ArrivalFit:
    """A fitted arrival process and the window it was measured on."""

    arrival: Arrival
    rate_rps: float  # in the measured window (the peak hour)
    mean_rate_rps: float  # over the whole trace
    cv: float
    span_s: float
    window_start_s: float
    window_s: float
    how: str


def poisson_tolerance(gaps: int) -> float:
    """|CV - 1| still read as Poisson: 3 standard errors of the CV of exponential gaps
    (sqrt(2 / n) for large n), never below 0.1."""
    return max(0.1, 3 * math.sqrt(2.0 / max(gaps, 1)))


def _windows(
    hourly: pl.DataFrame, spans: dict[str, Span]
) -> tuple[dict[str, tuple[float, float, int, bool]], dict[str, list[float]]]:
    """Per workload: the measured window (start, end, requests, whole trace?) and, for
    traces of a day or more, the mean rate of each of the 24 hours of day."""
    windows: dict[str, tuple[float, float, int, bool]] = {}
    daily: dict[str, list[float]] = {}
    for w, span in spans.items():
        rows = hourly.filter(pl.col("workload") == w)
        hours = rows.get_column("hour").to_list()
        counts = rows.get_column("n").to_list()
        cover = [
            min((h + 1) * HOUR_S, span.t1_s) - max(h * HOUR_S, span.t0_s) for h in hours
        ]
        whole = (span.t0_s, math.nextafter(span.t1_s, math.inf), span.requests, True)
        windows[w] = whole
        if span.t1_s - span.t0_s > HOUR_S:
            best = max(
                (i for i, c in enumerate(cover) if c >= _MIN_COVER_S),
                key=lambda i: counts[i] / cover[i],
            )
            start = max(hours[best] * HOUR_S, span.t0_s)
            end = min((hours[best] + 1) * HOUR_S, whole[1])
            if counts[best] >= _MIN_WINDOW_REQUESTS:
                windows[w] = (start, end, counts[best], False)
        if span.t1_s - span.t0_s >= DAY_S:
            n_hod = [0.0] * 24
            cover_hod = [0.0] * 24
            for h, n, c in zip(hours, counts, cover, strict=True):
                n_hod[h % 24] += n
                cover_hod[h % 24] += max(c, 0.0)
            rate = [n / c if c > 0 else 0.0 for n, c in zip(n_hod, cover_hod, strict=True)]
            daily[w] = rate
    return windows, daily


def fit_arrivals(frame: pl.LazyFrame, spans: dict[str, Span]) -> dict[str, ArrivalFit]:
    """Fit every workload's arrivals from `frame` (columns workload, t_s), in two streaming
    passes: requests per clock hour, then gap statistics inside each peak window."""
    hourly = (
        frame.select(
            "workload", (pl.col("t_s") / HOUR_S).floor().cast(pl.Int64).alias("hour")
        )
        .group_by("workload", "hour")
        .agg(pl.len().alias("n"))
        .sort("workload", "hour")
        .collect(engine="streaming")
    )
    windows, daily = _windows(hourly, spans)
    bounds = pl.LazyFrame(
        {
            "workload": list(windows),
            "w0": [v[0] for v in windows.values()],
            "w1": [v[1] for v in windows.values()],
        },
        schema={"workload": pl.String, "w0": pl.Float64, "w1": pl.Float64},
    )
    gap = pl.col("gap")
    stats = (
        frame.select("workload", "t_s")
        .join(bounds, on="workload")
        .filter((pl.col("t_s") >= pl.col("w0")) & (pl.col("t_s") < pl.col("w1")))
        .select("workload", "t_s")
        .sort("workload", "t_s")
        .with_columns(pl.col("t_s").diff().over("workload").alias("gap"))
        .group_by("workload")
        .agg(
            gap.mean().alias("mean"),
            gap.std().alias("std"),
            gap.count().alias("n"),
            (gap == 0).sum().alias("zeros"),
        )
        .collect(engine="streaming")
    )
    out: dict[str, ArrivalFit] = {}
    for row in stats.iter_rows(named=True):
        w = row["workload"]
        span = spans[w]
        start, end, n_window, whole = windows[w]
        n_gaps = int(row["n"])
        measured = n_gaps >= 2 and row["std"] is not None and row["mean"] > 0
        cv = max(float(row["std"]) / float(row["mean"]), _MIN_CV) if measured else 1.0
        width = span.t1_s - span.t0_s if whole else min(end, span.t1_s) - start
        rate = (n_window - 1) / width if whole else n_window / width
        tol = poisson_tolerance(n_gaps)
        poisson = not measured or abs(cv - 1.0) <= tol
        where = "whole trace" if whole else f"peak clock hour starting t={start:.0f} s"
        how = (
            f"rate {rate:.3g} req/s over the {where} ({n_window} requests); gap CV {cv:.2f} "
            + (f"within {tol:.2f} of 1 -> poisson" if poisson else f"-> gamma (cv {cv:.2f})")
        )
        if not measured:
            how = f"rate {rate:.3g} req/s over the {where}; too few gaps to measure, poisson"
        if row["zeros"] and row["zeros"] > 0.01 * n_gaps:
            how += f"; {row['zeros'] / n_gaps:.0%} of gaps are 0 (coarse timestamps inflate CV)"
        arrival: Arrival
        if w in daily:
            hod = daily[w]
            peak = max(hod)
            fractions = [round(r / peak, 3) for r in hod]
            fractions[hod.index(peak)] = 1.0
            arrival = DailyArrival(
                peak_rate_rps=_sig(peak),
                hourly_fraction=fractions,
                cv=1.0 if poisson else _sig(cv),
            )
            rate = peak
            how += f"; {span.t1_s - span.t0_s:.0f} s >= 24 h -> daily, peak hour-of-day mean"
        elif poisson:
            arrival = PoissonArrival(rate_rps=_sig(rate))
        else:
            arrival = GammaArrival(rate_rps=_sig(rate), cv=_sig(cv))
        out[w] = ArrivalFit(
            arrival=arrival,
            rate_rps=rate,
            mean_rate_rps=(span.requests - 1) / (span.t1_s - span.t0_s),
            cv=cv,
            span_s=span.t1_s - span.t0_s,
            window_start_s=start,
            window_s=width,
            how=how,
        )
    return out


def _sig(x: float, digits: int = 4) -> float:
    """Round to `digits` significant figures (stable, readable YAML)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))
