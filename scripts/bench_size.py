"""Sizing speed: wall-clock seconds of `capplan size` on the example production mix.

Times `size_mix` (what `capplan size` runs) end to end, default and `--quick`, with the
simulations each pool took. Set CAPPLAN_WORKERS=2 to run confirmation seeds in worker
processes. Falls back to the solver's test mix when the example is absent.

    python scripts/bench_size.py [--traffic examples/production-mix.yaml] [--no-quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from capplan.mix import load_mix
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

    modes = [m for m, skip in (("default", args.no_full), ("quick", args.no_quick)) if not skip]
    for mode in modes:
        t0, c0 = time.perf_counter(), time.process_time()
        plan = size_mix(mix, quick=mode == "quick")
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"{mode}: {elapsed:.1f} s ({cpu:.1f} s CPU) for {args.traffic.name} "
              f"({len(mix.workloads)} workloads, {len(plan.pools)} pools, {plan.gpus} GPUs)")
        for p in plan.pools:
            c = p.confidence
            print(f"  {p.pool:<14} {p.gpus:3d} GPUs  {c.simulations:3d} simulations "
                  f"(confirmed at {c.duration_s:g} s x {len(c.seeds)} seeds)")


if __name__ == "__main__":
    main()
