"""`capplan size` and `capplan sweep`: thin click shells over `size_mix`.

Each command turns a CapplanError into one red line and its exit code itself, so it behaves
the same run alone (tests, CliRunner) as under the `capplan` group.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import click
from rich.console import Console
from rich.table import Table

from capplan._cli import ProgressBar, check_out, finite_positive, write_out
from capplan._cli import errors_as_lines as _errors_as_lines
from capplan._cli import one_line as _one_line
from capplan.errors import ConfigError, InfeasibleError
from capplan.pool import PoolHost
from capplan.traffic import slo_allowed_share, slo_percentile
from capplan.units import duration

if TYPE_CHECKING:
    from capplan.mix import TrafficMix
    from capplan.solve.plan import Plan, PoolPlan, SloLine

RUNNERS_UP_SHOWN = 8
"""Runners-up printed per pool; the plan's JSON and the report hold all of them."""


def _console() -> Console:
    console = Console()
    # pipes and logs: tables fit 160 columns, lines are never broken (grep finds them whole)
    return console if console.is_terminal else Console(width=160, soft_wrap=True)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _share(v: float) -> str:
    return f"{v * 100:.2g} %"


def _load(traffic: Path, guard: str | None, host: str | None = None
          ) -> tuple[TrafficMix, list[str]]:
    """The mix, every pool on `host` where given (Pool.host), its SLOs tightened by `guard`
    (solve/guard.py) with a line per target. Called before any worker starts, so that bad
    input is one line."""
    from capplan.mix import load_mix

    mix = load_mix(traffic)
    if host is not None:
        mix = mix.on_host(host)
    if guard is None:
        return mix, []
    from capplan.solve.guard import guarded

    return guarded(mix, guard)  # type: ignore[arg-type]


def _start_workers(workers: int | None) -> int:
    """The worker count (--workers, $CAPPLAN_WORKERS, else the CPUs); with more than one, the
    workers start now, so that their fork server imports the simulator while this process
    does (jobs.py imports without it)."""
    from capplan.solve import jobs

    n = jobs.cli_workers(workers)
    if n > 1:
        jobs.warm(n)
    return n


def print_plan(plan: Plan, console: Console, elapsed_s: float | None = None) -> None:
    """The plan as a person reads it: one row per pool, then each pool's SLO lines."""
    title = f"plan for {plan.mix}: {plan.gpus} GPU(s), ${plan.usd_per_month:,.0f}/month"
    if plan.growth != 1 or plan.spare:
        title += f" (growth ×{plan.growth:g}, N+{plan.spare})"
    if plan.infeasible:
        title += (f"; {len(plan.infeasible)} pool(s) infeasible: "
                  + ", ".join(x.pool for x in plan.infeasible))
    table = Table(title=title, title_justify="left")
    for col in ("pool", "GPUs", "replicas", "precision", "binding workload / SLO", "margin",
                "engine busy", "$/month"):
        table.add_column(col, justify="left" if col in ("pool", "precision") or "/" in col
                         else "right")
    for p in plan.pools:
        reps = f"{p.replicas}" + (f" ({p.replicas_for_slo}+{p.spare})" if p.spare else "")
        table.add_row(
            p.pool, f"{p.gpus} {p.gpu}", reps, p.precision,
            f"{p.binding_workload} / {p.binding_slo}",
            _pct(p.binding_margin), _pct(p.utilisation), f"{p.cost.usd_per_month:,.0f}",
        )
    for x in plan.infeasible:
        table.add_row(x.pool, "–", "–", x.precision, "[bold red]infeasible[/] (why below)",
                      "–", "–", "–")
    console.print(table)
    if plan.guard != "none":
        n = sum(" -> " in line for line in plan.guarded)
        console.print(f"guard {plan.guard}: SLOs tightened by the simulator's validated "
                      f"error ({n} of {len(plan.guarded)}; the targets below are these)",
                      highlight=False)
        for line in plan.guarded:
            console.print(f"  {line}", highlight=False)
    for p in plan.pools:
        _print_pool(p, console, quick=plan.quick)
    for x in plan.infeasible:
        console.print(f"\n[bold]pool {x.pool}[/] ({x.model} on {x.gpu}, {x.precision})")
        console.print(f"  [bold red]infeasible[/]: {x.reason}", highlight=False)
    if elapsed_s is not None:
        console.print(f"sized in {elapsed_s:.1f} s")


