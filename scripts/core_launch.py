"""Write calibration/_raw/core-launch/<model>.json (another GPU's in its own raw folder,
calibration/_raw/h100/core-launch/): the serving engine core's own time a step, measured
from the validation engines whose core was traced (validate/corelaunch.py; the H200's
traces in validation/logs/s13-coretrace and s14-coretrace, the H100's in s33-coretrace).
`capplan calibrate [--gpu G] --from-raw` puts the figures in every profile of the model
(calibrate/build.py: core_launch).

    python scripts/core_launch.py          # write the files, print what they hold

Each model also takes the spread of each kind of step's core time (`spread`, sigma of its
logarithm; sim/replica.py LaunchSpread): the chosen engine's where its trace has 20 such
steps, else the median of the model's other traced engines'.

It also writes <raw>/core-launch/eager/<model>.json for every model and GPU whose traced
serving engines (text alone, no drafter; any stored core trace) hold 20 graph-less steps of
at most 1,100 tokens after a decode-only step (`write_eager`): the core's own time on such a
step, the median over those engines, since hosts differ there more than anywhere
(StepModel.core_eager_s, eager_sigma, and the GPU's span by precision, eager_gpu_s; forty-first
session).

Each model takes the engine measured on the host whose small prefills took what most of the
suite's hosts took (docs/validation.md, "Where the engine core's time goes"): Llama-3.1-8B
BF16 on the thirteenth session's third lease (cache-hit TTFT p50 18.9 ms there, 18.0-22.0 ms on
five of the six leases that ran the experiment, 13.3 ms on the other), and Qwen3-32B BF16 on
the same host. The other traced engines, on three other leases, are kept beside it as
`also_measured` (the fifth lease's Llama BF16 engine, measured after the figures were chosen,
took 2.93 and 12.14 ms; the fourteenth session's, 2.86 and 12.56 ms). Gemma 4 31B takes its
one traced engine, FP8 (fourteenth session). On the H100, Llama-3.1-8B takes its first
step-traced serving engine, FP8 (thirty-third session), for both precisions, as the H200's
BF16 engine serves the H200's FP8 profile; Qwen3-32B its one, FP8 (thirty-fifth session).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from capplan.validate.corelaunch import (
    LONE_MAX_TOKENS,
    SPREAD_MIN_STEPS,
    lone_drafter,
    lone_eager,
    measure,
    read_trace,
    step_core_times,
    summary,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Host:
    """One GPU's traced serving engines: where their traces and validation folders are, where
    the figures go (the GPU's raw folder, store.raw_dir), and each model's chosen engine
    with the others measured beside it."""

    traces: tuple[Path, ...]
    validation: Path
    out: Path
    chosen: dict[str, tuple[str, list[str]]]
    # traced engines of a model measured and printed, not written (no profile takes them)
    unchosen: dict[str, list[str]] = field(default_factory=dict)

    def trace_dir(self, engine: str) -> Path:
        """The folder holding the engine's stored core trace."""
        return next(d for d in self.traces if (d / f"{engine}.parquet").exists())

    def measure(self, model: str, engine: str) -> dict[str, Any]:
        """The engine's core time a step, from its stored trace and steps (`measure`)."""
        return measure(self.trace_dir(engine), engine, self.validation / model / "validation"
                       / engine)


HOSTS = {
    "h200": Host(
        traces=tuple(ROOT / "validation" / "logs" / d for d in ("s13-coretrace", "s14-coretrace")),
        validation=ROOT / "calibration" / "h200" / "vllm-0.26.0",
        out=ROOT / "calibration" / "_raw" / "core-launch",
        chosen={
            "llama-3.1-8b": ("llama-3.1-8b-bf16-hostb",
                             ["llama-3.1-8b-bf16-core2", "llama-3.1-8b-fp8-core2",
                              "llama-3.1-8b-fp8-hostc", "llama-3.1-8b-bf16-oos13",
                              "llama-3.1-8b-fp8-oos13", "llama-3.1-8b-bf16-core3"]),
            "qwen3-32b": ("qwen3-32b-bf16-core", ["qwen3-32b-fp8-core"]),
            "gemma-4-31b": ("gemma-4-31b-fp8-core", []),
        }),
    # the H100's step-traced serving engines (`measure` needs step records, trace_steps):
    # Llama-3.1-8B FP8 (thirty-third session), chosen for both precisions, with BF16's
    # shared-prefix engine of the thirty-fifth beside it. Qwen3-32B FP8's (thirty-fifth) is
    # measured and not chosen: its piecewise figure rests on 4 steps (38.7 ms, 2.6x the
    # calibration engine's 15.0), and taken it moved chat-c1's TTFT p50 from -2 % to +6 %
    # and no row into its target; the profile keeps the calibration engine's figures. AWQ's
    # step-traced engine (thirty-ninth session) holds 2 piecewise steps (chat's 512-token
    # prompts join decodes past the largest CUDA graph) and a decode-only figure of 4.63 ms
    # from the slowest H100 host met (its model-runner calls 2.3-2.7x the fast lease's):
    # measured, printed, not chosen either. FP8's of the fortieth session (3.49 ms, 1,794
    # decode-only steps; 16.6 ms, 10 piecewise; the calibration engine's 3.37 and 15.8) is
    # printed too, and its second, `-t2`: their 356 and 619 steps past the largest CUDA graph
    # took the core 43.8 and 38.7 ms at the median, which no profile term holds yet (`python
    # scripts/validation_analysis.py coretrial qwen3-32b-fp8-h100-t`: docs/validation.md,
    # fortieth session)
    "h100": Host(
        traces=tuple(ROOT / "validation" / "logs" / d
                     for d in ("s33-coretrace", "s35-coretrace", "s39-coretrace",
                               "s40-coretrace")),
        validation=ROOT / "calibration" / "h100" / "vllm-0.26.0",
        out=ROOT / "calibration" / "_raw" / "h100" / "core-launch",
        chosen={"llama-3.1-8b": ("llama-3.1-8b-fp8-h100", ["llama-3.1-8b-bf16-prefixrep-h100-t"])},
        unchosen={"qwen3-32b": ["qwen3-32b-fp8-h100-b", "qwen3-32b-awq-h100-t",
                                "qwen3-32b-fp8-h100-t", "qwen3-32b-fp8-h100-t2"]}),
}


def model_figures(host: Host, model: str) -> dict[str, object]:
    engine, others = host.chosen[model]
    out: dict[str, Any] = host.measure(model, engine)
    out["trace"] = str((host.trace_dir(engine) / f"{engine}.parquet").relative_to(ROOT))
    out["command"] = "python scripts/core_launch.py"
    out["also_measured"] = [host.measure(model, o) for o in others]
    out["spread"], out["spread_from"] = spread(out)
    return out


def spread(fig: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """Each kind of step's spread (sigma of the log of the core's time, corelaunch.summary):
    the chosen engine's where its trace has enough such steps, else the median over the
    model's other traced engines that have; a kind no trace has enough of takes the next
    kind's (eager from piecewise, piecewise from decode-only): past the largest graph, as in
    a piecewise step, the core's time is launching, layer by layer."""
    rows = [fig, *fig["also_measured"]]
    out: dict[str, float] = {}
    why: dict[str, str] = {}
    for kind in ("graph", "piecewise", "eager"):
        key = f"{kind}_sigma"
        if key in fig:
            out[kind], why[kind] = fig[key], str(fig["engine"])
            continue
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[kind] = round(float(statistics.median(vals)), 4)
            why[kind] = "median of " + ", ".join(str(r["engine"]) for r in rows if key in r)
    for kind, fallback in (("piecewise", "graph"), ("eager", "piecewise")):
        if kind not in out:
            out[kind], why[kind] = out[fallback], f"as {fallback} (no trace has enough)"
    return out, why


def lone_engines(gpu: str, model: str) -> list[dict[str, Any]]:
    """`lone_eager` of every step-traced serving engine of `model` on `gpu` that served text
    alone without speculative decoding (a picture's encoder and a drafter's passes hold the
    core on such a step too, and the simulator charges them apart), each with its trace, and
    its host; those with SPREAD_MIN_STEPS such steps or more."""
    validation = ROOT / "calibration" / gpu / "vllm-0.26.0" / model / "validation"
    out = []
    for trace in sorted((ROOT / "validation" / "logs").glob("s*-coretrace/*.parquet")):
        engine = trace.stem
        folder = validation / engine
        if ".start" in engine or not (folder / "steps.parquet").exists():
            continue
        run = json.loads((folder / "run.json").read_text())
        if run.get("draft_model") or run["pool"]["engine"].get("speculative") or any(
                w.get("image") for e in run["experiments"] for w in e["workloads"]):
            continue
        meta = json.loads(trace.with_suffix(".json").read_text())
        times = step_core_times(read_trace(trace), meta, pl.read_parquet(folder / "steps.parquet"))
        fig = lone_eager(times)
        if fig.get("lone_eager_steps", 0) >= SPREAD_MIN_STEPS:
            # the same host's decode-only step beside it, and its piecewise one where it ran
            # enough: how fast the host's core is (Profile.hosts, a pool's `host: slowest`)
            own = summary(times)
            piecewise = ({"core_piecewise_s": own["core_piecewise_s"],
                          "piecewise_steps": own["piecewise_steps"]}
                         if own.get("piecewise_steps", 0) >= SPREAD_MIN_STEPS else {})
            out.append({**fig, "core_graph_s": own["core_graph_s"], **piecewise,
                        "engine": engine, "precision": run["pool"]["precision"],
                        "trace": str(trace.relative_to(ROOT)), "host": meta.get("host")})
    return out


def write_eager(gpu: str, host: Host, model: str) -> None:
    """<raw>/core-launch/eager/<model>.json: the core's own time on a chat-sized step past
    the largest CUDA graph that follows a decode-only one (StepModel.core_eager_s), its
    spread and drift: the median, over the model's traced engines on this GPU, of each
    engine's (`lone_engines`). Hosts differ (Qwen3-32B FP8 on three H100 hosts: 18.8, 33.7,
    42.4 ms), so no one host's figure is taken; nothing is written where no engine has
    enough such steps."""
    rows = lone_engines(gpu, model)
    path = host.out / "eager" / f"{model}.json"
    if not rows:
        path.unlink(missing_ok=True)
        return
    fig: dict[str, Any] = {
        key: round(float(np.median([r[key] for r in rows if key in r])), 6 if key ==
                   "core_eager_s" else 4)
        for key in ("core_eager_s", "eager_sigma", "eager_rho")}
    # the GPU's span of such a step is the precision's, not the host's: each precision's
    # median over its engines (StepModel.eager_gpu_s; a trace's span holds any wait for the
    # core's launches, which a slow host lengthens, yet the least of the engines' medians
    # put fewer rows within target: `python scripts/validation_analysis.py coresuite`,
    # "gpumin")
    fig["gpu_eager_s"] = {
        prec: round(float(np.median([r["gpu_eager_s"] for r in rows
                                     if r["precision"] == prec and "gpu_eager_s" in r])), 6)
        for prec in sorted({r["precision"] for r in rows if "gpu_eager_s" in r})}
    fig |= {"engines": rows, "min_steps": SPREAD_MIN_STEPS, "max_tokens": LONE_MAX_TOKENS,
            "command": "python scripts/core_launch.py"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fig, indent=1) + "\n")
    print(f"{gpu} {model:14s} graph-less core {fig['core_eager_s'] * 1e3:.1f} ms, sigma "
          f"{fig['eager_sigma']}, rho {fig['eager_rho']}, GPU "
          + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in fig["gpu_eager_s"].items())
          + " ms: median of "
          + ", ".join(f"{r['engine']} {r['core_eager_s'] * 1e3:.1f} ({r['lone_eager_steps']}; "
                      f"GPU {r.get('gpu_eager_s', float('nan')) * 1e3:.1f}, decode-only "
                      f"{r['core_graph_s'] * 1e3:.2f})" for r in rows))


