"""The simulations a report draws from: each pool at its planned replicas, at the planned load
and at scaled loads (where the knee is), plus a bounds-based GPUs-versus-growth curve.

Re-simulations are short (60 s by default) so the whole report builds in about a minute; they
show shapes and knees, while the plan's own numbers (longer, several seeds) stay in its tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from capplan.errors import CapplanError
from capplan.mix import TrafficMix
from capplan.sim.results import SimResult
from capplan.sim.run import PoolSetup, setup_pool, simulate
from capplan.solve.choose import as_planned
from capplan.solve.options import grown
from capplan.solve.plan import Plan, PoolPlan

LOAD_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)
"""Load as a multiple of the planned traffic for the attainment-versus-load curves."""
QUICK_LOAD_SCALES = (0.5, 1.0, 1.5)
GROWTHS = (0.5, 1.0, 1.5, 2.0, 3.0)
"""Traffic growth factors of the GPUs-versus-growth curve."""
DURATION_S = 60.0
QUICK_DURATION_S = 20.0
DRAIN_S = 15.0
"""Overloaded runs stop waiting for stragglers after this (simulate's drain_cap_s: the same
requests as an uncapped run); the rest count as infinitely late."""


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One pool at its planned replicas under `scale` x the planned traffic."""

    scale: float
    margins: dict[str, float]  # "workload / slo key" -> margin (-inf: requests unfinished)
    utilisation: float
    kv_usage_peak: float

    @property
    def worst(self) -> tuple[str, float]:
        key = min(self.margins, key=lambda k: self.margins[k])
        return key, self.margins[key]


@dataclass(frozen=True, slots=True)
class GrowthPoint:
    """GPUs of one pool at traffic x `growth`: the analytic floor and the plan scaled."""

    growth: float
    floor_gpus: int
    estimate_gpus: int


@dataclass(slots=True)
class PoolRuns:
    """Everything simulated for one pool; `error` says why a part is missing."""

    pool: str
    base: SimResult | None = None
    load: list[LoadPoint] = field(default_factory=list)
    growth: list[GrowthPoint] = field(default_factory=list)
    sweep: dict[float, int] = field(default_factory=dict)
    """Simulated GPUs by growth relative to the plan's (from `capplan sweep`), when given."""
    notes: list[str] = field(default_factory=list)

    @property
    def knee(self) -> tuple[float | None, float | None, str]:
        """(last scale that holds every SLO, first that misses one, the SLO that misses)."""
        ok: float | None = None
        for p in sorted(self.load, key=lambda p: p.scale):
            key, m = p.worst
            if m < 0:
                return ok, p.scale, key
            ok = p.scale
        return ok, None, ""


def planned_mix(
    plan: Plan, mix: TrafficMix
) -> tuple[TrafficMix, dict[str, PoolSetup], dict[str, str]]:
    """The mix with each planned pool at its chosen configuration (precision, and the engine
    settings it left auto), the pools' setups, and why a pool could not be set up."""
    pools = []
    setups: dict[str, PoolSetup] = {}
    errors: dict[str, str] = {}
    chosen = {p.pool: p for p in plan.pools}
    for pool in mix.pools:
        pp = chosen.get(pool.name)
        if pp is not None:
            pool = as_planned(pool, pp, source=mix.source)
        pools.append(pool)
        if pp is not None:
            try:
                setups[pool.name] = setup_pool(pool, source=mix.source)
            except CapplanError as e:
                errors[pool.name] = f"cannot simulate: {e}"
    m = mix.model_copy(update={"pools": pools})
    m = m.with_source(mix.source, mix.base_dir)
    return m, setups, errors


def _margins(res: SimResult) -> dict[str, float]:
    return {f"{w.name} / {c.key}": c.margin for w in res.workloads for c in w.slo}


def _point(scale: float, res: SimResult) -> LoadPoint:
    return LoadPoint(scale, _margins(res), res.pool.utilisation, res.pool.kv_usage_peak)


def growth_curve(
    pp: PoolPlan, st: PoolSetup, mix: TrafficMix, growth: float,
    growths: tuple[float, ...] = GROWTHS,
) -> list[GrowthPoint]:
    """GPUs versus growth without simulating: the analytic floor (work, KV and sequence
    bounds; no count below it can hold the traffic) and the plan scaled linearly from its
    answer (an upper estimate: a larger pool multiplexes its bursts better)."""
    from capplan.solve.bounds import bracket

    out = []
    for g in growths:
        grown_mix = grown(mix, g * growth)
        b = bracket(st, grown_mix.workloads_of(pp.pool), rate_scale=g * growth,
                    base_dir=mix.base_dir)
        est = max(b.lower, math.ceil(pp.replicas_for_slo * g - 1e-9))
        out.append(GrowthPoint(g, b.lower * pp.tp, (est + pp.spare) * pp.tp))
    return out