def _past(line: SloLine, requests: int) -> str:
    """How much of the share the SLO lets past its limit is used: ' · 0.82 % past (1 %)'.
    A percentile met with more than its share past the limit is a short run's: the p99 of
    86 requests ranks below the largest (sim/metrics.py `percentile`, numpy's convention), so
    one request past is 1.2 %; the line says so rather than look self-contradictory."""
    if not line.beyond or line.allowed is None:
        return ""
    text = f" · {_share(line.beyond)} past ({_share(line.allowed)}"
    if line.met and line.beyond > line.allowed:
        if line.key.startswith(("ttft_", "e2e_")):  # one observation per request
            k = round(line.beyond * requests)
            text += (f"; {k} of {requests} request{'s' if requests != 1 else ''}: too few for "
                     f"the p{slo_percentile(line.key):g} to rank among them")
        else:
            text += "; to the histogram's resolution"
    return text + ")"


def _print_pool(p: PoolPlan, console: Console, *, quick: bool = False) -> None:
    routing = f", {p.router.replace('_', '-')} routing" if p.replicas > 1 else ""
    console.print(f"\n[bold]pool {p.pool}[/] ({p.model} on {p.gpu}, TP={p.tp}, {p.label}"
                  f"{routing})")
    binding = (p.binding_workload, p.binding_slo)
    for w in p.workloads:
        for line in w.slo:
            mark = "[green]✓[/]" if line.met else "[red]✗[/]"
            bind = "  ← binding" if (w.name, line.key) == binding else ""
            console.print(
                f"  {mark} {w.name:<16} {line.key:<11} {duration(line.value_s):>11} ≤ "
                f"{duration(line.limit_s):<9} margin {_pct(line.margin)}"
                f"{_past(line, w.requests)}{bind}",
                highlight=False,
            )
    if p.profile_source == "analytic":
        console.print(
            f"  [bold yellow]profile {p.profile}: ANALYTIC (datasheet roofline, not measured) — "
            "calibrate for measured step times[/]"
        )
    else:
        console.print(f"  profile {p.profile}: {p.profile_source}")
    c = p.confidence
    console.print(
        f"  prefix hit {_pct(p.prefix_hit_rate)} · KV headroom {_pct(p.kv_headroom)} · "
        f"{p.cost.gpu_hours_per_month:,.0f} GPU-h/month · "
        + (f"{p.cost.tokens_per_usd:,.0f} tokens/$" if p.cost.tokens_per_usd else "free")
    )
    fewer = {True: "one fewer fails", False: "one fewer passes too", None: "at the minimum"}
    stopped = ("" if c.one_fewer_stopped_at_s is None
               else f" (certain at {c.one_fewer_stopped_at_s:g} s, stopped there)")
    console.print(
        f"  confidence: seeds {c.seeds} {'all pass' if c.all_seeds_pass else 'NOT all pass'}, "
        f"worst margin {_pct(c.worst_margin)}, {c.duration_s:g} s simulated, "
        f"{fewer[c.one_fewer_fails]}{stopped}; analytic floor {p.bracket.lower} replica(s)"
    )
    if (tail := c.thin_tail(quick)) is not None:
        console.print(f"  tail: {tail}")
    f = p.fidelity
    if f is not None:
        spread = (f"predicted {f.p10:+.0%} to {f.p90:+.0%} of vLLM's (too few rows for a "
                  "spread: their range)" if f.few else
                  f"predicted {f.p10:+.0%} to {f.p90:+.0%} of vLLM's (p10-p90), worst "
                  f"{f.worst_under:+.0%}")
        console.print(
            f"  fidelity: {f.metric} on {f.rows} validation row{'s' * (f.rows != 1)} of this "
            f"profile: {spread}"
            + ("" if f.within_noise is None else
               f"; {f.within_noise} of the {f.rows} predictions inside the measurement's own "
               "noise"),
            highlight=False)
        worst = f.margin_after_worst
        style = "yellow" if worst is not None and worst < 0 else "default"
        could = (f"{_pct(worst)} (the worst of them)" if f.few else
                 f"{_pct(f.margin_after_p10)} (p10) or {_pct(worst)} (worst)")
        console.print(f"    [{style}]so margin {_pct(p.binding_margin)} could be {could}[/]",
                      highlight=False)
        if f.share_rows is not None and f.share_p90 is not None and f.share_max is not None:
            allowed = slo_allowed_share(f.metric)
            past = ""
            if f.beyond_after_p10 and f.beyond_after_worst and allowed is not None:
                over = f.beyond_after_worst > allowed
                past = (f": {'[yellow]' if over else ''}{_share(f.beyond_after_p10)} (p10) or "
                        f"{_share(f.beyond_after_worst)} (worst) past it, of the "
                        f"{_share(allowed)} allowed{'[/]' if over else ''}")
            console.print(
                f"    the engine's share past the limit ran {f.share_p90:.2f}x (p10) to "
                f"{f.share_max:.2f}x (worst) the prediction's on the {f.share_rows} rows near "
                f"it{past}", highlight=False)
        if f.unseen_rows and f.unseen_max is not None:
            console.print(
                f"    and on {f.unseen_rows} row{'s' * (f.unseen_rows != 1)} where the prediction "
                f"put almost nothing past the limit the engine put up to "
                f"{_share(f.unseen_max)} more past it", highlight=False)
    if p.extrapolated_steps:
        console.print(f"  [bold red]{p.extrapolated_steps:,} steps outside the calibrated box[/]")
    if p.reasoning:
        console.print(f"  chosen: {_one_line(p.reasoning)}", highlight=False)
    shown = p.runners_up[:RUNNERS_UP_SHOWN]
    for r in shown:
        gpus = "—"
        if r.gpus is not None:
            gpus = f"{r.gpus} GPU{'s' * (r.gpus != 1)}, ${r.usd_per_month or 0:,.0f}/month"
        # a runner-up on the analytic roofline (no profile measured there) is an estimate
        rough = "; ANALYTIC profile" if r.profile_source == "analytic" else ""
        console.print(f"  runner-up {r.label}: {gpus} ({_one_line(r.note)}{rough})",
                      highlight=False)
    if len(p.runners_up) > len(shown):
        console.print(f"  … {len(p.runners_up) - len(shown)} more runners-up in the JSON plan "
                      "(--out plan.json) and the report")
    for a in p.advice:
        label = "[red]warning[/]" if a.kind == "memory" else "[cyan]advice[/]"
        console.print(f"  {label}: {a.message}")


