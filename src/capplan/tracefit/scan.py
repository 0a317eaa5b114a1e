"""Request logs as one lazy polars frame with canonical columns, never loaded whole.

Every reader returns `Requests`: a `LazyFrame` with `t_s` (Float64 seconds), `input_tokens`,
`output_tokens` (Int64), `workload` (String) and, when the file has them, `hash_ids`
(List[Int64], block hash ids, Mooncake-style), `prefix_hash` + `prefix_tokens`, or
`prefix_group` + `prefix_tokens` (as a replay file has them: capplan/sim/workload.py).
Only the columns named here are read; the frame is scanned lazily and collected by the
fitters with polars' streaming engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from capplan._yaml import utf8_problem_behind
from capplan.errors import ConfigError
from capplan.sim.workload import NO_PREFIX

__all__ = [
    "FORMATS",
    "MOONCAKE_BLOCK_TOKENS",
    "PrefixSource",
    "Requests",
    "detect_format",
    "json_lines_problem",
    "scan_requests",
]

FORMATS = ("auto", "csv", "parquet", "jsonl", "mooncake", "vllm-bench", "metrics")
"""Formats `fit_trace` reads; `auto` picks one from the suffix and the first line."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry in the Mooncake traces (FAST'25 release: 512-token blocks)."""

PrefixSource = Literal["hash_ids", "prefix_hash", "prefix_group"]
"""Which columns give a log's prompt structure, in order of precedence."""

# Canonical name -> accepted spellings, first one preferred (named in errors).
_ALIASES: dict[str, tuple[str, ...]] = {
    "timestamp": ("timestamp", "arrival_s", "arrival_time", "time"),
    "input_tokens": ("input_tokens", "input_length", "prompt_tokens", "input_len"),
    "output_tokens": ("output_tokens", "output_length", "completion_tokens", "output_len"),
}


@dataclass(frozen=True)
class Requests:
    """A lazily scanned request log in canonical columns."""

    frame: pl.LazyFrame
    file: str
    format: str
    prefix: PrefixSource | None  # the columns giving prompt structure, if any
    block_tokens: int
    workload_column: str | None
    default_workload: str
    timestamp_unit: str  # "s", "ms" or "datetime": how `t_s` was derived (for the header)


def workload_name(text: str) -> str:
    """A workload name the traffic schema accepts (letters, digits, `_.-`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")
    return name or "trace"


def detect_format(path: Path) -> str:
    """The format of `path` from its suffix and, for JSON files, its first record."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".prom", ".metrics", ".txt"):
        return "metrics"
    if suffix in (".jsonl", ".ndjson", ".json"):
        first = _first_line(path)
        try:
            rec = json.loads(first) if first else None
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            if "input_length" in rec and "hash_ids" in rec:
                return "mooncake"
            if "input_lens" in rec or "request_throughput" in rec:
                return "vllm-bench"
        if suffix == ".json":
            return "vllm-bench"
        return "jsonl"
    head = _first_line(path)
    if head.startswith("# HELP") or head.startswith("# TYPE") or head.startswith("vllm:"):
        return "metrics"
    raise ConfigError(
        f"cannot tell the format from suffix {suffix or '(none)'!r}; pass --format "
        f"({', '.join(FORMATS[1:])})",
        file=str(path),
        field="--format",
    )


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return f.readline(1 << 20).strip()
    except OSError as e:
        raise ConfigError(f"cannot read file ({e.strerror}); check the path", file=str(path)) from e


def _pick(names: list[str], canonical: str, file: str) -> str:
    for candidate in _ALIASES[canonical]:
        if candidate in names:
            return candidate
    if bad := utf8_problem_behind(names, Path(file)):
        raise ConfigError(bad, file=file)
    spellings = ", ".join(_ALIASES[canonical])
    raise ConfigError(
        f"column {canonical!r} missing (accepted names: {spellings}; found: "
        f"{', '.join(names) or 'none'}); rename the column or pass --format",
        file=file,
        field=canonical,
    )


