"""`capplan calibrate`: measure on this GPU host (or refit from raw runner output) and write
profiles under `calibration/<gpu>/vllm-<version>/<model>/<key>/`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from capplan._cli import ProgressBar
from capplan.calibrate import store
from capplan.calibrate.build import UTILS, build_all
from capplan.calibrate.jobs import RUNNER, SPEC_METHODS, Job
from capplan.calibrate.store import CALIBRATION_DIR
from capplan.calibrate.sweep import make_plan, write_plan
from capplan.errors import CalibrationError, ConfigError
from capplan.hardware import Precision
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.profiles import DEFAULT_DRAFT

EXIT_NO_VLLM, EXIT_ENGINE = 3, 4  # runner.py's exit codes


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ConfigError(f"{what}: expected comma-separated numbers, got {text!r}") from e


def _precisions(text: str) -> list[Precision]:
    out = []
    for name in (x.strip().lower() for x in text.split(",") if x.strip()):
        try:
            out.append(Precision(name))
        except ValueError as e:
            valid = ", ".join(p.value for p in Precision)
            raise ConfigError(f"unsupported precision {name!r}; use one of {valid}") from e
    return out


def git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).parent, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return r.stdout.strip() or "unknown"


def _default_drafter(spec: ModelSpec, method: str) -> str | None:
    """The drafter folder when --spec-model is not given: the model's own MTP drafter, or
    capplan's draft model where it shares the target's vocabulary."""
    if method == "mtp" and spec.mtp_drafter is not None:
        return os.path.relpath(spec.mtp_drafter.config_dir)
    if method == "draft_model":
        draft = load_model_spec(DEFAULT_DRAFT)
        if draft.vocab_size == spec.vocab_size:
            return os.path.relpath(draft.config_path.parent)
    return None


def plan_jobs(model: str, precisions: list[Precision], spec_tokens: list[int],
              spec_method: str, spec_model: str | None, kv_cache_dtype: str,
              utils: list[float], tp: int, prefix_cache: bool = False,
              graph_scan: bool = False, core_scan: bool = False,
              repeat: int = 0, mixlen_scan: bool = False,
              encoder_scan: bool = False, drain_scan: bool = False) -> list[Job]:
    """The engines to start: one timed engine per (precision, k) at 0.90, plus KV-only
    engines for the other utilisations (BF16, k = 0 only: the rest are derived). A
    multimodal model's engines run text-only, and one more KV-only engine at 0.90 keeps the
    image-encoder reservation: the difference is what the reservation costs in KV. With
    `prefix_cache`, one more engine per timed one, with prefix caching on, times the steps
    a prefix-cache hit makes (sweep.cache_points); with `graph_scan`, one more per timed
    engine times a decode-only batch at every CUDA-graph size (sweep.graph_points); with
    `mixlen_scan`, one more per timed engine without speculative decoding times decode
    batches of unequal lengths beside their twins of one length (sweep.mixlen_points); with
    `core_scan`, one more per timed engine without speculative
    decoding times the engine core's CPU time a step (sweep.core_points); with
    `encoder_scan`, one more per timed engine without speculative decoding, with images
    allowed, times the vision encoder (sweep.encoder_points); with `drain_scan`, one more per
    timed engine without speculative decoding times decode points' ends and traces them
    under torch's profiler (sweep.drain_points). With `repeat`
    N, only the timed engines start, as run N of each (`--rN`), whose steps join the fit, and
    with `encoder_scan` the encoder engines as run N (`--rN--encoder`), whose picture steps
    join the profile's draws (build.encoder_time)."""
    if tp != 1:
        raise ConfigError(f"--tp {tp}: only tensor parallel 1 is calibrated so far")
    try:
        spec = load_model_spec(model)
    except ConfigError as e:
        raise ConfigError(str(e), field="--model") from e
    if any(k < 0 or k > 8 for k in spec_tokens):
        raise ConfigError(f"--spec-tokens {spec_tokens}: each k must be in 0..8")
    if any(spec_tokens) and spec_method not in SPEC_METHODS:
        raise ConfigError(f"--spec-method {spec_method!r}: use one of {', '.join(SPEC_METHODS)}")
    if any(spec_tokens) and spec_model is None:
        spec_model = _default_drafter(spec, spec_method)
    text = 0 if spec.vision_encoder_params else None
    jobs = [Job(spec, p, kv_cache_dtype=kv_cache_dtype, spec_k=k, limit_images=text,
                spec_method=spec_method if k else None, spec_model=spec_model if k else None)
            for p in precisions for k in spec_tokens]
    first = precisions[0]
    jobs += [Job(spec, first, gpu_memory_utilization=u, kv_only=True, limit_images=text,
                 kv_cache_dtype=kv_cache_dtype) for u in utils if abs(u - 0.90) > 1e-9]
    if spec.vision_encoder_params:
        jobs.append(Job(spec, first, kv_only=True, kv_cache_dtype=kv_cache_dtype))
    timed = [j for j in jobs if not j.kv_only]
    if encoder_scan and not spec.vision_encoder_params:
        raise ConfigError(f"--encoder-scan: {spec.name} has no vision encoder "
                          "(its spec's vision_encoder_params is 0)")
    encoders = [replace(j, encoder_scan=True, limit_images=None)
                for j in timed if not j.spec_k] if encoder_scan else []
    if repeat:
        if repeat < 2:
            raise ConfigError(f"--repeat {repeat}: run 1 is the main run; number a repeat 2 "
                              "or more")
        return [replace(j, repeat=repeat) for j in timed + encoders]
    if prefix_cache:
        jobs += [replace(j, prefix_cache=True) for j in timed]
    if graph_scan:
        jobs += [replace(j, graph_scan=True) for j in timed]
    if mixlen_scan:
        jobs += [replace(j, mixlen_scan=True) for j in timed if not j.spec_k]
    if core_scan:
        jobs += [replace(j, core_scan=True) for j in timed if not j.spec_k]
    if drain_scan:
        jobs += [replace(j, drain_scan=True) for j in timed if not j.spec_k]
    return jobs + encoders


