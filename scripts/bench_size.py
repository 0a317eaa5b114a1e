"""Sizing speed: wall-clock seconds of `capplan size` on the example production mix.

Times `size_mix` (what `capplan size` runs) end to end, default and `--quick`, with the
simulations each pool took. Like `capplan size`, it uses a worker process per CPU (--workers,
or $CAPPLAN_WORKERS; 1: all in this process). Falls back to the solver's test mix when the
example is absent.

    python scripts/bench_size.py [--traffic examples/production-mix.yaml] [--no-quick]
        [--workers N]   # --workers 1: the pools in turn, with each pool's seconds
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench_sim import machine  # scripts/, beside this file

from capplan.mix import load_mix
from capplan.solve.jobs import cli_workers
from capplan.solve.options import size_mix

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "examples" / "production-mix.yaml"
FALLBACK = ROOT / "tests" / "data" / "size-small.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traffic", type=Path, default=DEFAULT if DEFAULT.exists() else FALLBACK)
    ap.add_argument("--no-quick", action="store_true", help="skip the --quick timing")
    ap.add_argument("--no-full", action="store_true", help="skip the default timing")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    workers = cli_workers(args.workers)
    mix = load_mix(args.traffic)
    print(machine())

    modes = [m for m, skip in (("default", args.no_full), ("quick", args.no_quick)) if not skip]
    for mode in modes:
        starts: list[float] = []  # with one worker the pools run in turn: time each
        t0, c0 = time.perf_counter(), time.process_time()
        plan = size_mix(mix, quick=mode == "quick", workers=workers,
                        on_pool=lambda name, i, n, at=starts: at.append(time.perf_counter()))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        took = ([b - a for a, b in zip(starts, [*starts[1:], t0 + elapsed], strict=True)]
                if workers == 1 and len(starts) == len(plan.pools) else None)
        print(f"{mode}: {elapsed:.1f} s ({cpu:.1f} s CPU here, {workers} worker(s)) for "
              f"{args.traffic.name} "
              f"({len(mix.workloads)} workloads, {len(plan.pools)} pools, {plan.gpus} GPUs)")
        for p in plan.pools:
            c = p.confidence
            own = f", {took[plan.pools.index(p)]:.1f} s" if took else ""
            print(f"  {p.pool:<14} {p.gpus:3d} GPUs  {c.simulations:3d} simulations "
                  f"(confirmed at {c.duration_s:g} s x {len(c.seeds)} seeds){own}")


if __name__ == "__main__":
    main()
