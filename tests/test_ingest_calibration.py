"""scripts/ingest_calibration.py: a GPU session's calibration runs stored, another GPU's apart."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ingest_calibration.py"


def _lane(tmp: Path) -> Path:
    """A lane as scripts/gpu_calibrate.sh packs it: one timed run, one KV-only run, one failed."""
    lane = tmp / "lane0"
    lane.mkdir()
    (lane / "m--bf16.jsonl").write_text('{"step": 1}\n')
    (lane / "m--bf16.meta.json").write_text(json.dumps({"args": {}}))
    (lane / "m--bf16.log").write_text("ENGINE ...\n")
    (lane / "m--bf16--u85.meta.json").write_text(json.dumps({"args": {"kv_only": True}}))
    (lane / "rc.txt").write_text("m--bf16 rc=0 s=100\nm--bf16--u85 rc=0 s=40\nm--fp8 rc=1 s=9\n")
    return lane


def _ingest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script run from `cwd`, so that its default folder (calibration/_raw, relative)
    could never be the repository's."""
    return subprocess.run([sys.executable, str(SCRIPT), "s99", *args, "--runner-commit", "abc1234"],
                          capture_output=True, text=True, cwd=cwd)


def test_another_gpus_runs_are_stored_in_their_own_folder(tmp_path: Path) -> None:
    """`--raw` names the folder (calibration/_raw/<gpu> for a GPU other than the H200, which a
    missing folder becomes): the finished runs land there with their logs and rc.txt lines,
    the failed one does not, and a second ingest of the same runs is refused."""
    lane, raw = _lane(tmp_path), tmp_path / "_raw" / "h100"
    out = _ingest(tmp_path, str(lane), "--raw", str(raw))
    assert out.returncode == 0, out.stderr
    assert lzma.decompress((raw / "m--bf16.jsonl.xz").read_bytes()) == b'{"step": 1}\n'
    assert json.loads((raw / "m--bf16.meta.json").read_text())["runner_commit"] == "abc1234"
    assert (raw / "m--bf16--u85.meta.json").exists() and not (raw / "m--fp8.meta.json").exists()
    assert (raw / "logs-s99" / "m--bf16.log.gz").exists()
    assert (raw / "rc.txt").read_text().splitlines() == ["m--bf16 rc=0 s=100",
                                                         "m--bf16--u85 rc=0 s=40"]
    again = _ingest(tmp_path, str(lane), "--raw", str(raw))
    assert not (tmp_path / "calibration").exists()  # nothing went to the default folder
    assert again.returncode != 0 and "stored already" in again.stderr


def test_a_drain_scans_traces_are_stored_compressed_with_its_core_trace(tmp_path: Path) -> None:
    """A drain scan's NAME.traces/: the profiler's step records and calls xz-compressed, its
    table as it is, and the core trace of runner.py --trace-core (coretrace/core-<pid>.jsonl)
    xz-compressed in its own folder; nothing else of the lane."""
    lane = tmp_path / "lane0"
    traces = lane / "m--bf16--drain.traces"
    (traces / "coretrace").mkdir(parents=True)
    (lane / "m--bf16--drain.jsonl").write_text('{"step": 1}\n')
    (lane / "m--bf16--drain.meta.json").write_text(json.dumps({"args": {}}))
    (lane / "rc.txt").write_text("m--bf16--drain rc=0 s=100\n")
    (traces / "p.calls.json").write_text("[]")
    (traces / "p.table.txt").write_text("Name ...\n")
    (traces / "p.trace.json.gz").write_bytes(b"chrome")
    (traces / "coretrace" / "core-7.jsonl").write_text('["sample", "MainThread", 1.0, 2.0]\n')
    raw = tmp_path / "_raw"
    out = _ingest(tmp_path, str(lane), "--raw", str(raw))
    assert out.returncode == 0, out.stderr
    stored = raw / "m--bf16--drain.traces"
    assert lzma.decompress((stored / "p.calls.json.xz").read_bytes()) == b"[]"
    assert (stored / "p.table.txt").read_text() == "Name ...\n"
    assert lzma.decompress((stored / "coretrace" / "core-7.jsonl.xz").read_bytes()).startswith(
        b'["sample"')
    assert sorted(p.name for p in stored.rglob("*") if p.is_file()) == [
        "core-7.jsonl.xz", "p.calls.json.xz", "p.table.txt"]
