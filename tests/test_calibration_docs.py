"""docs/calibration.md's tables of the shipped profiles (each profile's sweep, held-out
errors, KV capacity and GPU-minutes; the H200's physics check) are pasted from
`python scripts/calibration_analysis.py table` and `sanity`; every row they print must be in
the page as printed today, so a refit that moves a figure fails here until the page says it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("gpu", "what"), [("h200", "table"), ("h200", "sanity"),
                                           ("h100", "table")])
def test_the_pages_profile_tables_are_todays(gpu: str, what: str) -> None:
    env = {**os.environ, "CAPPLAN_PROFILES": str(ROOT / "calibration" / gpu / "vllm-0.26.0")}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibration_analysis.py"),
                          what], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) > 3, out.stdout
    page = (ROOT / "docs" / "calibration.md").read_text()
    stale = [row for row in rows if row not in page]
    assert not stale, (f"docs/calibration.md lacks these rows of {gpu}'s `"
                       f"calibration_analysis.py {what}` (CAPPLAN_PROFILES="
                       f"calibration/{gpu}/vllm-0.26.0):\n" + "\n".join(stale))
