"""Pool advice is computed by simulating the change, never written by hand (the seeds' pool
table: latency-bound and batch traffic in separate pools)."""

from __future__ import annotations

from pathlib import Path

from capplan.mix import load_mix
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