def _plan(job: Job, budget_s: float) -> dict[str, object]:
    return make_plan(job.spec, job.precision, budget_s=budget_s * 1.6, spec_k=job.spec_k,
                     cache=job.prefix_cache, graphs=job.graph_scan, core=job.core_scan,
                     mixlen=job.mixlen_scan, encoder=job.encoder_scan, drain=job.drain_scan,
                     max_num_seqs=job.max_num_seqs)


def run_job(job: Job, raw: Path, budget_s: float, echo: bool = True) -> float:
    """Run one engine through its plan in a child process; returns wall seconds.

    The runner appends to `<raw>/<job>.jsonl` and skips points already there, so running
    the same command again after a crash resumes where it stopped."""
    raw.mkdir(parents=True, exist_ok=True)
    plan = None
    if not job.kv_only:
        plan = str(write_plan(_plan(job, budget_s), raw / f"{job.name}.plan.json"))
    args = job.runner_args(str(job.model_dir(raw / "engines")), plan,
                           str(raw / f"{job.name}.jsonl"), str(raw / f"{job.name}.meta.json"),
                           budget_s)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(RUNNER), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if echo and line.startswith(("ENGINE", "POINT", "TIME", "DONE")):
            click.echo(f"[{job.name}] {line.rstrip()}", err=True)
    err = proc.stderr.read()
    rc = proc.wait()
    secs = time.monotonic() - t0
    with open(raw / "rc.txt", "a") as f:
        f.write(f"{job.name} rc={rc} s={secs:.0f}\n")
    if rc:
        last = next((ln for ln in reversed(err.splitlines()) if ln.startswith("capplan-runner")),
                    err.strip().splitlines()[-1] if err.strip() else f"exit status {rc}")
        raise CalibrationError(f"{job.name}: {last.removeprefix('capplan-runner: ')} "
                               f"(measured points kept in {raw})")
    return secs


START_MARGIN = 1.15
"""A queued engine's start is allowed this much more than the longest one measured."""


