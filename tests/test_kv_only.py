"""KV capacities measured without a step sweep (`runner.py --kv-only` on the H200), checked
against the model that predicts them where no profile was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profiles import resolve_profile

KV_ONLY = Path(__file__).resolve().parents[1] / "calibration/h200/vllm-0.26.0/llama-3.1-8b/kv-only"


@pytest.mark.parametrize("util", [85, 90, 95])
def test_fp8_kv_cache_capacity_is_predicted_within_one_percent(util: int) -> None:
    meta = json.loads((KV_ONLY / f"bf16-kvfp8-u{util}.json").read_text())
    assert meta["versions"]["gpu_name"] == "NVIDIA H200" and meta["versions"]["vllm"] == "0.26.0"
    assert meta["kv"]["cache_dtype"] == "fp8"
    measured = meta["kv"]["kv_tokens"]
    pool = Pool.model_validate({"name": "p", "model": "llama-3.1-8b", "precision": "bf16",
                                "engine": {"kv_cache_dtype": "fp8", "max_model_len": 32768}})
    prof = resolve_profile(pool, load_model_spec("llama-3.1-8b"))
    predicted = prof.kv.tokens(util / 100)
    assert predicted == pytest.approx(measured, rel=0.01)


def test_fp8_kv_cache_doubles_the_tokens_of_bf16() -> None:
    """Same memory, one byte per element instead of two: twice the tokens (to 0.5 %)."""
    fp8 = json.loads((KV_ONLY / "bf16-kvfp8-u90.json").read_text())["kv"]["kv_tokens"]
    bf16 = json.loads((KV_ONLY.parent / "bf16/profile.json").read_text())["kv"]["measured"]
    at90 = next(m["tokens"] for m in bf16 if m["gpu_memory_utilization"] == 0.9)
    assert fp8 / at90 == pytest.approx(2.0, rel=0.005)
