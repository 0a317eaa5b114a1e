"""The engine core's time a step, drawn about its median (simulation.core_spread): the
spread comes from the serving core traces, keeps the median, and changes nothing else."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.mix import TrafficMix
from capplan.profile import Profile
from capplan.sim.replica import LaunchSpread
from capplan.sim.run import simulate
from capplan.validate.corelaunch import summary

PROFILES = CALIBRATION_DIR / "h200" / "vllm-0.26.0"


def test_the_spread_keeps_the_median_and_its_sigma() -> None:
    """Factors exp(sigma z): median 1, and the log's spread sigma."""
    draw = LaunchSpread(np.random.default_rng(0))
    x = np.log([draw.factor(0.2) for _ in range(20_000)])
    assert abs(float(np.median(x))) < 0.01
    assert abs(float(np.std(x)) - 0.2) < 0.01


def test_sigma_is_the_log_normal_of_the_traced_p10_and_p90() -> None:
    """corelaunch.summary reads each kind's sigma as ln(p90 / p10) / 2.563, and only from
    20 steps or more."""
    rng = np.random.default_rng(1)
    core = np.exp(rng.normal(math.log(3e-3), 0.15, 4000))
    times = pl.DataFrame({"kind": ["graph"] * 4000 + ["eager"] * 10,
                          "core_s": [*core, *[0.02] * 10]})
    out = summary(times)
    assert abs(out["graph_sigma"] - 0.15) < 0.01
    assert "eager_sigma" not in out and out["eager_steps"] == 10


def test_profiles_take_the_spread_of_their_models_serving_trace() -> None:
    """Every profile of a model whose serving core was traced carries that trace's spread
    (calibration/_raw/core-launch/<model>.json, scripts/core_launch.py); a graph-less
    step's, where the model's traces measured its core time apart (core-launch/eager/),
    theirs."""
    for model in ("llama-3.1-8b", "qwen3-32b", "gemma-4-31b"):
        raw = CALIBRATION_DIR / "_raw" / "core-launch"
        spread = json.loads((raw / f"{model}.json").read_text())["spread"]
        eager = raw / "eager" / f"{model}.json"
        if eager.exists():
            spread["eager"] = json.loads(eager.read_text())["eager_sigma"]
        for d in sorted((PROFILES / model).glob("*/profile.json")):
            step = Profile.load(d.parent).step
            assert (step.core_graph_sigma, step.core_piecewise_sigma, step.eager_sigma) == (
                spread["graph"], spread["piecewise"], spread["eager"]), d
            assert 0.05 < step.core_graph_sigma < 0.3


def _mix(spread: bool, profile: Path | None = None) -> TrafficMix:
    pool = {"name": "p", "model": "llama-3.1-8b", "engine": {"max_model_len": 4096}}
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [pool | ({"profile": str(profile)} if profile else {})],
        "workloads": [{"pool": "p", "name": "chat", "arrival": {"kind": "poisson",
                                                                "rate_rps": 20},
                       "input_tokens": {"kind": "constant", "value": 512},
                       "output_tokens": {"kind": "constant", "value": 128}}],
        "simulation": {"duration_s": 20.0, "warmup_s": 2.0, "core_spread": spread},
    })


def test_the_spread_is_seeded_and_moves_only_the_core_time() -> None:
    """Same seed, same result; the same requests as without the spread, their latencies
    moved: the median inter-token time within a few per cent, and a tail further out."""
    on = simulate(_mix(True), "p", 1, seed=4)
    assert on.model_dump() == simulate(_mix(True), "p", 1, seed=4).model_dump()
    off = simulate(_mix(False), "p", 1, seed=4)
    a, b = on.requests(), off.requests()
    assert a["arrival_s"].equals(b["arrival_s"]) and not a["ttft_s"].equals(b["ttft_s"])
    w_on, w_off = on.workloads[0], off.workloads[0]
    assert abs(w_on.itl_p50_s / w_off.itl_p50_s - 1) < 0.05
    assert w_on.itl_p99_s != w_off.itl_p99_s


def test_graph_less_core_time_is_drawn_where_measured(tmp_path: Path) -> None:
    """Where a profile measured the serving core's own time on a step past the largest CUDA
    graph (core_eager_s) with its spread, every such step's core time is drawn (no
    core_spread needed), from the replica's own stream: seeded, the requests the same, the
    latencies moved; with no spread the median holds every step."""
    prof = Profile.load(PROFILES / "llama-3.1-8b" / "bf16")
    assert prof.step.core_eager_s > 0 and prof.step.eager_sigma > 0
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "profile.json").write_text(prof.model_copy(update={"step": prof.step.model_copy(
        update={"eager_sigma": 0.0})}).model_dump_json())
    drawn = simulate(_mix(False), "p", 1, seed=4)
    assert drawn.model_dump() == simulate(_mix(False), "p", 1, seed=4).model_dump()
    median = simulate(_mix(False, flat), "p", 1, seed=4)
    a, b = drawn.requests(), median.requests()
    assert a["arrival_s"].equals(b["arrival_s"]) and not a["ttft_s"].equals(b["ttft_s"])
