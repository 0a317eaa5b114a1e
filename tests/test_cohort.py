"""The decode cohort is an evaluation shortcut, never a model change: with and without it,
the same seed must give the same simulation, figure for figure (sim/cohort.py)."""

from __future__ import annotations

from typing import Any

import pytest

from capplan.mix import TrafficMix
from capplan.sim.run import simulate


def _mix(engine: dict[str, Any], workloads: list[dict[str, Any]], duration: float,
         **simulation: Any) -> TrafficMix:
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "engine": engine}],
        "workloads": [{"pool": "p", **w} for w in workloads],
        "simulation": {"duration_s": duration, "warmup_s": 2.0, "drain_s": 60.0, **simulation},
    })


CHAT = {
    "name": "chat",
    "arrival": {"kind": "poisson", "rate_rps": 30},
    "input_tokens": {"kind": "lognormal", "mean": 500, "sigma": 0.6, "max": 1500},
    "output_tokens": {"kind": "lognormal", "mean": 120, "sigma": 0.6, "max": 400},
    "slo": {"ttft_p99_s": 0.5, "itl_p99_s": 0.05},
}
RAG = {
    "name": "rag",
    "arrival": {"kind": "poisson", "rate_rps": 8},
    "input_tokens": {"kind": "uniform", "low": 1200, "high": 1800},
    "output_tokens": {"kind": "uniform", "low": 20, "high": 200},
    "prefix": {"shared_tokens": 1000, "groups": 3},
    "priority": 1,
}
USERS = {
    "name": "users",
    "arrival": {"kind": "closed", "concurrency": 24},
    "input_tokens": {"kind": "constant", "value": 300},
    "output_tokens": {"kind": "uniform", "low": 30, "high": 90},
}

CASES = {
    "open loop, prefix caching": (
        {"max_model_len": 4096}, [CHAT, RAG], 1, 20.0,
    ),
    "priority, budget-bound chunks": (
        {"max_model_len": 4096, "scheduling_policy": "priority", "max_num_batched_tokens": 512,
         "max_num_seqs": 512},
        [CHAT, RAG], 1, 15.0,
    ),
    "KV pressure with preemption": (
        {"max_model_len": 2048, "gpu_memory_utilization": 0.14}, [CHAT, RAG], 1, 15.0,
    ),
    "sync scheduling, closed loop, two replicas": (
        {"max_model_len": 4096, "async_scheduling": False}, [USERS, RAG], 2, 15.0,
    ),
    # one client's event loop and the output path's delay (sim/client.py): tokens read late,
    # the cohort's by its own lag (APPROXIMATE below)
    "one client loop, output delay, closed loop": (
        {"max_model_len": 4096}, [USERS, CHAT], 1, 15.0,
        {"client_send_s": 0.4e-3, "output_jitter_s": 0.14e-3},
    ),
    # each step's core time drawn about its median (simulation.core_spread)
    "core-time spread, priority, budget-bound chunks": (
        {"max_model_len": 4096, "scheduling_policy": "priority", "max_num_batched_tokens": 512,
         "max_num_seqs": 512},
        [CHAT, RAG], 1, 15.0, {"core_spread": True},
    ),
}


APPROXIMATE = {"one client loop, output delay, closed loop"}
"""Cases where the cohort reads its members' tokens after the step's explicit requests: with
one client loop the reading order moves a read by a send, and the request-by-request walk
reads in scheduling order. Every request's row is the same; the ITL histograms may differ
by a few bins."""


def _close(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        if str(a.get("key", "")).startswith("itl"):  # an SLO's verdict on ITL quotes its
            # percentile
            path += "(itl)"
        for k in a:
            _close(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and "itl" in path:
        # a few bins of the 0.1 % histogram: the engine core's launches (core_graph_s) and
        # its wake (idle_wake_s) move a step's output past a client read more often than the
        # steps alone did
        assert a == pytest.approx(b, rel=2e-2), path
    else:
        assert a == b, path


@pytest.mark.parametrize("case", list(CASES))
def test_cohort_gives_the_reference_result(case: str) -> None:
    """Same seed, same figures with the decode cohort and with the request-by-request walk
    (ITL percentiles within 2 % where a client loop's reading order differs)."""
    engine, workloads, replicas, duration, *simulation = CASES[case]
    mix = _mix(engine, workloads, duration, **(simulation[0] if simulation else {}))
    fast = simulate(mix, "p", replicas, seed=3)
    ref = simulate(mix, "p", replicas, seed=3, decode_cohort=False)
    if case in APPROXIMATE:
        _close(fast.model_dump(), ref.model_dump())
    else:
        assert fast.model_dump() == ref.model_dump()
    assert fast.requests().equals(ref.requests())


def test_kv_pressure_case_really_preempts() -> None:
    """The KV-pressure case above exercises preemption (else it would prove little)."""
    engine, workloads, replicas, duration, *_ = CASES["KV pressure with preemption"]
    res = simulate(_mix(engine, workloads, duration), "p", replicas, seed=3)
    assert res.pool.preemptions > 0
