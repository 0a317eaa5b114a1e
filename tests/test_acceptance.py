"""Draft acceptance: the traffic file's two ways to give it, and what the simulator does with
it. vLLM logs "Mean acceptance length" (vllm/v1/spec_decode/metrics.py: 1 + accepted drafts /
drafts, the bonus token included); the simulator accepts each draft with probability α once
every draft before it was accepted (sim/core.py update_from_output)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from capplan.mix import TrafficMix
from capplan.pool import SpeculativeConfig, alpha_from_mean_length
from capplan.sim.core import CoreConfig, EngineCore
from capplan.sim.request import SimRequest


@given(st.integers(1, 8), st.floats(0.0, 0.98))
@settings(deadline=None)  # the first example imports scipy.optimize
def test_mean_length_solves_back_to_the_acceptance(k: int, alpha: float) -> None:
    length = 1 + sum(alpha**i for i in range(1, k + 1))
    assert alpha_from_mean_length(length, k) == pytest.approx(alpha, abs=1e-6)


def test_simulated_tokens_per_step_are_the_mean_acceptance_length() -> None:
    """What a user reads off vLLM's log is what the simulator's decoders gain a step: 2.5
    tokens a verify step at k = 4, over 20,000 steps (the draw's own spread is ~0.3 %)."""
    k, length = 4, 2.5
    alpha = alpha_from_mean_length(length, k)
    core = EngineCore(CoreConfig(num_blocks=4096, block_size=16, spec_k=k, max_model_len=10**6,
                                 async_scheduling=False), random.Random(3), [alpha])
    for rid in range(4):
        core.add_request(SimRequest(rid, 0, 0.0, 16, 10**6))
    tokens = steps = 0
    for _ in range(5_000):
        plan = core.schedule()
        out = core.update_from_output(plan)
        spec = dict(zip((r.rid for r in plan.reqs), plan.spec, strict=True))
        for r, n, _done in out:
            if spec[r.rid] == k:  # a verify step (not the prefill)
                tokens += n
                steps += 1
    assert steps > 19_000
    assert tokens / steps == pytest.approx(length, rel=0.01)


def test_pool_takes_a_mean_acceptance_length_for_its_k() -> None:
    spec = SpeculativeConfig(method="mtp", num_speculative_tokens=2, mean_acceptance_length=2.19)
    assert spec.acceptance == pytest.approx(0.7, abs=1e-6)
    # a dumped config carries both and loads again
    assert SpeculativeConfig.model_validate(spec.model_dump()) == spec


@pytest.mark.parametrize(("fields", "message"), [
    ({"mean_acceptance_length": 3.0}, r"below 1 \+ k = 3"),
    ({"mean_acceptance_length": 2.0, "acceptance": 0.5}, "not both"),
])
def test_pool_refuses_a_mean_length_it_cannot_meet(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SpeculativeConfig(method="mtp", num_speculative_tokens=2, **fields)


def _mix(speculative: Any, **workload: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b",
                   "engine": {"speculative": speculative}}],
        "workloads": [{"name": "w", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 1},
                       "input_tokens": {"kind": "constant", "value": 64},
                       "output_tokens": {"kind": "constant", "value": 16}, **workload}],
    }


def test_workload_mean_length_is_read_at_its_pools_k() -> None:
    k4 = {"method": "draft_model", "num_speculative_tokens": 4}
    mix = TrafficMix.model_validate(_mix(k4, spec_mean_acceptance_length=2.5))
    w, spec = mix.workloads[0], mix.pools[0].engine.speculative
    assert spec is not None
    assert w.acceptance(spec) == pytest.approx(alpha_from_mean_length(2.5, 4))


@pytest.mark.parametrize(("speculative", "workload", "message"), [
    ({"method": "mtp", "num_speculative_tokens": 2}, {"spec_mean_acceptance_length": 3.5},
     r"workloads\.0\.spec_mean_acceptance_length: .*below 1 \+ k = 3"),
    ("auto", {"spec_mean_acceptance_length": 2.0}, "fixes none; give spec_acceptance"),
    ({"method": "mtp", "num_speculative_tokens": 2},
     {"spec_mean_acceptance_length": 2.0, "spec_acceptance": 0.5}, "not both"),
])
def test_workload_mean_length_errors_name_the_field(
    speculative: Any, workload: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        TrafficMix.model_validate(_mix(speculative, **workload))
