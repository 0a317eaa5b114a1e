"""`fit_trace`: a traffic mix from a request log, in a few streaming passes over the file.

Passes (each collected with polars' streaming engine, reading only the needed columns):
1. per workload: request count, first/last arrival, empty and non-positive values;
2. the histogram of input and of output lengths (`value -> count`);
3. requests per clock hour, then gap statistics inside each workload's peak hour;
4. when the log has block hash ids, a prefix hash or prefix groups: the leading tokens each
   request shares with earlier ones.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from capplan._yaml import utf8_problem_behind
from capplan.errors import ConfigError
from capplan.tracefit.arrivals import Span, fit_arrivals
from capplan.tracefit.lengths import LengthFit, fit_lengths
from capplan.tracefit.prefix import PrefixFit, fit_prefix
from capplan.tracefit.result import SloLike, TraceFit, WorkloadFit, build_mix
from capplan.tracefit.scan import Requests, json_lines_problem, scan_requests, workload_name

__all__ = ["fit_requests"]

_COLUMNS = ("t_s", "input_tokens", "output_tokens")
_SOURCE_NAME = {
    "t_s": "timestamp",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
}


def _collect(lf: pl.LazyFrame, file: str) -> pl.DataFrame:
    """Collect with the streaming engine; a value polars cannot parse is the user's error."""
    try:
        return lf.collect(engine="streaming")
    except pl.exceptions.PolarsError as e:
        if bad := utf8_problem_behind(e, Path(file)):
            raise ConfigError(bad, file=file) from e
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        m = re.search(r"column '([^']+)'", str(e))
        raise ConfigError(
            f"cannot parse the trace ({text}); timestamps must be seconds or ISO datetimes "
            "and token counts integers",
            file=file,
            field=m[1] if m else None,
        ) from e


def _check(req: Requests) -> tuple[dict[str, Span], int, bool, list[str]]:
    """Pass 1: spans per workload; empty values and zero-token prompts are errors, and
    requests that produced no output (failed or aborted) are dropped and counted. Also
    whether each workload's rows are in arrival order (then nothing needs sorting), and
    the workloads left out for having fewer than two distinct arrival times."""
    c = pl.col
    basic = _collect(
        req.frame.group_by("workload").agg(
            pl.len().alias("rows"),
            *(c(k).null_count().alias(f"null_{k}") for k in _COLUMNS),
            (c("input_tokens") < 1).sum().alias("bad_input"),
            (c("output_tokens") < 1).sum().alias("no_output"),
            c("t_s").filter(c("output_tokens") >= 1).min().alias("t0"),
            c("t_s").filter(c("output_tokens") >= 1).max().alias("t1"),
            (c("output_tokens") >= 1).sum().alias("n"),
            (c("t_s").diff() < 0).sum().alias("unordered"),
        ),
        req.file,
    ).sort("workload")
    if basic.height == 0 or int(basic.get_column("rows").sum()) == 0:
        raise ConfigError("the trace has no rows", file=req.file)
    for k in _COLUMNS:
        nulls = int(basic.get_column(f"null_{k}").sum())
        if nulls:
            raise ConfigError(
                f"{nulls} row(s) have no {_SOURCE_NAME[k]} value; fill or drop them",
                file=req.file,
                field=_SOURCE_NAME[k],
            )
    bad = int(basic.get_column("bad_input").sum())
    if bad:
        raise ConfigError(
            f"{bad} row(s) have input_tokens < 1; every prompt has at least one token",
            file=req.file,
            field="input_tokens",
        )
    spans: dict[str, Span] = {}
    sparse: list[str] = []
    for row in basic.iter_rows(named=True):
        if row["n"] < 2 or row["t1"] <= row["t0"]:
            sparse.append(row["workload"])
        else:
            spans[row["workload"]] = Span(float(row["t0"]), float(row["t1"]), int(row["n"]))
    if not spans:
        raise ConfigError(
            "no workload has two completed requests at distinct times; a rate needs them",
            file=req.file,
            field="timestamp",
        )
    in_order = int(basic.get_column("unordered").sum()) == 0
    return spans, int(basic.get_column("no_output").sum()), in_order, sparse


def _lengths(frame: pl.LazyFrame, column: str, file: str) -> dict[str, LengthFit]:
    """Pass 2: the exact histogram of one length column per workload, then the fits."""
    hist = _collect(frame.group_by("workload", column).agg(pl.len().alias("n")), file)
    out = {}
    for (w,), rows in hist.group_by("workload"):
        out[str(w)] = fit_lengths(rows.get_column(column).to_numpy(), rows["n"].to_numpy())
    return out