PLAN_SUFFIXES = (".json", ".csv")


def _write_plan(plan: Plan, out: Path) -> None:
    if out.suffix.lower() == ".csv":
        write_out(out, "--out", plan.to_csv)
    else:
        write_out(out, "--out", lambda tmp: tmp.write_text(plan.to_json() + "\n"))


_traffic = click.option("--traffic", required=True, type=click.Path(path_type=Path),
                        help="traffic mix YAML")
_seed = click.option("--seed", type=click.IntRange(min=0), default=None,
                     help="base seed (default: the mix's)")
_spare = click.option("--spare", type=click.IntRange(min=0), default=0, show_default=True,
                      help="N+k: extra replicas per pool for failures")
_workers = click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="processes for the simulations (default: $CAPPLAN_WORKERS, else "
                        "the CPU count; 1: all in this process); the plan is the same")
_quick = click.option("--quick", is_flag=True,
                      help="short probes, confirm at probe length (rougher, faster)")
_host = click.option("--host", type=click.Choice(get_args(PoolHost)),
                     default=None,
                     help="price every pool's engine core as on this host (default: each "
                     "pool's `host`, median): slowest or fastest, that end of the hosts the "
                     "calibration traced serving the pool's model on its GPU; any, sized on the "
                     "median and both ends and the most GPUs kept, for hosts you do not choose")
_guard = click.option("--guard", type=click.Choice(["p10", "worst"]), default=None,
                      help="tighten each SLO by how far the simulator's predictions have "
                      "fallen short of real vLLM on the pool's profile (its stored validation "
                      "rows): p10 by the shortfall 90 % of them stay within, worst by the largest. "
                      "Where rows near the limit measured it, the share allowed past the limit "
                      "shrinks by the engine's share past it over the prediction's; else the "
                      "limit shrinks by the percentile's error. SLOs with fewer than 5 rows "
                      "are kept as they are, and say so; refused with gpu: auto")


