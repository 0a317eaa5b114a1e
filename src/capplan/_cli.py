"""What every capplan command shares: an expected failure becomes one red line and its exit
code, never a traceback (the commands also run standalone, outside the `capplan` group);
a long command shows a progress bar on a terminal and stays quiet in pipes and logs."""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from capplan.errors import CapplanError, ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def one_line(text: str) -> str:
    """A message folded onto one line."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def fail(message: str, exit_code: int) -> None:
    """Print `error: <message>` in red on stderr and exit with `exit_code`."""
    click.secho(f"error: {one_line(message)}", fg="red", err=True)
    raise click.exceptions.Exit(exit_code)


def errors_as_lines(fn: F) -> F:
    """Decorate a click callback: a CapplanError ends it with one line and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CapplanError as e:
            fail(str(e), e.exit_code)

    return wrapper  # type: ignore[return-value]


def check_out(path: Path | None, option: str, suffixes: Sequence[str] | None) -> None:
    """Refuse an output path before any work is done, rather than after it: a suffix other
    than `suffixes` (which say what will be written; None: any), a folder that does not
    exist or cannot be written, or a path that is a folder."""
    if path is None:
        return
    suffix = path.suffix.lower()
    if suffixes is not None and suffix not in suffixes:
        raise ConfigError(f"unknown suffix {suffix or '(none)'!r}; use " + " or ".join(suffixes),
                          file=str(path), field=option)
    folder = path.parent
    if path.is_dir():
        raise ConfigError("is a folder; give a file name", file=str(path), field=option)
    if not folder.is_dir():
        raise ConfigError(f"folder {folder} does not exist; create it first",
                          file=str(path), field=option)
    try:  # the one sure test: write a file there (permissions, read-only or special mounts)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write in folder {folder} ({e.strerror or e})",
                          file=str(path), field=option) from e


def write_out(path: Path, option: str, write: Callable[[Path], object]) -> None:
    """Write `path` whole or not at all: `write` fills a temporary file beside it (same
    suffix, so writers that go by it still can), which then replaces `path`; a failure
    removes it and is one line naming the file and the option."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"cannot write file ({e.strerror or e})", file=str(path),
                          field=option) from e
    finally:
        tmp.unlink(missing_ok=True)


def finite_positive(ctx: click.Context, param: click.Parameter, value: float | None) -> Any:
    """A click callback: a float option must be a finite number above 0 (click's FloatRange
    lets inf and nan through)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a finite number above 0")
    return value


def stderr_console() -> Console:
    """A console on stderr; off a terminal 160 columns wide, so logs do not wrap at 80."""
    console = Console(stderr=True)
    return console if console.is_terminal else Console(stderr=True, width=160)


class ProgressBar:
    """A progress bar with elapsed time and ETA on stderr, shown only when stderr is a
    terminal (pipes, logs, CI and CliRunner see nothing); it disappears when done.

        with ProgressBar("refitting", total=len(jobs)) as bar:
            for i, job in enumerate(jobs):
                bar.update(i, description=f"refitting {job}")
                ...
    """

    def __init__(
        self, description: str, total: int | None = None, *, console: Console | None = None
    ) -> None:
        self.console = console or Console(stderr=True)
        self.description = description
        self.total = total
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    @property
    def shown(self) -> bool:
        return self.progress is not None

    def __enter__(self) -> ProgressBar:
        if self.console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.description, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(
        self,
        completed: float | None = None,
        *,
        total: int | None = None,
        description: str | None = None,
        advance: float | None = None,
    ) -> None:
        """Set the steps done (or `advance` them), the total, or the description; drawn at
        once (steps are seconds apart, so a redraw each costs nothing)."""
        if self.progress is None or self.task is None:
            return
        self.progress.update(
            self.task,
            completed=completed,
            total=total,
            description=description,
            advance=advance,
            refresh=True,
        )
