"""The recorded requests a replay workload names (`arrival: {kind: replay, path: ...}`): the
file read and checked once, as part of reading the traffic input, so that a bad row is an
error naming the file, the column and the row before anything is simulated.

A CSV or JSON-lines file with columns `arrival_s, input_tokens, output_tokens` and,
together, `prefix_group, prefix_tokens` (docs/reference.md). The simulator replays it
(sim/workload.py); the traffic file's cross-checks (mix.py `check_lengths`) hold each request
to its pool's `max_model_len`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from capplan._yaml import utf8_problem_behind
from capplan.errors import ConfigError
from capplan.traffic import ReplayArrival, Workload

if TYPE_CHECKING:
    import polars as pl

NO_PREFIX = -1
"""`prefix_group` of a request that shares no prefix with any other."""
_REQUIRED = ("arrival_s", "input_tokens", "output_tokens")
_OPTIONAL = ("prefix_group", "prefix_tokens")
_COLUMNS_HELP = (
    "a replay file needs columns arrival_s, input_tokens, output_tokens "
    "(optional: prefix_group, prefix_tokens)"
)


@dataclass(frozen=True, slots=True)
class ReplayTrace:
    arrival_s: np.ndarray  # sorted, in trace time (before time_scale)
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_tokens: np.ndarray
    has_prefix: bool  # the file recorded prompt structure (prefix columns present)
    file: str
    row: np.ndarray  # each request's row in the file (1-based), for errors that name it


def _resolve(workload: Workload, base_dir: Path | None) -> Path:
    assert isinstance(workload.arrival, ReplayArrival)
    path = workload.arrival.path
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


def read_trace(workload: Workload, base_dir: Path | None) -> ReplayTrace:
    """Read and check a replay file, scanning lazily and only the columns needed."""
    path = _resolve(workload, base_dir)
    file = str(path)
    field = f"{workload.name}.arrival.path"
    if not path.is_file():
        where = f" (relative paths resolve against {base_dir})" if base_dir else ""
        raise ConfigError(f"replay file not found{where}; fix arrival.path", file=file, field=field)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise ConfigError(
            f"replay file must end in .csv, .jsonl or .ndjson, not {suffix or '(none)'!r}",
            file=file,
            field=field,
        )

    import polars as pl  # only replayed traces need it

    def scan(overrides: Mapping[str, type[pl.DataType]] | None) -> pl.LazyFrame:
        if suffix == ".csv":
            return pl.scan_csv(path, schema_overrides=overrides)
        return pl.scan_ndjson(path, schema_overrides=overrides)

    try:
        names = scan(None).collect_schema().names()
    except pl.exceptions.PolarsError as e:
        raise ConfigError(utf8_problem_behind(e, path)
                          or f"cannot read replay file: {_first_line(e)}", file=file) from e
    for col in _REQUIRED:
        if col not in names:
            if bad := utf8_problem_behind(names, path):
                raise ConfigError(bad, file=file)
            raise ConfigError(f"column missing; {_COLUMNS_HELP}", file=file, field=col)
    present = [c for c in _OPTIONAL if c in names]
    if len(present) == 1:
        other = next(c for c in _OPTIONAL if c not in present)
        raise ConfigError(
            f"column missing; give prefix_group and prefix_tokens together "
            f"(found only {present[0]})",
            file=file,
            field=other,
        )
    cols = [*_REQUIRED, *present]
    # Float64 everywhere so "12.0" parses; integrality is checked below.
    overrides = dict.fromkeys(cols, pl.Float64)
    try:
        df = scan(overrides).select(cols).collect()
    except pl.exceptions.PolarsError as e:
        if bad := utf8_problem_behind(e, path):
            raise ConfigError(bad, file=file) from e
        m = re.search(r"column '([^']+)'", str(e))
        raise ConfigError(
            f"not a number: {_first_line(e)}; every value must be numeric",
            file=file,
            field=m[1] if m else None,
        ) from e
    if df.height == 0:
        raise ConfigError("replay file has no rows", file=file, field=field)

    def column(
        name: str, *, integer: bool, minimum: float, nullable: bool = False, fill: float = 0.0
    ) -> np.ndarray:
        s = df.get_column(name)
        if s.null_count() and not nullable:
            row = int(s.is_null().arg_max() or 0)
            raise ConfigError(f"empty value at row {row + 1}; fill it in", file=file, field=name)
        x = s.fill_null(fill).to_numpy().astype(np.float64)
        bad = ~np.isfinite(x) | (x < minimum)
        if integer:
            bad |= x != np.floor(x)
        if bad.any():
            row = int(np.argmax(bad))
            kind = "an integer" if integer else "a number"
            raise ConfigError(
                f"row {row + 1} has {float(x[row]):g}; values must be {kind} >= {minimum:g}",
                file=file,
                field=name,
            )
        return x.astype(np.int64) if integer else x

    arrival = column("arrival_s", integer=False, minimum=0.0)
    input_tokens = column("input_tokens", integer=True, minimum=1)
    output_tokens = column("output_tokens", integer=True, minimum=1)
    if present:
        group = column(
            "prefix_group", integer=True, minimum=NO_PREFIX, nullable=True, fill=NO_PREFIX
        )
        prefix = column("prefix_tokens", integer=True, minimum=0, nullable=True)
        over = prefix > input_tokens
        if over.any():
            row = int(np.argmax(over))
            raise ConfigError(
                f"row {row + 1} shares {prefix[row]} tokens of a {input_tokens[row]}-token "
                "prompt; prefix_tokens must be <= input_tokens",
                file=file,
                field="prefix_tokens",
            )
        loose = (prefix > 0) & (group == NO_PREFIX)
        if loose.any():
            row = int(np.argmax(loose))
            raise ConfigError(
                f"row {row + 1} has prefix_tokens but no prefix_group; give the group "
                "(>= 0) or set prefix_tokens to 0",
                file=file,
                field="prefix_group",
            )
        # A repeated whole prompt still recomputes its last token (kv_cache_manager.py).
        prefix = np.minimum(prefix, input_tokens - 1)
        group[prefix == 0] = NO_PREFIX
    else:
        group = np.full(len(arrival), NO_PREFIX, dtype=np.int64)
        prefix = np.zeros(len(arrival), dtype=np.int64)
    order = np.argsort(arrival, kind="stable")
    return ReplayTrace(
        arrival[order],
        input_tokens[order],
        output_tokens[order],
        group[order],
        prefix[order],
        bool(present),
        file,
        order + 1,
    )


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
