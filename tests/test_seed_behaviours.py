"""The seeds' measured behaviours (shared/seeds/DIGEST.md) must emerge from `simulate` on the
analytic H200 profile, qualitatively, without being painted on. One test per behaviour; the
set-ups copy the seeds' (closed-loop concurrency like `vllm bench --max-concurrency`).

The analytic profile is pinned (measured profiles under calibration/ would otherwise be
picked up, and a refit must not move these tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.profiles import resolve_profile
from capplan.sim.results import SimResult
from capplan.sim.run import simulate

SEED = 0
NO_CALIBRATION = Path(__file__).parent / "no-such-calibration-dir"  # -> analytic profile


def workload(name: str = "w", *, concurrency: int | None = 32, inp: int = 1000,
             out: int = 200, **extra: Any) -> dict[str, Any]:
    """Lengths uniform in [x/2, 3x/2], as a benchmark's spread of prompts."""
    arrival = extra.pop("arrival", {"kind": "closed", "concurrency": concurrency})
    return {
        "name": name, "pool": "p", "arrival": arrival,
        "input_tokens": {"kind": "uniform", "low": inp // 2, "high": inp * 3 // 2},
        "output_tokens": {"kind": "uniform", "low": out // 2, "high": out * 3 // 2},
        **extra,
    }


def run(workloads: list[dict[str, Any]], *, duration_s: float = 15.0,
        **engine: Any) -> SimResult:
    mix = TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b",
                   "engine": {"max_model_len": 8192, **engine}}],
        "workloads": workloads,
        "simulation": {"duration_s": duration_s, "drain_s": 60.0},
    })
    profile = resolve_profile(mix.pool("p"), load_model_spec("llama-3.1-8b"),
                              calibration_dir=NO_CALIBRATION)
    assert profile.source == "analytic"
    return simulate(mix, "p", 1, seed=SEED, profile=profile)


def test_max_num_seqs_is_a_cap_not_a_knob() -> None:
    """Seeds: at c=32, --max-num-seqs 16 caps throughput (367 vs 518 tok/s); 32, 64 and 128
    all give the same. Below the concurrency it binds; at or above it changes nothing."""
    tput = {m: run([workload()], max_num_seqs=m).pool.output_tokens_per_s
            for m in (16, 32, 64, 128)}
    assert tput[16] < 0.9 * tput[32]
    assert tput[32] == tput[64] == tput[128]


def test_prefix_caching_raises_throughput_and_cuts_ttft_tail() -> None:
    """Seeds: 90 % shared prefix at c=8, prefix caching on: +40 % output tok/s and TTFT p99
    2.1x better. The hit rate must emerge from the simulated cache, near the shared share."""
    wl = workload(concurrency=8, inp=4000, out=100, prefix={"shared_fraction": 0.9})
    off = run([wl], enable_prefix_caching=False)
    on = run([wl], enable_prefix_caching=True)
    assert off.pool.prefix_hit_rate == 0.0
    assert 0.8 < on.pool.prefix_hit_rate <= 0.9
    assert on.pool.output_tokens_per_s > 1.2 * off.pool.output_tokens_per_s
    assert on.workload("w").ttft_p99_s < off.workload("w").ttft_p99_s / 2


@pytest.mark.parametrize("concurrency", [1, 4])
def test_speculative_decoding_raises_throughput_and_itl_tail(concurrency: int) -> None:
    """Seeds: a drafter with num_speculative_tokens 4 raises throughput (2.13x at c=1) while
    ITL p99 rises (27 -> 112 ms at c=4): a verify step is longer and tokens arrive in
    bursts. Here with the draft_model method (Llama-3.2-1B drafting for Llama-3.1-8B)."""
    wl = workload(concurrency=concurrency)
    base = run([wl])
    spec = run([wl], speculative={"method": "draft_model", "num_speculative_tokens": 4})
    assert spec.pool.output_tokens_per_s > 1.2 * base.pool.output_tokens_per_s
    assert spec.workload("w").itl_p99_s > 1.2 * base.workload("w").itl_p99_s
    assert spec.workload("w").tpot_p50_s < base.workload("w").tpot_p50_s  # per token: faster


def test_priority_scheduling_protects_the_interactive_tail() -> None:
    """Seeds: with --scheduling-policy priority and batch requests at low priority, the
    interactive workload is unaffected near saturation while batch pays a little. Here a
    chat workload (priority 0) shares a pool with long batch requests (priority 1) near the
    pool's capacity (max_num_seqs 32 makes a waiting queue): priority must cut chat's TTFT
    and E2E tails, and cost batch only a little."""
    chat = workload("chat", inp=500, out=100, priority=0,
                    arrival={"kind": "poisson", "rate_rps": 5.0})
    batch = workload("batch", inp=3000, out=400, priority=1,
                     arrival={"kind": "poisson", "rate_rps": 5.0})
    fcfs = run([chat, batch], duration_s=20.0, max_num_seqs=32)
    prio = run([chat, batch], duration_s=20.0, max_num_seqs=32, scheduling_policy="priority")
    assert prio.workload("chat").ttft_p99_s < fcfs.workload("chat").ttft_p99_s / 2
    assert prio.workload("chat").e2e_p99_s < fcfs.workload("chat").e2e_p99_s
    assert prio.workload("batch").completed == prio.workload("batch").requests
    assert prio.workload("batch").e2e_p99_s < 1.5 * fcfs.workload("batch").e2e_p99_s


def test_gpu_memory_utilization_only_moves_kv_capacity() -> None:
    """Seeds: 0.85 / 0.90 / 0.95 give 114 K / 126 K / 137 K KV tokens and the same c=32
    throughput: when KV is not binding, more of it changes nothing."""
    res = [run([workload()], gpu_memory_utilization=g) for g in (0.85, 0.90, 0.95)]
    kv = [r.pool.kv_tokens_per_replica for r in res]
    assert kv[0] < kv[1] < kv[2]
    assert res[0].pool.kv_usage_peak < 0.5  # not binding
    assert len({r.pool.output_tokens_per_s for r in res}) == 1


def test_prefix_hit_rate_falls_once_eviction_starts() -> None:
    """Seeds: the prefix cache competes with running requests for KV memory, so the hit
    rate falls once eviction starts. 40 distinct 2.7 K-token prefixes fit a large KV cache
    but not a small one (gpu_memory_utilization 0.22), where LRU eviction loses them."""
    wl = workload(concurrency=32, inp=3000, out=100,
                  prefix={"shared_fraction": 0.9, "groups": 40})
    small = run([wl], gpu_memory_utilization=0.22)
    large = run([wl], gpu_memory_utilization=0.92)
    assert small.pool.prefix_hit_rate < large.pool.prefix_hit_rate - 0.1
    assert small.pool.output_tokens_per_s < large.pool.output_tokens_per_s
