"""The `capplan` command line: a thin shell over the library.

Every `CapplanError` (bad input, no feasible plan, missing calibration) becomes one red line on
stderr and the error's exit code; anything else is a bug and keeps its traceback.
Commands owned by later stages (`calibrate`, `size`, `sweep`) are resolved lazily, so a stage
that is missing or cannot import fails only when its command is used.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from capplan._cli import check_out, fail, finite_positive, one_line, write_out
from capplan.errors import CapplanError, ConfigError
from capplan.units import duration

LAZY_COMMANDS: dict[str, str] = {
    "calibrate": "capplan.calibrate.cli:calibrate",
    "size": "capplan.solve.cli:size",
    "sweep": "capplan.solve.cli:sweep",
    "traffic": "capplan.tracefit.cli:traffic",
    "deploy": "capplan.deploy.cli:deploy",
    "report": "capplan.report.cli:report",
    "validate": "capplan.validate.cli:validate",
}
"""Subcommands living in later stages, as `module:attribute`, imported on first use."""


def _unavailable(name: str, target: str, reason: str) -> click.Command:
    """A stand-in for a lazy command whose module cannot be imported: fails only when used."""

    def run() -> None:
        fail(f"`capplan {name}` is unavailable: cannot load {target} ({reason})", 1)

    return click.Command(
        name,
        callback=run,
        help=f"(unavailable: {target} cannot be loaded)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


class CapplanGroup(click.Group):
    """A click group that resolves `lazy` subcommands on demand and turns CapplanError into
    one line plus its exit code."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in self.lazy:
            return cmd
        target = self.lazy[cmd_name]
        module_name, _, attr = target.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            return _unavailable(cmd_name, target, one_line(str(e)) or type(e).__name__)
        if not isinstance(obj, click.Command):
            return _unavailable(cmd_name, target, f"{attr} is not a click command")
        return obj

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CapplanError as e:
            fail(str(e), e.exit_code)


@click.group(cls=CapplanGroup, lazy=LAZY_COMMANDS)
@click.version_option(package_name="capplan", prog_name="capplan")
def main() -> None:
    """Plan GPU capacity for vLLM 0.26.0 serving: calibrate, simulate, size."""


# -- formatting --------------------------------------------------------------------------------


def _console() -> Console:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # pipes and logs: do not wrap the table at 80 columns
    return console


def _finite(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON has no inf/nan)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def result_document(res: Any) -> dict[str, Any]:
    """The `--format json` document: pool figures and one entry per workload, with
    `slo_met` as {slo key: bool} and `slo` as the checks (limit, value, met)."""
    workloads = []
    for w in res.workloads:
        d = w.model_dump(mode="json")
        d["slo_met"] = {c.key: c.met for c in w.slo}
        d["all_slo_met"] = w.slo_met
        workloads.append(d)
    doc = {"pool": res.pool.model_dump(mode="json"), "workloads": workloads,
           "slo_met": res.slo_met}
    return dict(_finite(doc))


def _print_table(res: Any, console: Console) -> None:
    p = res.pool
    table = Table(
        title=f"pool {p.pool}: {p.replicas} replica(s), {p.gpus} GPU(s), seed {p.seed}",
        title_justify="left",
    )
    for col in ("workload", "requests", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                "E2E p99", "out tok/s", "hit rate", "SLO"):
        table.add_column(col, justify="left" if col in ("workload", "SLO") else "right")
    for w in res.workloads:
        checks = [
            f"[{'green' if c.met else 'red'}]{'✓' if c.met else '✗'} {c.key} "
            f"{duration(c.value_s)} ≤ {duration(c.limit_s)}[/]"
            for c in w.slo
        ]
        table.add_row(
            w.name,
            f"{w.requests}" + (f" ({w.requests - w.completed} unfinished)"
                               if w.completed < w.requests else ""),
            duration(w.ttft_p50_s), duration(w.ttft_p99_s),
            duration(w.itl_p50_s), duration(w.itl_p99_s), duration(w.e2e_p99_s),
            f"{w.output_tokens_per_s:,.0f}", f"{w.prefix_hit_rate:.1%}",
            "\n".join(checks) or "(no SLO)",
        )
    console.print(table)
    if p.profile_source == "analytic":
        console.print(
            f"[bold yellow]profile {p.profile}: ANALYTIC (datasheet roofline estimate, not "
            "measured) — calibrate on the GPU for measured step times[/]"
        )
    else:
        console.print(f"profile {p.profile}: {p.profile_source}")
    console.print(
        f"KV cache {p.kv_tokens_per_replica:,} tokens/replica · engine busy {p.utilisation:.1%}"
        f" · KV usage mean {p.kv_usage_mean:.1%} peak {p.kv_usage_peak:.1%}"
        f" · prefix hit rate {p.prefix_hit_rate:.1%} · preemptions {p.preemptions:,}"
        f" · {p.steps:,} steps · {p.output_tokens_per_s:,.0f} out tok/s"
    )
    console.print(
        f"window [{p.warmup_s:g}, {p.duration_s:g}) s measured; simulated {p.simulated_s:.1f} s"
    )
    if p.extrapolated_steps:
        console.print(
            f"[bold red]extrapolated steps: {p.extrapolated_steps:,} of {p.steps:,} fell outside "
            "the profile's calibrated box[/]"
        )
    else:
        console.print("extrapolated steps: 0")
    verdict = "[green]all SLOs met[/]" if res.slo_met else "[red]SLOs missed[/]"
    if not any(w.slo for w in res.workloads):
        verdict = "no SLOs to check (the mix's workloads set none)"
    console.print(verdict)


