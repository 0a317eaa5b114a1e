"""`capplan traffic from-trace`: a thin click shell over `fit_trace_report` and `to_yaml`.

The YAML goes to stdout (or --out); a short summary goes to stderr, so
`capplan traffic from-trace t.csv > mix.yaml` keeps the file clean. A CapplanError becomes
one red line and its exit code here too, so the group behaves the same run alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.table import Table

from capplan._cli import check_out, stderr_console, write_out
from capplan._cli import errors_as_lines as _errors_as_lines
from capplan.errors import ConfigError

YAML_SUFFIXES = (".yaml", ".yml")
"""What `--out` may end in: the fitted mix is YAML (with its provenance as comments)."""


@click.group()
def traffic() -> None:
    """Build a traffic YAML from what you already have (logs, traces, bench results, metrics)."""


@traffic.command("from-trace")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "csv", "parquet", "jsonl", "mooncake", "vllm-bench", "metrics"]),
    default="auto",
    show_default=True,
    help="input format; auto reads the suffix and the first record",
)
@click.option("--workload-column", default=None, help="column naming each request's workload")
@click.option("--pool", default="default", show_default=True, help="pool name in the mix")
@click.option("--model", default="llama-3.1-8b", show_default=True, help="model spec of the pool")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="write the YAML here")
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="tokens per hash_ids entry (default 512, the Mooncake traces')",
)
@click.option(
    "--second-scrape",
    type=click.Path(path_type=Path),
    default=None,
    help="metrics: a later scrape of the same server (gives the request rate)",
)
@click.option(
    "--interval-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="metrics: seconds between the two scrapes",
)
@click.option(
    "--rate-rps",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="metrics with one scrape: the request rate to assume",
)
@click.option(
    "--slo",
    "slos",
    multiple=True,
    metavar="KEY=SECONDS",
    help="an SLO for every fitted workload, e.g. --slo ttft_p99_s=0.5 --slo itl_p99_s=0.05",
)
@_errors_as_lines
def from_trace(
    trace: Path,
    fmt: str,
    workload_column: str | None,
    pool: str,
    model: str,
    out: Path | None,
    block_tokens: int | None,
    second_scrape: Path | None,
    interval_s: float | None,
    rate_rps: float | None,
    slos: tuple[str, ...],
) -> None:
    """Fit arrival rate, burstiness, lengths and prefix sharing from TRACE; print the YAML."""
    from capplan.tracefit import fit_trace_report, to_yaml

    check_out(out, "--out", YAML_SUFFIXES)  # before the fit, not after it
    slo: dict[str, float] = {}
    for item in slos:
        key, _, value = item.partition("=")
        try:
            slo[key.strip()] = float(value)
            if not math.isfinite(slo[key.strip()]):
                raise ValueError(value)
        except ValueError:
            raise ConfigError(
                f"expected KEY=SECONDS such as ttft_p99_s=0.5, got {item!r}", field="--slo"
            ) from None

    fit = fit_trace_report(
        trace,
        format=fmt,
        workload_column=workload_column,
        pool=pool,
        model=model,
        block_tokens=block_tokens,
        second_scrape=second_scrape,
        interval_s=interval_s,
        rate_rps=rate_rps,
        slo=slo or None,
    )
    text = to_yaml(fit)
    if out is None:
        click.echo(text, nl=False)
    else:
        write_out(out, "--out", lambda tmp: tmp.write_text(text))
    console = stderr_console()
    table = Table(title=f"fitted from {trace} ({fit.format})", title_justify="left")
    for col in ("workload", "requests", "arrival", "rate req/s", "gap CV", "mean in",
                "mean out", "prefix hit"):
        table.add_column(col, justify="left" if col in ("workload", "arrival") else "right")
    for w, spec in zip(fit.workloads, fit.mix.workloads, strict=True):
        table.add_row(
            w.name,
            f"{w.requests:,}",
            spec.arrival.kind,
            "-" if w.rate_rps is None else f"{w.rate_rps:.3g}",
            "-" if w.cv is None else f"{w.cv:.2f}",
            f"{w.mean_input_tokens:,.0f}",
            f"{w.mean_output_tokens:,.0f}",
            "-" if w.hit_rate is None else f"{w.hit_rate:.1%}",
        )
    console.print(table)
    for note in fit.notes:  # a workload left out, requests dropped: not in the file's header only
        console.print(f"note: {note}")
    if out is not None:
        console.print(f"wrote {out}; how each field was fitted is in its header comment")
