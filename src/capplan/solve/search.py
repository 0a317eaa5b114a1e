"""The fewest replicas of one pool that hold every SLO of every workload it serves.

The simulator is the judge, and it is expensive, so the search is frugal: an analytic
bracket (`bounds.bracket`) says where to start, short probe runs gallop up and then bisect
(pass/fail is monotone in replicas: more replicas only take load off each one), and only the
answer is re-run, long enough for every workload's tail percentile, with independent seeds.
The answer is the smallest count at which every seed passes, and the count below it is checked
to fail. Runs expected to fail (probes, the one-fewer check) stop as soon as their miss is
certain (sim/verdict.py); runs that pass always run to the end.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field, replace
from typing import Any

from capplan.errors import InfeasibleError
from capplan.mix import TrafficMix
from capplan.sim.results import SimResult, SloCheck, check_window_has_requests
from capplan.sim.run import PoolSetup, setup_pool, simulate_timed
from capplan.solve import jobs
from capplan.solve.bounds import (
    Bracket,
    bracket,
    infeasible_reason,
    rate_of,
    slo_floor,
    tail_e2e_s,
    unloaded_e2e_s,
)

GROWTH_FACTOR = 1.5
"""Galloping step above a failing count: n -> ceil(1.5 n)."""

MEASURED_FRACTION = 0.9
"""Of a run `simulate(duration_s=...)`, the part whose arrivals are measured (the first 10 %
is warm-up)."""


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How hard to look. `quick` shortens probes and confirms at probe length and drain (so
    the probes' runs count towards confirmation)."""

    seed: int | None = None
    rate_scale: float = 1.0
    extra_seeds: int = 2
    quick: bool = False
    probe_requests: int = 200
    """Probe long enough for this many requests of the pool's slowest workload ..."""
    probe_cap_requests: int = 2500
    """... but no more than this many requests in all."""
    confirm_tail_requests: int = 50
    """Confirm long enough that each workload has this many measured requests beyond its
    tightest SLO percentile (n >= 50 / (1 - q/100): 5,000 for a p99, 500 for a p90): with
    k requests in the tail, the estimated percentile's rank is uncertain by about sqrt(k)
    of them (binomial), so k = 50 pins a p99 between ranks ~p98.7 and ~p99.3 (2 sd) ..."""
    confirm_floor_s: float = 30.0
    """... for no less than this many simulated seconds (and no more than the mix's duration_s).
    A short run sees few of the queue's bursts even when it holds many requests: its tail
    is one burst's, not the traffic's. `--quick` confirms in that regime (10 s on the example
    production mix) and answers 4 and 5 GPUs for two pools where 120 s x 3 seeds answer 5
    and 4; 30 s also outlasts a tail request's lifetime (seconds) many times over."""
    workers: int | None = None
    """Processes for the simulations (None: $CAPPLAN_WORKERS, else 1: all in this process;
    `capplan size` passes the CPU count). With more than one, a pool's confirmation seeds
    run side by side and `size_mix` searches its pools at once (solve/jobs.py)."""
    log: Callable[[str], None] | None = field(default=None, compare=False)
    """Told each simulation the search runs and what it found (`capplan size --verbose`)."""
    stop: threading.Event | None = field(default=None, compare=False)
    """Once set, the next simulation the search asks for raises CancelledError (pools sized
    side by side stop so when the caller is interrupted)."""

    def scaled(self) -> SearchSettings:
        if not self.quick:
            return self
        return replace(self, probe_requests=60, probe_cap_requests=600)

    @property
    def processes(self) -> int:
        return max(1, self.workers) if self.workers is not None else jobs.default_workers()


_Key = tuple[int, float, int, bool]
"""A simulation of the search: (replicas, duration_s, seed, probe)."""


@dataclass(slots=True)
class PoolSizing:
    """The search's answer for one pool configuration, with the runs that back it."""

    setup: PoolSetup
    replicas: int
    bracket: Bracket
    result: SimResult
    """At `replicas`, the base seed, the confirmation duration."""
    seed_results: list[SimResult]
    below: SimResult | None
    """At replicas - 1 (None when replicas is 1): expected to miss an SLO (stopped early once
    the miss was certain, when it was: `below.stopped_at_s`)."""
    probes: list[tuple[int, bool]]
    confirmed: bool
    duration_s: float
    simulations: int = 0
    wall_s: float = 0.0

    @property
    def gpus(self) -> int:
        return self.replicas * self.setup.pool.tp

    @property
    def stable(self) -> bool:
        return all(r.slo_met for r in self.seed_results)

    @property
    def seeds(self) -> list[int]:
        return [r.pool.seed for r in self.seed_results]

    @property
    def below_fails(self) -> bool | None:
        return None if self.below is None else not self.below.slo_met


