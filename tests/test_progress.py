"""Progress feedback: a long command shows a bar with elapsed time and ETA when stderr is a
terminal, and writes nothing otherwise (pipes, logs, CI, CliRunner)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from capplan import _cli
from capplan.calibrate import cli as ccli
from capplan.calibrate import store
from capplan.cli import main


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=120), buf


def test_quiet_off_a_terminal() -> None:
    """Off a terminal the bar is never started: nothing is written, updates do nothing."""
    buf = io.StringIO()
    with _cli.ProgressBar("working", total=3, console=Console(file=buf)) as bar:
        bar.update(1, description="step 1")
        bar.update(advance=1)
    assert not bar.shown and buf.getvalue() == ""


def test_terminal_shows_steps_and_eta() -> None:
    """On a terminal the bar shows the description, steps done of the total, and an ETA."""
    console, buf = _terminal()
    with _cli.ProgressBar("working", console=console) as bar:
        bar.update(0, total=4, description="fitting a")
        bar.update(2, description="fitting c")
    assert bar.shown
    out = buf.getvalue()
    assert "fitting c" in out and "2/4" in out and "ETA" in out


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    for key in ("bf16", "fp8"):
        for f in (store.CALIBRATION_DIR / "_raw").glob(f"qwen3-32b--{key}.*"):
            shutil.copy(f, raw)
    return raw


def test_refit_from_raw_shows_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate --from-raw` names each profile as it fits it (BF16 base first) on the
    terminal its bar draws on, and writes only the folders to its output (one refit for
    both: the bar's console is a terminal, CliRunner's output is not; test_quiet_off_a_terminal
    shows a bar off a terminal writes nothing)."""
    raw = _raw(tmp_path)
    console, buf = _terminal()

    class OnTerminal(_cli.ProgressBar):
        def __init__(self, description: str, total: int | None = None) -> None:
            super().__init__(description, total, console=console)

    monkeypatch.setattr(ccli, "ProgressBar", OnTerminal)
    res = CliRunner().invoke(main, ["calibrate", "--from-raw", str(raw), "--out",
                                    str(tmp_path / "cal")])
    assert res.exit_code == 0, res.output
    assert [Path(line).name for line in res.output.split()] == ["bf16", "fp8"]
    out = buf.getvalue()
    assert "fitting qwen3-32b/bf16" in out and "fitting qwen3-32b/fp8" in out
    assert "1/2" in out and "ETA" in out