@click.command()
@_traffic
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="also write the plan: .json (the schema) or .csv")
@click.option("--growth", type=float, default=1.0, callback=finite_positive,
              show_default=True, help="scale every workload's traffic (> 0)")
@_spare
@_seed
@_quick
@_workers
@click.option("--report", "report_out", type=click.Path(path_type=Path), default=None,
              help="also write the plan's HTML report (as `capplan report` does)")
@click.option("--verbose", "-v", is_flag=True,
              help="explain each search step (every simulation and what it found) on stderr")
@_guard
@_host
@_errors_as_lines
def size(traffic: Path, fmt: str, out: Path | None, growth: float, spare: int,
         seed: int | None, quick: bool, workers: int | None, report_out: Path | None,
         verbose: bool, guard: str | None, host: str | None) -> None:
    """Fewest GPUs per pool that hold every workload's SLOs, with cost and why."""
    t0 = time.perf_counter()
    check_out(out, "--out", PLAN_SUFFIXES)
    from capplan.report.cli import REPORT_SUFFIXES, write_report

    check_out(report_out, "--report", REPORT_SUFFIXES)
    mix, guarded = _load(traffic, guard, host)
    n = _start_workers(workers)
    from capplan.solve.options import size_mix

    with _Feedback(verbose) as fb:
        plan = size_mix(mix, growth=growth, spare=spare, seed=seed, quick=quick,
                        log=fb.log, on_pool=fb.pool, workers=n)
    if guard is not None:
        # the guard has taken the validated error into the limits: quoting it again against
        # them would count it twice
        pools = [p.model_copy(update={"fidelity": None}) for p in plan.pools]
        plan = plan.model_copy(update={"guard": guard, "guarded": guarded, "pools": pools})
    elapsed = time.perf_counter() - t0
    if out is not None:
        _write_plan(plan, out)
    if report_out is not None:
        write_report(plan, mix, report_out, quick=quick, option="--report")
    if fmt == "json":
        click.echo(plan.to_json())
    elif fmt == "csv":
        click.echo(plan.to_csv(), nl=False)
    else:
        print_plan(plan, _console(), elapsed)
    if plan.infeasible:
        # the answer is printed (and written); the exit code tells a script it is not whole
        raise click.exceptions.Exit(InfeasibleError.exit_code)


class _Feedback:
    """What a person waiting on a long search sees, on stderr: a progress bar over the pools
    with elapsed time and ETA on a terminal (nothing when piped), and with --verbose every
    step."""

    def __init__(self, verbose: bool) -> None:
        self.console = Console(stderr=True)
        if not self.console.is_terminal:
            self.console = Console(stderr=True, width=160)  # logs: do not wrap at 80
        self.verbose = verbose
        self.bar: ProgressBar | None = None

    def __enter__(self) -> _Feedback:
        if not self.verbose:
            self.bar = ProgressBar("sizing", console=self.console).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def pool(self, name: str, i: int, n: int) -> None:
        if self.bar is not None:
            self.bar.update(i, total=n, description=f"sizing pool {name}")
        elif self.verbose:
            self.console.print(f"[bold]pool {name}[/] ({i + 1}/{n})")

    def log(self, line: str) -> None:
        if self.verbose:
            self.console.print(f"  {line}", highlight=False)


def _growths(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"expected numbers like 1,1.5,2, got {text!r}", field="--growth"
        ) from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigError(f"growth factors must be finite numbers above 0, got {text!r}",
                          field="--growth")
    return values


def sweep_rows(plans: list[Plan]) -> list[dict[str, Any]]:
    """One row per (growth, pool): the capacity curve; `configuration` is the GPU where the
    mix left it open, the precision and the values chosen for engine settings left auto
    (they may change as traffic grows)."""
    return [
        {"growth": plan.growth, "pool": p.pool, "gpus": p.gpus, "replicas": p.replicas,
         "precision": p.precision, "binding_workload": p.binding_workload,
         "binding_slo": p.binding_slo, "usd_per_month": p.cost.usd_per_month,
         "configuration": p.candidate}
        for plan in plans for p in plan.pools
    ]


