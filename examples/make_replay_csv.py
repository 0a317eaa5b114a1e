"""Write examples/requests.csv: a small recorded-looking trace for `examples/replay.yaml`.

500 requests over ~100 s (Poisson, ~5 req/s) with lognormal lengths; a third of them start
with one of three 1,024-token system prompts (prefix_group 0..2), the rest share nothing
(prefix_group -1). Fixed seed, so the file is the same on every run:

    python examples/make_replay_csv.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

SEED = 20260101
ROWS = 500
RATE_RPS = 5.0
SYSTEM_PROMPT_TOKENS = 1024
OUT = Path(__file__).with_name("requests.csv")


def main(path: Path = OUT) -> None:
    rng = np.random.default_rng(SEED)
    arrival_s = np.cumsum(rng.exponential(1 / RATE_RPS, ROWS))
    body = np.clip(np.rint(rng.lognormal(np.log(500) - 0.32, 0.8, ROWS)), 16, 6000)
    output = np.clip(np.rint(rng.lognormal(np.log(180) - 0.25, 0.7, ROWS)), 1, 1500)
    shared = rng.random(ROWS) < 1 / 3
    group = np.where(shared, rng.integers(0, 3, ROWS), -1)
    prefix = np.where(shared, SYSTEM_PROMPT_TOKENS, 0)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["arrival_s", "input_tokens", "output_tokens", "prefix_group", "prefix_tokens"])
        for t, b, o, g, p in zip(arrival_s, body, output, group, prefix, strict=True):
            w.writerow([f"{t:.4f}", int(b + p), int(o), int(g), int(p)])


if __name__ == "__main__":
    main()