THIN_MARGIN = 0.2
"""A probe passing by less than this share of a limit is often failed by a seed at
confirmation length (the production mix's interactive pool: agent TTFT p99 at 0.88 of its
limit in the probe, 1.6 x it at 120 s); `Search.confirm` then starts one replica up. The
answer is the same either way (the walk goes down again when one fewer passes)."""


def worst_check(res: SimResult) -> tuple[str, SloCheck] | None:
    """(workload, check) with the smallest margin: the binding SLO."""
    worst: tuple[str, SloCheck] | None = None
    for w in res.workloads:
        for c in w.slo:
            if worst is None or c.margin < worst[1].margin:
                worst = (w.name, c)
    return worst


def _fmt(v: float) -> str:
    return "never (requests unfinished)" if not math.isfinite(v) else f"{v:.3g} s"


class Sizer:
    """Searches one pool of a mix; keeps every run so later questions reuse them."""

    def __init__(
        self,
        mix: TrafficMix,
        pool_name: str,
        settings: SearchSettings | None = None,
        *,
        setup: PoolSetup | None = None,
        floor: int = 1,
        start: int | None = None,
        label: str | None = None,
    ) -> None:
        """`floor`: a count known to be needed (a sweep's answer at lower traffic: more
        traffic never needs fewer replicas); the search starts at or above it. `start`: where
        to begin instead of the analytic estimate (a quick screen's answer). `label`: the
        candidate configuration, in messages and the log (default: the precision)."""
        self.settings = (settings or SearchSettings()).scaled()
        self.floor = floor
        self.start = start
        self._label = label
        self.pool = mix.pool(pool_name)
        self.workloads = mix.workloads_of(pool_name)
        self.setup = setup or setup_pool(self.pool, source=mix.source)
        self.seed = mix.simulation.seed if self.settings.seed is None else self.settings.seed
        st, scale = self.setup, self.settings.rate_scale
        self.bracket = bracket(st, self.workloads, rate_scale=scale, base_dir=mix.base_dir)
        # probes cut the drain short (an overloaded probe is slow and fails either way) but
        # serve the very requests of a confirmation run of the same length and seed
        # (simulate's drain_cap_s), which keeps the mix's drain, so `capplan simulate`
        # reproduces it: a probe and a confirmation at one count never disagree by their
        # requests alone
        e2e_limits = [t.limit_s for w in self.workloads for t in w.slo.targets
                      if t.metric == "e2e"]
        drain = max(10.0, 2 * tail_e2e_s(st, self.workloads), *e2e_limits)
        self.probe_drain_s = min(mix.simulation.drain_s, drain)
        self.mix = mix
        self.probe_s, self.confirm_s = self._durations(mix)
        self.probes: list[tuple[int, bool]] = []
        self._cache: dict[_Key, SimResult] = {}
        self._pending: dict[_Key, Future[tuple[SimResult, float]]] = {}
        self.processes = self.settings.processes
        self.simulations = 0
        self.wall_s = 0.0
        self._sim_s = self._replica_s = 0.0  # wall and simulated replica-seconds of runs

    def _durations(self, mix: TrafficMix) -> tuple[float, float]:
        s = self.settings
        full = mix.simulation.duration_s
        rates = [rate_of(w, self.setup, s.rate_scale, mix.base_dir) for w in self.workloads]
        r_min, r_all = max(min(rates), 1e-6), max(sum(rates), 1e-6)
        unloaded = max(unloaded_e2e_s(self.setup, w) for w in self.workloads)
        probe = min(s.probe_requests / r_min, s.probe_cap_requests / r_all)
        probe = min(full, max(probe, 10.0, 2 * unloaded))
        if s.quick:
            return probe, probe
        return probe, self._confirm_s(rates, full, probe)

    def _confirm_s(self, rates: list[float], full_s: float, probe_s: float) -> float:
        """Simulated seconds for confirmation: the longest any workload needs to put
        `confirm_tail_requests` measured requests beyond its tightest percentile, between the
        floor and the mix's duration_s, and never shorter than the probes. Whole seconds, so
        the plan's `duration_s` reproduces the runs exactly."""
        s = self.settings
        need_s = 0.0
        for w, rate in zip(self.workloads, rates, strict=True):
            qs = [t.percentile for t in w.slo.targets]
            if not qs:
                continue  # no percentile of its own to estimate
            n = s.confirm_tail_requests / (1 - max(qs) / 100)
            # simulate() measures arrivals after a warm-up of 10 % of the duration
            need_s = max(need_s, n / (MEASURED_FRACTION * max(rate, 1e-6)))
        return min(full_s, max(math.ceil(need_s), s.confirm_floor_s, probe_s))

    def run(
        self, replicas: int, duration_s: float, seed: int, *, probe: bool = False,
        verdict_only: bool = False,
    ) -> SimResult:
        """One simulation, memoised (same inputs, same result). `verdict_only`: the caller
        needs pass or fail only, so the run stops once a miss is certain; a run that passes
        is the full run either way, and a stopped one is re-run in full when its figures are
        wanted. A run counts (`simulations`, the log) when the search first uses it, so the
        count and the log are the same whether runs were prefetched or not."""
        if self.settings.stop is not None and self.settings.stop.is_set():
            raise CancelledError(f"sizing of pool {self.pool.name} stopped")
        key = (replicas, duration_s, seed, probe)
        pending = self._pending.pop(key, None)
        if pending is not None:
            jobs.promote(self.processes, pending)
            self._use(key, pending)
        cached = self._cache.get(key)
        if cached is None or (cached.stopped_at_s is not None and not verdict_only):
            if self.processes > 1:
                self._use(key, self._submit(key, verdict_only, jobs.CHAIN))
            else:
                t0 = time.perf_counter()
                self._record(key, simulate_timed(*self._args(key), **self._kwargs(
                    key, verdict_only)), time.perf_counter() - t0)
        check_window_has_requests(self._cache[key], self.mix, self.settings.rate_scale)
        return self._cache[key]

    def _args(self, key: _Key) -> tuple[TrafficMix, str, int]:
        return self.mix, self.pool.name, key[0]

    def _kwargs(self, key: _Key, verdict_only: bool) -> dict[str, Any]:
        return {"duration_s": key[1], "seed": key[2], "rate_scale": self.settings.rate_scale,
                "setup": self.setup, "keep_requests": False, "stop_when_missed": verdict_only,
                "drain_cap_s": self.probe_drain_s if key[3] else None}

    def _submit(
        self, key: _Key, verdict_only: bool, priority: tuple[int, float]
    ) -> Future[tuple[SimResult, float]]:
        return jobs.submit(self.processes, priority, *self._args(key),
                           **self._kwargs(key, verdict_only))

    def _use(self, key: _Key, future: Future[tuple[SimResult, float]]) -> None:
        t0 = time.perf_counter()
        done = future.result()
        self._record(key, done, time.perf_counter() - t0)

    def _cost_s(self, replicas: int, duration_s: float) -> float:
        """Wall seconds a run is expected to take, from the runs so far (for scheduling)."""
        return replicas * duration_s * self._sim_s / max(self._replica_s, 1e-9)

    def _record(self, key: _Key, done: tuple[SimResult, float], waited_s: float) -> None:
        res, sim_s = done
        self._cache[key] = res
        self.simulations += 1
        self._sim_s += sim_s
        self._replica_s += key[0] * (res.stopped_at_s or res.pool.simulated_s)
        self.wall_s += waited_s
        self._tell(key, res, sim_s)

    def _tell(self, key: _Key, res: SimResult, wall_s: float) -> None:
        log = self.settings.log
        if log is None:
            return
        replicas, duration_s, seed, probe = key
        verdict = "meets every SLO" if res.slo_met else "misses"
        worst = ""
        found = worst_check(res)
        if res.stopped_at_s is not None:  # partial figures: only the verdict is the full run's
            worst = (f"; stopped early at {res.stopped_at_s:g} s, the miss of "
                     f"{res.stopped_by} certain")
        elif found is not None:
            wl, check = found
            worst = f"; tightest {wl} {check.key} {_fmt(check.value_s)} vs {check.limit_s:g} s"
        name = f"{self.pool.name} [{self._label}]" if self._label else self.pool.name
        log(f"{name}: {replicas} replica(s), {'probe' if probe else 'confirm'} "
            f"{duration_s:g} s, seed {seed}: {verdict}{worst} ({wall_s:.1f} s)")

    def prefetch(self, runs: list[tuple[int, int, bool, bool]]) -> None:
        """Start the confirmation-length simulations (replicas, seed, probe, verdict_only)
        not yet run, side by side in worker processes (with one process: nothing; `run`
        runs them when asked). They count when the search uses them. A verdict-only run
        decides where the walk goes next, so it goes first; the rest, longest first."""
        if self.processes < 2:
            return
        for n, seed, probe, verdict_only in dict.fromkeys(runs):
            key = (n, self.confirm_s, seed, probe)
            if key not in self._cache and key not in self._pending:
                priority = (jobs.CHAIN if verdict_only
                            else jobs.bulk(self._cost_s(n, self.confirm_s)))
                self._pending[key] = self._submit(key, verdict_only, priority)

    def _expect(self, n: int, *, below_known: bool = False) -> None:
        """Prefetch what confirming `n` usually takes: every seed at n, the base seed at
        n - 1 (expected to fail, so verdict only) unless `below_known`: n - 1 has already
        failed a seed at confirmation length."""
        self.prefetch([(n, s, self.settings.quick, False) for s in self.seeds]
                      + ([(n - 1, self.seed, True, True)] if n > 1 and not below_known
                         else []))

    def _thin(self, n: int) -> bool:
        """The probe at `n` passed by less than THIN_MARGIN of a limit."""
        res = self._cache.get((n, self.probe_s, self.seed, True))
        if res is None or not res.slo_met:
            return False
        found = worst_check(res)
        return found is not None and found[1].margin < THIN_MARGIN

    def _drop(self, n: int) -> None:
        """The walk left `n`: prefetched runs at n that have not started are not needed."""
        for key in [k for k in self._pending if k[0] == n]:
            if self._pending[key].cancel():
                del self._pending[key]

    def _probe(self, n: int) -> bool:
        ok = self.run(n, self.probe_s, self.seed, probe=True, verdict_only=True).slo_met
        self.probes.append((n, ok))
        return ok

    @property
    def precision(self) -> str:
        p = self.setup.pool.precision
        return str(getattr(p, "value", p))

    @property
    def label(self) -> str:
        return self._label or self.precision

    def check_feasible(self) -> None:
        """Refuse, before any simulation, SLOs the step model alone rules out."""
        cap = self.pool.max_replicas
        for w in self.workloads:
            for t in w.slo.targets:
                why = infeasible_reason(self.setup, w, t)
                if why:
                    raise InfeasibleError(
                        f"no replica count ≤ {cap} meets {t.key} ≤ {t.limit_s:g} s for workload "
                        f"{w.name} in pool {self.pool.name} ({self.label}): "
                        f"{why}"
                    )
        if self.bracket.lower > cap:
            raise InfeasibleError(
                f"no replica count ≤ {cap} can carry pool {self.pool.name}'s traffic "
                f"({self.label}): the work alone needs ≥ {self.bracket.lower} "
                f"replicas ({self.bracket.describe()})"
            )

    def _infeasible(self, n: int, res: SimResult | None = None) -> InfeasibleError:
        res = res or self.run(n, self.probe_s, self.seed, probe=True)  # in full: its figures
        found = worst_check(res)
        assert found is not None
        wl, c = found
        why = ""
        w = next(x for x in self.workloads if x.name == wl)
        t = next(x for x in w.slo.targets if x.key == c.key)
        floor = slo_floor(self.setup, w, t)
        if floor is not None:
            why = f" ({floor[1]})"
        return InfeasibleError(
            f"no replica count ≤ {n} meets {c.key} ≤ {c.limit_s:g} s for workload {wl} in pool "
            f"{self.pool.name} ({self.label}): best {_fmt(c.value_s)} at {n} "
            f"replica{'s' * (n != 1)}{why}"
        )

    def search(self) -> int:
        """Probe-level answer: gallop up from the analytic estimate, then bisect."""
        self.check_feasible()
        cap = self.pool.max_replicas
        lower = max(self.bracket.lower, self.floor)
        if lower > cap:
            raise InfeasibleError(
                f"no replica count ≤ {cap} carries pool {self.pool.name} ({self.label}): "
                f"{lower} were needed at lower traffic"
            )
        lo = lower - 1  # below the work/KV floor: fails without simulating
        n = min(max(self.start or self.bracket.estimate, lower), cap)
        if self._probe(n):
            hi = n
            if self.start is not None and n - 1 > lo:
                # a screen's answer is usually right or one off: try one below before bisecting
                if self._probe(n - 1):
                    hi = n - 1
                else:
                    lo = n - 1
        else:
            lo = n
            while True:
                if n >= cap:
                    raise self._infeasible(cap)
                n = min(cap, max(n + 1, math.ceil(n * GROWTH_FACTOR)))
                if self._probe(n):
                    hi = n
                    break
                lo = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._probe(mid):
                hi = mid
            else:
                lo = mid
        return hi

    @property
    def seeds(self) -> list[int]:
        return [self.seed + 1000 * i for i in range(self.settings.extra_seeds + 1)]

    def _all_seeds(self, n: int) -> list[SimResult]:
        seeds = self.seeds
        out = []
        for s in seeds:
            out.append(self.run(n, self.confirm_s, s, probe=self.settings.quick))
            if not out[-1].slo_met:
                break  # one failing seed settles it
        return out

    def _below(self, n: int) -> SimResult:
        """The base seed at n - 1 at confirmation length, expected to fail: an overloaded run
        is the slow kind, so it gets the probes' short drain (stragglers cut off count as
        late) and stops once its miss is certain."""
        return self.run(n - 1, self.confirm_s, self.seed, probe=True, verdict_only=True)

    def _walk_down(self, n: int) -> tuple[int, list[SimResult] | None, SimResult | None]:
        """From `n`, step down while one fewer passes with every seed: (count, its seeds'
        runs if they were run, the run at one fewer that fails)."""
        results = None
        while n > 1:
            below = self._below(n)
            if not below.slo_met:
                return n, results, below
            self._drop(n)
            self._expect(n - 1)
            lower = self._all_seeds(n - 1)
            if not lower[-1].slo_met:
                return n, results, lower[-1]  # the seed that fails
            n, results = n - 1, lower
        return n, results, None

    def confirm(self, n: int) -> PoolSizing:
        """Smallest count where every seed passes at confirmation length, with one fewer
        failing: from `n`, walk down while one fewer passes every seed, else up until every
        seed passes. The one-fewer check runs before the seeds at `n`, so a probe answer one
        too high costs no seed runs at it."""
        cap = self.pool.max_replicas
        if n < cap and self._thin(n):
            # a seed would likely fail at n: start one up, where the one-fewer check (a run
            # that stops once its miss is certain) settles n instead of a full seed run
            n += 1
        self._expect(n)  # the usual outcome: every seed at n passes, n - 1 fails
        n, results, below = self._walk_down(n)
        if results is None:
            results = self._all_seeds(n)
            failed = None
            while not all(r.slo_met for r in results) and n < cap:
                self._drop(n)
                self._expect(n + 1, below_known=True)
                n, failed, results = n + 1, results, self._all_seeds(n + 1)
            if failed is not None:  # walked up: n - 1 failed a seed, at confirmation length
                below = failed[-1]  # the seed that failed there (no other run needed)
        for k in {key[0] for key in self._pending} - {n, n - 1}:
            self._drop(k)  # speculation the walk did not need
        if not results[0].slo_met:
            raise self._infeasible(n, results[0])  # the cap fails at confirmation length too
        confirmed = all(r.slo_met for r in results)
        sizing = self.sizing(n, results, below, confirmed=confirmed)
        sizing.duration_s = self.confirm_s
        return sizing

    def sizing(
        self,
        n: int,
        results: list[SimResult] | None = None,
        below: SimResult | None = None,
        *,
        confirmed: bool = False,
    ) -> PoolSizing:
        """The answer as a record; unconfirmed ones carry the probe run only."""
        results = results or [self.run(n, self.probe_s, self.seed, probe=True)]
        return PoolSizing(
            setup=self.setup,
            replicas=n,
            bracket=self.bracket,
            result=results[0],
            seed_results=results,
            below=below,
            probes=list(self.probes),
            confirmed=confirmed,
            duration_s=self.probe_s,
            simulations=self.simulations,
            wall_s=self.wall_s,
        )


def size_pool(
    mix: TrafficMix,
    pool_name: str,
    settings: SearchSettings | None = None,
    *,
    setup: PoolSetup | None = None,
    confirm: bool = True,
) -> PoolSizing:
    """Fewest replicas of `pool_name` meeting every SLO; raises InfeasibleError with the reason."""
    sizer = Sizer(mix, pool_name, settings, setup=setup)
    n = sizer.search()
    return sizer.confirm(n) if confirm else sizer.sizing(n)


__all__ = ["PoolSizing", "SearchSettings", "Sizer", "size_pool", "worst_check"]
