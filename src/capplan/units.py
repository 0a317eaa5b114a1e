"""How capplan writes a duration for people: one rule for the CLI, the plan's advice and the
HTML report."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """Milliseconds below one second (a TTFT of 412.3 ms), seconds above (an E2E of 12.35 s);
    no value, or an infinite one, means requests never finished."""
    if seconds is None or not math.isfinite(seconds):
        return "unfinished"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
