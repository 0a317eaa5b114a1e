"""Predictions recorded before the engine is measured: the out-of-sample check.

`compare` predicts every stored run again with today's code and profiles, which is what the
CI gate needs, but a rule fitted after a row was measured can bend the row's prediction
toward it. What the simulator said before anyone saw the engine is the honest figure, so
`capplan validate predict SUITE --record validation/queued` writes it down, one file per
engine (`<engine>.json`: when, at which commit, and every experiment's predicted figures),
once: an engine already measured, or already recorded, is refused. `compare --write-docs`
then holds each measured engine with such a file to what it was predicted to do
(docs/validation.md, "Predicted before measured").
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capplan.errors import ConfigError

QUEUED_DIR = Path(__file__).resolve().parents[3] / "validation" / "queued"
"""Where the repository keeps them."""

SCHEMA_VERSION = 1


def refuse_recorded(folder: Path, engine: str) -> None:
    """A ConfigError where `engine`'s predictions were recorded in `folder` before."""
    path = folder / f"{engine}.json"
    if path.exists():
        old = json.loads(path.read_text())
        raise ConfigError(f"predictions for {engine} were recorded on {old.get('recorded')} "
                          f"at {old.get('git_commit')}; a prediction is recorded once (delete "
                          "the file to queue the engine anew)", file=str(path))


def record(folder: Path, engine: str, predictions: dict[str, dict[str, dict[str, float]]], *,
           suite: str) -> Path:
    """Write `folder/<engine>.json`: `predictions` as {experiment: {workload: {metric:
    value}}}, with the date and the commit; refused where the engine was recorded before."""
    from capplan.validate.store import _git_commit

    refuse_recorded(folder, engine)
    path = folder / f"{engine}.json"
    folder.mkdir(parents=True, exist_ok=True)
    body = {"schema_version": SCHEMA_VERSION, "engine": engine, "suite": suite,
            "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": _git_commit(),
            "predictions": {e: {w: {m: round(v, 6) for m, v in ms.items() if math.isfinite(v)}
                                for w, ms in ws.items()} for e, ws in predictions.items()}}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def load(folder: Path = QUEUED_DIR) -> dict[str, dict[str, Any]]:
    """Every recorded engine's file, by engine name (none where the folder is missing)."""
    if not folder.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
