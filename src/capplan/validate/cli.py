"""`capplan validate`: measure real vLLM, predict the same experiments, compare.

    capplan validate emit SUITE --out DIR        # runner jobs, one per engine (any machine)
    capplan validate measure SUITE --engine NAME # on a GPU host: run it, store it, compare
    capplan validate ingest SUITE RAW            # store runner output under calibration/
    capplan validate compare                     # every stored run, measured vs predicted
    capplan validate predict SUITE               # what the simulator predicts, before a run
    capplan validate plan --traffic MIX --plan PLAN --out SUITE
                                                 # the suite that checks a plan's decision
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from capplan._cli import check_out, errors_as_lines, finite_positive, write_out
from capplan.calibrate.store import CALIBRATION_DIR
from capplan.errors import CalibrationError, CapplanError, ConfigError
from capplan.validate.queued import QUEUED_DIR
from capplan.validate.suite import RUNNER, Suite, emit_job, load_suite

if TYPE_CHECKING:
    from capplan.memory import OutOfMemory
    from capplan.pool import Pool

MODELS_DIR = Path(__file__).resolve().parents[3] / "models"


def _write_json(path: Path, obj: object) -> None:
    text = json.dumps(obj, separators=(",", ":")) + "\n"
    write_out(path, "--out", lambda tmp: tmp.write_text(text))


def _engines(suite: Suite, names: tuple[str, ...]) -> list[str]:
    return [suite.engine(n).name for n in names] if names else [e.name for e in suite.engines]


@click.group()
def validate() -> None:
    """Prove predictions against real vLLM: measure experiments on a GPU, predict them, compare."""


@validate.command()
@click.argument("suite_file", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="folder for job files")
@click.option("--engine", "engines", multiple=True, help="only these engine runs (repeatable)")
@click.option("--models", type=click.Path(path_type=Path), default=Path("models"),
              show_default=True, help="models folder as the GPU host sees it")
@click.option("--missing", is_flag=True,
              help="only experiment runs not yet stored under --root (ingest adds them)")
@click.option("--root", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True, help="calibration folder the stored runs live in")
@click.option("--queued", "queued_dir", type=click.Path(path_type=Path, file_okay=False),
              default=QUEUED_DIR, show_default=True,
              help="where predictions are recorded before a run (predict --record)")
@errors_as_lines
def emit(suite_file: Path, out: Path, engines: tuple[str, ...], models: Path, missing: bool,
         root: Path, queued_dir: Path) -> None:
    """Write one runner job per engine run of SUITE_FILE (request shapes included); say
    which of them has no prediction recorded yet, while there is time to record one."""
    from capplan.validate.store import longest_start_s, stored_run_names

    suite = load_suite(suite_file)
    if out.exists() and not out.is_dir():
        raise ConfigError("is a file; --out names the folder for the job files",
                          file=str(out), field="--out")
    names = _engines(suite, engines)  # an unknown --engine fails before anything is made
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot make the folder ({e.strerror or e})", file=str(out),
                          field="--out") from e
    for name in names:
        run = suite.engine(name)
        skip = stored_run_names(root, run, gpu=suite.gpu, vllm_version=suite.vllm) \
            if missing else frozenset()
        job = emit_job(run, models, out, skip=skip)
        start_s = longest_start_s(root, suite.gpu, suite.vllm, run.pool.model)
        if start_s is not None:  # what the call must leave for the engine's start
            job["expected_start_s"] = start_s
        n = sum(1 for e in job["experiments"] if not e.get("warmup"))
        if missing and n == 0:
            click.echo(f"{name}: every run already stored; no job")
            continue
        _write_json(out / f"{name}.json", job)
        click.echo(f"{out / (name + '.json')}: {n} experiment run{'s' * (n != 1)}")
        oom = _measured_oom(run.pool)
        if oom is not None:
            click.echo(f"{name}: vLLM ran out of GPU memory under load with these settings "
                       f"before ({oom.engine}, {oom.logs[0]}); the lease may measure nothing",
                       err=True)
        if not (queued_dir / f"{name}.json").exists():
            click.echo(f"{name}: no prediction recorded before its run; record one now: "
                       f"capplan validate predict {suite_file} --engine {name} --record "
                       f"{queued_dir}", err=True)


def _measured_oom(pool: Pool) -> OutOfMemory | None:
    """The stored out-of-memory run (capplan/memory.py) a suite engine's settings reach."""
    from capplan.memory import failure_for
    from capplan.sim.run import setup_pool

    try:
        return failure_for(pool, setup_pool(pool).profile)
    except CapplanError:  # a pool the simulator refuses is said so by `predict`
        return None


