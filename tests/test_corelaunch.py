"""The engine core's time a step: measured from the stored core traces, shipped in profiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from capplan.calibrate import store
from capplan.calibrate.build import build_profile, calibration_core, groups
from capplan.calibrate.store import CALIBRATION_DIR
from capplan.profile import Profile
from capplan.steptime import StepTimer
from capplan.validate.corelaunch import (
    SPREAD_MIN_STEPS,
    lone_drafter,
    lone_eager,
    measure,
    pack,
    read_trace,
    step_core_times,
)

ROOT = Path(__file__).resolve().parents[1]
RAW_DIR = ROOT / "calibration" / "_raw"
RAW = RAW_DIR / "core-launch"
MODELS = sorted(p.stem for p in RAW.glob("*.json"))
CORE_RUNS = sorted(p.name.removesuffix(".jsonl.xz") for p in RAW_DIR.glob("*--core.jsonl.xz"))


# every GPU's shipped figures: (gpu, model), the H200's in _raw, another GPU's in _raw/<gpu>
SHIPPED = [(gpu, p.stem) for gpu in ("h200", "h100")
           for p in sorted((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch").glob("*.json"))]


@pytest.mark.parametrize(("gpu", "model"), SHIPPED)
def test_core_launch_is_remeasured_from_its_trace(gpu: str, model: str) -> None:
    """<raw>/core-launch/<model>.json is what its stored core traces and the engines' stored
    steps give (scripts/core_launch.py), to the microsecond: the chosen engine's figures and
    those of every engine measured beside it."""
    shipped = json.loads((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch"
                          / f"{model}.json").read_text())
    for fig in (shipped, *shipped["also_measured"]):
        engine = fig["engine"]
        traces = next((ROOT / "validation" / "logs").glob(f"s*-coretrace/{engine}.parquet")).parent
        again = measure(traces, engine, CALIBRATION_DIR / gpu / "vllm-0.26.0" / model
                        / "validation" / engine)
        for key in ("core_graph_s", "core_piecewise_s", "graph_steps", "piecewise_steps"):
            assert again[key] == fig[key], (engine, key)
        # a decode-only step costs the core a few ms, a piecewise one several times that
        assert 1e-3 < fig["core_graph_s"] < 5e-3, engine
        assert 2 * fig["core_graph_s"] < fig["core_piecewise_s"] < 0.05, engine
    # a decode-only step costs the core a few ms, a piecewise one several times that
    assert 1e-3 < shipped["core_graph_s"] < 5e-3
    assert 2 * shipped["core_graph_s"] < shipped["core_piecewise_s"] < 0.05


def _profile_dirs(gpu: str, model: str) -> list[Path]:
    """Every shipped profile folder of `model` on `gpu` (at least one)."""
    dirs = [p.parent for p in (CALIBRATION_DIR / gpu / "vllm-0.26.0" / model).glob(
        "*/profile.json")]
    assert dirs
    return dirs


@pytest.mark.parametrize("model", MODELS)
def test_every_profile_of_the_model_carries_it(model: str) -> None:
    shipped = json.loads((RAW / f"{model}.json").read_text())
    for d in _profile_dirs("h200", model):
        step = Profile.load(d).step
        assert (step.core_graph_s, step.core_piecewise_s) == (
            shipped["core_graph_s"], shipped["core_piecewise_s"]), d.name


def test_step_times_charge_the_core_by_kind_of_step() -> None:
    """A decode-only step's launch is core_graph_s, a prefill within the largest CUDA graph
    core_piecewise_s, a step past it the serving core's own time for one (core_eager_s),
    else the eager floor; work is unchanged."""
    prof = Profile.load(CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / "bf16")
    s = prof.step
    timer = StepTimer(prof, max_num_seqs=1024, max_num_batched_tokens=8192)
    _, decode = timer.step_times(8, 8, 0.0, 8 * 600)
    _, piece = timer.step_times(208, 1, 208 * (1840 + 104), 0)
    _, eager = timer.step_times(2048, 1, 2048 * 1024, 0)
    assert decode == s.core_graph_s and piece == s.core_piecewise_s
    assert s.core_eager_s > 0 and eager == s.core_eager_s
    floor = StepTimer(prof.model_copy(update={"step": s.model_copy(
        update={"core_eager_s": 0.0})}), max_num_seqs=1024, max_num_batched_tokens=8192)
    assert floor.step_times(2048, 1, 2048 * 1024, 0)[1] == s.eager_floor_s
    bare = prof.model_copy(update={"step": s.model_copy(
        update={"core_graph_s": 0.0, "core_piecewise_s": 0.0})})
    t0 = StepTimer(bare, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert t0.step_times(8, 8, 0.0, 8 * 600) == (timer.step_times(8, 8, 0.0, 8 * 600)[0], 0.0)


@pytest.mark.parametrize("run", CORE_RUNS)
def test_calibration_measures_the_core_itself(run: str) -> None:
    """A core scan's steps give both figures; a piecewise step costs the core several times
    a decode-only one, as in serving; the profile of that engine records them."""
    meta = json.loads((RAW_DIR / f"{run}.meta.json").read_text())
    df = store.read_runner_jsonl(RAW_DIR / f"{run}.jsonl.xz")
    own = calibration_core(df, meta["engine"])
    assert own is not None
    assert 1e-3 < own["core_graph_s"] < 6e-3
    assert 2 * own["core_graph_s"] < own["core_piecewise_s"] < 0.05
    assert own["graph_steps"] > 50 and own["piecewise_steps"] > 50
    model, key = run.split("--")[:2]
    prov = json.loads((CALIBRATION_DIR / "h200" / "vllm-0.26.0" / model / key
                       / "provenance.json").read_text())
    got = prov["core_launch"]["calibration"]
    if got["run"] == run:
        assert got == {**own, "run": run}
    else:  # the profile's own timed runs recorded it too, and are taken first
        assert got["run"] in (f"{model}--{key}", f"{model}--{key}--r2")
        assert 0.5 < got["core_graph_s"] / own["core_graph_s"] < 2
        assert 0.5 < got["core_piecewise_s"] / own["core_piecewise_s"] < 2


def test_runs_without_the_cores_time_give_none() -> None:
    """Runners before the fourteenth session recorded no CPU time a step: nothing to take."""
    meta = json.loads((RAW_DIR / "llama-3.1-8b--bf16.meta.json").read_text())
    df = store.read_runner_jsonl(RAW_DIR / "llama-3.1-8b--bf16.jsonl.xz")
    assert "cpu_launch_s" not in df.columns
    assert calibration_core(df, meta["engine"]) is None


def test_without_a_serving_trace_the_profile_takes_the_calibrations(tmp_path: Path) -> None:
    """A model with no serving core trace gets what its calibration engine measured."""
    run = "llama-3.1-8b--bf16--core"
    for p in RAW_DIR.glob("llama-3.1-8b--bf16*"):
        if "--r" not in p.name:  # run 2 times the core itself (fifteenth session)
            (tmp_path / p.name).symlink_to(p)
    g = groups(tmp_path)[("llama-3.1-8b", "bf16")]
    profile, prov, _ = build_profile(g, tmp_path, {}, gpu="h200", git_commit="")
    meta = json.loads((RAW_DIR / f"{run}.meta.json").read_text())
    own = calibration_core(store.read_runner_jsonl(RAW_DIR / f"{run}.jsonl.xz"), meta["engine"])
    assert own is not None
    assert (profile.step.core_graph_s, profile.step.core_piecewise_s) == (
        own["core_graph_s"], own["core_piecewise_s"])
    assert prov["core_launch"]["run"] == run
    assert "in-process calibration engine" in profile.provenance.note


def test_pack_stores_a_raw_trace_compactly(tmp_path: Path) -> None:
    """The runner's raw spans become integer microseconds from the first span; the json keeps
    what step_core_times needs."""
    (tmp_path / "coretrace").mkdir()
    (tmp_path / "coretrace" / "core-7.jsonl").write_text(
        '["process", "MainThread", 100.0, 100.0]\n'
        '["execute_model", "MainThread", 100.5, 100.5125]\n')
    (tmp_path / "coretrace" / "core-3.jsonl").write_text(
        '["decode", "MainThread", 100.25, 100.26]\n')
    (tmp_path / "engine.json").write_text(json.dumps({
        "job": "e", "experiments": {"x": {"t0_perf": 100.1, "wall_s": 2.0, "requests": 4},
                                    "y": {"skipped": "time budget"}},  # never ran: left out
        "trace_core": ["Scheduler.schedule"], "versions": {"host": {"cpus": 2}}}))
    trace, meta = pack(tmp_path)
    assert trace.rows() == [(7, "process", "MainThread", 0, 0),
                            (3, "decode", "MainThread", 250_000, 10_000),
                            (7, "execute_model", "MainThread", 500_000, 12_500)]
    assert trace.schema["t0_us"] == pl.Int64 and trace.schema["dur_us"] == pl.Int32
    assert meta == {"engine": "e", "experiments": {"x": {"t0_perf": 100.1, "wall_s": 2.0}},
                    "wrapped": ["Scheduler.schedule"], "host": {"cpus": 2},
                    "clock_base_s": 100.0}


# every GPU's graph-less core figures: (gpu, model)
EAGER = [(gpu, p.stem) for gpu in ("h200", "h100")
         for p in sorted((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch" / "eager")
                         .glob("*.json"))]


@pytest.mark.parametrize(("gpu", "model"), EAGER)
def test_core_eager_is_remeasured_and_every_profile_carries_it(gpu: str, model: str) -> None:
    """<raw>/core-launch/eager/<model>.json is what its engines' stored traces give
    (corelaunch.lone_eager), its figures the medians over them; every profile of the model
    on that GPU carries them, the GPU's span its precision's where one was traced."""
    shipped = json.loads((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch" / "eager"
                          / f"{model}.json").read_text())
    assert len(shipped["engines"]) >= 1
    for fig in shipped["engines"]:
        trace = ROOT / fig["trace"]
        folder = CALIBRATION_DIR / gpu / "vllm-0.26.0" / model / "validation" / fig["engine"]
        again = lone_eager(step_core_times(read_trace(trace), json.loads(
            trace.with_suffix(".json").read_text()), pl.read_parquet(folder / "steps.parquet")))
        assert {k: fig[k] for k in again} == again, fig["engine"]
        assert fig["lone_eager_steps"] >= SPREAD_MIN_STEPS
    # a graph-less step costs the core several times a piecewise one's few ms
    assert 5e-3 < shipped["core_eager_s"] < 0.1
    assert shipped["core_eager_s"] == pytest.approx(
        float(np.median([f["core_eager_s"] for f in shipped["engines"]])), abs=1e-6)
    for d in _profile_dirs(gpu, model):
        step = Profile.load(d).step
        assert (step.core_eager_s, step.eager_sigma) == (
            shipped["core_eager_s"], shipped["eager_sigma"]), d.name
        prec = d.name.split("-")[0]
        assert step.eager_gpu_s == shipped["gpu_eager_s"].get(prec, 0.0), d.name


def test_lone_eager_reads_graph_less_steps_after_a_decode_only_one() -> None:
    """Only a graph-less step of at most LONE_MAX_TOKENS right after a decode-only step in
    the same run counts; its spread and drift need SPREAD_MIN_STEPS of them."""
    # each run: a decode-only step, a graph-less one (counted), a graph-less one after it
    # (not), a decode-only one, a long graph-less one (not: past LONE_MAX_TOKENS)
    pattern = [("graph", 40), ("eager", 600), ("eager", 600), ("graph", 40), ("eager", 4096)]
    rows = [{"run": run, "step": i, "kind": pattern[i % 5][0], "tokens": pattern[i % 5][1],
             "core_s": 0.003 if pattern[i % 5][0] == "graph" else 0.020 + i * 1e-4,
             "gpu_s": 0.017}
            for run in ("a", "b") for i in range(60)]
    t = pl.DataFrame(rows)
    got = lone_eager(t)
    counted = [r["core_s"] for r in rows if r["step"] % 5 == 1]
    assert got["lone_eager_steps"] == len(counted) == 24
    assert got["core_eager_s"] == pytest.approx(float(np.median(counted)), abs=1e-6)
    assert got["gpu_eager_s"] == pytest.approx(0.017)
    assert got["eager_rho"] > 0.9  # a steady climb within each run
    assert "eager_sigma" not in lone_eager(t.filter(pl.col("step") < 20))
    assert lone_eager(t.head(0)) == {}



DRAFTER = [(gpu, p.stem) for gpu in ("h200", "h100")
           for p in sorted((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch" / "drafter")
                           .glob("*.json"))]


@pytest.mark.parametrize(("gpu", "model"), DRAFTER)
def test_a_draft_model_profile_steps_at_the_serving_cores_median_pace(gpu: str,
                                                                      model: str) -> None:
    """<raw>/core-launch/drafter/<model>.json holds each traced draft-model engine's median
    core step and drafter pass at concurrency 1, as its stored trace gives them, and their
    medians; every draft-model profile of the model at that k prices a step of one request
    at the median (StepModel.draft_serving_scale), and the fit's error is left as fitted."""
    shipped = json.loads((store.raw_dir(CALIBRATION_DIR, gpu) / "core-launch" / "drafter"
                          / f"{model}.json").read_text())
    for fig in shipped["engines"]:
        trace = ROOT / fig["trace"]
        run = json.loads((CALIBRATION_DIR / gpu / "vllm-0.26.0" / model / "validation"
                          / fig["engine"] / "run.json").read_text())
        again = lone_drafter(read_trace(trace), json.loads(
            trace.with_suffix(".json").read_text()), run)
        assert again is not None and {k: fig[k] for k in again} == again, fig["engine"]
        assert fig["steps"] >= SPREAD_MIN_STEPS
        # the drafter holds the core most of a step
        assert 0.5 * fig["step_s"] < fig["pass_s"] < fig["step_s"]
    for key in ("step_s", "pass_sigma"):
        assert shipped[key] == pytest.approx(
            float(np.median([f[key] for f in shipped["engines"]])), abs=1e-4), key
    profiles = [Profile.load(d) for d in _profile_dirs(gpu, model)]
    drafts = [p for p in profiles if p.spec_method == "draft_model" and p.spec_k in shipped["k"]]
    assert drafts
    for p in drafts:
        timer = StepTimer(p, max_num_seqs=int(p.engine["max_num_seqs"]),  # type: ignore[call-overload]
                          max_num_batched_tokens=int(p.engine["max_num_batched_tokens"]))  # type: ignore[call-overload]
        assert timer.step_time_s(1 + p.spec_k, 1, 0.0, 576) == pytest.approx(
            shipped["step_s"], rel=1e-3)
        assert p.step.draft_serving_scale != 1.0
        # drawn every step with the engines' spread (sim/replica.py)
        assert p.step.draft_sigma == shipped["pass_sigma"] > 0
        # each traced engine's own pace, for a pool sized on one end (Profile.on_host)
        assert [h.engine for h in p.drafter_hosts] == [e["engine"] for e in shipped["engines"]]
        for h in p.drafter_hosts:
            own = p.model_copy(update={"step": p.step.model_copy(
                update={"draft_serving_scale": h.draft_serving_scale})})
            timer = StepTimer(own, max_num_seqs=int(p.engine["max_num_seqs"]),  # type: ignore[call-overload]
                              max_num_batched_tokens=int(p.engine["max_num_batched_tokens"]))  # type: ignore[call-overload]
            assert timer.step_time_s(1 + p.spec_k, 1, 0.0, 576) == pytest.approx(
                h.step_s, rel=1e-3), h.engine
    for p in profiles:
        if p not in drafts:
            assert p.step.draft_serving_scale == 1.0 and p.drafter_hosts == ()
            assert p.step.draft_sigma == 0.0