def fit_requests(
    path: str | Path,
    fmt: str = "auto",
    *,
    workload_column: str | None = None,
    pool: str = "default",
    model: str = "llama-3.1-8b",
    slo: SloLike = None,
    block_tokens: int | None = None,
) -> TraceFit:
    """Fit a traffic mix from a request log (csv, parquet, jsonl, Mooncake)."""
    req = scan_requests(path, fmt, workload_column=workload_column)
    with tempfile.TemporaryDirectory(prefix="capplan-trace-") as tmp:
        if req.format in ("jsonl", "mooncake"):
            req = _staged(req, Path(tmp) / "requests.parquet")
        return _fit(req, pool=pool, model=model, slo=slo, block_tokens=block_tokens)


def _staged(req: Requests, path: Path) -> Requests:
    """JSON is slow to parse and every pass would parse it again: stream the canonical
    columns once into a Parquet file and scan that instead."""
    try:
        req.frame.sink_parquet(path)
    except pl.exceptions.PolarsError as e:
        _collect(req.frame.head(0), req.file)  # a parse error, named as such
        why = json_lines_problem(Path(req.file)) or str(e)
        raise ConfigError(f"cannot read the trace ({why})", file=req.file) from e
    return dataclasses.replace(req, frame=pl.scan_parquet(path))


def _fit(
    req: Requests, *, pool: str, model: str, slo: SloLike, block_tokens: int | None
) -> TraceFit:
    spans, dropped, in_order, sparse = _check(req)
    frame = req.frame.filter(pl.col("output_tokens") >= 1)
    if sparse:
        frame = frame.filter(~pl.col("workload").is_in(sparse))
    inputs = _lengths(frame, "input_tokens", req.file)
    outputs = _lengths(frame, "output_tokens", req.file)
    try:
        arrivals = fit_arrivals(frame.select("workload", "t_s"), spans)
    except pl.exceptions.PolarsError as e:
        raise ConfigError(f"cannot fit arrivals ({e})", file=req.file, field="timestamp") from e
    block = block_tokens or req.block_tokens
    prefixes: dict[str, PrefixFit] = {}
    if req.prefix is not None:
        prefixes = fit_prefix(
            frame, source=req.prefix, block_tokens=block, in_order=in_order, file=req.file
        )

    names = {w: workload_name(w) for w in spans}
    fits: list[WorkloadFit] = []
    specs: list[dict[str, Any]] = []
    for w in spans:
        arr, inp, out, pre = arrivals[w], inputs[w], outputs[w], prefixes.get(w)
        notes = [
            f"arrival: {arr.how}",
            f"input_tokens: {inp.how}; mean {inp.mean:.0f}, p50 {inp.p50}, p99 {inp.p99}, "
            f"p99.9 {inp.p999}, max {inp.max}",
            f"output_tokens: {out.how}; mean {out.mean:.0f}, p50 {out.p50}, p99 {out.p99}, "
            f"p99.9 {out.p999}, max {out.max}",
        ]
        prefix = None
        if pre is not None:
            prefix, why = pre.below(inp.dist.max)
            notes.append(f"prefix: {pre.how}" + (f"; {why}" if why else ""))
        spec: dict[str, Any] = {
            "name": names[w],
            "arrival": arr.arrival,
            "input_tokens": inp.dist,
            "output_tokens": out.dist,
        }
        if prefix is not None:
            spec["prefix"] = prefix
        specs.append(spec)
        fits.append(
            WorkloadFit(
                name=names[w],
                requests=spans[w].requests,
                rate_rps=arr.rate_rps,
                cv=arr.cv,
                mean_input_tokens=inp.mean,
                mean_output_tokens=out.mean,
                hit_rate=pre.hit_rate if pre else None,
                notes=tuple(notes),
            )
        )
    general = []
    if sparse:
        general.append(
            f"left out workload(s) {', '.join(sparse)}: fewer than two distinct arrival times"
        )
    if dropped:
        general.append(f"dropped {dropped} request(s) with no output tokens (failed or aborted)")
    if req.workload_column:
        general.append(f"workloads from column {req.workload_column!r}")
    general.append(f"timestamps read as {req.timestamp_unit}")
    stem = workload_name(Path(req.file).stem)
    mix = build_mix(
        stem,
        f"fitted from {Path(req.file).name} by capplan traffic from-trace",
        specs,
        pool=pool,
        model=model,
        slo=slo,
        source=req.file,
    )
    return TraceFit(mix, req.file, req.format, tuple(fits), tuple(general))
