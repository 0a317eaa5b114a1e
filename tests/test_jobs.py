"""Sizing in worker processes (solve/jobs.py): the same plan, count and log as in one process."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import CancelledError
from functools import cache
from pathlib import Path

import pytest

from capplan.mix import TrafficMix, load_mix
from capplan.solve import jobs
from capplan.solve.jobs import InOrder
from capplan.solve.options import size_mix, with_pool
from capplan.solve.search import SearchSettings, Sizer

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ROOT / "examples" / "production-mix.yaml"
SMALL = Path(__file__).parent / "data" / "size-small.yaml"


@cache
def production() -> TrafficMix:
    return load_mix(PRODUCTION)


def _untimed(lines: list[str]) -> list[str]:
    """Log lines without the wall time each simulation took (the one part that varies)."""
    return [re.sub(r" \(\d+\.\d s\)$", "", line) for line in lines]


def _sized(workers: int) -> tuple[str, list[str]]:
    lines: list[str] = []
    plan = size_mix(production(), quick=True, workers=workers,
                    log=lines.append, on_pool=lambda name, i, n: lines.append(f"pool {i} {name}"))
    return plan.to_json(), _untimed(lines)


def test_pools_side_by_side_give_the_serial_plan_and_log() -> None:
    """Every pool searched at once, simulations in two processes: the plan byte for byte,
    and the log and progress line for line, as one pool after another in this process."""
    serial, parallel = _sized(1), _sized(2)
    assert parallel[0] == serial[0]
    assert parallel[1] == serial[1]
    assert any(line.startswith("pool 2 ") for line in serial[1])


@pytest.mark.parametrize("offset", [2, -1])
def test_confirmation_walk_with_prefetched_seeds_matches_one_process(offset: int) -> None:
    """Confirming from a count too high (walk down) or too low (walk up), with the
    seeds prefetched and dropped in worker processes: the same answer, runs and count."""
    mix = load_mix(SMALL)
    quick = SearchSettings(quick=True, workers=1)
    n = Sizer(mix, "chat", quick).search()
    out = []
    for workers in (1, 2):
        sizer = Sizer(mix, "chat", SearchSettings(quick=True, workers=workers))
        sizer.search()
        s = sizer.confirm(max(1, n + offset))
        out.append((s.replicas, s.seeds, s.stable, s.below_fails, s.simulations,
                    [r.model_dump_json() for r in s.seed_results],
                    None if s.below is None else s.below.model_dump_json()))
    assert out[0] == out[1]
    assert out[0][0] != n + offset  # it walked


def test_an_infeasible_pool_is_an_answer_side_by_side_as_in_one_process() -> None:
    """A pool that no count can size is listed as infeasible with the same reason and log
    side by side as serially, and the pool after it is sized all the same, as it is alone."""
    mix = production()
    capped = with_pool(mix, mix.pool("interactive").model_copy(update={"max_replicas": 1}))
    seen = []
    for workers in (1, 2):
        lines: list[str] = []
        plan = size_mix(capped, quick=True, workers=workers, log=lines.append, advice=False,
                        pools=["interactive", "batch"])
        seen.append((plan.pools, plan.infeasible, _untimed(lines)))
    assert seen[0] == seen[1]
    pools, infeasible, lines = seen[0]
    assert [x.pool for x in infeasible] == ["interactive"]
    assert re.search(r"no replica count ≤ 1 ", infeasible[0].reason)
    assert f"infeasible: {infeasible[0].reason}" in lines
    assert pools == size_mix(mix, quick=True, advice=False, pools=["batch"]).pools


def test_in_order_releases_lines_in_pool_order() -> None:
    """Pools finishing out of order tell their lines and starts in pool order; a failed pool
    ends the telling, as the serial run would have stopped there."""
    out: list[str] = []
    order = InOrder(["a", "b", "c", "d"], out.append,
                    lambda name, i, n: out.append(f"start {name}"))
    logs = [order.logger(i) for i in range(4)]
    assert all(log is not None for log in logs)
    a, b, c, d = (log for log in logs if log is not None)
    c("c1")
    b("b1")
    a("a1")
    order.finished(2)
    d("d1")
    order.finished(0)
    b("b2")
    order.finished(3, failed=False)
    order.finished(1)
    assert out == ["start a", "a1", "start b", "b1", "b2", "start c", "c1", "start d", "d1"]

    out.clear()
    order = InOrder(["a", "b", "c"], out.append, None)
    a2, b2, c2 = (order.logger(i) for i in range(3))
    assert a2 is not None and b2 is not None and c2 is not None
    c2("c1")
    order.finished(2)
    b2("b1")
    order.finished(1, failed=True)
    a2("a1")
    order.finished(0)
    assert out == ["a1", "b1"]


def test_a_stopped_search_asks_for_no_more_simulations() -> None:
    """Once the stop event is set (the caller was interrupted), the next simulation a search
    asks for raises instead of running."""
    stop = threading.Event()
    sizer = Sizer(load_mix(SMALL), "chat", SearchSettings(quick=True, workers=1, stop=stop))
    stop.set()
    with pytest.raises(CancelledError):
        sizer.search()
    assert sizer.simulations == 0


def test_the_feeder_sleeps_once_its_holds_expire() -> None:
    """A worker held for a search's next step (HOLD_S) is let go when the hold expires, even
    with nothing queued, so that the feeder thread then waits for work. (It did not: with an
    expired hold and an empty queue it woke at once, for ever, a busy thread in the caller's
    process that made every later test of the suite several times slower.)"""
    d = jobs._dispatcher(1)
    with d._cond:
        d._holds.append(time.monotonic() - 1.0)  # a hold that has expired
        d._cond.notify()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        with d._cond:
            if not d._holds:
                break
        time.sleep(0.01)
    with d._cond:
        assert d._holds == [] and not d._queue
