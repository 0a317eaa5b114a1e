"""The serving engine core's own time per step, from a core trace (validate/coretrace.py).

vLLM 0.26.0's engine core runs one loop (vllm/v1/engine/core.py step_with_batch_queue): it
schedules a step, launches it (`execute_model`, `sample_tokens`: the CPU prepares the inputs
and launches the kernels), and, with the batch queue full, waits for the oldest step and
processes its output. The loop's time less its wait is what the core spends on a step, and
while it spends it, it can neither schedule the next step nor hand out the last one's tokens.
A decode-only step replays one full CUDA graph and costs the core 2-4 ms; a step with a
prefill chunk within the largest CUDA graph runs piecewise graphs, its attention launched
layer by layer, and costs 7-14 ms on the H200 hosts measured (docs/validation.md, "Where the
engine core's time goes"). The GPU cannot finish a step before the core has launched it.

This module pairs each launched step with its composition (the runner's `trace_steps`) and
measures those two times; `capplan.calibrate.build` puts them in every profile of the model
(`StepModel.core_graph_s`, `core_piecewise_s`), and the simulator charges them
(`StepTimer.step_times`).
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

IDLE_US = 20_000
"""A wait on the input queue this long means nothing was in flight (the batch queue is
empty): the pairing of launched and processed steps restarts there."""


def core_process(trace: pl.DataFrame) -> pl.DataFrame:
    """The engine core process's spans: the traced file's busiest process (the client's
    own process writes a few output-decoding spans too)."""
    pid = trace.group_by("pid").len().sort("len")["pid"][-1]
    return trace.filter(pl.col("pid") == pid)


def spans(trace: pl.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (µs on the trace's clock) of every span `name`, in time order."""
    x = trace.filter(pl.col("name") == name).sort("t0_us")
    t0 = x["t0_us"].to_numpy()
    return t0, t0 + x["dur_us"].to_numpy()


