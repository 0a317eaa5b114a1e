"""`capplan report`: a plan JSON (from `capplan size --out`) as one self-contained HTML page."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from capplan._cli import check_out, errors_as_lines, one_line, write_out
from capplan.errors import ConfigError
from capplan.mix import TrafficMix
from capplan.solve.plan import Plan

REPORT_SUFFIXES = (".html", ".htm")
"""What `--out` may end in: the report is one HTML page."""


def _read_sweep(path: Path) -> list[dict[str, object]]:
    import polars as pl

    try:
        df = pl.read_csv(path)
    except (OSError, pl.exceptions.PolarsError) as e:
        raise ConfigError(f"cannot read sweep CSV ({one_line(str(e))})", file=str(path),
                          field="--sweep") from e
    missing = {"growth", "pool", "gpus"} - set(df.columns)
    if missing:
        raise ConfigError(f"sweep CSV lacks column(s) {', '.join(sorted(missing))} (write it "
                          "with `capplan sweep --out`)", file=str(path), field="--sweep")
    return df.select("growth", "pool", "gpus").to_dicts()


def _build(plan_path: Path, traffic: Path | None, out: Path, quick: bool,
           sweep: Path | None, workers: int | None) -> tuple[int, float]:
    from capplan.deploy.cli import load_plan
    from capplan.mix import load_mix
    from capplan.solve.choose import check_plan_mix

    t0 = time.perf_counter()
    check_out(out, "--out", REPORT_SUFFIXES)  # before minutes of simulation, not after
    plan = load_plan(plan_path)
    if traffic is None and Path(plan.source).is_file():
        traffic = Path(plan.source)
    mix = load_mix(traffic) if traffic is not None else None
    if mix is None:
        click.echo(f"note: the plan's traffic mix {plan.source} is not here (paths are "
                   "relative to where `capplan size` ran), so the page holds the plan's tables "
                   "only; give --traffic for its latency and load figures", err=True)
    else:
        check_plan_mix(plan, mix)
        if plan.guard != "none":
            from capplan.solve.guard import guarded

            mix, _ = guarded(mix, plan.guard)  # the limits the plan was sized against
    size = write_report(plan, mix, out, quick=quick,
                        sweep=_read_sweep(sweep) if sweep is not None else None, workers=workers)
    return size, time.perf_counter() - t0


def write_report(plan: Plan, mix: TrafficMix | None, out: Path, *, quick: bool = False,
                 sweep: list[dict[str, object]] | None = None,
                 workers: int | None = None, option: str = "--out") -> int:
    """Render the plan's report into `out` (whole or not at all; a failure names `option`);
    returns its size in bytes."""
    from capplan.report.render import render_report
    from capplan.report.runs import (
        DURATION_S,
        LOAD_SCALES,
        QUICK_DURATION_S,
        QUICK_LOAD_SCALES,
    )

    page = render_report(
        plan, mix,
        duration_s=QUICK_DURATION_S if quick else DURATION_S,
        scales=QUICK_LOAD_SCALES if quick else LOAD_SCALES,
        sweep=sweep,
        workers=workers if workers is not None else (os.cpu_count() or 1),
    )
    write_out(out, option, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return len(page.encode())


@click.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path))
@click.option("--traffic", type=click.Path(path_type=Path), default=None,
              help="the traffic mix YAML the plan was sized for (default: the plan's source, "
                   "if that file exists); without one the report holds tables only")
@click.option("--out", type=click.Path(path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write")
@click.option("--quick", is_flag=True, help="shorter re-simulations at fewer loads (rougher)")
@click.option("--sweep", type=click.Path(path_type=Path), default=None,
              help="CSV from `capplan sweep --out`: simulated points on the growth curve")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="processes for the re-simulations (default: the CPU count)")
@errors_as_lines
def report(plan_path: Path, traffic: Path | None, out: Path, quick: bool, sweep: Path | None,
           workers: int | None) -> None:
    """One self-contained HTML report of a plan: tables, latency CDFs against the SLOs, SLO
    margin versus load, GPUs versus growth, KV and prefix caching, configuration chosen."""
    size, elapsed = _build(plan_path, traffic, out, quick, sweep, workers)
    click.echo(f"wrote {out} ({size / 1e6:.1f} MB) in {elapsed:.1f} s")
