"""The engine core's time a step: measured from the stored core traces, shipped in profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.profile import Profile, StepTimer
from capplan.validate.corelaunch import measure

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "calibration" / "_raw" / "core-launch"
TRACES = ROOT / "validation" / "logs" / "s13-coretrace"
MODELS = sorted(p.stem for p in RAW.glob("*.json"))


@pytest.mark.parametrize("model", MODELS)
def test_core_launch_is_remeasured_from_its_trace(model: str) -> None:
    """calibration/_raw/core-launch/<model>.json is what its stored core trace and the
    engine's stored steps give (scripts/core_launch.py), to the microsecond."""
    shipped = json.loads((RAW / f"{model}.json").read_text())
    engine = shipped["engine"]
    again = measure(TRACES, engine, CALIBRATION_DIR / "h200" / "vllm-0.26.0" / model
                    / "validation" / engine)
    for key in ("core_graph_s", "core_piecewise_s", "graph_steps", "piecewise_steps"):
        assert again[key] == shipped[key], key
    # a decode-only step costs the core a few ms, a piecewise one several times that
    assert 1e-3 < shipped["core_graph_s"] < 5e-3
    assert 2 * shipped["core_graph_s"] < shipped["core_piecewise_s"] < 0.05


@pytest.mark.parametrize("model", MODELS)
def test_every_profile_of_the_model_carries_it(model: str) -> None:
    shipped = json.loads((RAW / f"{model}.json").read_text())
    dirs = [p.parent for p in (CALIBRATION_DIR / "h200" / "vllm-0.26.0" / model).glob(
        "*/profile.json")]
    assert dirs
    for d in dirs:
        step = Profile.load(d).step
        assert (step.core_graph_s, step.core_piecewise_s) == (
            shipped["core_graph_s"], shipped["core_piecewise_s"]), d.name


def test_step_times_charge_the_core_by_kind_of_step() -> None:
    """A decode-only step's launch is core_graph_s, a prefill within the largest CUDA graph
    core_piecewise_s, a step past it the eager floor; work is unchanged."""
    prof = Profile.load(CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / "bf16")
    s = prof.step
    timer = StepTimer(prof, max_num_seqs=1024, max_num_batched_tokens=8192)
    _, decode = timer.step_times(8, 8, 0.0, 8 * 600)
    _, piece = timer.step_times(208, 1, 208 * (1840 + 104), 0)
    _, eager = timer.step_times(2048, 1, 2048 * 1024, 0)
    assert decode == s.core_graph_s and piece == s.core_piecewise_s
    assert eager == s.eager_floor_s
    bare = prof.model_copy(update={"step": s.model_copy(
        update={"core_graph_s": 0.0, "core_piecewise_s": 0.0})})
    t0 = StepTimer(bare, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert t0.step_times(8, 8, 0.0, 8 * 600) == (timer.step_times(8, 8, 0.0, 8 * 600)[0], 0.0)