def step_core_times(trace: pl.DataFrame, meta: dict[str, Any], steps: pl.DataFrame,
                    piecewise_max_tokens: int = 512) -> pl.DataFrame:
    """One row per launched step that the runner's step trace saw: its composition, the
    core's time in the loop iteration that launched it (`core_s`: the iteration's span less
    its wait for the GPU) and its `kind` ("graph": decode only; "piecewise": a prefill within
    `piecewise_max_tokens`, the largest CUDA graph; "eager": past it).

    `trace` is the engine core process's spans (the traced file's busiest process), `meta`
    its json (each experiment's `t0_perf`, `clock_base_s`), `steps` the stored steps.parquet
    (`t` from the experiment's start, when the client received the step's stats).
    `gpu_after_s` is how long after the core's `execute_model` returned the GPU ended the
    step's forward: near 0 where the launch binds; `gpu_s` the GPU's own span of the step;
    `gc_s` the garbage collector's time in that iteration, on any of the core's threads (a
    collection holds the GIL: coretrace.py `gc<generation>` spans; NaN for a trace taken
    before they were recorded)."""
    trace = core_process(trace)
    ex0, ex1 = spans(trace, "execute_model")
    up0, up1 = spans(trace, "update_from_output")
    it0, it1 = spans(trace, "step_with_batch_queue")
    wt0, wt1 = spans(trace, "result")
    ip0, ip1 = spans(trace, "_process_input_queue")
    gp0, gp1 = spans(trace, "gpu:execute_model")
    # the collector's passes in the core's process, summed up to each moment
    gcs = trace.filter(pl.col("name").cast(pl.String).str.contains(r"^gc\d$")).sort("t0_us")
    gc_t0 = gcs["t0_us"].to_numpy()
    gc_cum = np.concatenate([[0.0], np.cumsum(gcs["dur_us"].to_numpy(), dtype=float)])
    gc_traced = "gc.callbacks" in meta.get("wrapped", [])
    # each update_from_output takes the oldest step launched and not yet taken (the batch
    # queue is first in, first out); an idle wait empties the queue
    events = sorted([(t, 0, j) for j, t in enumerate(ex0)]
                    + [(t, 1, j) for j, t in enumerate(up0)]
                    + [(t, 2, 0) for t in ip0[(ip1 - ip0) > IDLE_US]])
    queue: deque[int] = deque()
    taken: dict[int, int] = {}
    for _, event, j in events:
        if event == 0:
            queue.append(j)
        elif event == 2:
            queue.clear()
        elif queue:
            taken[j] = queue.popleft()
    # the iteration that launched each step, and its wait
    it_of = np.searchsorted(it0, ex0, side="right") - 1
    waits = np.zeros(len(it0))
    np.add.at(waits, np.searchsorted(it0, wt0, side="right") - 1, wt1 - wt0)
    base = meta["clock_base_s"]

    def gpu_span(i: int) -> tuple[float, float]:
        """How long after the core's launch of step i the GPU ended it, and how long the GPU
        took from its entry event to its end (its events are recorded on entry to
        execute_model and on its return, so the span holds any wait for the launches)."""
        g = int(np.searchsorted(gp0, ex0[i] - 200))
        if g >= len(gp0) or gp0[g] > ex1[i]:
            return float("nan"), float("nan")
        return float(gp1[g] - ex1[i]) / 1e6, float(gp1[g] - gp0[g]) / 1e6

    rows = []
    for run, info in meta["experiments"].items():
        mine = steps.filter(pl.col("run") == run)
        if mine.is_empty():
            continue
        at = (info["t0_perf"] + mine["t"].to_numpy() - base) * 1e6
        u = np.searchsorted(up1, at) - 1  # the last output processed before the client had it
        for r, k in zip(mine.iter_rows(named=True), u, strict=True):
            i = taken.get(int(k)) if k >= 0 else None
            if i is None or it_of[i] < 0:
                continue
            n = it_of[i]
            tokens = r["prefill_tokens"] + r["decode_tokens"]
            kind = ("graph" if r["prefill_reqs"] == 0 else
                    "piecewise" if tokens <= piecewise_max_tokens else "eager")
            after, span = gpu_span(i)
            gc_s = ((gc_cum[np.searchsorted(gc_t0, it1[n])]
                     - gc_cum[np.searchsorted(gc_t0, it0[n])]) / 1e6 if gc_traced
                    else float("nan"))
            rows.append({"run": run, "step": r["step"], "kind": kind, "tokens": tokens,
                         "prefill_reqs": r["prefill_reqs"], "decode_reqs": r["decode_reqs"],
                         "core_s": (it1[n] - it0[n] - waits[n]) / 1e6,
                         "execute_s": (ex1[i] - ex0[i]) / 1e6,
                         "gpu_after_s": after, "gpu_s": span, "gc_s": gc_s})
    return pl.DataFrame(rows)


SPREAD_MIN_STEPS = 20
"""Steps of a kind a trace needs before its spread (`<kind>_sigma`) is read from it."""
Z90 = 1.2815516
"""The standard normal's 90th percentile: ln(p90 / p10) / (2 Z90) is a log-normal's sigma."""


def log_sigma(x: np.ndarray) -> float:
    """The sigma of a log-normal with the same 10th and 90th percentiles as `x`."""
    p10, p90 = np.percentile(x, [10, 90])
    return float(np.log(p90 / p10) / (2 * Z90))


def summary(times: pl.DataFrame) -> dict[str, Any]:
    """The two figures a profile takes (medians), with their spread and counts; and for
    each kind of step with SPREAD_MIN_STEPS or more (decode-only "graph", "piecewise", and
    "eager" past the largest CUDA graph), `<kind>_sigma`: ln(p90 / p10) / 2.563, the sigma
    of a log-normal of the same 10th and 90th percentiles (StepModel.core_graph_sigma)."""
    out: dict[str, Any] = {}
    for kind, key in (("graph", "core_graph_s"), ("piecewise", "core_piecewise_s"),
                      ("eager", None)):
        x = times.filter(pl.col("kind") == kind)["core_s"].to_numpy()
        if len(x) == 0:
            continue
        if key is not None:
            out[key] = round(float(np.median(x)), 6)
        out[f"{kind}_steps"] = len(x)
        p10, p90 = np.percentile(x, [10, 90])
        out[f"{kind}_p10_p90_s"] = [round(float(p10), 6), round(float(p90), 6)]
        if len(x) >= SPREAD_MIN_STEPS and p10 > 0:
            out[f"{kind}_sigma"] = round(log_sigma(x), 4)
    return out