def spec_method_of(run: str) -> str | None:
    """The speculative method of a stored run's name (`<model>--<key>[--...]`, the key's
    `-<method>K` part, jobs.Job.key), None without one."""
    key = run.split("--")[1]
    return next((m for m in SPEC_METHODS if f"-{m}" in key), None)


def measured_start_s(raw: Path, job: Job) -> float:
    """The longest engine start measured for engines like `job`'s (`engine_start_s` in the
    run metadata under `raw`): the same model, and the same speculative method or none, any
    precision or utilisation. A fresh GPU host compiles cold (torch.compile, CUDA graphs):
    Gemma 4 31B's engines took 73-245 s (`python scripts/calibration_analysis.py starts`).
    0 where none was measured."""
    method = job.spec_method if job.spec_k else None
    longest = 0.0
    for meta in raw.glob(f"{job.spec.name}--*.meta.json"):
        if spec_method_of(meta.name.removesuffix(".meta.json")) != method:
            continue
        try:
            start = json.loads(meta.read_text()).get("engine_start_s") or 0.0
        except (OSError, ValueError):
            continue
        longest = max(longest, float(start))
    return longest


def queue_line(job: Job, out: Path, budget_s: float, gpu: str = store.RAW_HOME_GPU) -> str:
    """`NAME|MIN_S|runner args` for scripts/gpu_calibrate.sh (paths relative to here, as the
    script runs from the repository root); MIN_S: the engine's start plus the measuring
    budget, the start being the longest measured for such engines (`measured_start_s`, with
    START_MARGIN), else ~60 s plus ~1.2 s per GB of weights (the H200's first starts). A job
    given less than its start is killed before it measures anything (the nineteenth
    session's Gemma 4 MTP k = 4 KV-only engine, twice, at 100 s)."""
    plan = None
    if not job.kv_only:
        plan = os.path.relpath(write_plan(_plan(job, budget_s),
                                          store.plans_dir(out, gpu) / f"{job.name}.json"))
    model_dir = os.path.relpath(job.model_dir(out / "_engines"))
    args = job.runner_args(model_dir, plan, "-", "-", 0 if job.kv_only else budget_s)
    args = args[args.index("--gpu-memory-utilization"):]
    start = max(60 + 1.2 * job.spec.weight_bytes(job.precision) / 1e9,
                START_MARGIN * measured_start_s(store.raw_dir(out, gpu), job))
    min_s = start + (0 if job.kv_only else budget_s)
    if job.drain_scan:
        min_s += budget_s  # the traced pass runs two of the plan's points once more
    return f"{job.name}|{min_s:.0f}|--model {model_dir} {' '.join(args)}"


def _refit(raw: Path, out: Path, gpu: str) -> list[Path]:
    """Fit every profile the raw folder supports, with a progress bar on a terminal."""
    with ProgressBar("fitting profiles") as bar:

        def on_profile(name: str, i: int, n: int) -> None:
            bar.update(i, total=n, description=f"fitting {name}")

        return build_all(raw, out, gpu=gpu, git_commit=git_commit(), on_profile=on_profile)


@click.command("calibrate")
@click.option("--model", help="model spec name or path (models/<name>)")
@click.option("--precision", default="bf16", show_default=True, help="comma-separated")
@click.option("--spec-tokens", default="0", show_default=True, help="draft tokens k, e.g. 0,2,4")
@click.option("--spec-method", default="draft_model", show_default=True)
@click.option("--spec-model", default=None, help="draft model folder (config.json)")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto",
              show_default=True)
@click.option("--gpu-memory-utilization", "utils", default="0.85,0.90,0.95", show_default=True)
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--budget-s", type=float, default=60.0, show_default=True,
              help="measuring seconds per engine (engine start comes on top)")
@click.option("--gpu", default="h200", show_default=True, help="GPU name in the output path")
@click.option("--out", type=click.Path(path_type=Path), default=CALIBRATION_DIR,
              show_default=True)
