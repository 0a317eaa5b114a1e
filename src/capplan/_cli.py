"""What every capplan command shares: an expected failure becomes one red line and its exit
code, never a traceback (the commands also run standalone, outside the `capplan` group)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

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
