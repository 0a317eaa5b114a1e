"""The replica's per-step bookkeeping is an evaluation detail: streaming one step's tokens in
bulk must give the same simulation, byte for byte, as streaming them one request at a time
(rule 7: same seed, same result). The engine's own per-step rules are held to a transcription
of vLLM by tests/test_sim_properties.py (test_engine_matches_reference_vllm)."""

from __future__ import annotations

import io
from typing import Any

import pytest

import capplan.sim.run
from capplan.mix import TrafficMix
from capplan.sim.metrics import WorkloadRecorder
from capplan.sim.replica import Replica
from capplan.sim.request import SimRequest
from capplan.sim.run import simulate


def _reference_emit(
    self: Replica, emitted: list[tuple[SimRequest, int, bool]], now: float
) -> None:
    """Replica._emit as it was: every token's figures recorded as it streams."""
    window = self.window
    seen = now + self.latency
    in_window = window.start_s <= now < window.end_s
    for r, new, done in emitted:
        rec = window.recorders[r.wl]
        if in_window:
            rec.output_tokens_in_window += new
        if r.first_token_s < 0:
            r.first_token_s = now
            r.first_seen_s = seen
            if in_window:
                rec.input_tokens_in_window += r.prompt
        elif r.measured:
            rec.itl.add(now - r.last_token_s)
        r.last_token_s = now
        if done:
            self._finish(r, rec, seen)  # unchanged by the bulk path: shared, not copied


def _mix(engine: dict[str, Any]) -> TrafficMix:
    """Two workloads (one long-prompt, one chat) on one pool, enough load to keep ~50
    requests decoding per replica."""
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "engine": engine}],
        "workloads": [
            {"name": "docs", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 8},
             "input_tokens": {"kind": "normal", "mean": 3000, "std": 600, "min": 500,
                              "max": 6000},
             "output_tokens": {"kind": "normal", "mean": 200, "std": 50, "min": 20, "max": 400},
             "priority": 1},
            {"name": "chat", "pool": "p", "arrival": {"kind": "poisson", "rate_rps": 12},
             "input_tokens": {"kind": "lognormal", "mean": 500, "sigma": 0.6, "max": 1500},
             "output_tokens": {"kind": "lognormal", "mean": 120, "sigma": 0.6, "max": 400},
             "slo": {"ttft_p99_s": 0.5, "itl_p99_s": 0.05}},
        ],
        "simulation": {"duration_s": 20.0, "warmup_s": 2.0, "drain_s": 60.0},
    })


def _fingerprint(mix: TrafficMix, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> bytes:
    """The result, its per-request rows and KV series, and every histogram bin count."""
    recorders: list[WorkloadRecorder] = []

    def recorder(**kw: Any) -> WorkloadRecorder:
        recorders.append(WorkloadRecorder(**kw))
        return recorders[-1]

    monkeypatch.setattr(capplan.sim.run, "WorkloadRecorder", recorder)
    res = simulate(mix, "p", 1, seed=3, **kw)
    buf = io.BytesIO()
    res.requests().write_csv(buf)
    res.kv_series().write_csv(buf)
    for rec in recorders:
        buf.write(f"{rec.output_tokens_in_window} {rec.input_tokens_in_window}".encode())
        for hist in (rec.itl, rec.ttft, rec.e2e, rec.tpot, rec.queue):
            hist.merge(type(hist)())  # flushes its buffers into the counts
            buf.write(hist.counts.tobytes() + str(hist.n).encode())
    return res.model_dump_json().encode() + buf.getvalue()


@pytest.mark.parametrize(
    ("engine", "kw"),
    [
        ({"speculative": {"method": "draft_model", "num_speculative_tokens": 4},
          "scheduling_policy": "priority"}, {}),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 3},
          "async_scheduling": False, "gpu_memory_utilization": 0.3}, {}),
        ({"max_num_batched_tokens": 512, "max_num_seqs": 512}, {}),
        ({"max_num_batched_tokens": 512, "max_num_seqs": 512}, {"decode_cohort": False}),
    ],
    ids=["draft-model-priority", "ngram-sync-preempting", "cohort", "no-cohort"],
)
def test_bulk_emit_matches_token_by_token(
    engine: dict[str, Any], kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica._emit hands a step's ITL gaps and window tokens to the recorders per workload
    after its loop: the figures, per-request rows and KV series equal the reference's."""
    mix = _mix(engine)
    fast = _fingerprint(mix, monkeypatch, **kw)
    monkeypatch.setattr(Replica, "_emit", _reference_emit)
    assert _fingerprint(mix, monkeypatch, **kw) == fast


def test_unfinished_requests_weigh_on_itl_by_their_token_share() -> None:
    """Requests still running at the end count as infinitely late in ITL too, in proportion
    to the tokens they stand for: with half the requests unfinished, ITL p90 is infinite
    even when every observed gap is still in the histogram's buffer."""
    from capplan.sim.results import summarise
    from capplan.traffic import Workload

    w = Workload.model_validate({
        "name": "w", "pool": "p", "input_tokens": {"kind": "constant", "value": 8},
        "output_tokens": {"kind": "constant", "value": 8},
        "arrival": {"kind": "poisson", "rate_rps": 1.0}, "slo": {"itl_p90_s": 1.0}})
    rec = WorkloadRecorder()
    for i in range(10):
        rec.add_request(float(i), 0.1, 1.0, 0.0, 8, 8, 0, 0, 0)
        rec.itl.add_many([0.01] * 7)  # buffered, not yet flushed
    res = summarise(w, rec, created=20, window_s=10.0)
    assert res.itl_p50_s == pytest.approx(0.01, rel=2e-3)
    assert res.itl_p90_s == float("inf") and not res.slo[0].met


def test_an_slo_says_how_much_of_its_tail_it_lets_past_the_limit() -> None:
    """A p99 lets 1 % of the gaps past its limit: 99 short gaps and one stall put the p99
    below the limit with the whole 1 % used, which the check's `beyond` says; unfinished
    requests count past it."""
    from capplan.sim.metrics import GapHistogram
    from capplan.sim.results import SloCheck

    h = GapHistogram()
    h.add_many([0.012] * 99 + [0.120])
    assert h.percentile(99) < 0.05
    assert h.share_above(0.05) == 0.01
    assert h.share_above(0.005) == 1.0
    assert h.share_above(0.2) == 0.0
    assert h.share_above(0.05, missing=1) == 2 / 101
    check = SloCheck(key="itl_p99_s", limit_s=0.05, value_s=h.percentile(99), met=True,
                     beyond=h.share_above(0.05))
    assert check.allowed == pytest.approx(0.01)
    assert check.margin > 0.7 and check.beyond == pytest.approx(check.allowed)
