"""Unit and property tests for capplan.sim.workload: requests drawn from a workload spec."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.errors import ConfigError
from capplan.sim.workload import (
    NO_PREFIX,
    TARGET_HIT_RATE,
    ClosedLoopSampler,
    RequestBatch,
    generate,
    offered_rate_rps,
    offered_tokens_per_s,
)
from capplan.traffic import Workload


def make(arrival: dict[str, Any], **extra: Any) -> Workload:
    spec: dict[str, Any] = {
        "name": "w",
        "pool": "p",
        "arrival": arrival,
        "input_tokens": {"kind": "uniform", "low": 20, "high": 400},
        "output_tokens": {"kind": "constant", "value": 8},
    }
    spec.update(extra)
    return Workload.model_validate(spec)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def cv_of(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


# --- arrivals -----------------------------------------------------------------------------


def test_poisson_gaps_are_exponential() -> None:
    """Poisson arrivals: gaps have mean 1/rate and CV 1 (fixed seed, ~20k gaps)."""
    b = generate(make({"kind": "poisson", "rate_rps": 40.0}), 0, 500.0, rng(1))
    gaps = np.diff(b.arrival_s)
    assert len(b) == pytest.approx(20_000, rel=0.03)
    assert gaps.mean() == pytest.approx(1 / 40.0, rel=0.03)
    assert cv_of(gaps) == pytest.approx(1.0, abs=0.04)


def test_poisson_gaps_are_not_clipped() -> None:
    """Bursts are not understated: no clipping of gaps (vidur clips at 3x the mean)."""
    b = generate(make({"kind": "poisson", "rate_rps": 40.0}), 0, 500.0, rng(2))
    gaps = np.diff(b.arrival_s)
    # P(gap > 3/rate) = e^-3 ~ 5 %; P(gap > 6/rate) = e^-6 ~ 0.25 %
    assert np.mean(gaps > 3 / 40.0) == pytest.approx(np.exp(-3), rel=0.15)
    assert gaps.max() > 6 / 40.0


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_gaps_have_the_requested_cv(cv: float) -> None:
    """Gamma arrivals: gap CV equals the spec's cv and the mean gap 1/rate."""
    b = generate(make({"kind": "gamma", "rate_rps": 40.0, "cv": cv}), 0, 500.0, rng(3))
    gaps = np.diff(b.arrival_s)
    assert gaps.mean() == pytest.approx(1 / 40.0, rel=0.05)
    assert cv_of(gaps) == pytest.approx(cv, rel=0.08)


def test_daily_runs_at_the_peak_rate() -> None:
    """Daily arrivals simulate the peak hour: rate = peak_rate_rps, gaps with the daily cv."""
    w = make(
        {"kind": "daily", "peak_rate_rps": 30.0, "hourly_fraction": [0.5] * 23 + [1.0], "cv": 1.5}
    )
    b = generate(w, 0, 500.0, rng(4))
    gaps = np.diff(b.arrival_s)
    assert len(b) / 500.0 == pytest.approx(30.0, rel=0.05)
    assert cv_of(gaps) == pytest.approx(1.5, rel=0.08)
    assert offered_rate_rps(w) == 30.0


def test_same_seed_same_arrays() -> None:
    """Randomness is injected: the same seed gives identical arrays, another seed others."""
    w = make(
        {"kind": "gamma", "rate_rps": 10.0, "cv": 2.0},
        prefix={"shared_fraction": 0.5, "groups": 7, "zipf_s": 1.1},
    )
    a, b, c = (generate(w, 3, 60.0, rng(s)) for s in (5, 5, 6))
    for name in ("arrival_s", "input_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.workload == 3
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_generate_rejects_closed_loop() -> None:
    """Closed-loop workloads have no arrival schedule; generate says to use the sampler."""
    with pytest.raises(ValueError, match="ClosedLoopSampler"):
        generate(make({"kind": "closed", "concurrency": 4}), 0, 10.0, rng())


def test_batch_rejects_ragged_arrays() -> None:
    """A RequestBatch's arrays all have one entry per request."""
    one, two = np.zeros(1), np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="input_tokens"):
        RequestBatch(one, two, two, two, two, two, 0)


