"""Simulation speed: simulated requests per wall-clock second, and memory vs duration.

One H200 replica (the default profile for llama-3.1-8b bf16) serving the chat workload
(512 prompt tokens, 128 output tokens, Poisson arrivals) at 80 % of its saturation rate,
the rate itself measured first by a closed loop of 512 users.

    python scripts/bench_sim.py [--duration-s 1200] [--profile 15]

`--profile N` also runs the shorter duration under cProfile and prints the N functions with
the most time of their own, and the Python calls a simulated request costs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
import tracemalloc

from capplan.mix import TrafficMix
from capplan.sim.run import simulate
from capplan.validate.runner import host


def mix(arrival: dict[str, object], duration_s: float) -> TrafficMix:
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "chat", "model": "llama-3.1-8b", "engine": {"max_model_len": 8192}}],
        "workloads": [{
            "name": "chat", "pool": "chat", "arrival": arrival,
            "input_tokens": {"kind": "constant", "value": 512},
            "output_tokens": {"kind": "constant", "value": 128},
        }],
        "simulation": {"duration_s": duration_s, "warmup_s": 0.1 * duration_s},
    })


def machine() -> str:
    """The machine's speed, so that figures taken on different machines can be compared:
    the figure each validation engine start records for its host (validate/runner.py
    `host`), best of three runs of a pure-Python loop of 1,000,000 additions."""
    h = host()
    return (f"machine: {h['cpus']} CPUs, {h.get('cpu_model')}, pure-Python loop of 1M "
            f"additions {h['py_loop_1m_ms']} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-s", type=float, default=1200.0)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the shorter run: its N costliest functions")
    args = ap.parse_args()
    print(machine())

    sat = simulate(mix({"kind": "closed", "concurrency": 512}, 120.0), "chat", 1)
    capacity_rps = sat.workloads[0].output_tokens_per_s / 128
    rate = 0.8 * capacity_rps
    print(f"saturation: {capacity_rps:.1f} req/s ({sat.pool.profile}, {sat.pool.profile_source})")

    for duration in (args.duration_s / 8, args.duration_s):
        m = mix({"kind": "poisson", "rate_rps": rate}, duration)
        t0 = time.perf_counter()
        res = simulate(m, "chat", 1, seed=1)
        wall = time.perf_counter() - t0
        tracemalloc.start()  # a second run for memory: tracing slows Python several-fold
        simulate(m, "chat", 1, seed=1, keep_requests=False)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        n = res.requests().height  # measured requests
        total = rate * res.pool.simulated_s  # all simulated requests, warm-up and drain too
        print(
            f"duration {duration:6.0f} s: {total:8.0f} requests in {wall:6.2f} s wall = "
            f"{total / wall:7.0f} simulated requests/s ({n} measured); "
            f"peak traced memory (no per-request rows) {peak / 2**20:6.1f} MiB"
        )
        if args.profile and duration < args.duration_s:
            prof = cProfile.Profile()
            prof.runcall(simulate, m, "chat", 1, seed=1)
            stats = pstats.Stats(prof)
            calls = stats.total_calls  # type: ignore[attr-defined]
            print(f"profiled: {calls} Python calls, {calls / total:.0f} a simulated request; "
                  f"the {args.profile} with the most time of their own:")
            stats.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
