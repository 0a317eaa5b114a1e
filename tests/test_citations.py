"""Every vLLM source file capplan cites exists in vLLM 0.26.0, the release it models.

The simulator's rules, the calibration's and validation's notes and the docs name the vLLM
file each follows (`vllm/v1/core/sched/scheduler.py`, ...); a path that is not in the
release is a rule whose source nobody can check. The release's file list is stored beside
the tests (scripts/vllm_files.py writes it from the wheel)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\bvllm/[A-Za-z0-9_/]+\.py\b")


def _release_files() -> set[str]:
    with gzip.open(ROOT / "tests/data/vllm-0.26.0-files.txt.gz", "rt") as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def _citing_files() -> list[Path]:
    return [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py")),
            *sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "docs").glob("*.md")),
            ROOT / "README.md", *sorted((ROOT / "models").rglob("*.md"))]


def test_the_stored_file_list_is_vllm_0_26_0s() -> None:
    with gzip.open(ROOT / "tests/data/vllm-0.26.0-files.txt.gz", "rt") as f:
        header = f.readline()
    assert header.startswith("# vllm-0.26.0-") and " sha256 " in header
    files = _release_files()
    assert "vllm/v1/core/sched/scheduler.py" in files and len(files) > 1000


def test_every_cited_vllm_file_is_in_the_release() -> None:
    files = _release_files()
    missing = sorted({f"{p.relative_to(ROOT)}: {m}"
                      for p in _citing_files()
                      for m in CITED.findall(p.read_text(encoding="utf-8"))
                      if m not in files})
    assert not missing, "cited vLLM files not in 0.26.0:\n" + "\n".join(missing)


def test_the_scheduler_rules_cite_their_sources() -> None:
    """The simulator's modules that model vLLM (its scheduler, KV cache manager, engine
    core loop and client) each cite the vLLM files they follow."""
    sim = ROOT / "src/capplan/sim"
    for name in ("core.py", "request.py", "window.py", "kvcache.py", "replica.py", "client.py",
                 "run.py"):
        assert CITED.search((sim / name).read_text()), f"sim/{name} cites no vLLM file"
