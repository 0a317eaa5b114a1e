"""A vLLM server's Prometheus `/metrics` scrape as workloads, one per `model_name`.

Metric names as vLLM 0.26.0 registers them (vllm/v1/metrics/loggers.py, PrometheusStatLogger;
prometheus_client adds `_total` to counters and `_bucket/_sum/_count` to histograms):
- `vllm:request_prompt_tokens`, `vllm:request_generation_tokens`: per-request length
  histograms with 1-2-5 buckets up to max_model_len (build_1_2_5_buckets);
- `vllm:request_success_total{finished_reason=...}`: finished requests;
- `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`: prompt tokens looked up
  in and served from the prefix cache (counted when a request is scheduled);
- `vllm:num_requests_running`, `vllm:num_requests_waiting`: gauges of the requests in the
  engine, logged together with the counters.
Series are summed over `engine` (data-parallel ranks). Counters are cumulative, so a rate
needs two scrapes and the time between them; lengths and the hit rate then describe the
interval between the scrapes, otherwise everything since the server started. Requests that
arrived in the interval are the ones that finished plus the growth of those in the engine:
over a short interval, or on an overloaded server, the finished count alone understates
the offered rate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capplan._yaml import read_utf8
from capplan.distributions import Empirical
from capplan.errors import ConfigError
from capplan.tracefit.result import SloLike, TraceFit, WorkloadFit, build_mix
from capplan.tracefit.scan import workload_name
from capplan.traffic import PoissonArrival, PrefixSpec

__all__ = ["Histogram", "Sample", "Scrape", "fit_metrics", "histogram_lengths", "parse_metrics"]

PROMPT = "vllm:request_prompt_tokens"
GENERATION = "vllm:request_generation_tokens"
SUCCESS = "vllm:request_success_total"
CACHE_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_HITS = "vllm:prefix_cache_hits_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)"
    r"(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    """One exposition line: `name{labels} value [timestamp_ms]`."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    timestamp_ms: int | None

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram summed over engines: upper bounds (last is +inf)."""

    bounds: np.ndarray
    cumulative: np.ndarray
    sum: float
    count: float

    def __sub__(self, earlier: Histogram) -> Histogram:
        if not np.array_equal(self.bounds, earlier.bounds):
            raise ValueError("histograms with different buckets")
        return Histogram(
            self.bounds,
            self.cumulative - earlier.cumulative,
            self.sum - earlier.sum,
            self.count - earlier.count,
        )


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


@dataclass(frozen=True)
class Scrape:
    """A parsed scrape."""

    samples: tuple[Sample, ...]
    file: str

    @property
    def timestamp_ms(self) -> int | None:
        stamps = [s.timestamp_ms for s in self.samples if s.timestamp_ms is not None]
        return max(stamps) if stamps else None

    def models(self) -> list[str]:
        names = {s.label("model_name") for s in self.samples if s.name.startswith("vllm:")}
        return sorted(n for n in names if n is not None)

    def total(self, name: str, model: str) -> float | None:
        """Sum of `name` over every label set of `model` (None: no such series)."""
        values = [
            s.value for s in self.samples if s.name == name and s.label("model_name") == model
        ]
        return float(sum(values)) if values else None

    def in_engine(self, model: str) -> float | None:
        """Requests running or waiting in the engine (None: neither gauge is there)."""
        running, waiting = self.total(RUNNING, model), self.total(WAITING, model)
        if running is None and waiting is None:
            return None
        return (running or 0.0) + (waiting or 0.0)

    def histogram(self, name: str, model: str) -> Histogram | None:
        buckets: dict[float, float] = {}
        for s in self.samples:
            if s.name == f"{name}_bucket" and s.label("model_name") == model:
                le = s.label("le")
                if le is None:
                    raise ConfigError(f"{name}_bucket sample without le", file=self.file)
                bound = math.inf if le in ("+Inf", "Inf") else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + s.value
        if not buckets:
            return None
        bounds = np.array(sorted(buckets))
        cumulative = np.array([buckets[b] for b in bounds])
        total = self.total(f"{name}_sum", model) or 0.0
        count = self.total(f"{name}_count", model)
        return Histogram(bounds, cumulative, total, cumulative[-1] if count is None else count)


def parse_metrics(text: str, *, file: str = "<text>") -> Scrape:
    """Parse Prometheus text exposition (version 0.0.4) into samples."""
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ConfigError(
                f"line {number} is not a Prometheus sample: {line[:80]!r}", file=file
            )
        labels: list[tuple[str, str]] = []
        body = m["labels"] or ""
        pos = 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if lm is None:
                raise ConfigError(f"line {number}: bad labels {body!r}", file=file)
            labels.append((lm[1], _unescape(lm[2])))
            pos = lm.end()
        try:
            value = float(m["value"])
        except ValueError as e:
            raise ConfigError(f"line {number}: bad value {m['value']!r}", file=file) from e
        ts = int(m["ts"]) if m["ts"] else None
        samples.append(Sample(m["name"], tuple(labels), value, ts))
    return Scrape(tuple(samples), file)


def read_scrape(path: str | Path) -> Scrape:
    p = Path(path)
    try:
        return parse_metrics(read_utf8(p), file=str(p))
    except OSError as e:
        raise ConfigError(f"cannot read file ({e.strerror}); check the path", file=str(p)) from e


def histogram_lengths(h: Histogram, *, inf_factor: float = 2.0) -> Empirical:
    """Per-bucket representative lengths whose mean matches the histogram's sum / count.

    Bucket i holds integers in (lo, hi]; every bucket's point is placed at the same relative
    position t in its range, with t solved so the mean equals `sum / count` (clipped to the
    buckets). The +Inf bucket spans (last bound, inf_factor x last bound].
    """
    counts = np.diff(np.concatenate(([0.0], h.cumulative)))
    finite = h.bounds[np.isfinite(h.bounds)]
    hi = np.where(np.isfinite(h.bounds), h.bounds, (finite[-1] if len(finite) else 1) * inf_factor)
    lo = np.concatenate(([0.0], hi[:-1])) + 1  # smallest integer in (previous bound, bound]
    keep = counts > 0
    if not keep.any():
        raise ValueError("empty histogram")
    c, lo, hi = counts[keep], lo[keep], np.maximum(hi[keep], lo[keep])
    n = c.sum()
    base = float(np.dot(c, lo)) / n
    spread = float(np.dot(c, hi - lo)) / n
    target = h.sum / h.count if h.count > 0 else base
    t = 0.5 if spread == 0 else min(1.0, max(0.0, (target - base) / spread))
    values = np.maximum(np.rint(lo + t * (hi - lo)), 1).astype(np.int64)
    merged: dict[int, float] = {}
    for v, w in zip(values.tolist(), (c / n).tolist(), strict=True):
        merged[v] = merged.get(v, 0.0) + round(w, 6)
    return Empirical(values=list(merged), weights=list(merged.values()))


def fit_metrics(
    path: str | Path,
    *,
    second: str | Path | None = None,
    interval_s: float | None = None,
    rate_rps: float | None = None,
    pool: str = "default",
    model: str = "llama-3.1-8b",
    slo: SloLike = None,
) -> TraceFit:
    """Workloads from one scrape (lengths, hit rate; give `rate_rps`) or two (`second`,
    taken `interval_s` later unless the samples carry timestamps): the rate is the
    finished-request count's increase over the interval."""
    first = read_scrape(path)
    later = read_scrape(second) if second is not None else None
    file = str(path)
    if later is not None and interval_s is None:
        a, b = first.timestamp_ms, later.timestamp_ms
        if a is None or b is None:
            raise ConfigError(
                "two scrapes without sample timestamps; give the seconds between them with "
                "--interval-s",
                file=str(second),
                field="--interval-s",
            )
        interval_s = (b - a) / 1000.0
    if interval_s is not None and interval_s <= 0:
        raise ConfigError(f"interval {interval_s} s must be positive", field="--interval-s")
    if later is None and rate_rps is None:
        raise ConfigError(
            "one scrape gives lengths and the hit rate but no rate (counters are cumulative); "
            "give a second scrape (--second-scrape, --interval-s) or --rate-rps",
            file=file,
            field="--second-scrape",
        )
    scrape = later or first
    models = scrape.models()
    if not models:
        raise ConfigError(
            "no vllm: series with a model_name label; is this a vLLM /metrics scrape?",
            file=file,
        )
    specs: list[dict[str, Any]] = []
    fits: list[WorkloadFit] = []
    for m in models:
        notes: list[str] = []
        lengths = {}
        for key, metric in (("input_tokens", PROMPT), ("output_tokens", GENERATION)):
            h = scrape.histogram(metric, m)
            if h is None:
                raise ConfigError(
                    f"histogram {metric} missing for model {m!r}", file=scrape.file, field=metric
                )
            if later is not None:
                earlier = first.histogram(metric, m)
                h = h - earlier if earlier is not None else h
            if h.count <= 0:
                raise ConfigError(
                    f"{metric} counted no requests{' between the scrapes' if later else ''}",
                    file=scrape.file,
                    field=metric,
                )
            lengths[key] = histogram_lengths(h)
            notes.append(
                f"{key}: empirical from {metric} ({len(h.bounds)} buckets, mean "
                f"{h.sum / h.count:.0f} kept)"
            )
        finished = scrape.total(SUCCESS, m)
        requests = int(finished or 0)
        if later is not None:
            assert interval_s is not None
            before = first.total(SUCCESS, m) or 0.0
            if finished is None:
                raise ConfigError(f"counter {SUCCESS} missing", file=scrape.file, field=SUCCESS)
            requests = int(finished - before)
            arrived = finished - before
            how = f"{requests} finished"
            queue_a, queue_b = first.in_engine(m), later.in_engine(m)
            if queue_a is not None and queue_b is not None and queue_b != queue_a:
                arrived += queue_b - queue_a
                how += (
                    f" {'+' if queue_b > queue_a else '-'} {abs(queue_b - queue_a):g} "
                    f"{'more' if queue_b > queue_a else 'fewer'} in the engine "
                    f"({RUNNING} + {WAITING}) = {arrived:g} arrived"
                )
            rate = arrived / interval_s
            if rate <= 0:
                raise ConfigError(
                    f"no request arrived in the {interval_s:g} s between the scrapes",
                    file=scrape.file,
                    field=SUCCESS,
                )
            notes.append(
                f"arrival: {how} in {interval_s:g} s -> {rate:.3g} req/s; "
                "a scrape has no gaps, so poisson is assumed"
            )
        else:
            assert rate_rps is not None
            rate = rate_rps
            notes.append(f"arrival: rate {rate:g} req/s given; poisson assumed")
        hits = scrape.total(CACHE_HITS, m)
        queries = scrape.total(CACHE_QUERIES, m)
        if later is not None and hits is not None and queries is not None:
            hits -= first.total(CACHE_HITS, m) or 0.0
            queries -= first.total(CACHE_QUERIES, m) or 0.0
        hit_rate = hits / queries if hits is not None and queries else None
        spec: dict[str, Any] = {
            "name": workload_name(m.rsplit("/", 1)[-1]),
            "arrival": PoissonArrival(rate_rps=round(rate, 4)),
            **lengths,
        }
        if hit_rate:
            spec["prefix"] = PrefixSpec(target_hit_rate=round(hit_rate, 3))
            notes.append(
                f"prefix: measured hit rate {hit_rate:.1%} ({CACHE_HITS} / {CACHE_QUERIES}) "
                "-> target_hit_rate"
            )
        specs.append(spec)
        fits.append(
            WorkloadFit(
                spec["name"],
                requests,
                rate,
                None,
                lengths["input_tokens"].mean,
                lengths["output_tokens"].mean,
                hit_rate,
                tuple(notes),
            )
        )
    mix = build_mix(
        workload_name(Path(file).stem),
        f"fitted from {Path(file).name} (vLLM /metrics) by capplan traffic from-trace",
        specs,
        pool=pool,
        model=model,
        slo=slo,
        source=file,
    )
    general = (f"second scrape {second}, {interval_s:g} s later",) if later is not None else ()
    return TraceFit(mix, file, "metrics", tuple(fits), general)
