"""Pool advice is computed by simulating the change, never written by hand (the seeds' pool
table: latency-bound and batch traffic in separate pools)."""

from __future__ import annotations

import re
from pathlib import Path

from capplan.mix import TrafficMix, load_mix
from capplan.pool import EngineConfig
from capplan.solve.choose import MAX_NUM_BATCHED_TOKENS_LADDER, with_pool
from capplan.solve.options import size_mix

MIXED = Path(__file__).parent / "data" / "size-mixed-batch.yaml"


def test_batch_workload_sharing_a_latency_pool_gets_batch_pool_advice() -> None:
    """A workload with only an E2E SLO that shares a pool with chat is advised into a batch
    pool with speculative decoding at low priority, with the GPUs of both pools simulated;
    here its long prompts stall chat's decodes, so the split saves GPUs."""
    plan = size_mix(load_mix(MIXED), quick=True)
    (pool,) = plan.pools
    advice = [a for a in pool.advice if a.kind == "batch_pool"]
    assert len(advice) == 1, pool.advice
    a = advice[0]
    assert "summarise" in a.message and "draft_model" in a.message
    assert a.gpus_saved is not None and a.gpus_saved > 0


def test_pool_of_only_latency_workloads_gets_no_batch_pool_advice() -> None:
    """No batch workload, no batch-pool advice."""
    mix = load_mix(MIXED)
    only_chat = mix.model_copy(update={"workloads": [mix.workloads[0]]})
    plan = size_mix(only_chat, quick=True)
    assert not [a for a in plan.pools[0].advice if a.kind == "batch_pool"]


BUDGET = Path(__file__).parents[1] / "examples" / "token-budget.yaml"


def _fixed_budget(budget: int) -> TrafficMix:
    """examples/token-budget.yaml with its token budget fixed instead of left `auto` (and
    max_num_seqs within it, as vLLM needs)."""
    mix = load_mix(BUDGET)
    pool = mix.pools[0]
    engine = EngineConfig.model_validate(
        {**pool.engine.model_dump(mode="json"), "max_num_batched_tokens": budget,
         "max_num_seqs": min(budget, pool.engine.max_num_seqs)})
    return with_pool(mix, pool.model_copy(update={"engine": engine}))


def test_a_binding_itl_at_a_fixed_budget_gets_token_budget_advice() -> None:
    """Long prompts under a tight ITL SLO at vLLM's default budget: the advice names a smaller
    budget and the GPUs it needs, the same count the pool sized at that budget gets, and
    fewer than the plan's, whose count it names and saves from."""
    plan = size_mix(_fixed_budget(8192), quick=True)
    (pool,) = plan.pools
    assert pool.binding_slo.startswith("itl")
    (a,) = [a for a in pool.advice if a.kind == "token_budget"]
    budget = int(re.search(r"max_num_batched_tokens (\d+)", a.message)[1])  # type: ignore[index]
    assert budget in MAX_NUM_BATCHED_TOKENS_LADDER and budget < 8192
    assert a.gpus_saved is not None and a.gpus_saved > 0
    smaller = size_mix(_fixed_budget(budget), quick=True, advice=False).pools[0]
    assert f"needs {smaller.gpus} GPUs" in a.message and smaller.gpus < pool.gpus
    # set against the plan's own count, not its probe answer (which can sit one above)
    assert f"against {pool.gpus} at 8192" in a.message
    assert a.gpus_saved == pool.gpus - smaller.gpus


def test_no_token_budget_advice_where_the_budget_was_searched_or_is_the_least() -> None:
    """A budget left `auto` was searched (the runners-up say what each needs), and the
    smallest budget has nothing smaller to try: no token-budget advice either way."""
    for mix in (load_mix(BUDGET), _fixed_budget(min(MAX_NUM_BATCHED_TOKENS_LADDER))):
        plan = size_mix(mix, quick=True)
        assert not [a for a in plan.pools[0].advice if a.kind == "token_budget"]


def test_the_budget_advice_reads_an_e2e_in_seconds_and_a_gap_in_milliseconds() -> None:
    from capplan.units import duration

    assert duration(12.345) == "12.35 s"
    assert duration(0.4123) == "412.3 ms"
    assert duration(None) == duration(float("inf")) == "unfinished"