def _seconds(col: str, dtype: pl.DataType, scale: float) -> tuple[pl.Expr, str]:
    """`t_s` from a numeric (seconds x scale), ISO-string or datetime column."""
    if dtype.is_numeric():
        return pl.col(col).cast(pl.Float64) * scale, "ms" if scale != 1.0 else "s"
    if dtype == pl.String:
        parsed = pl.col(col).str.to_datetime(time_unit="us", time_zone="UTC")
        return parsed.dt.epoch("us").cast(pl.Float64) / 1e6, "datetime"
    if isinstance(dtype, pl.Datetime | pl.Date):
        return pl.col(col).dt.epoch("us").cast(pl.Float64) / 1e6, "datetime"
    raise ConfigError(
        f"timestamps of type {dtype} are not supported; give seconds or ISO datetimes",
        field=col,
    )


EPOCH_UNITS = ((1e17, 1e9, "ns"), (1e14, 1e6, "us"), (1e11, 1e3, "ms"))
"""Numeric timestamps from this value up are epoch times in a finer unit than seconds: 1e11
seconds after 1970 is the year 5138, and 1e11 ms is March 1973 (as 1e14 us and 1e17 ns are)."""


def _epoch_by_magnitude(lf: pl.LazyFrame, col: str, t_expr: pl.Expr,
                        unit: str) -> tuple[pl.Expr, str]:
    """Seconds from epoch milliseconds, microseconds or nanoseconds, told by their size (a
    log's `time.time_ns()` or JavaScript `Date.now()`), which read as seconds gave a rate
    1000 times too low."""
    try:
        first = lf.select(pl.col(col).cast(pl.Float64).min()).collect(engine="streaming").item()
    except pl.exceptions.PolarsError:
        return t_expr, unit  # unreadable: the full read says where, and how to fix it
    for floor, per_s, name in EPOCH_UNITS:
        if first is not None and first >= floor:
            return pl.col(col).cast(pl.Float64) / per_s, f"epoch {name} (by their size)"
    return t_expr, unit


def _scan(path: Path, fmt: str) -> pl.LazyFrame:
    if fmt == "csv":
        return pl.scan_csv(path)
    if fmt == "parquet":
        return pl.scan_parquet(path)
    return pl.scan_ndjson(path, infer_schema_length=1000)