# --- prompt structure ---------------------------------------------------------------------


def test_shared_fraction_rounds_down_and_leaves_a_token() -> None:
    """shared_fraction: prefix = floor(fraction * input), at most input - 1."""
    for fraction, want in ((0.55, 5), (0.99, 9), (1.0, 9), (0.05, 0)):
        w = make(
            {"kind": "poisson", "rate_rps": 5.0},
            input_tokens={"kind": "constant", "value": 10},
            prefix={"shared_fraction": fraction},
        )
        b = generate(w, 0, 10.0, rng())
        assert (b.prefix_tokens == want).all(), fraction
        assert (b.prefix_group == (0 if want else NO_PREFIX)).all()


def test_shared_tokens_clip_to_short_prompts() -> None:
    """shared_tokens: prompts shorter than the prefix share all but their last token."""
    w = make(
        {"kind": "poisson", "rate_rps": 50.0},
        input_tokens={"kind": "uniform", "low": 1, "high": 300},
        prefix={"shared_tokens": 100, "groups": 3},
    )
    b = generate(w, 0, 20.0, rng())
    np.testing.assert_array_equal(b.prefix_tokens, np.minimum(100, b.input_tokens - 1))
    assert (b.prefix_group[b.input_tokens == 1] == NO_PREFIX).all()
    assert set(b.prefix_group[b.input_tokens > 1].tolist()) == {0, 1, 2}


def test_zipf_popularity() -> None:
    """Groups follow Zipf(s): P(k) proportional to 1/(k+1)^s; s = 0 is uniform."""
    for s in (0.0, 1.2):
        w = make(
            {"kind": "poisson", "rate_rps": 200.0},
            prefix={"shared_tokens": 10, "groups": 5, "zipf_s": s},
        )
        b = generate(w, 0, 100.0, rng(7))
        freq = np.bincount(b.prefix_group, minlength=5) / len(b)
        p = 1 / np.arange(1, 6) ** s
        np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)


def test_target_hit_rate_marks_cached_tokens() -> None:
    """target_hit_rate: group -2 and prefix_tokens = floor(hit * input), below input."""
    w = make({"kind": "poisson", "rate_rps": 50.0}, prefix={"target_hit_rate": 0.9})
    b = generate(w, 0, 10.0, rng())
    assert (b.prefix_group == TARGET_HIT_RATE).all()
    np.testing.assert_array_equal(b.prefix_tokens, np.floor(0.9 * b.input_tokens))
    w1 = make({"kind": "poisson", "rate_rps": 50.0}, prefix={"target_hit_rate": 1.0})
    b1 = generate(w1, 0, 10.0, rng())
    np.testing.assert_array_equal(b1.prefix_tokens, b1.input_tokens - 1)


def test_image_tokens_are_added_to_the_prompt() -> None:
    """Image requests: images_per_request * tokens_per_image added to input_tokens."""
    w = make(
        {"kind": "poisson", "rate_rps": 20.0},
        input_tokens={"kind": "constant", "value": 100},
        image={"images_per_request": 2, "tokens_per_image": 576},
    )
    b = generate(w, 0, 10.0, rng())
    assert (b.image_tokens == 1152).all()
    assert (b.input_tokens == 100 + 1152).all()
    assert offered_tokens_per_s(w) == (20.0 * 1252, 20.0 * 8)


# --- closed loop --------------------------------------------------------------------------


