"""Sizing speed: wall-clock seconds of `capplan size` on the example production mix.

Times `size_mix` (what `capplan size` runs) end to end, default and `--quick`, and breaks the
time down per pool: simulations run, simulated seconds, wall seconds. Falls back to the
solver's test mix when the example is absent.

    python scripts/bench_size.py [--traffic examples/production-mix.yaml] [--no-quick]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from capplan.mix import load_mix
from capplan.solve import search
from capplan.solve.options import size_mix

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "examples" / "production-mix.yaml"
FALLBACK = ROOT / "tests" / "data" / "size-small.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traffic", type=Path, default=DEFAULT if DEFAULT.exists() else FALLBACK)
    ap.add_argument("--no-quick", action="store_true", help="skip the --quick timing")
    ap.add_argument("--no-full", action="store_true", help="skip the default timing")
    args = ap.parse_args()
    mix = load_mix(args.traffic)

    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    original = search.simulate

    def counted(m, pool, n, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        res = original(m, pool, n, **kw)
        s = stats[pool]
        s[0] += 1
        s[1] += kw["duration_s"]
        s[2] += time.perf_counter() - t0
        return res

    search.simulate = counted
    modes = [m for m, skip in (("default", args.no_full), ("quick", args.no_quick)) if not skip]
    for mode in modes:
        stats.clear()
        t0 = time.perf_counter()
        plan = size_mix(mix, quick=mode == "quick")
        elapsed = time.perf_counter() - t0
        print(f"{mode}: {elapsed:.1f} s for {args.traffic.name} "
              f"({len(mix.workloads)} workloads, {len(plan.pools)} pools, {plan.gpus} GPUs)")
        for pool, (n, sim_s, wall_s) in stats.items():
            print(f"  {pool:<24} {int(n):3d} simulations, {sim_s:7.0f} s simulated, "
                  f"{wall_s:6.1f} s wall")


if __name__ == "__main__":
    main()