def drafter_engines(gpu: str, model: str) -> list[dict[str, Any]]:
    """Each core-traced serving engine of `model` on `gpu` with a draft model: the median
    time its core spent in the drafter's pass a step (`propose`, on the core's thread:
    validate/coretrace.py) over the steps of its concurrency-1 experiments, each a decode
    of one request at a time, and its host."""
    validation = ROOT / "calibration" / gpu / "vllm-0.26.0" / model / "validation"
    out = []
    for path in sorted((ROOT / "validation" / "logs").glob("s*-coretrace/*.parquet")):
        folder = validation / path.stem
        if not (folder / "run.json").exists():
            continue
        run = json.loads((folder / "run.json").read_text())
        spec = run["pool"]["engine"].get("speculative") or {}
        if spec.get("method") != "draft_model":
            continue
        meta = json.loads(path.with_suffix(".json").read_text())
        fig = lone_drafter(read_trace(path), meta, run)
        if fig is not None:
            out.append({"engine": path.stem, **fig, "k": int(spec["num_speculative_tokens"]),
                        "trace": str(path.relative_to(ROOT)), "host": meta.get("host")})
    return out


def write_drafter(gpu: str, host: Host, model: str) -> None:
    """<raw>/core-launch/drafter/<model>.json: the drafter's pass a step, on the serving
    engine's core, at concurrency 1: the median over the model's traced draft-model engines
    on this GPU of each one's (`drafter_engines`). A draft model's 1B forwards are launched
    layer by layer on the core's thread, so the pass is the host's (1.0-1.8x the calibration
    engine's on ten H200 engines: docs/validation-log.md, twenty-seventh session) and no one
    host's figure is taken; `capplan calibrate --from-raw` prices a draft-model profile's
    drafter terms at it (calibrate/build.py: drafter_serving)."""
    rows = drafter_engines(gpu, model)
    # one k, so that the profiles compare like with like (build.py prices the pass at it)
    rows = [r for r in rows if r["k"] == max((r["k"] for r in rows), default=0)]
    path = host.out / "drafter" / f"{model}.json"
    if not rows:
        path.unlink(missing_ok=True)
        return
    fig = {"step_s": round(float(np.median([r["step_s"] for r in rows])), 6),
           "pass_sigma": round(float(np.median([r["pass_sigma"] for r in rows])), 4),
           "pass_s": round(float(np.median([r["pass_s"] for r in rows])), 6),
           "k": [rows[0]["k"]], "engines": rows,
           "min_steps": SPREAD_MIN_STEPS, "command": "python scripts/core_launch.py"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fig, indent=1) + "\n")
    print(f"{gpu} {model:14s} draft model at concurrency 1: the core's step "
          f"{fig['step_s'] * 1e3:.2f} ms, the drafter's pass {fig['pass_s'] * 1e3:.2f}: median "
          "of " + ", ".join(f"{r['engine']} {r['step_s'] * 1e3:.2f} / {r['pass_s'] * 1e3:.2f} "
                            f"({r['steps']})" for r in rows))