def _plot(rows: list[dict[str, Any]], path: Path, console: Console) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("[yellow]matplotlib is not installed: no plot (pip install capplan[plot])[/]")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for pool in dict.fromkeys(r["pool"] for r in rows):
        pts = [(r["growth"], r["gpus"]) for r in rows if r["pool"] == pool]
        ax.plot(*zip(*pts, strict=True), marker="o", label=pool)
    totals: dict[float, int] = {}
    for r in rows:
        totals[r["growth"]] = totals.get(r["growth"], 0) + r["gpus"]
    if len({r["pool"] for r in rows}) > 1:
        ax.plot(list(totals), list(totals.values()), marker="s", linestyle="--", label="total")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("traffic growth (× peak)")
    ax.set_ylabel("GPUs meeting every SLO")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_out(path, "--plot", lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)


@click.command()
@_traffic
@click.option("--growth", "growth_text", default="1,1.5,2,3", show_default=True,
              help="comma-separated traffic growth factors")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="curve as CSV")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="curve as a picture: .png, .svg or .pdf")
@_spare
@_seed
@_quick
@_workers
@_guard
@_host
@_errors_as_lines
def sweep(traffic: Path, growth_text: str, out: Path | None, plot: Path | None, spare: int,
          seed: int | None, quick: bool, workers: int | None, guard: str | None,
          host: str | None) -> None:
    """GPUs per pool as traffic grows: the capacity-planning curve. A growth no GPU count
    can serve ends the curve: it and every larger one are rows marked infeasible, and the
    command exits 5 once the rest is printed and written."""
    check_out(out, "--out", (".csv",))
    check_out(plot, "--plot", (".png", ".svg", ".pdf"))
    growths = sorted(_growths(growth_text))
    mix, guarded = _load(traffic, guard, host)
    for line in guarded:
        click.echo(f"guard {guard}: {line}", err=True)
    n_workers = _start_workers(workers)
    import polars as pl

    from capplan.solve.options import floors_of, size_mix

    console = _console()
    plans: list[Plan] = []
    floors: dict[tuple[str, str], int] = {}
    beyond: list[dict[str, Any]] = []  # the rows of the growths no GPU count serves
    with ProgressBar("sweeping", total=len(growths)) as bar:
        for k, g in enumerate(growths):
            def step(name: str, j: int, n: int, k: int = k, g: float = g) -> None:
                bar.update(k * n + j, total=len(growths) * n,
                           description=f"growth ×{g:g}: pool {name}")

            plan = size_mix(mix, growth=g, spare=spare, seed=seed, quick=quick, advice=False,
                            floors=floors, on_pool=step, workers=n_workers)
            if plan.infeasible:
                # more traffic never needs fewer GPUs: every larger growth is infeasible too
                reason = _one_line(plan.infeasible[0].reason)
                console.print(f"[red]growth ×{g:g} and above: infeasible: {reason}[/]")
                beyond = [{"growth": later, "pool": p.pool, "infeasible": _one_line(p.reason)}
                          for later in growths[k:] for p in plan.infeasible]
                break
            plans.append(plan)
            floors = floors_of(plan)
    if not plans:
        raise InfeasibleError(f"no growth factor in {growth_text!r} is feasible")
    rows = sweep_rows(plans)
    if out is not None:
        frame = pl.from_dicts(rows + beyond, infer_schema_length=None)
        write_out(out, "--out", frame.write_csv)
    if plot is not None:
        _plot(rows, plot, console)
    table = Table(title=f"GPUs vs growth for {mix.name}", title_justify="left")
    pools = list(dict.fromkeys(r["pool"] for r in rows))
    table.add_column("growth", justify="right")
    for p in pools:
        table.add_column(p, justify="right")
    table.add_column("total", justify="right")
    table.add_column("$/month", justify="right")
    for plan in plans:
        # a pool that leaves its GPU open may change GPU as traffic grows: say which
        by = {p.pool: f"{p.gpus} {p.gpu}" if "gpu" in p.auto else str(p.gpus)
              for p in plan.pools}
        table.add_row(f"×{plan.growth:g}", *(by.get(p, "-") for p in pools),
                      str(plan.gpus), f"{plan.usd_per_month:,.0f}")
    console.print(table)
    if beyond:
        raise click.exceptions.Exit(InfeasibleError.exit_code)
