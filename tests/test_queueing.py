"""Analytic checks: where queueing arithmetic gives the answer, `simulate` must give it too.

A hand-made profile where every engine step costs exactly C seconds makes the pipeline of
vllm/v1/engine/core.py countable in steps. With async scheduling, step k+1 is scheduled while
k runs, but a request whose in-flight steps already reach max_tokens is skipped
(vllm/v1/core/sched/scheduler.py), so no wasted step trails the last token: a lone request
with a one-block prompt gets its first token after one step and its n-th after n steps.
The client sees each request L later than it sends it, and each token L after its step
(L = simulation.client_latency_s each way, capplan/mix.py); an idle core schedules W after
a request reaches it (W = idle_wake_s of its prompt, capplan/sim/replica.py: the input
thread's time on it and the core's wake; `wake(p)` below).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from capplan.errors import ConfigError
from capplan.mix import CLIENT_LATENCY_S as L
from capplan.mix import TrafficMix
from capplan.sim.replica import idle_wake_s as wake
from capplan.sim.run import simulate
from helpers import constant_profile

C = 0.01  # seconds per engine step
W = wake(16)  # the idle core's wake for the default 16-token prompt


def mix(arrival: dict[str, Any], *, prompt: Any = 16, out: Any = 10,
        duration_s: float = 5.0, **engine: Any) -> TrafficMix:
    def dist(v: Any) -> dict[str, Any]:
        return v if isinstance(v, dict) else {"kind": "constant", "value": v}

    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b",
                   "engine": {"max_model_len": 8192, **engine}}],
        "workloads": [{"name": "w", "pool": "p", "arrival": arrival,
                       "input_tokens": dist(prompt), "output_tokens": dist(out)}],
        "simulation": {"duration_s": duration_s, "warmup_s": 0.5, "drain_s": 30.0},
    })


CLOSED1 = {"kind": "closed", "concurrency": 1}


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_lone_request_takes_one_step_per_token(async_scheduling: bool) -> None:
    """One request at a time, one-block prompt, n outputs: TTFT = C + 2L, ITL = C,
    E2E = n*C + 2L exactly, in both engine loops (core.py step and step_with_batch_queue)."""
    n = 10
    res = simulate(mix(CLOSED1, out=n, async_scheduling=async_scheduling), "p", 1, seed=0,
                   profile=constant_profile(C))
    req = res.requests()
    assert len(req) > 10
    assert req["ttft_s"].to_numpy() == pytest.approx(C + 2 * L + W, rel=1e-9)
    assert req["e2e_s"].to_numpy() == pytest.approx(n * C + 2 * L + W, rel=1e-9)
    w = res.workload("w")
    assert w.itl_p50_s == pytest.approx(C, rel=2e-3)  # ITL histogram: 0.1 % bins
    assert w.itl_p99_s == pytest.approx(C, rel=2e-3)
    # one user's cycle: n steps and the round trip before the next request starts
    assert w.output_tokens_per_s == pytest.approx(n / (n * C + 2 * L + W), rel=0.01)


def test_chunked_prompt_costs_one_step_per_chunk() -> None:
    """Chunked prefill: a P-token prompt under budget B takes ceil(P/B) steps to its first
    token, then one step per further token: E2E = (ceil(P/B) + n - 1) * C (+ 2L)."""
    p, b, n = 1000, 256, 5
    res = simulate(mix(CLOSED1, prompt=p, out=n, max_num_batched_tokens=b, max_num_seqs=b),
                   "p", 1, seed=0, profile=constant_profile(C))
    req = res.requests()
    chunks = math.ceil(p / b)
    assert req["ttft_s"].to_numpy() == pytest.approx(chunks * C + 2 * L + wake(p), rel=1e-9)
    assert req["e2e_s"].to_numpy() == pytest.approx((chunks + n - 1) * C + 2 * L + wake(p),
                                                    rel=1e-9)


@pytest.mark.parametrize(("method", "chunks"), [(None, 2), ("mtp", 2), ("draft_model", 3)])
def test_draft_model_keeps_a_slot_per_sequence(method: str | None, chunks: int) -> None:
    """vllm/config/vllm.py (_set_max_num_scheduled_tokens): with a draft model the scheduler
    may schedule max_num_batched_tokens less one slot per sequence (speculative.py:
    max_num_new_slots_for_drafting), 512 - 64 = 448 here, so a 1,000-token prompt takes
    three chunks, not two; MTP inserts no slots."""
    spec = {"speculative": {"method": method, "num_speculative_tokens": 2}} if method else {}
    res = simulate(mix(CLOSED1, prompt=1000, out=2, max_num_seqs=64,
                       max_num_batched_tokens=512, **spec), "p", 1, seed=0,
                   profile=constant_profile(C))
    assert res.requests()["ttft_s"].to_numpy() == pytest.approx(chunks * C + 2 * L + wake(1000),
                                                                rel=1e-9)


def test_draft_model_without_budget_left_is_a_config_error() -> None:
    """vLLM refuses to start when the draft slots take the whole budget; so does capplan."""
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        simulate(mix(CLOSED1, max_num_seqs=512, max_num_batched_tokens=512,
                     speculative={"method": "draft_model", "num_speculative_tokens": 2}),
                 "p", 1, seed=0, profile=constant_profile(C))


@pytest.mark.parametrize(("users", "max_num_seqs"), [(8, 16), (8, 8), (8, 4), (8, 2)])
def test_closed_loop_throughput_is_min_of_users_and_seqs_per_step(
    users: int, max_num_seqs: int
) -> None:
    """Every step costs C whatever its batch, so output tokens/s = min(users, max_num_seqs)/C:
    max_num_seqs is a cap on the batch, not a speed knob. (No client latency: it would
    leave steps short of users while requests travel.)"""
    res = simulate(mix({"kind": "closed", "concurrency": users}, max_num_seqs=max_num_seqs),
                   "p", 1, seed=0, profile=constant_profile(C), client_latency_s=0.0)
    assert res.workload("w").output_tokens_per_s == pytest.approx(
        min(users, max_num_seqs) / C, rel=0.01
    )


def test_littles_law_closed_loop() -> None:
    """Little's law for a closed system without think time: users = throughput x mean E2E
    (analytic H200 profile, variable lengths)."""
    users = 12
    m = mix({"kind": "closed", "concurrency": users},
            prompt={"kind": "uniform", "low": 100, "high": 2000},
            out={"kind": "uniform", "low": 20, "high": 200}, duration_s=40.0)
    res = simulate(m, "p", 1, seed=3)
    req = res.requests()
    window = res.pool.duration_s - res.pool.warmup_s
    throughput_rps = len(req) / window
    assert users == pytest.approx(throughput_rps * req["e2e_s"].mean(), rel=0.05)


def test_offered_load_below_capacity_is_carried() -> None:
    """Below saturation nothing accumulates: output and input tokens/s equal what the
    arrivals offered (measured requests x lengths / window), and all of them complete."""
    n, p, rate = 50, 500, 10.0
    m = mix({"kind": "poisson", "rate_rps": rate}, prompt=p, out=n, duration_s=40.0)
    res = simulate(m, "p", 1, seed=5)
    w = res.workload("w")
    window = res.pool.duration_s - res.pool.warmup_s
    assert w.completed == w.requests
    assert w.queue_p99_s < 0.1  # admitted at once: below capacity
    assert w.output_tokens_per_s == pytest.approx(w.requests * n / window, rel=0.02)
    assert w.input_tokens_per_s == pytest.approx(w.requests * p / window, rel=0.02)
    assert w.requests / window == pytest.approx(rate, rel=0.1)  # Poisson count, fixed seed


def test_light_load_latency_is_the_isolated_service_time() -> None:
    """At vanishing load (mean gap >> service time) almost every request runs alone, so the
    median E2E is the lone-request figure n*C + 2L + W (the idle core's wake), a request that
    arrives while another runs waits at most for the step it joins instead."""
    n = 10
    m = mix({"kind": "poisson", "rate_rps": 1.0}, out=n, duration_s=60.0)
    res = simulate(m, "p", 1, seed=2, profile=constant_profile(C))
    e2e = res.requests()["e2e_s"].to_numpy()
    assert n * C + 2 * L - 1e-9 <= e2e.min() <= n * C + 2 * L + W + 1e-9
    assert sorted(e2e)[len(e2e) // 2] == pytest.approx(n * C + 2 * L + W, rel=1e-9)
    assert e2e.max() <= (n + 2) * C + 2 * L + W + 1e-9


@pytest.mark.parametrize("latency", [0.0, 0.004])
def test_client_latency_comes_from_the_traffic_file(latency: float) -> None:
    """`simulation.client_latency_s` is the round trip's half: TTFT = C + 2 * latency, and
    W more when the request finds the core idle (with no latency, the user's next request
    reaches the core before it goes idle)."""
    m = mix(CLOSED1, out=3)
    m = m.model_copy(update={"simulation": m.simulation.model_copy(
        update={"client_latency_s": latency})})
    res = simulate(m, "p", 1, seed=0, profile=constant_profile(C))
    wake = W if latency else 0.0
    assert res.requests()["ttft_s"].to_numpy() == pytest.approx(C + 2 * latency + wake,
                                                                rel=1e-9)


def test_one_client_sends_one_request_at_a_time() -> None:
    """`simulation.client_send_s` S: users whose requests end together send their next ones
    one after another, S apart, each stamped when it leaves (the validation runner's
    client); with S = 0, the default, every user is its own client and a wave leaves at
    once."""
    m = mix({"kind": "closed", "concurrency": 4}, out=1)
    sent = m.model_copy(update={"simulation": m.simulation.model_copy(
        update={"client_send_s": C / 2})})
    res = simulate(sent, "p", 1, seed=0, profile=constant_profile(C))
    arrivals = res.requests()["arrival_s"].sort().to_numpy()
    gaps = arrivals[1:] - arrivals[:-1]
    assert gaps.min() >= C / 2 - 1e-9  # never two sends closer than S
    together = simulate(m, "p", 1, seed=0, profile=constant_profile(C))
    # without it the four users send at once, wave after wave
    assert (together.requests()["arrival_s"].value_counts()["count"] == 4).all()


def test_one_client_reads_after_its_sends() -> None:
    """One client's event loop (sim/client.py) reads nothing while it sends: two users
    whose requests end in the same step read their last tokens S apart, the first user's
    next send between them, so the second one's last gap is C + S (one gap in 18: the ITL
    p99) and every other gap C. Its request was sent S later, so both E2Es are equal."""
    S = W / 2  # below W: the wave's two requests still share their first step
    m = mix({"kind": "closed", "concurrency": 2}, out=10)
    m = m.model_copy(update={"simulation": m.simulation.model_copy(
        update={"client_send_s": S})})
    res = simulate(m, "p", 1, seed=0, profile=constant_profile(C))
    req = res.requests().sort("arrival_s")
    end = (req["arrival_s"] + req["e2e_s"]).to_numpy()
    assert end[1::2][:20] - end[0::2][:20] == pytest.approx(S, rel=1e-6)
    w = res.workload("w")
    assert w.itl_p50_s == pytest.approx(C, rel=2e-3)
    assert w.itl_p99_s == pytest.approx(C + S, rel=2e-3)
    assert req["e2e_s"].to_numpy()[2:-2] == pytest.approx(10 * C + 2 * L + W, rel=1e-9)
    alone = simulate(mix({"kind": "closed", "concurrency": 2}, out=10), "p", 1, seed=0,
                     profile=constant_profile(C))
    assert alone.workload("w").itl_p99_s == pytest.approx(C, rel=2e-3)


def test_output_jitter_delays_each_steps_outputs_alike() -> None:
    """`simulation.output_jitter_s` J: each step's outputs reach the client an exponential
    delay of mean J late, drawn per step, so a lone request's gaps are C plus the difference
    of two such delays (a Laplace distribution of scale J: median C, p99 C + J ln 50), and
    its TTFT and E2E grow by one delay (J on average)."""
    J = C / 10
    m = mix(CLOSED1, out=50, duration_s=20.0)
    jit = m.model_copy(update={"simulation": m.simulation.model_copy(
        update={"output_jitter_s": J})})
    res = simulate(jit, "p", 1, seed=0, profile=constant_profile(C))
    w = res.workload("w")
    assert w.itl_p50_s == pytest.approx(C, rel=5e-3)
    assert w.itl_p99_s == pytest.approx(C + J * math.log(50), rel=0.02)
    e2e = res.requests()["e2e_s"].to_numpy()
    assert e2e.mean() - (50 * C + 2 * L + W) == pytest.approx(J, rel=0.25)
    assert (e2e >= 50 * C + 2 * L + W - 1e-9).all()  # a delay, never early
    again = simulate(jit, "p", 1, seed=0, profile=constant_profile(C))
    assert again.workload("w").itl_p99_s == w.itl_p99_s  # seeded: the same run


def test_core_time_delays_the_first_token_by_the_next_launch() -> None:
    """With the engine core's own time a step (core_piecewise_s P > C, core_graph_s G < C),
    a lone request's prefill holds the core P; the core then launches the first decode step
    (G) before it takes the prefill's output (vllm/v1/engine/core.py step_with_batch_queue),
    so TTFT = 2L + W + P + G; the GPU then runs one decode step after another, so the last
    token comes at 2L + W + P + (n - 1) C and the steady ITL is C."""
    n, p, g = 10, 0.015, 0.004
    prof = constant_profile(C)
    prof = prof.model_copy(update={"step": prof.step.model_copy(
        update={"core_piecewise_s": p, "core_graph_s": g})})
    res = simulate(mix(CLOSED1, out=n), "p", 1, seed=0, profile=prof)
    req = res.requests()
    assert req["ttft_s"].to_numpy() == pytest.approx(2 * L + W + p + g, rel=1e-9)
    assert req["e2e_s"].to_numpy() == pytest.approx(2 * L + W + p + (n - 1) * C, rel=1e-9)
    assert res.workload("w").itl_p50_s == pytest.approx(C, rel=2e-3)


def test_an_arrival_during_a_launch_lengthens_it(tmp_path: Any) -> None:
    """The core's input thread decodes each arriving request holding the GIL (replica.py
    INPUT_S): a request that arrives while the core launches the first one's prefill (P)
    lengthens that launch by INPUT_S + INPUT_TOKEN_S * its prompt. The first token waits for
    the launch of the step after, which holds the second request's prefill beside the first
    one's decode, so it is piecewise too (P again). Replayed arrivals at 0 and 5 ms, P = 15 ms:
    TTFT = 2L + W + P + input + P."""
    from capplan.sim.replica import INPUT_S, INPUT_TOKEN_S

    p, g, prompt = 0.015, 0.004, 16
    trace = tmp_path / "arrivals.csv"
    trace.write_text(f"arrival_s,input_tokens,output_tokens\n0.0,{prompt},10\n0.005,{prompt},10\n")
    prof = constant_profile(C)
    prof = prof.model_copy(update={"step": prof.step.model_copy(
        update={"core_piecewise_s": p, "core_graph_s": g})})
    res = simulate(mix({"kind": "replay", "path": str(trace)}, prompt=prompt, duration_s=1.0),
                   "p", 1, seed=0, profile=prof, warmup_s=0.0)
    first = res.requests().sort("arrival_s")["ttft_s"].to_numpy()[0]
    assert first == pytest.approx(2 * L + W + 2 * p + INPUT_S + INPUT_TOKEN_S * prompt,
                                  rel=1e-9)
