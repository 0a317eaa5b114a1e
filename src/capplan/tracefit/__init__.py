"""Traffic from what users already have: request logs, public traces, bench results, metrics.

    mix = fit_trace("requests.parquet")          # a TrafficMix
    fit = fit_trace_report("requests.parquet")   # the mix plus what was fitted and how
    print(to_yaml(fit))
"""

from __future__ import annotations

from pathlib import Path

from capplan.errors import ConfigError
from capplan.mix import TrafficMix
from capplan.tracefit.bench import fit_vllm_bench
from capplan.tracefit.emit import to_yaml
from capplan.tracefit.fit import fit_requests
from capplan.tracefit.metrics import Scrape, fit_metrics, parse_metrics
from capplan.tracefit.result import SloLike, TraceFit, WorkloadFit, check_options
from capplan.tracefit.scan import FORMATS, detect_format

__all__ = [
    "FORMATS",
    "Scrape",
    "TraceFit",
    "WorkloadFit",
    "detect_format",
    "fit_metrics",
    "fit_trace",
    "fit_trace_report",
    "fit_vllm_bench",
    "parse_metrics",
    "to_yaml",
]


def fit_trace_report(
    path: str | Path,
    *,
    format: str = "auto",
    workload_column: str | None = None,
    pool: str = "default",
    model: str = "llama-3.1-8b",
    slo: SloLike = None,
    block_tokens: int | None = None,
    second_scrape: str | Path | None = None,
    interval_s: float | None = None,
    rate_rps: float | None = None,
) -> TraceFit:
    """Fit a traffic mix from `path` in any of `FORMATS`, keeping what was fitted and how.

    `block_tokens` is the tokens per `hash_ids` entry (default 512, Mooncake's);
    `second_scrape`, `interval_s` and `rate_rps` apply to the `metrics` format only.
    """
    if format not in FORMATS:
        raise ConfigError(
            f"unknown format {format!r}; use one of {', '.join(FORMATS)}", field="--format"
        )
    _, slo = check_options(pool, model, slo)  # before a long fit, not after it
    p = Path(path)
    if not p.is_file():
        raise ConfigError("trace file not found; check the path", file=str(p))
    fmt = detect_format(p) if format == "auto" else format
    if fmt == "vllm-bench":
        return fit_vllm_bench(p, pool=pool, model=model, slo=slo)
    if fmt == "metrics":
        return fit_metrics(
            p,
            second=second_scrape,
            interval_s=interval_s,
            rate_rps=rate_rps,
            pool=pool,
            model=model,
            slo=slo,
        )
    return fit_requests(
        p,
        fmt,
        workload_column=workload_column,
        block_tokens=block_tokens,
        pool=pool,
        model=model,
        slo=slo,
    )


def fit_trace(
    path: str | Path,
    *,
    workload_column: str | None = None,
    pool: str = "default",
    model: str = "llama-3.1-8b",
    slo: SloLike = None,
    format: str = "auto",
) -> TrafficMix:
    """A traffic mix fitted from a request log, public trace, bench result or scrape."""
    return fit_trace_report(
        path, format=format, workload_column=workload_column, pool=pool, model=model, slo=slo
    ).mix