def test_closed_loop_sampler_draws_from_the_workload() -> None:
    """ClosedLoopSampler: one request per call, from the workload's distributions,
    deterministic for a seed across chunk boundaries."""
    w = make(
        {"kind": "closed", "concurrency": 16, "think_time_s": 0.5},
        image={"tokens_per_image": 64},
        prefix={"shared_fraction": 0.5},
    )
    s1, s2 = ClosedLoopSampler(w, 2, chunk=7), ClosedLoopSampler(w, 2, chunk=7)
    r1, r2 = rng(9), rng(9)
    a = [s1.next(r1) for _ in range(30)]
    assert a == [s2.next(r2) for _ in range(30)]
    assert (s1.concurrency, s1.think_time_s, s1.index) == (16, 0.5, 2)
    for inp, out, group, prefix, image in a:
        assert 20 + 64 <= inp <= 400 + 64 and out == 8 and image == 64
        assert prefix == inp // 2 and group == 0
    assert offered_rate_rps(w) is None and offered_tokens_per_s(w) is None
    with pytest.raises(ValueError, match="not closed loop"):
        ClosedLoopSampler(make({"kind": "poisson", "rate_rps": 1.0}), 0)


# --- replay -------------------------------------------------------------------------------

ROWS = [
    {"arrival_s": 2.0, "input_tokens": 50, "output_tokens": 5, "prefix_group": 1,
     "prefix_tokens": 20},
    {"arrival_s": 0.0, "input_tokens": 10, "output_tokens": 1, "prefix_group": -1,
     "prefix_tokens": 0},
    {"arrival_s": 1.0, "input_tokens": 30, "output_tokens": 3, "prefix_group": 1,
     "prefix_tokens": 30},
    {"arrival_s": 3.0, "input_tokens": 70, "output_tokens": 7, "prefix_group": 0,
     "prefix_tokens": 10},
]  # fmt: skip


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    cols = list(rows[0])
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def replay(path: str | Path, **kw: Any) -> Workload:
    return Workload.model_validate(
        {"name": "r", "pool": "p", "arrival": {"kind": "replay", "path": str(path), **kw}}
    )