def test_the_collectors_time_is_read_per_step() -> None:
    """`gc_s`: the garbage collector's spans within the iteration that launched the step, on
    any of the core's threads (a collection holds the GIL); NaN for a trace taken before
    coretrace.py recorded them."""
    spans_ = [("step_with_batch_queue", "MainThread", 1_000, 10_000),
              ("execute_model", "MainThread", 2_000, 6_000),
              ("gc0", "MainThread", 3_000, 500),
              ("gc0", "Thread-3", 4_000, 1_000),  # the input thread's
              ("update_from_output", "MainThread", 9_000, 500),
              ("step_with_batch_queue", "MainThread", 11_000, 10_000),
              ("execute_model", "MainThread", 12_000, 3_000),
              ("gc1", "MainThread", 16_000, 2_000),
              ("update_from_output", "MainThread", 19_000, 500)]
    trace = pl.DataFrame([(1, *s) for s in spans_],
                         schema=["pid", "name", "thread", "t0_us", "dur_us"], orient="row")
    steps = pl.DataFrame({"run": ["x", "x"], "step": [0, 1], "t": [9.6e-3, 19.6e-3],
                          "prefill_reqs": [1, 0], "prefill_tokens": [300, 0],
                          "decode_reqs": [0, 1], "decode_tokens": [0, 1]})
    meta = {"experiments": {"x": {"t0_perf": 0.0}}, "clock_base_s": 0.0,
            "wrapped": ["gc.callbacks", "Scheduler.schedule"]}
    got = step_core_times(trace, meta, steps)
    assert got["kind"].to_list() == ["piecewise", "graph"]
    assert got["gc_s"].to_list() == pytest.approx([1.5e-3, 2e-3])
    assert got["core_s"].to_list() == pytest.approx([10e-3, 10e-3])  # the collector in it
    old = step_core_times(trace, {**meta, "wrapped": ["Scheduler.schedule"]}, steps)
    assert old["gc_s"].is_nan().all()
