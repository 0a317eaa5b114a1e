"""Simulation results: per-workload percentiles and SLO verdicts, per-pool engine figures."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_serializer

from capplan.sim.metrics import REQUEST_FIELDS, WorkloadRecorder
from capplan.traffic import Workload, slo_allowed_share

if TYPE_CHECKING:
    import polars as pl

    from capplan.mix import TrafficMix

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SloCheck(BaseModel):
    """One SLO target against what the simulation measured."""

    model_config = _FROZEN
    key: str
    limit_s: float
    value_s: float
    met: bool
    beyond: float | None = None
    """The share of the metric's observations (requests; inter-token gaps for ITL and TPOT)
    past the limit, unfinished requests counted past it. A p99 SLO allows 1 %: where the
    distribution has a cliff (a few long stalls among many short gaps), `value_s` can sit far
    below the limit while this share sits just under what the percentile allows."""

    @property
    def margin(self) -> float:
        """Headroom as a fraction of the limit (negative: missed by that much)."""
        return 1.0 - self.value_s / self.limit_s if math.isfinite(self.value_s) else -math.inf

    @property
    def allowed(self) -> float | None:
        """The share of observations the SLO lets past its limit (0.01 for a p99)."""
        return slo_allowed_share(self.key)

    @field_serializer("value_s")
    def _finite(self, v: float) -> float | None:
        return v if math.isfinite(v) else None


class WorkloadResult(BaseModel):
    """Steady-state figures of one workload (requests that arrived in the window)."""

    model_config = _FROZEN
    name: str
    requests: int
    completed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    queue_p99_s: float
    output_tokens_per_s: float
    input_tokens_per_s: float
    prefix_hit_rate: float
    preempted_requests: int
    slo: list[SloCheck]

    @property
    def slo_met(self) -> bool:
        return all(c.met for c in self.slo)

    @field_serializer(
        "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
        "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "queue_p99_s",
        "prefix_hit_rate",
    )
    def _finite(self, v: float) -> float | None:
        return round(v, 6) if math.isfinite(v) else None


class PoolRunResult(BaseModel):
    """Engine-level figures of one simulated pool."""

    model_config = _FROZEN
    pool: str
    replicas: int
    gpus: int
    profile: str
    profile_source: str
    kv_tokens_per_replica: int
    duration_s: float
    warmup_s: float
    simulated_s: float
    steps: int
    utilisation: float  # fraction of time the engine ran a step (busy whenever any request is in)
    kv_usage_mean: float
    kv_usage_peak: float
    prefix_hit_rate: float
    preemptions: int
    extrapolated_steps: int
    output_tokens_per_s: float
    seed: int


class SimResult(BaseModel):
    """What `capplan simulate` reports."""

    model_config = _FROZEN
    pool: PoolRunResult
    workloads: list[WorkloadResult]
    stopped_at_s: float | None = None
    """Set when the run was stopped early (sizing's `stop_when_missed`), at this simulated
    second, because an SLO miss was already certain: every figure then covers the run up to
    that moment (requests unfinished by then count as infinitely late), not the full run."""
    stopped_by: str | None = None
    """The target missed for certain ('<workload> <key>') when the run stopped early."""
    # polars frames, or what they are made of (RequestColumns, KvRows: made into frames on
    # first use, so that the simulation, and the worker processes running it, never import
    # polars)
    _requests: Any = None
    _kv_series: Any = None

    @property
    def slo_met(self) -> bool:
        return all(w.slo_met for w in self.workloads)

    def workload(self, name: str) -> WorkloadResult:
        return next(w for w in self.workloads if w.name == name)

    def requests(self) -> pl.DataFrame:
        """Per-request figures of the measured requests, one row each."""
        if isinstance(self._requests, RequestColumns):
            self._requests = self._requests.frame()
        if self._requests is None:
            import polars as pl

            return pl.DataFrame()
        frame: pl.DataFrame = self._requests
        return frame

    def kv_series(self) -> pl.DataFrame:
        """KV blocks in use and running requests per replica, sampled once a second."""
        if isinstance(self._kv_series, KvRows):
            self._kv_series = self._kv_series.frame()
        if self._kv_series is None:
            import polars as pl

            return pl.DataFrame()
        frame: pl.DataFrame = self._kv_series
        return frame

    def to_polars(self) -> pl.DataFrame:
        """Per-workload summary, one row each."""
        import polars as pl

        rows = []
        for w in self.workloads:
            d = w.model_dump(exclude={"slo"})
            d["slo_met"] = w.slo_met
            rows.append(d)
        return pl.DataFrame(rows)


def check_window_has_requests(res: SimResult, mix: TrafficMix, rate_scale: float = 1.0) -> None:
    """Refuse a run in which a workload had no request in the measured window: its percentiles
    are of nothing, and they read as requests never finished (`simulate` printed "unfinished"
    and `size` gave the pool up as infeasible, for a cause unrelated to it). Arrivals do not
    depend on the replica count, so no pool size changes this; a run stopped early (sizing's
    `stop_when_missed`) may not have reached the window's arrivals, and is not judged."""
    from capplan.errors import ConfigError
    from capplan.sim.workload import offered_rate_rps

    if res.stopped_at_s is not None:
        return
    start, end = res.pool.warmup_s, res.pool.duration_s
    for w in res.workloads:
        if w.requests:
            continue
        i, spec = next((i, x) for i, x in enumerate(mix.workloads) if x.name == w.name)
        rate = offered_rate_rps(spec, base_dir=mix.base_dir)
        expects = ""
        if rate is not None:
            rate *= rate_scale
            expects = f" ({rate:g} requests/s expects {rate * (end - start):.2g})"
        raise ConfigError(
            f"no request of workload {w.name} arrived in the measured window [{start:g}, {end:g}) "
            f"s{expects}, so it has no latency to judge; raise the rate, or the run's duration "
            "(simulation.duration_s, --duration-s), or for a replayed trace check that its "
            "arrival_s are seconds", file=mix.source, field=f"workloads.{i}.arrival")


def summarise(
    w: Workload, rec: WorkloadRecorder, created: int, window_s: float
) -> WorkloadResult:
    """Percentiles and SLO checks; requests still unfinished at the end count as infinitely
    late (so an overloaded pool fails its tail SLOs instead of looking fast)."""
    missing = max(created - rec.completed, 0)
    hist = {"ttft": rec.ttft, "itl": rec.itl, "tpot": rec.tpot, "e2e": rec.e2e}

    def value(metric: str, q: float) -> float:
        h = hist[metric]
        if metric in ("itl", "tpot"):  # per token: scale the unfinished share to its count
            return h.percentile(q, round(missing / max(created, 1) * h.count()))
        return h.percentile(q, missing)

    def beyond(metric: str, limit: float) -> float | None:
        h = hist[metric]
        if metric in ("itl", "tpot"):
            share = h.share_above(limit, round(missing / max(created, 1) * h.count()))
        else:
            share = h.share_above(limit, missing)
        return None if math.isnan(share) else share

    checks = []
    for t in w.slo.targets:
        v = value(t.metric, t.percentile)
        checks.append(SloCheck(key=t.key, limit_s=t.limit_s, value_s=v, met=v <= t.limit_s,
                               beyond=beyond(t.metric, t.limit_s)))
    return WorkloadResult(
        name=w.name,
        requests=created,
        completed=rec.completed,
        ttft_p50_s=value("ttft", 50),
        ttft_p90_s=value("ttft", 90),
        ttft_p99_s=value("ttft", 99),
        itl_p50_s=value("itl", 50),
        itl_p90_s=value("itl", 90),
        itl_p99_s=value("itl", 99),
        tpot_p50_s=value("tpot", 50),
        tpot_p99_s=value("tpot", 99),
        e2e_p50_s=value("e2e", 50),
        e2e_p90_s=value("e2e", 90),
        e2e_p99_s=value("e2e", 99),
        queue_p99_s=rec.queue.percentile(99, missing),
        output_tokens_per_s=rec.output_tokens_in_window / window_s,
        input_tokens_per_s=rec.input_tokens_in_window / window_s,
        prefix_hit_rate=rec.cached_tokens / rec.input_tokens if rec.input_tokens else 0.0,
        preempted_requests=rec.preempted,
        slo=checks,
    )


class RequestColumns:
    """The per-request rows of a run's recorders, made into `requests()`'s frame on first use."""

    __slots__ = ("columns",)

    def __init__(self, names: list[str], recs: list[WorkloadRecorder]) -> None:
        self.columns = [
            (name, {f: rec.column(f) for f in REQUEST_FIELDS})
            for name, rec in zip(names, recs, strict=True)
            if rec.cols is not None and rec.completed
        ]

    def __getstate__(self) -> object:
        return self.columns

    def __setstate__(self, state: Any) -> None:
        self.columns = state

    def frame(self) -> pl.DataFrame:
        import polars as pl

        frames = []
        ints = ("input_tokens", "output_tokens", "cached_tokens", "preemptions", "replica")
        for name, d in self.columns:
            frames.append(pl.DataFrame(d).with_columns(
                pl.lit(name).alias("workload"), *(pl.col(c).cast(pl.Int64) for c in ints)
            ))
        return pl.concat(frames) if frames else pl.DataFrame()


def requests_frame(names: list[str], recs: list[WorkloadRecorder]) -> pl.DataFrame:
    return RequestColumns(names, recs).frame()


class KvRows:
    """`kv_series()` rows (replica, time_s, kv_usage, running), made into its frame on first
    use."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __getstate__(self) -> object:
        return self.rows

    def __setstate__(self, state: Any) -> None:
        self.rows = state

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame(
            self.rows,
            schema={"replica": pl.Int64, "time_s": pl.Float64, "kv_usage": pl.Float64,
                    "running": pl.Int64},
        )