@pytest.mark.parametrize("writer", [write_csv, write_jsonl])
def test_replay_round_trip(tmp_path: Path, writer: Any) -> None:
    """Replay reproduces the file's requests, sorted by arrival, relative to base_dir;
    a whole-prompt prefix is capped at input - 1 (vLLM recomputes the last token)."""
    name = "trace.csv" if writer is write_csv else "trace.jsonl"
    writer(tmp_path / name, ROWS)
    b = generate(replay(name), 1, 100.0, rng(), base_dir=tmp_path)
    np.testing.assert_array_equal(b.arrival_s, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(b.input_tokens, [10, 30, 50, 70])
    np.testing.assert_array_equal(b.output_tokens, [1, 3, 5, 7])
    np.testing.assert_array_equal(b.prefix_group, [-1, 1, 1, 0])
    np.testing.assert_array_equal(b.prefix_tokens, [0, 29, 20, 10])
    assert b.arrival_s.dtype == np.float64 and b.input_tokens.dtype == np.int64
    assert b.workload == 1


def test_replay_time_scale_duration_and_loop(tmp_path: Path) -> None:
    """Replay: arrival / time_scale; rows at or after the duration dropped; loop repeats
    the trace shifted by its span so the rate holds (rate = rows / span * time_scale)."""
    path = write_csv(tmp_path / "t.csv", [{k: r[k] for k in list(r)[:3]} for r in ROWS])
    b = generate(replay(path, time_scale=2.0), 0, 1.5, rng())
    np.testing.assert_array_equal(b.arrival_s, [0.0, 0.5, 1.0])
    assert (b.prefix_group == NO_PREFIX).all() and (b.prefix_tokens == 0).all()
    looped = generate(replay(path, loop=True), 0, 10.0, rng())
    np.testing.assert_array_equal(looped.arrival_s, np.arange(10.0))
    np.testing.assert_array_equal(looped.input_tokens[:6], [10, 30, 50, 70, 10, 30])
    assert offered_rate_rps(replay(path, time_scale=2.0)) == pytest.approx(2.0)
    assert offered_tokens_per_s(replay(path)) == pytest.approx((40.0, 4.0))


def test_replay_without_prefix_columns_uses_the_prefix_spec(tmp_path: Path) -> None:
    """A trace without prompt structure takes it from the workload's prefix spec."""
    path = write_jsonl(tmp_path / "t.jsonl", [{k: r[k] for k in list(r)[:3]} for r in ROWS])
    w = Workload.model_validate(
        {
            "name": "r",
            "pool": "p",
            "arrival": {"kind": "replay", "path": str(path)},
            "prefix": {"shared_fraction": 0.5},
        }
    )
    b = generate(w, 0, 100.0, rng())
    np.testing.assert_array_equal(b.prefix_tokens, [5, 15, 25, 35])


@pytest.mark.parametrize(
    ("rows", "field", "fix"),
    [
        ([{"arrival_s": 0, "input_tokens": 5}], "output_tokens", "needs columns"),
        ([{"arrival_s": -1, "input_tokens": 5, "output_tokens": 1}], "arrival_s",
         "row 1 has -1; values must be a number >= 0"),  # not np.float64(-1.0)
        ([{"arrival_s": 0, "input_tokens": 5, "output_tokens": 0}], "output_tokens", ">= 1"),
        ([{"arrival_s": 0, "input_tokens": 5.5, "output_tokens": 2}], "input_tokens", "integer"),
        ([{"arrival_s": 0, "input_tokens": "x", "output_tokens": 2}], "input_tokens", "numeric"),
        (
            [{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2, "prefix_group": 0}],
            "prefix_tokens",
            "together",
        ),
        (
            [{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2, "prefix_group": 0,
              "prefix_tokens": 6}],
            "prefix_tokens",
            "<= input_tokens",
        ),
    ],
)  # fmt: skip
def test_replay_errors_name_file_and_column(
    tmp_path: Path, rows: list[dict[str, Any]], field: str, fix: str
) -> None:
    """Bad replay data is a ConfigError naming the file, the column and the fix."""
    path = write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(ConfigError, match=fix) as e:
        generate(replay(path), 0, 10.0, rng())
    assert e.value.file == str(path) and e.value.field == field
    assert str(path) in str(e.value) and field in str(e.value)


@pytest.mark.parametrize(("tokens", "column", "fix"), [
    ((16384, 1), "input_tokens", "has a 16384-token prompt, which vLLM refuses"),
    ((16000, 385), "output_tokens", "asks for 16000 + 385 tokens (prompt + output)"),
])
def test_a_replayed_request_must_fit_max_model_len(
    tmp_path: Path, tokens: tuple[int, int], column: str, fix: str
) -> None:
    """A recorded request that the pool's max_model_len cannot hold is refused when the
    traffic file is read, naming the file's row (not its place in arrival order): vLLM
    refuses such a prompt, or stops its output short, so the replay would not be the trace.
    A request that fits exactly (prompt + output = max_model_len) is kept."""
    from capplan.mix import load_mix

    rows = [{"arrival_s": 2.0, "input_tokens": 100, "output_tokens": 10},
            {"arrival_s": 3.0, "input_tokens": 16000, "output_tokens": 384},
            {"arrival_s": 1.0, "input_tokens": tokens[0], "output_tokens": tokens[1]}]
    write_csv(tmp_path / "trace.csv", rows)
    mix = tmp_path / "mix.yaml"
    mix.write_text(json.dumps({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "gpu": "h200", "precision": "bf16",
                   "engine": {"max_model_len": 16384}}],
        "workloads": [{"name": "w", "pool": "p", "slo": {"ttft_p99_s": 1.0},
                       "arrival": {"kind": "replay", "path": "trace.csv"}}],
    }))
    with pytest.raises(ConfigError, match=re.escape(fix)) as e:
        load_mix(mix)
    assert e.value.file == str(tmp_path / "trace.csv") and e.value.field == column
    assert "row 3 " in str(e.value) and "max_model_len of pool 'p'" in str(e.value)
    write_csv(tmp_path / "trace.csv", rows[:2])
    assert load_mix(mix).workloads[0].name == "w"


