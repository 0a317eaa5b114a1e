"""The error tree: expected outcomes (bad input, no feasible plan) are not bugs.

The CLI prints a `CapplanError` as one red line and exits non-zero; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class CapplanError(Exception):
    """Base of every expected failure; its message is one line a user can act on."""

    exit_code = 1


class ConfigError(CapplanError):
    """Bad input: names the file, the field and the fix."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        where = ": ".join(p for p in (file, field) if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.field = field


class CalibrationCoverageError(CapplanError):
    """A step-time model was asked about a batch outside the box it was calibrated on."""

    exit_code = 3


class CalibrationError(CapplanError):
    """Calibration could not run (no GPU, no vLLM, out of memory, ...)."""

    exit_code = 4


class InfeasibleError(CapplanError):
    """No GPU count up to the cap meets the SLOs; the message says why."""

    exit_code = 5
