"""What every capplan command shares: an expected failure becomes one red line and its exit
code, never a traceback (the commands also run standalone, outside the `capplan` group);
a long command shows a progress bar on a terminal and stays quiet in pipes and logs."""

from __future__ import annotations

import functools
from collections.abc import Callable
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

from capplan.errors import CapplanError

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