def _job(
    mix: TrafficMix, pool: str, replicas: int, st: PoolSetup, duration_s: float, seed: int,
    growth: float, scale: float, *, keep_requests: bool = True,
    drain_cap_s: float | None = None,
) -> SimResult:
    """One re-simulation (module level, so a worker process can run it)."""
    m = grown(mix, growth * scale)
    return simulate(m, pool, replicas, duration_s=duration_s, seed=seed,
                    rate_scale=growth * scale, setup=st, keep_requests=keep_requests,
                    drain_cap_s=drain_cap_s)


def _load_job(*args: Any) -> LoadPoint | str:
    """A scaled run reduced to its margins in the worker (no per-request rows kept)."""
    try:
        return _point(args[-1], _job(*args, keep_requests=False, drain_cap_s=DRAIN_S))
    except CapplanError as e:
        return str(e)


def _base_job(*args: Any) -> SimResult | str:
    try:
        return _job(*args)
    except CapplanError as e:
        return str(e)


def _map(jobs: list[tuple[Any, ...]], workers: int) -> list[Any]:
    """Run `(fn, *args)` jobs, in `workers` spawned processes when more than one (spawn, not
    fork: polars' thread pool does not survive a fork)."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*args) for fn, *args in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as ex:
        futures = [ex.submit(fn, *args) for fn, *args in jobs]
        return [f.result() for f in futures]


def run_all(
    plan: Plan, mix: TrafficMix, *, sims: dict[str, SimResult] | None = None,
    duration_s: float = DURATION_S, scales: tuple[float, ...] = LOAD_SCALES,
    growths: tuple[float, ...] = GROWTHS, sweep: list[dict[str, Any]] | None = None,
    workers: int = 1,
) -> dict[str, PoolRuns]:
    """Every planned pool's runs, keyed by pool name: the planned load (unless `sims` holds
    it) and `scales` x it, in `workers` processes."""
    m, setups, errors = planned_mix(plan, mix)
    out: dict[str, PoolRuns] = {}
    jobs: list[tuple[Any, ...]] = []
    keys: list[tuple[str, float | None]] = []  # (pool, scale; None: the planned-load run)
    for pp in plan.pools:
        curve = {
            float(r["growth"]) / plan.growth: int(r["gpus"])
            for r in sweep or []
            if r["pool"] == pp.pool and r["gpus"] is not None  # None: a growth marked infeasible
        }
        r = out[pp.pool] = PoolRuns(pp.pool, base=(sims or {}).get(pp.pool), sweep=curve)
        st = setups.get(pp.pool)
        if st is None:
            r.notes.append(errors.get(pp.pool, f"pool {pp.pool!r} is not in {mix.source}"))
            continue
        args = (pp.pool, pp.replicas, st, duration_s, plan.seed, plan.growth)
        if r.base is None:
            jobs.append((_base_job, m, *args, 1.0))
            keys.append((pp.pool, None))
        for s in scales:
            if s != 1.0:
                jobs.append((_load_job, m, *args, s))
                keys.append((pp.pool, s))
        try:
            r.growth = growth_curve(pp, st, m, plan.growth, growths)
        except CapplanError as e:
            r.notes.append(f"growth curve unavailable: {e}")
    # longest first: the busiest pools at the highest load
    order = sorted(range(len(jobs)), key=lambda i: -(jobs[i][3] * jobs[i][-1]))
    done = _map([jobs[i] for i in order], workers)
    results = dict(zip(order, done, strict=True))
    for i, (pool, scale) in enumerate(keys):
        res, r = results[i], out[pool]
        if isinstance(res, str):
            where = "the planned load" if scale is None else f"x{scale:g} load"
            r.notes.append(f"simulation at {where} failed: {res}")
        elif scale is None:
            assert isinstance(res, SimResult)
            r.base = res
        else:
            assert isinstance(res, LoadPoint)
            r.load.append(res)
    for pp in plan.pools:
        r = out[pp.pool]
        if r.base is not None and 1.0 in scales:
            r.load.append(_point(1.0, r.base))
        r.load.sort(key=lambda p: p.scale)
    return out