@validate.command()
@click.argument("suite_file", type=click.Path(path_type=Path))
@click.argument("raw", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--engine", "engines", multiple=True, help="only these engine runs (repeatable)")
@click.option("--root", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True, help="calibration folder to store into")
@click.option("--core-traces", type=click.Path(path_type=Path, file_okay=False),
              help="also store each traced engine's core trace here (trace_core: "
                   "<engine>.parquet and .json, as validate/corelaunch.py reads them)")
@errors_as_lines
def ingest(suite_file: Path, raw: Path, engines: tuple[str, ...], root: Path,
           core_traces: Path | None) -> None:
    """Store the runner output in RAW (one folder per engine run, found at any depth; one
    configuration started several times is merged, first folder first) under calibration/."""
    from capplan.validate.store import ingest as store

    suite = load_suite(suite_file)
    found = 0
    for name in _engines(suite, engines):
        folders = sorted(p for p in raw.rglob(name) if (p / "engine.json").exists())
        if not folders:
            continue
        dest = store(folders, suite.engine(name), root, gpu=suite.gpu, vllm_version=suite.vllm)
        click.echo(f"{name}: stored in {dest}")
        traced = [f for f in folders if any((f / "coretrace").glob("core-*.jsonl"))]
        # the starts that measured something: an engine started only to be stopped for
        # want of time served its warm-up alone
        traced = [f for f in traced if _measured(f)] or traced[:1]
        if core_traces is not None:
            for k, folder in enumerate(traced):
                stem = name if k == 0 else f"{name}.start{k + 1}"
                click.echo(f"{name}: core trace in {_store_trace(folder, stem, core_traces)}")
        found += 1
    if not found:
        raise CalibrationError(f"{raw}: no runner output for any engine of {suite_file}")


def _measured(folder: Path) -> bool:
    """Whether the runner's `folder` holds an experiment beyond the warm-ups."""
    return any(not f.name.startswith("warmup") for f in folder.glob("*.jsonl"))


def _store_trace(folder: Path, name: str, out: Path) -> Path:
    """The engine's core trace from the runner's `folder`, packed (corelaunch.pack) as
    `out/<name>.parquet` and `.json`. A trace's clock is its own start's, so an engine
    started more than once (on another host, to finish its experiments) keeps one trace per
    start that measured an experiment: the first as `<engine>`, the k-th as
    `<engine>.start<k>`."""
    from capplan.validate.corelaunch import pack, write_trace

    trace, meta = pack(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_trace(trace, out / f"{name}.parquet")
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out / f"{name}.parquet"


def _fmt(metric: str, v: float) -> str:
    if not math.isfinite(v):
        return "-"
    if metric == "output_tok_s":
        return f"{v:,.0f}"
    return f"{v * 1e3:,.1f}" if v < 1 else f"{v:,.2f}s"


@validate.command()
@click.option("--root", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True, help="calibration folder holding validation runs")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="write here instead of stdout")
@click.option("--write-docs", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="refresh the generated tables of this markdown file (docs/validation.md)")
@click.option("--plot", type=click.Path(path_type=Path), help="predicted-vs-measured PNG here")
@click.option("--ratchet", type=click.Path(path_type=Path),
              help="tighten the error bounds stored in this JSON file (validation/bounds.json)")
@click.option("--loosen", is_flag=True,
              help="with --ratchet: rows whose error grew past their bound take today's "
              "error plus the allowance (the rest still only tighten)")
@click.option("--fidelity", "fidelity_root", type=click.Path(path_type=Path, file_okay=False),
              help="under this calibration folder, for each GPU with stored rows, write the "
              "errors' spread per profile and metric, for plans to quote "
              "(<gpu>/vllm-0.26.0/fidelity.json), and beside it each row's shares past a "
              "grid of limits (fidelity-tails.parquet), for --guard")
@errors_as_lines
def compare(root: Path, fmt: str, out: Path | None, write_docs: Path | None,
            plot: Path | None, ratchet: Path | None, loosen: bool,
            fidelity_root: Path | None) -> None:
    """Predict every stored validation run again and show measured vs predicted."""
    from capplan._cli import ProgressBar
    from capplan.validate import report
    from capplan.validate.compare import METRICS, TARGETS, compare_all, to_frame
    from capplan.validate.store import stored_runs

    check_out(out, "--out", {"csv": (".csv",), "json": (".json",)}.get(fmt))
    check_out(plot, "--plot", (".png", ".svg", ".pdf"))
    folders = stored_runs(root)
    with ProgressBar("predicting stored runs", total=len(folders)) as bar:

        def shown(folders: list[Path]) -> Iterator[Path]:
            for f in folders:  # the bar advances once compare_all has predicted f
                bar.update(description=f"predicting {f.name}")
                yield f
                bar.update(advance=1)

        rows = compare_all(root, shown(folders))
    if not rows:
        raise CalibrationError(f"{root}: no stored validation runs (capplan validate ingest)")
    if write_docs is not None:
        changed = report.write_docs(write_docs, rows)
        click.echo(f"{write_docs}: {'updated' if changed else 'already current'}", err=True)
    if plot is not None:
        report.plot(rows, plot)
        click.echo(f"{plot}: written", err=True)
    if ratchet is not None:
        bounds = report.ratchet(rows, report.load_bounds(ratchet), loosen=loosen)
        report.save_bounds(ratchet, bounds)
        bad = report.violations(rows, bounds)
        click.echo(f"{ratchet}: {len(bounds)} rows bounded; {len(bad)} over their bound", err=True)
        for line in bad:
            click.echo(f"  {line}", err=True)
    if fidelity_root is not None:
        from capplan import fidelity

        for gpu, gpu_rows in fidelity.by_gpu(rows).items():
            path = fidelity.path_for(fidelity_root, gpu)
            fidelity.save(path, fidelity.summarise(gpu_rows))
            tails_out = fidelity.tails_path_for(fidelity_root, gpu)
            fidelity.tails(gpu_rows).write_parquet(tails_out)
            click.echo(f"{path}, {tails_out.name}: written", err=True)
    if any(x is not None for x in (write_docs, plot, ratchet, fidelity_root)):
        return
    df = to_frame(rows)
    if fmt == "csv":
        text = df.write_csv()
    elif fmt == "json":
        text = df.write_json()
    else:
        table = Table(title="measured / predicted (error); ms unless marked s; throughput tok/s; "
                            "yellow: a miss within the measurement's own noise")
        for col in ("engine", "run", "workload", *METRICS):
            table.add_column(col.removesuffix("_s"), justify="left" if col in
                             ("engine", "run", "workload") else "right")
        for r in rows:
            cells = []
            for m in METRICS:
                err = r.error(m)
                style = ("green" if abs(err) <= TARGETS[m] else
                         "yellow" if r.within_noise(m) else "red")
                cells.append(f"{_fmt(m, r.measured[m])} / {_fmt(m, r.predicted[m])} "
                             f"[{style}]({err:+.0%})[/{style}]")
            table.add_row(r.engine, r.run, r.workload, *cells)
        notes = [f"  {r.engine} {r.run} {r.workload}: {r.note}" for r in rows if r.note]
        with out.open("w") if out is not None else contextlib.nullcontext() as fh:
            console = Console(width=220, file=fh)  # no file: stdout
            console.print(table)
            if notes:  # what a row's run carried that its figures do not show
                console.print("notes:\n" + "\n".join(notes), highlight=False)
        return
    if out is None:
        click.echo(text, nl=not text.endswith("\n"))  # polars' CSV ends its last line
    else:
        write_out(out, "--out", lambda tmp: tmp.write_text(text))


@validate.command()
@click.argument("suite_file", type=click.Path(path_type=Path))
@click.option("--engine", "engines", multiple=True, help="only these engine runs (repeatable)")
@click.option("--root", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True, help="calibration folder to store into")
@click.option("--time-budget-s", type=float, default=3600.0, show_default=True,
              help="per engine: skip experiments that would end later")
@errors_as_lines
def measure(suite_file: Path, engines: tuple[str, ...], root: Path, time_budget_s: float) -> None:
    """On a GPU host with vLLM 0.26.0: run each engine's experiments, store them, compare."""
    import importlib.util

    from capplan.validate.store import ingest as store

    suite = load_suite(suite_file)
    if importlib.util.find_spec("vllm") is None:
        raise CalibrationError("vLLM is not installed here: `capplan validate measure` runs on "
                               "a GPU host with vllm==0.26.0 (pip install 'capplan[calibrate]')")
    with tempfile.TemporaryDirectory(prefix="capplan-validate-") as tmp:
        work = Path(tmp)
        for name in _engines(suite, engines):
            job_path = work / f"{name}.json"
            _write_json(job_path, emit_job(suite.engine(name), MODELS_DIR, work))
            cmd = [sys.executable, str(RUNNER), "--job", str(job_path), "--out",
                   str(work / name), "--time-budget-s", str(time_budget_s)]
            click.echo(f"{name}: starting vLLM ({' '.join(cmd[1:])})", err=True)
            rc = subprocess.call(cmd)
            if rc != 0 and not (work / name / "engine.json").exists():
                raise CalibrationError(f"{name}: the runner failed (exit {rc}); see its output")
            dest = store(work / name, suite.engine(name), root, gpu=suite.gpu,
                         vllm_version=suite.vllm, command=" ".join(sys.argv))
            click.echo(f"{name}: stored in {dest}", err=True)
    compare.callback(root=root, fmt="table", out=None, write_docs=None, plot=None,  # type: ignore[misc]
                     ratchet=None, loosen=False, fidelity_root=None)


PREDICTED = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s")


@validate.command()
@click.argument("suite_file", type=click.Path(path_type=Path))
@click.option("--engine", "engines", multiple=True, help="only these engine runs (repeatable)")
@click.option("--format", "fmt", type=click.Choice(["table", "csv"]), default="table",
              show_default=True)
@click.option("--record", type=click.Path(path_type=Path, file_okay=False),
              help="also write each engine's predictions to RECORD/<engine>.json, once and "
              "before it is measured (validation/queued: compare --write-docs holds the "
              "engine to them)")
@click.option("--root", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True, help="with --record: where measured engines are stored")
@errors_as_lines
def predict(suite_file: Path, engines: tuple[str, ...], fmt: str, record: Path | None,
            root: Path) -> None:
    """What the simulator predicts for every experiment of SUITE_FILE, before it is measured:
    the figures `compare` will hold the engine to (write them down when you queue a run:
    --record)."""
    from capplan.validate import queued
    from capplan.validate.compare import predict_pool
    from capplan.validate.store import stored_run_names

    suite = load_suite(suite_file)
    names = _engines(suite, engines)
    if record is not None:  # all refused before any is written
        for name in names:
            if stored_run_names(root, suite.engine(name), gpu=suite.gpu,
                                vllm_version=suite.vllm):
                raise ConfigError(f"{name} is measured already; a prediction recorded after "
                                  "the measurement checks nothing", file=str(suite_file))
            queued.refuse_recorded(record, name)
    rows: list[tuple[str, str, str, dict[str, float]]] = []
    for name in names:
        run = suite.engine(name)
        mine: dict[str, dict[str, dict[str, float]]] = {}
        for exp in run.experiments:
            mine[exp.name], pool = predict_pool(run, exp.name, None)
            rows += [(name, exp.name, w, m) for w, m in mine[exp.name].items()]
        # what the prediction rests on, to check against the engine's own log when it runs
        click.echo(f"{name}: profile {pool.profile} ({pool.profile_source}), "
                   f"{pool.kv_tokens_per_replica:,} KV tokens at gpu_memory_utilization "
                   f"{run.pool.engine.gpu_memory_utilization}", err=True)
        if record is not None:
            path = queued.record(record, name, mine, suite=str(suite_file))
            click.echo(f"{path}: recorded", err=True)
    if fmt == "csv":
        import polars as pl

        click.echo(pl.DataFrame([
            {"engine": e, "run": r, "workload": w, "requests": int(m["requests"]),
             **{k: m[k] for k in PREDICTED}} for e, r, w, m in rows]).write_csv(), nl=False)
        return
    table = Table(title=f"predicted for {suite_file} (times in ms, or in s where marked; "
                  "throughput in output tokens/s)", title_justify="left")
    for col in ("engine", "run", "workload", "n", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50",
                "ITL p99", "E2E p99"):
        table.add_column(col)
    for e, r, w, m in rows:
        table.add_row(e, r, w, str(int(m["requests"])), *(_fmt(k, m[k]) for k in PREDICTED))
    Console(width=220).print(table)


@validate.command("plan")
@click.option("--traffic", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              required=True, help="the traffic mix the plan was sized for")
@click.option("--plan", "plan_path", type=click.Path(path_type=Path, exists=True,
              dir_okay=False), required=True, help="`capplan size --out plan.json`")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="the validation suite to write (YAML)")
