"""The working tree travels to the lent GPU host with every call, 64 MiB in all with what
the call carries (scripts/gpu_pieces.sh): the vLLM bundle (81 MB) and FlashAttention 4's
wheel (84 MB) go in pieces beside it. A tree past 48 MiB would leave pieces under 16 MiB,
over a dozen calls for the bundle alone, and at 63 MiB none at all (the eighteenth session's
tree reached 62.8 MB before the stored chunk times were packed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 48 * 2**20


def test_the_tracked_tree_leaves_room_for_the_gpu_bundle() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked tree to measure")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    files = [ROOT / f for f in out.stdout.decode().split("\0") if f]
    size = sum(f.stat().st_size for f in files if f.is_file())
    assert size < LIMIT, (
        f"the tracked tree is {size / 2**20:.1f} MiB, over {LIMIT / 2**20:.0f} MiB: a GPU call "
        "carries it beside the vLLM bundle's pieces (scripts/gpu_pieces.sh); store less or pack it")