def scan_requests(
    path: str | Path, fmt: str = "auto", *, workload_column: str | None = None
) -> Requests:
    """Open a request log (csv, parquet, jsonl or the Mooncake trace) as canonical columns."""
    p = Path(path)
    file = str(p)
    if not p.is_file():
        raise ConfigError("trace file not found; check the path", file=file)
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt not in ("csv", "parquet", "jsonl", "mooncake"):
        raise ConfigError(f"{fmt!r} is not a request-log format", file=file, field="--format")
    lf = _scan(p, fmt)
    try:
        schema = lf.collect_schema()
    except pl.exceptions.PolarsError as e:
        why = (json_lines_problem(p) if fmt in ("jsonl", "mooncake") else None) or _first(e)
        raise ConfigError(f"cannot read {fmt} file: {why}", file=file) from e
    names = schema.names()
    ts = _pick(names, "timestamp", file)
    inp = _pick(names, "input_tokens", file)
    out = _pick(names, "output_tokens", file)
    scale = 1e-3 if fmt == "mooncake" else 1.0
    try:
        t_expr, unit = _seconds(ts, schema[ts], scale)
    except ConfigError as e:
        raise ConfigError(str(e), file=file, field=ts) from e
    if schema[ts] == pl.String:
        _check_datetimes(lf, ts, file)
    elif schema[ts].is_numeric() and fmt != "mooncake":
        t_expr, unit = _epoch_by_magnitude(lf, ts, t_expr, unit)
    if workload_column is None and "workload" in names:
        workload_column = "workload"
    if workload_column is not None and workload_column not in names:
        raise ConfigError(
            f"workload column {workload_column!r} missing (found: {', '.join(names)}); "
            "fix --workload-column",
            file=file,
            field=workload_column,
        )
    default = workload_name(p.stem)
    wl = (
        pl.col(workload_column).cast(pl.String).fill_null("unlabelled")
        if workload_column
        else pl.lit(default)
    )
    exprs = [
        t_expr.alias("t_s"),
        pl.col(inp).cast(pl.Int64).alias("input_tokens"),
        pl.col(out).cast(pl.Int64).alias("output_tokens"),
        wl.alias("workload"),
    ]
    prefix: PrefixSource | None = None
    if "hash_ids" in names:
        if not isinstance(schema["hash_ids"], pl.List):
            raise ConfigError(
                f"hash_ids must be a list of integers, found {schema['hash_ids']}",
                file=file,
                field="hash_ids",
            )
        exprs.append(pl.col("hash_ids").cast(pl.List(pl.Int64)))
        prefix = "hash_ids"
    elif "prefix_hash" in names or "prefix_group" in names:
        key: PrefixSource = "prefix_hash" if "prefix_hash" in names else "prefix_group"
        if "prefix_tokens" not in names:
            raise ConfigError(
                f"column 'prefix_tokens' missing: {key} needs the length of the shared "
                f"prompt head it names; add prefix_tokens or drop {key}",
                file=file,
                field="prefix_tokens",
            )
        if key == "prefix_hash":
            exprs.append(pl.col("prefix_hash").cast(pl.String))
        else:  # as the replay reader fills them: no group, nothing shared
            exprs.append(pl.col("prefix_group").cast(pl.Int64).fill_null(NO_PREFIX))
        exprs.append(pl.col("prefix_tokens").cast(pl.Int64).fill_null(0))
        prefix = key
    elif "prefix_tokens" in names:
        raise ConfigError(
            "column 'prefix_group' missing: prefix_tokens needs the shared-prefix group each "
            "prompt belongs to (prefix_group, or prefix_hash); add it or drop prefix_tokens",
            file=file,
            field="prefix_group",
        )
    return Requests(
        frame=lf.select(exprs),
        file=file,
        format=fmt,
        prefix=prefix,
        block_tokens=MOONCAKE_BLOCK_TOKENS,
        workload_column=workload_column,
        default_workload=default,
        timestamp_unit=unit,
    )


def _check_datetimes(lf: pl.LazyFrame, col: str, file: str) -> None:
    """Text timestamps must be ISO datetimes: polars infers their format from the first one
    and, when it cannot, names neither the column nor the value. A column of seconds with
    one non-number in it (nan, a dash) is read as text: that row is named."""
    rows = lf.select(pl.col(col)).with_row_index("row").drop_nulls(col)
    try:
        first = rows.head(1).collect()
        if first.height == 0:
            return
        row, value = first.row(0)
        parsed = pl.Series([value]).str.to_datetime(time_unit="us", time_zone="UTC",
                                                    strict=False)
        if not parsed.null_count():
            return
        seconds = pl.col(col).cast(pl.Float64, strict=False)
        bad = rows.filter(seconds.is_null() | ~seconds.is_finite()).head(1).collect()
    except pl.exceptions.PolarsError:
        return  # the fit's passes report it
    if bad.height:  # seconds, but for this row (the first value was a number)
        row, value = bad.row(0)
    raise ConfigError(
        f"row {row + 1} has {value!r}, neither seconds nor an ISO datetime such as "
        "2024-05-01T12:00:00Z; fix or drop the row",
        file=file,
        field=col,
    )


def json_lines_problem(path: Path) -> str | None:
    """What is wrong with the first line of a JSON-lines file that is not one JSON object,
    naming the line (polars names only a character within it); None if every line is one.
    For error paths: it reads the file in Python."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line.rstrip())
                except json.JSONDecodeError as e:
                    return (f"line {n} is not JSON ({e.msg} at column {e.colno}); fix the "
                            "line, or pass --format if the file is not JSON lines")
                if not isinstance(rec, dict):
                    return f"line {n} is not a JSON object; each line must be one"
    except OSError:
        return None
    return None


def _first(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