def main() -> None:
    for gpu, host in HOSTS.items():
        host.out.mkdir(parents=True, exist_ok=True)
        for model in host.chosen:
            write(gpu, host, model)
        for model, engines in host.unchosen.items():
            for name in engines:
                show(gpu, model, host.measure(model, name), "not chosen")
        for model in sorted(p.name for p in host.validation.iterdir() if p.is_dir()):
            write_eager(gpu, host, model)
            write_drafter(gpu, host, model)


def write(gpu: str, host: Host, model: str) -> None:
    fig = model_figures(host, model)
    (host.out / f"{model}.json").write_text(json.dumps(fig, indent=1) + "\n")
    rows = [fig, *fig["also_measured"]]  # type: ignore[list-item]
    for r in rows:
        show(gpu, model, r)
    print(f"{gpu} {model:14s} spread taken: " + ", ".join(
        f"{k} {v} ({fig['spread_from'][k]})" for k, v in fig["spread"].items()))


def show(gpu: str, model: str, r: dict[str, Any], tag: str = "") -> None:
    print(f"{gpu} {model:14s} {r['engine']:26s} decode-only {r['core_graph_s'] * 1e3:5.2f} "
          f"ms ({r['graph_steps']} steps), piecewise {r['core_piecewise_s'] * 1e3:5.2f} ms "
          f"({r['piecewise_steps']} steps), eager {r.get('eager_steps', 0)} steps; "
          "sigma " + " / ".join(str(r.get(f"{k}_sigma", "-"))
                                for k in ("graph", "piecewise", "eager"))
          + (f" ({tag})" if tag else ""))


if __name__ == "__main__":
    sys.exit(main())