REQUESTS_SUFFIXES = (".csv", ".parquet")
MAX_SIMULATED_REQUESTS = 20_000_000
"""More open-loop arrivals than this in one `capplan simulate` is a mistake, not a pool: at
the 4,500-27,000 simulated requests a second of docs/performance.md it would run for 12
minutes to over an hour, and a rate mistyped by a few zeros for days."""


def _write_requests(res: Any, path: Path) -> None:
    frame = res.requests()
    write = frame.write_csv if path.suffix.lower() == ".csv" else frame.write_parquet
    write_out(path, "--requests-out", write)


def _check_arrivals(mix: Any, pool: str, duration_s: float) -> None:
    """Refuse an open-loop load whose arrivals over the run no simulation can get through."""
    from capplan.sim.workload import offered_rate_rps

    for i, w in enumerate(mix.workloads):
        rate = offered_rate_rps(w, base_dir=mix.base_dir) if w.pool == pool else None
        if rate is not None and rate * duration_s > MAX_SIMULATED_REQUESTS:
            raise ConfigError(
                f"{rate:g} requests/s for {duration_s:g} s is {rate * duration_s:,.0f} "
                f"requests, more than {MAX_SIMULATED_REQUESTS:,} to simulate; lower the rate "
                "or --duration-s (capplan size answers such a load at once)",
                file=mix.source, field=f"workloads.{i}.arrival")


# -- commands ----------------------------------------------------------------------------------


@main.command()
@click.option("--traffic", "traffic", required=True, type=click.Path(path_type=Path),
              help="traffic mix YAML")
@click.option("--pool", "pool", required=True, help="pool of the mix to simulate")
@click.option("--replicas", type=click.IntRange(min=1), required=True,
              help="vLLM replicas in the pool")
@click.option("--duration-s", type=float, default=None, callback=finite_positive,
              help="simulated seconds of arrivals (default: the mix's simulation.duration_s)")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="random seed (default: the mix's)")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--requests-out", type=click.Path(path_type=Path), default=None,
              help="write per-request figures to a .csv or .parquet file")
def simulate(
    traffic: Path,
    pool: str,
    replicas: int,
    duration_s: float | None,
    seed: int | None,
    fmt: str,
    requests_out: Path | None,
) -> None:
    """Simulate REPLICAS vLLM replicas of one pool serving its workloads."""
    from capplan.mix import load_mix
    from capplan.sim.results import check_window_has_requests
    from capplan.sim.run import simulate as run_simulation

    check_out(requests_out, "--requests-out", REQUESTS_SUFFIXES)
    mix = load_mix(traffic)
    mix.fixed_pool(pool)
    _check_arrivals(mix, pool, duration_s or mix.simulation.duration_s)
    res = run_simulation(mix, pool, replicas, duration_s=duration_s, seed=seed)
    check_window_has_requests(res, mix)
    if requests_out is not None:
        _write_requests(res, requests_out)
    if fmt == "json":
        click.echo(json.dumps(result_document(res), sort_keys=True, indent=2, allow_nan=False))
    else:
        _print_table(res, _console())


