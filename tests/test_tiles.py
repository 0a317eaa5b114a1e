"""FlashAttention 3's decode tiles (capplan/tiles.py) and their price in the step model and
the simulator (steptime.StepTimer.tail_factor, sim/core.py decode_contexts)."""

from __future__ import annotations

from typing import Any

import pytest

from capplan.mix import TrafficMix
from capplan.profile import Profile
from capplan.profiles import CALIBRATION_DIR
from capplan.sim.core import EngineCore
from capplan.sim.run import simulate
from capplan.steptime import StepTimer
from capplan.tiles import kv_blocks, splits, tail_factor

H100 = CALIBRATION_DIR / "h100" / "vllm-0.26.0" / "llama-3.1-8b" / "fp8" / "profile.json"


def _tiles(blocks: list[int]) -> int:
    return 8 * sum(splits(blocks, 8, 132))


def test_equal_decodes_tile_as_the_kernel_splits_them() -> None:
    """Equal decodes of 8,192 tokens on 132 SMs and 8 KV heads: the split rule aims at about
    120 tiles, and rounds each sequence up (prepare_varlen_num_blocks_kernel). 16 sequences
    fill a wave (128 tiles) and cost their bandwidth; 17 make 136 and leave a second wave of
    four tiles, 6 make 144: the saw-tooth the H100's sweep measured (+19.5 % and +10.8 % over
    the summed-context price at 17 and 6, +1.8 % at 16)."""
    b = kv_blocks(8192)
    assert b == 65  # the new token's slot is in the cache before the kernel reads it
    assert [_tiles([b] * n) for n in (4, 6, 16, 17, 24)] == [128, 144, 128, 136, 192]
    f = {n: tail_factor([b] * n, 8, 132, 2.3) for n in (4, 6, 16, 17, 24)}
    assert f[4] == f[16] == f[24] == 1.0
    assert f[17] > f[6] > 1.2


def test_a_fast_enough_lone_tile_frees_the_tail() -> None:
    """F is the kernel's time over the bandwidth-bound time: at least 1, falling as a lone
    tile streams faster (rho), and 1 once it can draw the whole bandwidth."""
    blocks = [32, 96, 32, 32, 96, 32, 32, 96, 32, 40]
    fs = [tail_factor(blocks, 8, 132, rho) for rho in (1.0, 1.5, 2.3, 4.0, 1e9)]
    assert fs == sorted(fs, reverse=True)
    assert fs[0] > fs[2] > 1.0 == fs[-1]


def test_the_split_rule_rounds_in_float32() -> None:
    """ceilf(float(total) * 1.1f * heads / SMs): 675 blocks of 8 heads on 132 SMs is 45.0 in
    float32 and 45.000000000000014 in double; the kernel's 45 gives two splits of 47 blocks,
    46 would give two all the same, and one of 45 three."""
    assert splits([90, 585], 8, 132) == [2, 13]


def _profile(rho: float) -> Profile:
    p = Profile.load(H100)
    return p.model_copy(update={"step": p.step.model_copy(update={"tile_rho": rho})})


def test_the_step_model_adds_the_tail_to_decode_only_steps_alone() -> None:
    """graph_ctx_s x context x (F - 1) on a decode-only step within the largest graph; a step
    with a prompt chunk, or a profile without tile_rho, is priced as before."""
    on, off = (StepTimer(_profile(r), max_num_seqs=256, max_num_batched_tokens=8192)
               for r in (2.3, 0.0))
    assert on.tiles == (8, 132) and off.tiles is None
    ctx = 17 * 8192
    blocks = (kv_blocks(8192),) * 17
    f = on.tail_factor(blocks)
    assert f > 1.2 and off.tail_factor(blocks) == 1.0
    extra = on.step_time_s(17, 17, 0.0, ctx) - off.step_time_s(17, 17, 0.0, ctx)
    assert extra == pytest.approx(on._tile_rate * ctx * (f - 1), rel=1e-9)
    # the step's own lengths, given, replace the equal ones
    assert on.step_time_s(17, 17, 0.0, ctx, tile_factor=1.0) == off.step_time_s(17, 17, 0.0, ctx)
    assert (on.step_time_s(400, 17, 384 * 192.0, ctx)
            == off.step_time_s(400, 17, 384 * 192.0, ctx))


def _rag(engine: dict[str, Any]) -> TrafficMix:
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "gpu": "h100", "precision": "fp8",
                   "engine": engine}],
        "workloads": [{
            "name": "rag", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 3},
            "input_tokens": {"kind": "lognormal", "mean": 6000, "sigma": 0.4, "max": 12000},
            "output_tokens": {"kind": "lognormal", "mean": 300, "sigma": 0.5, "max": 1000}}],
        "simulation": {"duration_s": 20.0, "warmup_s": 2.0},
    })


def test_a_decode_steps_lengths_are_its_sequences_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator hands the step model each decode's context, in the running list's
    order, with or without the decode cohort's shortcut: they sum to the step's context, and
    the two paths see the same lengths, step for step."""
    seen: list[list[int]] = []
    original = EngineCore.decode_contexts

    def checked(self: EngineCore, plan: Any) -> list[int]:
        out = original(self, plan)
        assert sum(out) == plan.decode_ctx and len(out) == len(plan.reqs) + plan.cohort_size
        seen.append(out)
        return out

    monkeypatch.setattr(EngineCore, "decode_contexts", checked)
    mix = _rag({"max_model_len": 16384, "max_num_batched_tokens": 1024})
    runs = []
    for cohort in (True, False):
        seen.clear()
        simulate(mix, "p", 1, seed=1, decode_cohort=cohort)
        runs.append(list(seen))
    assert runs[0] == runs[1]
    assert len(runs[0]) > 100 and max(map(len, runs[0])) >= 5
