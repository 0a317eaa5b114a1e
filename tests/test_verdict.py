"""Stopping a run once its SLO miss is certain (sim/verdict.py): the verdict is the full run's,
a run that passes is never cut short, and the stopped run says so."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.mix import TrafficMix, load_mix
from capplan.sim.metrics import _BINS_PER_E, _LOG_LO, _bins
from capplan.sim.run import simulate
from capplan.sim.verdict import over_limit_s

DATA = Path(__file__).parent / "data"


def _centre(x: float) -> float:
    i = int(_bins(np.array([x]))[0])
    return math.exp(_LOG_LO + (i + 0.5) / _BINS_PER_E)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 500.0))
def test_over_limit_is_the_first_value_binned_over_the_limit(limit_s: float) -> None:
    """A latency at or past over_limit_s(limit) lands in a bin whose centre (what the
    percentile reports) exceeds the limit; one a hair (0.01 %) below it does not: the early
    verdict counts exactly the requests the full run's percentile would count as over."""
    edge = over_limit_s(limit_s)
    assert _centre(edge) > limit_s
    assert _centre(edge * 1.0001) > limit_s
    assert _centre(edge * 0.9999) <= limit_s


def small() -> TrafficMix:
    return load_mix(DATA / "size-small.yaml")


def tight(ttft_s: float, e2e_s: float) -> TrafficMix:
    """The small mix with TTFT and E2E limits that some replica counts miss."""
    mix = small()
    wls = []
    for w in mix.workloads:
        slo = {"ttft_p99_s": ttft_s} if w.name == "chat" else {"e2e_p90_s": e2e_s}
        wls.append(w.model_copy(update={"slo": type(w.slo).model_validate(slo)}))
    return mix.model_copy(update={"workloads": wls})


CASES = [
    (small(), 1, 7), (small(), 2, 7), (small(), 3, 7), (small(), 1, 8),
    (tight(0.1, 4.0), 1, 7), (tight(0.1, 4.0), 2, 7), (tight(0.05, 3.0), 2, 9),
    (tight(0.05, 3.0), 3, 9), (tight(0.2, 2.0), 2, 11), (tight(1.0, 30.0), 1, 12),
    (tight(5.0, 1.2), 1, 7), (tight(5.0, 1.44), 1, 7), (tight(5.0, 1.45), 1, 7),
]


@pytest.mark.parametrize(("mix", "replicas", "seed"), CASES)
def test_stopped_early_fails_exactly_when_the_full_run_fails(
    mix: TrafficMix, replicas: int, seed: int
) -> None:
    """A run watched for a certain miss has the full run's verdict; one that was not stopped
    is the full run, figure for figure; one that was stopped says when and on which target,
    and that target is missed in the full run too."""
    full = simulate(mix, "chat", replicas, seed=seed, keep_requests=False)
    watched = simulate(mix, "chat", replicas, seed=seed, keep_requests=False,
                       stop_when_missed=True)
    assert watched.slo_met == full.slo_met
    if watched.stopped_at_s is None:
        assert watched.model_dump() == full.model_dump()
    else:
        assert not full.slo_met
        assert watched.stopped_at_s < full.pool.simulated_s
        assert watched.stopped_by is not None
        wl, key = watched.stopped_by.split()
        assert not next(c for c in full.workload(wl).slo if c.key == key).met
        assert full.stopped_at_s is None


def test_some_case_stops_early() -> None:
    """The cases above exercise the stop: an overloaded replica misses TTFT long before the
    end of the run."""
    res = simulate(tight(0.1, 4.0), "chat", 1, seed=7, keep_requests=False,
                   stop_when_missed=True)
    assert res.stopped_at_s is not None and res.stopped_at_s < 30
    assert not res.slo_met


def test_simulate_runs_in_full_by_default() -> None:
    """`capplan simulate` (the default) never stops early."""
    res = simulate(tight(0.1, 4.0), "chat", 1, seed=7, keep_requests=False)
    assert res.stopped_at_s is None and res.stopped_by is None


def test_sizing_reports_a_stopped_one_fewer_check() -> None:
    """The search stops its one-fewer check early when the miss is certain, and says so: in
    the plan (`one_fewer_stopped_at_s`) and in the --verbose log; the answer's own seeds run
    in full."""
    from capplan.solve.plan import pool_plan
    from capplan.solve.search import SearchSettings, Sizer

    mix = tight(0.1, 4.0)
    lines: list[str] = []
    sizer = Sizer(mix, "chat", SearchSettings(log=lines.append))
    sizing = sizer.confirm(sizer.search())
    assert sizing.below is not None and sizing.below_fails
    assert all(r.stopped_at_s is None for r in sizing.seed_results)
    plan = pool_plan(sizing, mix.workloads_of("chat"))
    assert plan.confidence.one_fewer_stopped_at_s == sizing.below.stopped_at_s
    if sizing.below.stopped_at_s is not None:
        assert any("stopped early" in line for line in lines)


def test_a_capped_drain_serves_the_requests_of_the_full_run() -> None:
    """Sizing's probes cap the drain (simulate's drain_cap_s) but keep the arrival streams'
    horizon, so a probe and a confirmation of the same count, length and seed serve the same
    requests: the figures of a run whose requests all finish within the cap are the full
    run's to the bit. Capping the mix's drain_s instead redraws every request's lengths
    (each stream chunk draws them for the arrivals within its horizon), which once turned a
    9-replica vision pool's ITL p99 from 30.0 ms into 40.3 ms and a guarded plan's answer
    from 9 replicas into 10."""
    mix = load_mix(Path(__file__).parents[1] / "examples" / "chat-only.yaml")
    full = simulate(mix, "chat", 2, duration_s=40, seed=3, keep_requests=False)
    capped = simulate(mix, "chat", 2, duration_s=40, seed=3, keep_requests=False,
                      drain_cap_s=15.0)
    a, b = full.workload("chat"), capped.workload("chat")
    assert (a.completed, a.ttft_p99_s, a.itl_p99_s, a.e2e_p99_s) == \
        (b.completed, b.ttft_p99_s, b.itl_p99_s, b.e2e_p99_s)
    redrawn = mix.model_copy(update={"simulation": mix.simulation.model_copy(
        update={"drain_s": 15.0})})
    other = simulate(redrawn, "chat", 2, duration_s=40, seed=3, keep_requests=False)
    assert other.workload("chat").e2e_p99_s != a.e2e_p99_s
    overloaded = simulate(tight(0.1, 4.0), "chat", 1, seed=7, keep_requests=False,
                          drain_cap_s=5.0)
    assert overloaded.pool.simulated_s <= tight(0.1, 4.0).simulation.duration_s + 5.0 + 1e-9