LONE_MAX_TOKENS = 1100
"""The largest step `lone_eager` reads: chat-sized steps past the largest CUDA graph (513 to
1,100 tokens, the span the profiles' eager floor is fitted on, calibrate/fit.py). Past it
the core's time grows with the tokens (Llama-3.1-8B FP8 on two H100 hosts: execute_model
20.2 ms at the median on steps of 543 tokens, 28.6 on steps of 4,109), and the GPU's span
more (71 ms: `python scripts/validation_analysis.py eager llama-3.1-8b-fp8-h100-long`)."""


def lone_eager(times: pl.DataFrame) -> dict[str, Any]:
    """The core's own time on a step past the largest CUDA graph that follows a decode-only
    step (`step_core_times`; of at most LONE_MAX_TOKENS): its median (`core_eager_s`), how
    many, their spread (`eager_sigma`, as `summary` reads one, with SPREAD_MIN_STEPS or
    more) and how it drifts (`eager_rho`: the lag-1 autocorrelation of its logarithm from
    one such step to the next in a run); and the GPU's own span of those steps, at the
    median (`gpu_eager_s`). Such a step's launch is the core's alone; one that
    follows another graph-less step also waits on the GPU still running that one (its core
    time the longer: Qwen3-32B FP8 on an H100, 33.7 ms at the median after a decode-only
    step, 50.1 after a graph-less one: validation_analysis.py eager), a wait the simulator
    has as the GPU's order. Empty
    where the trace holds none."""
    if times.is_empty():
        return {}
    t = times.sort(["run", "step"]).with_columns(
        after=pl.col("kind").shift(1).over("run"),
        gap=(pl.col("step") - pl.col("step").shift(1)).over("run"))
    x = t.filter((pl.col("kind") == "eager") & (pl.col("after") == "graph")
                 & (pl.col("gap") == 1) & (pl.col("tokens") <= LONE_MAX_TOKENS))
    if x.is_empty():
        return {}
    core = x["core_s"].to_numpy()
    out: dict[str, Any] = {"core_eager_s": round(float(np.median(core)), 6),
                           "lone_eager_steps": len(core)}
    gpu = x["gpu_s"].drop_nans().drop_nulls().to_numpy()
    if len(gpu):  # the GPU's own span of those steps (step_core_times' gpu_s)
        out["gpu_eager_s"] = round(float(np.median(gpu)), 6)
    if len(core) >= SPREAD_MIN_STEPS and np.percentile(core, 10) > 0:
        out["eager_sigma"] = round(log_sigma(core), 4)
        runs = x["run"].to_numpy()
        same = runs[1:] == runs[:-1]
        if same.sum() >= SPREAD_MIN_STEPS:
            lc = np.log(core)
            out["eager_rho"] = round(float(np.corrcoef(lc[:-1][same], lc[1:][same])[0, 1]), 3)
    return out


