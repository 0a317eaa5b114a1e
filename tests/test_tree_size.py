"""The working tree travels to the lent GPU host with every call, 64 MiB in all with what
the call carries: the vLLM bundle (81 MB) and FlashAttention 4's wheel (84 MB) go in pieces
beside it, each what is left under 64 MiB less the tree and 2 MiB for job files
(scripts/gpu_pieces.sh, which counts the tree as a tar holds it, about 1.3 MB more). At 48
MiB of tree the pieces were 13 MiB, 6 calls for the bundle; at 50 MiB, 10 MiB and 8 calls; at
52 MiB, 8 MiB and 10 calls; at this limit, 56 MiB, 6 MiB and 14 calls (each a few seconds
of device time, and the host is given back 30 s after a call); at 63 MiB there would be none
at all (the eighteenth session's tree reached 62.8 MB before the stored chunk times were
packed). Raised from 48 MiB by the thirty-third session, whose H100 rows and drain scans took
the tree past it, and from 52 by the thirty-fifth, whose H200 drain scans and rows did; from 56
to 60 by the thirty-eighth, whose three leases' rows did. Since the thirty-seventh session a
GPU call carries a slim tree instead (scripts/gpu_slim.sh holds the stored measurements back:
about 4 MB travels, and the bundle goes in two calls), so this limit now bounds only the
older scripts/gpu_pieces.sh flow, at 60 MiB 2 MiB pieces."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60 * 2**20


def test_the_tracked_tree_leaves_room_for_the_gpu_bundle() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked tree to measure")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    files = [ROOT / f for f in out.stdout.decode().split("\0") if f]
    size = sum(f.stat().st_size for f in files if f.is_file())
    assert size < LIMIT, (
        f"the tracked tree is {size / 2**20:.1f} MiB, over {LIMIT / 2**20:.0f} MiB: a GPU call "
        "carries it beside the vLLM bundle's pieces (scripts/gpu_pieces.sh); store less or pack it")
