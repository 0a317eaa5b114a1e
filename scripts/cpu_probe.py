"""Time the host's CPU beside a running engine: cpu_probe.py OUT.jsonl [PERIOD_S]

Every PERIOD_S (0.05) it times a fixed pure-Python loop of 50,000 additions and writes one line
`{"t": perf_counter at its start, "loop_ms": its time, "cpu": the core it ran on}`; every
second it adds the host's CPU time split from /proc/stat since the last line (`"stat": user,
system, idle, iowait, irq, softirq, steal`, in clock ticks, summed over cores). The clock is
`time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and so the same clock as the
calibration runner's step stamps and the core tracer's spans: the loop's slow stretches can be
laid beside the engine's (scripts/calibration_analysis.py probe, validation_analysis.py probe).

It runs on the GPU host beside the engine, so it is standard library only; it stops on SIGTERM
or SIGINT, and costs 2-6 % of one core.
"""

from __future__ import annotations

import json
import signal
import sys
import time

LOOP = 50_000


def cpu_now() -> int:
    """The core this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def stat_now() -> list[int]:
    """The host's CPU time so far, summed over cores: user, system, idle, iowait, irq,
    softirq, steal (clock ticks; nice folded into user)."""
    with open("/proc/stat") as f:
        x = [int(v) for v in f.readline().split()[1:9]]
    return [x[0] + x[1], x[2], x[3], x[4], x[5], x[6], x[7]]


def main() -> None:
    out, period = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    last_stat, last_stat_t = stat_now(), time.perf_counter()
    with open(out, "w") as f:
        while not stop:
            t = time.perf_counter()
            acc = 0
            for i in range(LOOP):
                acc += i
            line = {"t": round(t, 6), "loop_ms": round((time.perf_counter() - t) * 1e3, 4),
                    "cpu": cpu_now()}
            if t - last_stat_t >= 1.0:
                now = stat_now()
                line["stat"] = [a - b for a, b in zip(now, last_stat, strict=True)]
                last_stat, last_stat_t = now, t
            f.write(json.dumps(line) + "\n")
            f.flush()
            time.sleep(max(0.0, period - (time.perf_counter() - t)))


if __name__ == "__main__":
    main()