def pack(run_dir: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A traced engine's raw core trace (the runner's `run_dir/coretrace/core-<pid>.jsonl`,
    one `[name, thread, t0_s, t1_s]` line a span, and its `engine.json`) as stored under
    validation/logs: the spans as integer microseconds from the first (`pid`, `name`,
    `thread`, `t0_us`, `dur_us`), and the json that step_core_times reads (`clock_base_s`,
    each experiment's `t0_perf` and `wall_s`, the host, the wrapped methods)."""
    frames = []
    for f in sorted((run_dir / "coretrace").glob("core-*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if rows:
            frames.append(pl.DataFrame(rows, schema=["name", "thread", "t0", "t1"], orient="row")
                          .with_columns(pid=pl.lit(int(f.stem.split("-")[1]))))
    if not frames:
        raise FileNotFoundError(f"{run_dir}/coretrace: no core-<pid>.jsonl traces")
    raw = pl.concat(frames)
    base = float(raw["t0"].min())  # type: ignore[arg-type]
    trace = raw.select(
        pl.col("pid").cast(pl.Int64), pl.col("name").cast(pl.Categorical),
        pl.col("thread").cast(pl.Categorical),
        ((pl.col("t0") - base) * 1e6).round().cast(pl.Int64).alias("t0_us"),
        ((pl.col("t1") - pl.col("t0")) * 1e6).round().cast(pl.Int32).alias("dur_us"),
    ).sort("t0_us")
    eng = json.loads((run_dir / "engine.json").read_text())
    meta = {"engine": eng["job"],
            "experiments": {k: {"t0_perf": v["t0_perf"], "wall_s": v["wall_s"]}
                            for k, v in eng["experiments"].items()
                            if "t0_perf" in v},  # not those the runner skipped
            "wrapped": eng.get("trace_core", []),
            "host": eng.get("versions", {}).get("host"),
            "clock_base_s": base}
    return trace, meta


def write_trace(trace: pl.DataFrame, path: Path) -> None:
    """Store a packed trace (`pack`) with each span's start as microseconds after the one
    before (`dt_us`, the spans in start order): the deltas compress smaller than the
    starts, which keeps the stored suite small enough to travel to the GPU host
    (tests/test_tree_size.py)."""
    trace.sort("t0_us", maintain_order=True).with_columns(
        pl.col("t0_us").diff().fill_null(pl.col("t0_us").first()).alias("t0_us")).rename(
        {"t0_us": "dt_us"}).write_parquet(path, compression="zstd", compression_level=19)


def read_trace(path: Path) -> pl.DataFrame:
    """A stored trace as `pack` made it (`write_trace`; a trace stored before, with `t0_us`,
    reads the same)."""
    trace = pl.read_parquet(path)
    if "dt_us" in trace.columns:
        trace = trace.with_columns(pl.col("dt_us").cum_sum()).rename({"dt_us": "t0_us"})
    return trace.select("pid", "name", "thread", "t0_us", "dur_us")


def measure(trace_dir: Path, engine: str, validation_dir: Path) -> dict[str, Any]:
    """summary() of one traced engine: `trace_dir/<engine>.parquet` and `.json` (as the
    thirteenth session stored them under validation/logs/s13-coretrace), its steps from the
    stored validation run in `validation_dir`."""
    trace = read_trace(trace_dir / f"{engine}.parquet")
    meta = json.loads((trace_dir / f"{engine}.json").read_text())
    steps = pl.read_parquet(validation_dir / "steps.parquet")
    out = summary(step_core_times(trace, meta, steps))
    out["engine"] = engine
    out["host"] = meta.get("host")
    return out


def lone_drafter(trace: pl.DataFrame, meta: dict[str, Any], run: dict[str, Any]
                 ) -> dict[str, Any] | None:
    """A draft-model serving engine's pace at concurrency 1 (its `run.json` as `run`, its
    core trace and the trace's metadata): over each experiment whose every workload is one
    closed-loop user, the median core step (`step_with_batch_queue`) and drafter pass
    (`propose`, on the core's thread: coretrace.py), where it holds SPREAD_MIN_STEPS passes
    or more; the medians over those experiments (with the pass's spread, `pass_sigma`, as
    `summary` reads one), how many and the passes counted. None where no experiment holds
    enough."""
    spans = trace.filter(pl.col("name").is_in(["propose", "step_with_batch_queue"]))
    passes, steps, sigmas, counted = [], [], [], 0
    for e in run["experiments"]:
        when = meta["experiments"].get(e["name"])
        if when is None or any(w["arrival"].get("concurrency") != 1 for w in e["workloads"]):
            continue
        lo = (when["t0_perf"] - meta["clock_base_s"]) * 1e6
        win = spans.filter((pl.col("t0_us") >= lo) & (pl.col("t0_us") < lo + when["wall_s"] * 1e6))
        drafter = win.filter(pl.col("name") == "propose")["dur_us"]
        if len(drafter) >= SPREAD_MIN_STEPS:
            passes.append(float(drafter.median()) / 1e6)  # type: ignore[arg-type]
            sigmas.append(log_sigma(drafter.to_numpy()))
            steps.append(float(win.filter(pl.col("name") == "step_with_batch_queue")
                               ["dur_us"].median()) / 1e6)  # type: ignore[arg-type]
            counted += len(drafter)
    if not passes:
        return None
    return {"pass_s": round(float(np.median(passes)), 6),
            "step_s": round(float(np.median(steps)), 6),
            "pass_sigma": round(float(np.median(sigmas)), 4),
            "experiments": len(passes), "steps": counted}