@main.command()
def profiles() -> None:
    """List measured profiles under calibration/; other pools use the analytic roofline."""
    from capplan.modelspec import load_model_spec
    from capplan.profiles import CALIBRATION_DIR, list_profiles
    from capplan.steptime import StepTimer

    found = list_profiles()
    console = _console()
    if not found:
        console.print(
            f"no measured profiles under {CALIBRATION_DIR}; every pool uses the ANALYTIC "
            "roofline profile (source: analytic) until calibrated"
        )
        return
    table = Table(title=f"measured profiles under {CALIBRATION_DIR}", title_justify="left")
    for col in ("gpu", "vllm", "model", "profile", "tp", "source",
                "held-out APE\nmedian / p95", "designed\nsteps",
                "box tokens /\nseqs / context", "shared-prefix\nsaving", "picture",
                "graph\nsizes"):
        table.add_column(col, no_wrap=True)  # a 160-column pipe holds every row on one line
    for p in found:
        fit = designed = "-"
        if p.fit is not None:  # the profile as shipped where recorded, else the fit's own
            med, p95 = ((p.fit.shipped_median_ape, p.fit.shipped_p95_ape)
                        if p.fit.shipped_median_ape is not None and p.fit.shipped_p95_ape
                        is not None else (p.fit.median_ape, p.fit.p95_ape))
            fit = f"{med:.1%} / {p95:.1%}"
        prov = (CALIBRATION_DIR / p.gpu / f"vllm-{p.vllm_version}" / p.model / p.key
                / "provenance.json")
        if prov.is_file():  # the same held-out steps less the sweep points' drains
            f = json.loads(prov.read_text()).get("fit", {})
            if f.get("designed_shipped_p95_ape") is not None:
                designed = (f"{f['designed_shipped_median_ape']:.1%} / "
                            f"{f['designed_shipped_p95_ape']:.1%}")
        box = f"{p.box.max_tokens:,} / {p.box.max_seqs:,} / {p.box.max_context_tokens:,}"
        saving = f"{p.step.shared_ctx_saving:.0%}" if p.step.shared_ctx_saving else "-"
        graphs = str(len(p.step.graph_offset_s)) if p.step.graph_offset_s else "-"
        encoder = "-"
        if p.step.encoder_token_s:  # one picture of the model's default size, alone
            tokens = load_model_spec(p.model).image_tokens_per_image
            timer = StepTimer(p, max_num_seqs=256, max_num_batched_tokens=8192)
            encoder = f"{(timer.encoder_pass_s(tokens, 1) + p.step.encoder_step_s) * 1e3:.1f} ms"
        table.add_row(p.gpu, p.vllm_version, p.model, p.key, str(p.tp), p.source, fit,
                      designed, box, saving, encoder, graphs)
    console.print(table)
    console.print("pools matching none of these use the ANALYTIC roofline profile")
    console.print("designed steps: the same held-out steps less each sweep point's drain, its "
                  "requests finishing 16 a step, where the host stalled the engine core and the "
                  "GPU idled (docs/calibration.md, \"A point's drain\")")
    console.print("shared-prefix saving: of the decode read, per prefix token that running "
                  "requests read in common (measured by `capplan calibrate --prefix-cache`; "
                  "- : not measured, none assumed)")
    console.print("picture: what a step that encodes one picture of the model's default size "
                  "costs beyond its text, which every decode of its step waits for: the vision "
                  "encoder's pass and the median step around it (measured by `capplan "
                  "calibrate --encoder-scan`; - : no vision encoder)")
    console.print("graph sizes: CUDA-graph sizes whose decode-only step was timed on its own "
                  "(`capplan calibrate --graph-scan`; - : priced by the linear terms alone)")


@main.command()
def models() -> None:
    """List model specs under models/: parameters, weight GB per precision, KV bytes/token."""
    from capplan.hardware import Precision
    from capplan.modelspec import MODELS_DIR, load_model_spec

    names = sorted(d.name for d in MODELS_DIR.iterdir() if (d / "spec.yaml").is_file())
    precisions = list(Precision)
    table = Table(title=f"model specs under {MODELS_DIR}", title_justify="left")
    table.add_column("model")
    table.add_column("params", justify="right")
    for pr in precisions:
        table.add_column(f"{pr.value} GB", justify="right")
    table.add_column("KV B/token (bf16 / fp8)", justify="right")
    table.add_column("context", justify="right")
    table.add_column("vision", justify="right")
    for name in names:
        s = load_model_spec(name)
        params = s.linear_params + s.embedding_params + s.vision_encoder_params
        table.add_row(
            s.name,
            f"{params / 1e9:.2f} B",
            *(f"{s.weight_bytes(pr) / 1e9:.1f}" for pr in precisions),
            f"{s.kv_bytes_per_token(2):,} / {s.kv_bytes_per_token(1):,}",
            f"{s.max_position_embeddings:,}",
            f"{s.vision_encoder_params / 1e6:.0f} M" if s.vision_encoder_params else "-",
        )
    console = _console()
    console.print(table)
    console.print("weights at TP=1; embeddings, LM head and vision encoder stay in BF16")


if __name__ == "__main__":  # pragma: no cover
    main()