def test_replay_missing_file_and_bad_suffix(tmp_path: Path) -> None:
    """A missing or unsupported replay file is a ConfigError naming the resolved path."""
    with pytest.raises(ConfigError, match="not found") as e:
        generate(replay("nope.csv"), 0, 10.0, rng(), base_dir=tmp_path)
    assert e.value.file == str(tmp_path / "nope.csv")
    (tmp_path / "t.parquet").write_text("x")
    with pytest.raises(ConfigError, match=r"\.csv, \.jsonl"):
        generate(replay(tmp_path / "t.parquet"), 0, 10.0, rng())


def test_replay_loop_needs_a_span(tmp_path: Path) -> None:
    """A one-instant trace has no rate: looping or asking its rate is a ConfigError."""
    path = write_csv(tmp_path / "t.csv", [{"arrival_s": 1, "input_tokens": 5, "output_tokens": 1}])
    assert len(generate(replay(path), 0, 10.0, rng())) == 1
    with pytest.raises(ConfigError, match="two distinct arrival times"):
        generate(replay(path, loop=True), 0, 10.0, rng())


# --- properties ---------------------------------------------------------------------------

prefixes = st.one_of(
    st.none(),
    st.builds(lambda k, g, s: {"shared_tokens": k, "groups": g, "zipf_s": s},
              st.integers(1, 49), st.integers(1, 20), st.floats(0, 3)),
    st.builds(lambda f, g: {"shared_fraction": f, "groups": g},
              st.floats(0.01, 1.0), st.integers(1, 20)),
    st.builds(lambda h: {"target_hit_rate": h}, st.floats(0, 1)),
)  # fmt: skip
arrivals = st.one_of(
    st.builds(lambda r: {"kind": "poisson", "rate_rps": r}, st.floats(0.1, 100)),
    st.builds(lambda r, c: {"kind": "gamma", "rate_rps": r, "cv": c},
              st.floats(0.1, 100), st.floats(0.1, 5)),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    arrival=arrivals,
    low=st.integers(1, 100),
    span=st.integers(0, 400),
    prefix=prefixes,
    image=st.one_of(st.none(), st.integers(1, 1000)),
    seed=st.integers(0, 2**32 - 1),
)
def test_batch_invariants(
    arrival: dict[str, Any],
    low: int,
    span: int,
    prefix: dict[str, Any] | None,
    image: int | None,
    seed: int,
) -> None:
    """Any spec: equal-length arrays, sorted arrivals in [0, duration), lengths >= 1,
    0 <= prefix_tokens < input_tokens, image tokens within the prompt."""
    extra: dict[str, Any] = {"input_tokens": {"kind": "uniform", "low": low, "high": low + span}}
    if prefix is not None:
        if "shared_tokens" in prefix:
            prefix["shared_tokens"] = min(prefix["shared_tokens"], low + span - 1)
        extra["prefix"] = prefix
    if image is not None:
        extra["image"] = {"tokens_per_image": image}
    if prefix and prefix.get("shared_tokens", 1) < 1:
        return  # a one-token prompt cannot share a prefix; the schema refuses it
    w = make(arrival, **extra)
    b = generate(w, 0, 20.0, rng(seed))
    n = len(b.arrival_s)
    for a in (b.input_tokens, b.output_tokens, b.prefix_group, b.prefix_tokens, b.image_tokens):
        assert len(a) == n
    assert (np.diff(b.arrival_s) >= 0).all()
    assert n == 0 or (b.arrival_s[0] >= 0 and b.arrival_s[-1] < 20.0)
    assert (b.input_tokens >= 1).all() and (b.output_tokens >= 1).all()
    assert (b.prefix_tokens >= 0).all() and (b.prefix_tokens < b.input_tokens).all()
    assert (b.image_tokens < b.input_tokens).all()
    assert ((b.prefix_group == NO_PREFIX) == (b.prefix_tokens == 0)).all() or (
        prefix is not None and "target_hit_rate" in prefix
    )
