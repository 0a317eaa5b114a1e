"""Requests of one prefix group read the same cached KV blocks (vLLM's prefix caching shares
the blocks themselves), and a decode step pays less for what later readers read in common
(steptime.py: shared_ctx_saving, measured by a prefix-cache engine's `shared` points)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.mix import TrafficMix
from capplan.profile import Profile
from capplan.sim.core import EngineCore
from capplan.sim.request import StepPlan
from capplan.sim.run import simulate
from capplan.steptime import StepTimer

LLAMA = CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "llama-3.1-8b" / "bf16"


def _timer(saving: float) -> StepTimer:
    prof = Profile.load(LLAMA)
    step = prof.step.model_copy(update={"shared_ctx_saving": saving})
    return StepTimer(prof.model_copy(update={"step": step}), max_num_seqs=256,
                     max_num_batched_tokens=8192)


def test_shared_context_saves_its_fraction_of_the_decode_read() -> None:
    """S tokens read in common take shared_ctx_saving of their decode_ctx_s off the step;
    S never counts past the step's decode context; a profile that measured no saving (0)
    is unchanged."""
    t = _timer(0.4)
    d_ctx = t._c[4]
    base = t.step_time_s(64, 64, 0.0, 64 * 2048)
    assert t.step_time_s(64, 64, 0.0, 64 * 2048, shared_ctx=63 * 1840) == pytest.approx(
        base - 0.4 * d_ctx * 63 * 1840)
    assert t.step_time_s(8, 8, 0.0, 100, shared_ctx=10**6) == pytest.approx(
        t.step_time_s(8, 8, 0.0, 100) - 0.4 * d_ctx * 100)
    plain = _timer(0.0)
    assert plain.step_time_s(64, 64, 0.0, 64 * 2048, shared_ctx=63 * 1840) == base


def _mix(caching: bool) -> TrafficMix:
    engine: dict[str, Any] = {"enable_prefix_caching": caching, "max_num_seqs": 64,
                              "max_model_len": 8192}
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "precision": "bf16",
                   "engine": engine}],
        "workloads": [
            {"name": "agents", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 30},
             "input_tokens": {"kind": "lognormal", "mean": 2000, "sigma": 0.5, "max": 6000},
             "output_tokens": {"kind": "lognormal", "mean": 150, "sigma": 0.6, "max": 600},
             "prefix": {"shared_tokens": 1536, "groups": 3, "zipf_s": 1.0}},
            {"name": "chat", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 10},
             "input_tokens": {"kind": "constant", "value": 512},
             "output_tokens": {"kind": "constant", "value": 128}},
        ],
        "simulation": {"duration_s": 20.0, "warmup_s": 2.0, "drain_s": 60.0, "seed": 3},
    })


def _recount(core: EngineCore) -> float:
    """S from scratch: per prefix group among the running requests, (readers - 1) x their
    mean shared tokens."""
    groups: defaultdict[int, list[int]] = defaultdict(list)
    for r in core.running:
        if r.prefix_blocks:
            groups[r.prefix_base].append(r.prefix_blocks * core.cfg.block_size)
    return sum((len(v) - 1) * sum(v) / len(v) for v in groups.values() if len(v) > 1)


@pytest.mark.parametrize("blocks", [None, 3000], ids=["plenty", "preempting"])
def test_shared_reads_follow_the_running_requests(monkeypatch: pytest.MonkeyPatch,
                                                   blocks: int | None) -> None:
    """The engine keeps S as requests start, finish and are preempted; at every step it
    equals a recount over the running list (also when KV runs short and preemption sends
    readers back to the queue)."""
    seen: list[tuple[float, float]] = []
    schedule = EngineCore.schedule

    def checked(self: EngineCore) -> StepPlan:
        plan = schedule(self)
        seen.append((plan.shared_ctx, _recount(self)))
        return plan

    monkeypatch.setattr(EngineCore, "schedule", checked)
    prof = Profile.load(LLAMA)
    if blocks is not None:  # a KV pool of about `blocks` blocks at the pool's utilisation
        kv = prof.kv.model_copy(update={"slope_tokens": blocks * 16 / 0.9,
                                        "intercept_tokens": 0.0})
        prof = prof.model_copy(update={"kv": kv})
    res = simulate(_mix(True), "p", 1, profile=prof)
    assert len(seen) > 500 and max(s for s, _ in seen) > 10_000
    for kept, recount in seen:
        assert kept == pytest.approx(recount, abs=1e-6)
    if blocks is not None:
        assert res.pool.preemptions > 0


def test_no_prefix_caching_no_shared_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """With prefix caching off every request holds blocks of its own: nothing is shared."""
    seen: list[float] = []
    schedule = EngineCore.schedule

    def checked(self: EngineCore) -> StepPlan:
        plan = schedule(self)
        seen.append(plan.shared_ctx)
        return plan

    monkeypatch.setattr(EngineCore, "schedule", checked)
    simulate(_mix(False), "p", 1)
    assert seen and not any(seen)


def test_shared_prefix_decodes_faster_with_the_measured_saving() -> None:
    """Serving a shared-prefix mix, the measured saving shortens inter-token latency against
    the same profile without it."""
    mix = _mix(True)
    prof = Profile.load(LLAMA)
    assert prof.step.shared_ctx_saving > 0.2
    none = prof.model_copy(update={"step": prof.step.model_copy(
        update={"shared_ctx_saving": 0.0})})
    fast = simulate(mix, "p", 1, profile=prof).workload("agents")
    slow = simulate(mix, "p", 1, profile=none).workload("agents")
    assert fast.itl_p50_s < slow.itl_p50_s