@click.option("--raw", type=click.Path(path_type=Path), default=None,
              help="where raw runner output goes [default: OUT/_raw, or OUT/_raw/GPU for a "
              "GPU other than the H200]")
@click.option("--from-raw", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=None, help="no GPU: refit profiles from existing raw runner output")
@click.option("--dry-run", is_flag=True, help="list the engines that would start, and stop")
@click.option("--emit-queue", type=click.Path(path_type=Path), default=None,
              help="write plans and a queue for scripts/gpu_calibrate.sh, and stop")
@click.option("--prefix-cache", is_flag=True,
              help="also an engine with prefix caching on per timed one, that times the steps "
              "a prefix-cache hit makes (analysed beside the profile, not fitted)")
@click.option("--graph-scan", is_flag=True,
              help="also an engine per timed one that times a decode-only batch at every "
              "CUDA-graph size: the profile's per-size offsets (graph_offset_s)")
@click.option("--mixlen-scan", is_flag=True,
              help="also an engine per timed one (k = 0) that times decode batches of unequal "
              "lengths beside their twins of one length (a test of the model, not fitted)")
@click.option("--core-scan", is_flag=True,
              help="also an engine per timed one (k = 0) that times the engine core's own CPU "
              "time a step (core_graph_s, core_piecewise_s); a full sweep records it too")
@click.option("--encoder-scan", is_flag=True,
              help="also an engine per timed one (k = 0) of a multimodal model, images "
              "allowed, that times its vision encoder: the profile's encoder_token_s")
@click.option("--drain-scan", is_flag=True,
              help="also an engine per timed one (k = 0) that times decode points' ends, "
              "their requests finishing 16 a step and all at once, and traces them under "
              "torch's profiler (why a drain stalls the engine core; not fitted)")
@click.option("--repeat", type=int, default=0,
              help="start only the timed engines, as run N (`<model>--<key>--rN`) of each: a "
              "later lease's steps, fitted with the main run's (with --encoder-scan, the "
              "encoder engines too, `--rN--encoder`)")
def calibrate(model: str | None, precision: str, spec_tokens: str, spec_method: str,
              spec_model: str | None, kv_cache_dtype: str, utils: str, tp: int,
              budget_s: float, gpu: str, out: Path, raw: Path | None, from_raw: Path | None,
              dry_run: bool, emit_queue: Path | None, prefix_cache: bool,
              graph_scan: bool, mixlen_scan: bool, core_scan: bool, encoder_scan: bool,
              drain_scan: bool, repeat: int) -> None:
    """Measure vLLM step times and KV capacity on this GPU and write profiles."""
    if from_raw is not None:
        for d in _refit(from_raw, out, gpu):
            click.echo(str(d))
        return
    if not model:
        raise ConfigError("--model is required (or --from-raw to refit)")
    ks = [int(k) for k in _floats(spec_tokens, "--spec-tokens")]
    us = _floats(utils, "--gpu-memory-utilization") or list(UTILS)
    jobs = plan_jobs(model, _precisions(precision), ks, spec_method, spec_model,
                     kv_cache_dtype, us, tp, prefix_cache, graph_scan, core_scan, repeat,
                     mixlen_scan, encoder_scan, drain_scan)
    if emit_queue is not None:
        emit_queue.parent.mkdir(parents=True, exist_ok=True)
        emit_queue.write_text("".join(queue_line(j, out, budget_s, gpu) + "\n" for j in jobs))
        click.echo(str(emit_queue))
        return
    if dry_run:
        for j in jobs:
            click.echo(f"{j.name}{' (KV only)' if j.kv_only else ''}")
        return
    if importlib.util.find_spec("vllm") is None:
        raise CalibrationError("vLLM is not installed here; run on a GPU host with "
                               "`pip install capplan[calibrate]` (vllm==0.26.0)")
    raw = raw or store.raw_dir(out, gpu)
    for i, job in enumerate(jobs, 1):
        click.echo(f"engine {i}/{len(jobs)}: {job.name}", err=True)
        run_job(job, raw, budget_s)
    for d in _refit(raw, out, gpu):
        click.echo(str(d))