@click.option("--duration-s", type=float, default=None, callback=finite_positive,
              help="seconds each experiment serves [default: 90]")
@errors_as_lines
def plan_cmd(traffic: Path, plan_path: Path, out: Path, duration_s: float | None) -> None:
    """The suite that puts a plan's decision to real vLLM: per pool, one replica at the share
    of the traffic one of its N replicas takes, and one of N - 1, split at random and as the
    pool's router hands it out."""
    import yaml

    from capplan.deploy.cli import load_plan
    from capplan.mix import load_mix
    from capplan.validate.plan import DURATION_S, plan_suite, suite_yaml

    check_out(out, "--out", (".yaml", ".yml"))
    mix = load_mix(traffic)
    plan = load_plan(plan_path)
    unknown = [p.pool for p in plan.pools if p.pool not in {q.name for q in mix.pools}]
    if unknown:
        raise ConfigError(f"the plan's pool {unknown[0]!r} is not in {traffic}; give the mix "
                          "the plan was sized for", file=str(plan_path))
    suite, skipped = plan_suite(mix, plan, duration_s=duration_s or DURATION_S)
    for pool, why in skipped.items():
        click.echo(f"pool {pool}: left out: {why}", err=True)
    if suite is None:
        raise ConfigError("no pool of the plan can be replayed on the GPU runner",
                          file=str(plan_path))
    text = ("# capplan validate plan: " + f"{plan_path} on {traffic}\n"
            + yaml.safe_dump(suite_yaml(suite), sort_keys=False))
    write_out(out, "--out", lambda tmp: tmp.write_text(text))
    for e in suite.engines:
        click.echo(f"{e.name}: " + ", ".join(x.name for x in e.experiments), err=True)
    click.echo(f"{out}: written; next: capplan validate emit {out} --out JOBS, run the jobs "
               "on a GPU host, capplan validate ingest, capplan validate compare", err=True)
