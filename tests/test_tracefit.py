"""Traffic from traces: fits recover known parameters, public formats parse, errors name the fix."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.distributions import Constant, Empirical, LogNormal
from capplan.errors import ConfigError
from capplan.mix import load_mix
from capplan.sim.run import simulate
from capplan.sim.workload import generate
from capplan.tracefit import (
    fit_trace,
    fit_trace_report,
    parse_metrics,
    to_yaml,
)
from capplan.tracefit.cli import traffic
from capplan.tracefit.lengths import fit_lengths, histogram_dist
from capplan.tracefit.metrics import histogram_lengths
from capplan.tracefit.prefix import PrefixFit, _per_request_prefix_group
from capplan.traffic import (
    ClosedLoop,
    DailyArrival,
    GammaArrival,
    PoissonArrival,
    PrefixSpec,
    ReplayArrival,
    Workload,
)

TRACES = Path(__file__).parent / "data" / "traces"
REAL = Path(__file__).parent / "data" / "vllm-metrics-h200"


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    mu = math.log(mean) - sigma**2 / 2
    return np.maximum(np.rint(rng.lognormal(mu, sigma, n)), 1).astype(np.int64)


def _write(path: Path, t: np.ndarray, inp: np.ndarray, out: np.ndarray, **extra: object) -> Path:
    frame = pl.DataFrame({"timestamp": t, "input_tokens": inp, "output_tokens": out, **extra})
    if path.suffix == ".parquet":
        frame.write_parquet(path)
    else:
        frame.write_csv(path)
    return path


def _open_loop(tmp_path: Path, *, rate: float, cv: float | None, seconds: float, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    if cv is None:
        gaps = rng.exponential(1 / rate, n)
    else:
        shape = 1 / cv**2
        gaps = rng.gamma(shape, 1 / (rate * shape), n)
    t = np.cumsum(gaps)
    return _write(
        tmp_path / "trace.csv", t, _lognormal(rng, 800, 0.8, n), _lognormal(rng, 200, 0.5, n)
    )


# -- arrivals and lengths round trip ---------------------------------------------------------


def test_poisson_round_trip(tmp_path: Path) -> None:
    """A Poisson trace at 20 req/s with lognormal lengths fits back as poisson, rate within
    5 %, mean lengths within 5 %, both lengths lognormal."""
    mix = fit_trace(_open_loop(tmp_path, rate=20, cv=None, seconds=600, seed=1))
    (w,) = mix.workloads
    assert isinstance(w.arrival, PoissonArrival)
    assert w.arrival.rate_rps == pytest.approx(20, rel=0.05)
    assert isinstance(w.input_tokens, LogNormal) and isinstance(w.output_tokens, LogNormal)
    assert w.input_tokens.mean == pytest.approx(800, rel=0.05)
    assert w.output_tokens.mean == pytest.approx(200, rel=0.05)
    assert w.input_tokens.sigma == pytest.approx(0.8, rel=0.1)


def test_gamma_round_trip(tmp_path: Path) -> None:
    """A bursty gamma trace (gap CV 2.5) fits back as gamma with its CV within 15 % and its
    rate within 5 %."""
    mix = fit_trace(_open_loop(tmp_path, rate=20, cv=2.5, seconds=600, seed=2))
    arrival = mix.workloads[0].arrival
    assert isinstance(arrival, GammaArrival)
    assert arrival.cv == pytest.approx(2.5, rel=0.15)
    assert arrival.rate_rps == pytest.approx(20, rel=0.05)


def test_peak_hour_rate(tmp_path: Path) -> None:
    """A 3-hour trace at 2, 6 and 3 req/s is sized at its peak hour: rate 6, not the mean."""
    rng = np.random.default_rng(3)
    parts = [h * 3600 + np.sort(rng.uniform(0, 3600, int(r * 3600))) for h, r in
             enumerate((2, 6, 3))]
    t = np.concatenate(parts)
    n = len(t)
    path = _write(tmp_path / "t.csv", t, np.full(n, 100), np.full(n, 10))
    fit = fit_trace_report(path)
    (w,) = fit.mix.workloads
    assert w.arrival.rate_rps == pytest.approx(6, rel=0.03)  # type: ignore[union-attr]
    assert isinstance(w.input_tokens, Constant) and w.input_tokens.value == 100
    assert "peak clock hour starting t=3600" in to_yaml(fit)


def test_daily_profile(tmp_path: Path) -> None:
    """A trace spanning two days becomes `daily`: the busiest hour of day gets fraction 1 and
    a quiet hour its share of the peak (within 15 %)."""
    rng = np.random.default_rng(4)
    shape = [0.2] * 24
    shape[14] = 1.0
    shape[9] = 0.6
    parts = [
        (d * 24 + h) * 3600 + np.sort(rng.uniform(0, 3600, rng.poisson(0.5 * 3600 * shape[h])))
        for d in range(2)
        for h in range(24)
    ]
    t = np.concatenate(parts)
    n = len(t)
    mix = fit_trace(_write(tmp_path / "d.csv", t, np.full(n, 50), np.full(n, 5)))
    arrival = mix.workloads[0].arrival
    assert isinstance(arrival, DailyArrival)
    assert arrival.hourly_fraction.index(1.0) == 14
    assert arrival.peak_rate_rps == pytest.approx(0.5, rel=0.05)
    assert arrival.hourly_fraction[9] == pytest.approx(0.6, rel=0.15)
    assert arrival.hourly_fraction[3] == pytest.approx(0.2, rel=0.15)


def test_iso_timestamps_and_workload_column(tmp_path: Path) -> None:
    """ISO datetimes are read as seconds, and a workload column splits the log into one
    workload per label, each with its own rate."""
    rng = np.random.default_rng(5)
    rows = []
    for label, rate in (("chat", 4.0), ("batch", 1.0)):
        t = np.cumsum(rng.exponential(1 / rate, int(rate * 1200)))
        rows += [(1.7e9 + x, label) for x in t]
    rows.sort()
    iso = [datetime.fromtimestamp(x, UTC).isoformat() for x, _ in rows]
    n = len(rows)
    path = _write(
        tmp_path / "iso.csv",
        np.array(iso),
        rng.integers(10, 500, n),
        rng.integers(1, 50, n),
        kind=[label for _, label in rows],
    )
    mix = fit_trace(path, workload_column="kind", pool="p")
    rates = {w.name: w.arrival.rate_rps for w in mix.workloads}  # type: ignore[union-attr]
    assert rates["chat"] == pytest.approx(4, rel=0.1)
    assert rates["batch"] == pytest.approx(1, rel=0.15)
    assert {w.pool for w in mix.workloads} == {"p"}


@pytest.mark.parametrize(("per_s", "unit"), [(1e3, "ms"), (1e6, "us"), (1e9, "ns")])
def test_epoch_timestamps_finer_than_seconds_are_told_by_their_size(
    tmp_path: Path, per_s: float, unit: str
) -> None:
    """`Date.now()` milliseconds (or `time.time_ns()`) read as seconds gave a rate 1000 times
    too low; an epoch number past 1e11 cannot be seconds, and is read in its unit."""
    rng = np.random.default_rng(7)
    t = 1.7e9 + np.cumsum(rng.exponential(1 / 5.0, 1500))
    path = _write(tmp_path / "epoch.csv", np.round(t * per_s).astype(np.int64),
                  rng.integers(10, 500, len(t)), rng.integers(1, 50, len(t)))
    mix = fit_trace(path, pool="p")
    assert mix.workloads[0].arrival.rate_rps == pytest.approx(5, rel=0.1)  # type: ignore[union-attr]
    assert f"timestamps read as epoch {unit}" in to_yaml(fit_trace_report(path, pool="p"))


def test_empirical_when_lognormal_fits_badly() -> None:
    """A bimodal length histogram is kept as an empirical histogram (KS above the threshold),
    preserving the mean; a lognormal one stays lognormal."""
    rng = np.random.default_rng(6)
    bimodal = np.concatenate([rng.integers(90, 110, 5000), rng.integers(3900, 4100, 5000)])
    fit = fit_lengths(*np.unique(bimodal, return_counts=True))
    assert isinstance(fit.dist, Empirical) and fit.ks is not None and fit.ks > 0.05
    assert fit.dist.mean == pytest.approx(bimodal.mean(), rel=0.01)
    assert "empirical" in fit.how
    smooth = fit_lengths(*np.unique(_lognormal(rng, 500, 0.7, 20000), return_counts=True))
    assert isinstance(smooth.dist, LogNormal) and "lognormal" in smooth.how
    assert smooth.dist.max == smooth.p999


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=400))
def test_histogram_keeps_the_mean(lengths: list[int]) -> None:
    """Binning a histogram into the empirical form keeps its mean (within bin rounding)."""
    values, counts = np.unique(np.asarray(lengths), return_counts=True)
    dist = histogram_dist(values, counts)
    assert len(dist.values) <= 64
    assert dist.mean == pytest.approx(np.mean(lengths), rel=1e-3, abs=1.0)


# -- prefix structure ------------------------------------------------------------------------


def _reference_hits(path: Path, block: int = 512) -> float:
    """Infinite-cache token hit rate, request by request in arrival order (slow, obvious)."""
    recs = sorted(
        (json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["timestamp"]
    )
    seen: set[int] = set()
    hit = total = 0
    for r in recs:
        lead = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            lead += 1
        hit += min(lead * block, r["input_length"] - 1)
        total += r["input_length"]
        seen.update(r["hash_ids"])
    return hit / total


def test_mooncake_prefix_structure() -> None:
    """The Mooncake fixture (4 Zipf-popular 4-block system prompts) reads with ms timestamps
    and yields 4 groups, a positive zipf_s, and the infinite-cache hit rate of a
    request-by-request reference."""
    fit = fit_trace_report(TRACES / "mooncake.jsonl")
    assert fit.format == "mooncake"
    (w,) = fit.mix.workloads
    assert w.prefix is not None and w.prefix.groups == 4 and w.prefix.zipf_s > 0.3
    expected = _reference_hits(TRACES / "mooncake.jsonl")
    assert fit.workloads[0].hit_rate == pytest.approx(expected, abs=1e-9)
    assert w.prefix.shared_fraction == pytest.approx(expected, abs=1e-3)
    assert w.arrival.rate_rps == pytest.approx(5, rel=0.1)  # type: ignore[union-attr]
    assert "infinite-cache hit rate" in to_yaml(fit)


def test_prefix_hash_column(tmp_path: Path) -> None:
    """A `prefix_hash` + `prefix_tokens` log: every request after the first of its group
    hits its prefix; prefix_hash without prefix_tokens is an error naming prefix_tokens."""
    t = np.arange(10, dtype=float)
    inp = np.full(10, 1000)
    path = _write(
        tmp_path / "p.csv", t, inp, np.full(10, 5),
        prefix_hash=["a", "b"] * 5, prefix_tokens=[600] * 10,
    )
    fit = fit_trace_report(path)
    assert fit.workloads[0].hit_rate == pytest.approx(8 * 600 / 10_000)
    assert fit.mix.workloads[0].prefix is not None
    assert fit.mix.workloads[0].prefix.groups == 2
    bad = _write(tmp_path / "q.csv", t, inp, np.full(10, 5), prefix_hash=["a"] * 10)
    with pytest.raises(ConfigError, match="prefix_tokens") as err:
        fit_trace(bad)
    assert err.value.field == "prefix_tokens"


def _replay_csv(path: Path, spec: PrefixSpec, *, n: int, seed: int) -> Path:
    """A replay-style log whose prefix_group/prefix_tokens the simulator's own generator drew
    from `spec` (capplan/sim/workload.py), at 10 req/s."""
    w = Workload(
        name="w", pool="p", arrival=PoissonArrival(rate_rps=10.0),
        input_tokens=LogNormal(mean_tokens=1200, sigma=0.7, max_tokens=8000),
        output_tokens=Constant(value=50),
        prefix=spec,
    )
    b = generate(w, 0, n / 10.0, np.random.default_rng(seed))
    return _write(
        path, b.arrival_s, b.input_tokens, b.output_tokens,
        prefix_group=b.prefix_group, prefix_tokens=b.prefix_tokens,
    )


@pytest.mark.parametrize(
    "spec",
    [
        PrefixSpec(shared_tokens=256, groups=12, zipf_s=1.1),
        PrefixSpec(shared_fraction=0.4, groups=5, zipf_s=0.0),
    ],
)
def test_prefix_group_columns_recover_the_spec(tmp_path: Path, spec: PrefixSpec) -> None:
    """prefix_group + prefix_tokens columns become the PrefixSpec that drew them: one head
    length per group gives shared_tokens (exactly), heads that scale with the prompt give
    shared_fraction; the recurring groups and their popularity skew come back too."""
    fit = fit_trace_report(_replay_csv(tmp_path / "t.csv", spec, n=4000, seed=3))
    got = fit.mix.workloads[0].prefix
    assert got is not None and got.groups == spec.groups
    assert got.zipf_s == pytest.approx(spec.zipf_s, abs=0.2)
    if spec.shared_tokens is not None:
        assert got.shared_tokens == spec.shared_tokens and got.shared_fraction is None
    else:
        assert got.shared_tokens is None
        assert got.shared_fraction == pytest.approx(spec.shared_fraction, abs=0.005)
    assert "prefix_group" in to_yaml(fit)


def test_prefix_group_real_trace() -> None:
    """The requests of a real vLLM run (8 Zipf-popular 512-token prefixes) give
    shared_tokens 512 and 8 groups; the infinite-cache hits per request, rounded down to
    vLLM's 16-token blocks, are exactly the cached_tokens vLLM reported for every measured
    request."""
    path = REAL / "requests.csv"
    fit = fit_trace_report(path)
    (w,) = fit.mix.workloads
    assert w.prefix is not None and 0.5 < w.prefix.zipf_s < 1.3
    assert w.prefix == PrefixSpec(shared_tokens=512, groups=8, zipf_s=w.prefix.zipf_s)
    sent = pl.read_csv(path)
    measured = sent.filter("measured")
    truth = int(measured["cached_tokens"].sum()) / int(measured["input_tokens"].sum())
    assert fit.workloads[0].hit_rate == pytest.approx(truth, abs=0.005)
    frame = sent.lazy().select(
        pl.col("arrival_s").alias("t_s"), "input_tokens", "prefix_group", "prefix_tokens",
        pl.lit("w").alias("workload"),
    )
    hits = _per_request_prefix_group(frame, True).collect().get_column("hit")
    rounded = sent.with_columns((hits // 16 * 16).alias("hit")).filter("measured")
    assert rounded["hit"].to_list() == rounded["cached_tokens"].to_list()


def test_prefix_group_round_trip_in_the_simulator(tmp_path: Path) -> None:
    """The fitted spec gives the simulated cache about the hit rate of replaying the trace
    itself (within 2 points); without the prefix columns it would be 0."""
    src = pl.read_csv(REAL / "requests.csv")
    trace = tmp_path / "replay.csv"
    src.select("arrival_s", "input_tokens", "output_tokens", "prefix_group",
               "prefix_tokens").write_csv(trace)
    fit = fit_trace_report(trace)
    fitted = simulate(fit.mix, "default", 1, duration_s=60, warmup_s=0)
    replay = fit.mix.model_copy(update={"workloads": [fit.mix.workloads[0].model_copy(
        update={"arrival": ReplayArrival(path=trace), "prefix": None})]})
    replayed = simulate(replay, "default", 1, duration_s=24, warmup_s=0)
    assert replayed.workloads[0].requests == src.height
    hit = replayed.workloads[0].prefix_hit_rate
    assert hit > 0.4
    assert fitted.workloads[0].prefix_hit_rate == pytest.approx(hit, abs=0.02)


def test_prefix_group_rows(tmp_path: Path) -> None:
    """Replay semantics: a group of one shares with nobody and a null group is none, so
    shared_tokens shrinks to keep the trace's shared-token total (4 x 400 over 6 prompts);
    a whole repeated prompt shares all but its last token; rows of group -2 (treated as
    cached) alone give target_hit_rate; heads growing within a group (multi-turn) give
    shared_fraction, and hit what the group's earlier requests held."""
    t, inp, out = np.arange(6, dtype=float), np.full(6, 1000), np.full(6, 5)
    one = _write(tmp_path / "a.csv", t, inp, out, prefix_group=[0, 0, 0, 1, None, 0],
                 prefix_tokens=[400, 400, 400, 400, 0, 400])
    fit = fit_trace_report(one)
    assert fit.mix.workloads[0].prefix == PrefixSpec(shared_tokens=267, groups=1)
    assert fit.workloads[0].hit_rate == pytest.approx(3 * 400 / 6000)
    whole = _write(tmp_path / "w.csv", t, inp, out, prefix_group=[0] * 6,
                   prefix_tokens=[1000] * 6)
    assert fit_trace(whole).workloads[0].prefix == PrefixSpec(shared_tokens=999)
    pinned = _write(tmp_path / "b.csv", t, inp, out, prefix_group=[-2] * 6,
                    prefix_tokens=[300] * 6)
    assert fit_trace(pinned).workloads[0].prefix == PrefixSpec(target_hit_rate=0.3)
    chat = _write(tmp_path / "c.csv", t, inp, out, prefix_group=[0, 0, 0, 1, 1, 1],
                  prefix_tokens=[100, 300, 500, 200, 400, 600])
    fit = fit_trace_report(chat)
    assert fit.mix.workloads[0].prefix == PrefixSpec(shared_fraction=0.35, groups=2)
    assert fit.workloads[0].hit_rate == pytest.approx((100 + 300 + 200 + 400) / 6000)


def test_shared_tokens_stay_below_the_longest_prompt() -> None:
    """A shared_tokens head not below the longest fitted prompt (the schema refuses it)
    becomes the same share of prompt tokens as shared_fraction, and the note says so."""
    fit = PrefixFit(PrefixSpec(shared_tokens=500, groups=2, zipf_s=0.5), 0.3, 0.9, 0.42, 2,
                    0.5, "")
    assert fit.below(501) == (fit.spec, None)
    spec, why = fit.below(500)
    assert spec == PrefixSpec(shared_fraction=0.42, groups=2, zipf_s=0.5)
    assert why is not None and "shared_fraction 0.42" in why


@pytest.mark.parametrize(
    ("columns", "field"),
    [
        ({"prefix_group": [0, 0]}, "prefix_tokens"),
        ({"prefix_tokens": [10, 10]}, "prefix_group"),
        ({"prefix_group": [0, 0], "prefix_tokens": [10, 2000]}, "prefix_tokens"),
        ({"prefix_group": [-1, 0], "prefix_tokens": [10, 10]}, "prefix_group"),
        ({"prefix_group": [-3, 0], "prefix_tokens": [10, 10]}, "prefix_group"),
    ],
)
def test_prefix_group_errors(tmp_path: Path, columns: dict[str, list[int]], field: str) -> None:
    """Prefix columns that break the replay reader's rules (both columns together; at most
    the prompt's length; tokens need a group; groups >= -2) are one-line errors naming the
    column, never silently dropped."""
    path = _write(tmp_path / "bad.csv", np.arange(2.0), np.full(2, 1000), np.full(2, 5),
                  **columns)
    with pytest.raises(ConfigError) as err:
        fit_trace(path)
    assert err.value.field == field and err.value.file == str(path)
    res = CliRunner().invoke(traffic, ["from-trace", str(path)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1


def test_a_workload_left_out_is_said_on_stderr(tmp_path: Path) -> None:
    """A workload with one arrival cannot be fitted and is left out; with --out the user saw
    it only in a comment inside the written file. (Every general note goes to stderr.)"""
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.2, 200))
    path = _write(tmp_path / "two.csv", np.append(t, 5.0), np.full(201, 300), np.full(201, 20),
                  workload=["a"] * 200 + ["b"])
    res = CliRunner().invoke(traffic, ["from-trace", str(path), "--out", str(tmp_path / "o.yaml")])
    assert res.exit_code == 0, res.output
    assert "note: left out workload(s) b: fewer than two distinct arrival times" in res.stderr


# -- public formats --------------------------------------------------------------------------


def test_vllm_bench_results() -> None:
    """A `vllm bench serve --save-detailed` result becomes poisson at its request rate with
    empirical lengths of the completed requests only; an infinite-rate run capped by
    --max-concurrency becomes a closed loop, constant at the mean without per-request data."""
    mix = fit_trace(TRACES / "vllm_bench.json")
    (w,) = mix.workloads
    raw = json.loads((TRACES / "vllm_bench.json").read_text())
    ok = [i for i, e in enumerate(raw["errors"]) if not e]
    assert isinstance(w.arrival, PoissonArrival) and w.arrival.rate_rps == 4.0
    assert isinstance(w.input_tokens, Empirical) and isinstance(w.output_tokens, Empirical)
    assert w.output_tokens.mean == pytest.approx(np.mean([raw["output_lens"][i] for i in ok]), 0.01)
    assert min(w.output_tokens.values) >= 1
    closed = fit_trace(TRACES / "vllm_bench_closed.json").workloads[0]
    assert closed.arrival == ClosedLoop(concurrency=16)
    assert closed.input_tokens == Constant(value=1000)


def test_metrics_scrape_parsed() -> None:
    """The synthetic 2-engine vLLM 0.26.0 scrape parses: series summed over engines, the
    length histograms become empirical distributions with the scrape's mean, two scrapes
    60 s apart give (600 finished - 9 fewer running) / 60 s = 9.85 req/s, and the prefix hit
    rate is hits / queries."""
    a = parse_metrics((TRACES / "metrics_a.prom").read_text())
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert a.models() == [model]
    assert a.total("vllm:request_success_total", model) == 1000
    h = a.histogram("vllm:request_prompt_tokens", model)
    assert h is not None and h.count == 1000 and h.bounds[-1] == math.inf
    assert histogram_lengths(h).mean == pytest.approx(h.sum / h.count, rel=0.01)
    fit = fit_trace_report(
        TRACES / "metrics_a.prom", second_scrape=TRACES / "metrics_b.prom", interval_s=60
    )
    (w,) = fit.mix.workloads
    assert isinstance(w.arrival, PoissonArrival) and w.arrival.rate_rps == pytest.approx(9.85)
    assert isinstance(w.input_tokens, Empirical)
    assert w.prefix is not None and w.prefix.target_hit_rate == pytest.approx(0.4, abs=0.02)
    assert fit.workloads[0].requests == 600


def test_one_scrape_needs_a_rate() -> None:
    """One scrape has no time base: without --rate-rps the error says to give a second
    scrape; with it, the lengths and hit rate are fitted."""
    with pytest.raises(ConfigError, match="second scrape") as err:
        fit_trace(TRACES / "metrics_a.prom")
    assert err.value.field == "--second-scrape"
    fit = fit_trace_report(TRACES / "metrics_a.prom", rate_rps=3.0)
    assert fit.mix.workloads[0].arrival == PoissonArrival(rate_rps=3.0)


# -- errors ----------------------------------------------------------------------------------


def test_missing_column_names_it(tmp_path: Path) -> None:
    """A log without output tokens fails with a ConfigError naming the file, the column and
    the accepted spellings; the CLI prints it as one line with exit code 2."""
    path = tmp_path / "bad.csv"
    pl.DataFrame({"timestamp": [0.0, 1.0], "input_tokens": [5, 6]}).write_csv(path)
    with pytest.raises(ConfigError) as err:
        fit_trace(path)
    assert err.value.field == "output_tokens" and err.value.file == str(path)
    assert "output_length" in str(err.value)
    res = CliRunner().invoke(traffic, ["from-trace", str(path)])
    assert res.exit_code == 2
    assert "output_tokens" in res.output and len(res.output.strip().splitlines()) == 1


def test_bad_values_are_errors(tmp_path: Path) -> None:
    """Empty values and zero-token prompts are errors naming the column; requests with no
    output (failed) are dropped and reported in the header."""
    empty = tmp_path / "empty.csv"
    empty.write_text("timestamp,input_tokens,output_tokens\n0,5,1\n1,,2\n2,5,3\n")
    with pytest.raises(ConfigError, match="no input_tokens value"):
        fit_trace(empty)
    failed = _write(tmp_path / "f.csv", np.arange(5.0), np.full(5, 9), np.array([3, 0, 3, 3, 3]))
    fit = fit_trace_report(failed)
    assert fit.workloads[0].requests == 4
    assert "dropped 1 request(s) with no output tokens" in to_yaml(fit)
    with pytest.raises(ConfigError, match="workload column 'nope'"):
        fit_trace(failed, workload_column="nope")


def test_sparse_and_regular_traces(tmp_path: Path) -> None:
    """Degenerate traces still fit: a workload with one request is left out (and said so),
    perfectly regular arrivals become a very smooth gamma, and a trace too sparse to have a
    meaningful peak hour is measured whole."""
    t = np.arange(0.0, 100.0, 0.5)
    n = len(t)
    labels = ["tick"] * n
    labels[7] = "lonely"
    path = _write(tmp_path / "r.csv", t, np.full(n, 20), np.full(n, 4), workload=labels)
    fit = fit_trace_report(path)
    assert [w.name for w in fit.mix.workloads] == ["tick"]
    assert "left out workload(s) lonely" in to_yaml(fit)
    arrival = fit.mix.workloads[0].arrival
    assert isinstance(arrival, GammaArrival) and arrival.cv < 0.1
    sparse = _write(tmp_path / "s.csv", np.array([0.0, 5000.0, 9000.0]), np.full(3, 9),
                    np.full(3, 9))
    w = fit_trace_report(sparse)
    assert "whole trace" in w.workloads[0].notes[0]
    assert w.workloads[0].rate_rps == pytest.approx(2 / 9000)


@pytest.mark.parametrize(("args", "says"), [
    (["--slo", "ttft=0.5"], "--slo: ttft=0.5: unknown SLO key 'ttft'; write "),
    (["--slo", "ttft_p100_s=0.5"], "--slo: ttft_p100_s=0.5: "),
    (["--slo", "ttft_p99_s=-1"], "--slo: ttft_p99_s=-1.0: SLO ttft_p99_s must be a positive"),
    (["--slo", "ttft_p0_s=1"], "--slo: ttft_p0_s=1.0: SLO key 'ttft_p0_s': the percentile "
                               "must lie between 0 and 100"),
    (["--slo", "ttft_p99_s=nan"], "--slo: expected KEY=SECONDS"),
    (["--pool", "bad pool!"], "--pool: 'bad pool!' is not a pool name"),
    (["--model", "llama-9b"], "--model: "),
])
def test_cli_bad_options_name_the_option(tmp_path: Path, args: list[str], says: str) -> None:
    """Rule: bad input is one line naming the option and the fix, checked before the trace
    is fitted (--slo was a ValidationError traceback; --pool and --model named no option)."""
    out = tmp_path / "m.yaml"
    res = CliRunner().invoke(traffic, ["from-trace", str(TRACES / "mooncake.jsonl"), *args,
                                       "--out", str(out)])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"error: {says}"), line
    if args[0] == "--slo" and "KEY=SECONDS" not in says:
        assert "_p<percentile>_s=<seconds>, percentile in (0, 100) and seconds > 0" in line
    if args[0] == "--pool":
        assert "^[A-Za-z0-9_.-]+$" in line
    if args[0] == "--model":
        assert "unknown model 'llama-9b'; known: " in line
    assert not out.exists()


def test_cli_out_must_be_yaml(tmp_path: Path) -> None:
    """`--out t.json` would hold YAML that `capplan size` then refuses as JSON: refused
    before the fit, nothing written."""
    out = tmp_path / "t.json"
    res = CliRunner().invoke(traffic, ["from-trace", str(TRACES / "mooncake.jsonl"),
                                       "--out", str(out)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {out}: --out: unknown suffix '.json'; use .yaml or .yml"
    assert not out.exists()


def test_json_lines_errors_name_the_line(tmp_path: Path) -> None:
    """A line that is not JSON is named by its number (polars says only 'Syntax at character
    36' or 'InternalError(TapeError)'), inside the schema-inference window or beyond it."""
    good = '{"timestamp": 0, "input_length": 100, "output_length": 50}\n'
    short = tmp_path / "short.jsonl"
    short.write_text(good + '{"timestamp": 1000, "input_length": 200\n')
    with pytest.raises(ConfigError, match=r"line 2 is not JSON \(Expecting ',' delimiter"):
        fit_trace(short)
    long = tmp_path / "long.jsonl"
    long.write_text(good * 3000 + '{"timestamp": 1, "input_length": 2\n' + good * 3)
    with pytest.raises(ConfigError, match="line 3001 is not JSON"):
        fit_trace(long)
    csv = tmp_path / "requests.csv"
    csv.write_text("timestamp,input_tokens,output_tokens\n0,1,1\n1,1,1\n")
    with pytest.raises(ConfigError, match="cannot read mooncake file: line 1 is not JSON"):
        fit_trace(csv, format="mooncake")


@pytest.mark.parametrize(("rows", "row", "value"), [
    (["nan", "0.2", "0.3"], 1, "nan"),
    (["0.1", "0.2", "-", "0.3"], 3, "-"),
    (["yesterday", "today"], 1, "yesterday"),
])
def test_text_timestamps_name_the_column_and_row(
    tmp_path: Path, rows: list[str], row: int, value: str
) -> None:
    """A timestamp that is neither seconds nor an ISO datetime is named with its column and
    row (polars said only 'could not find an appropriate format to parse dates')."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n"
                    + "".join(f"{t},100,100\n" for t in rows))
    with pytest.raises(ConfigError) as err:
        fit_trace(path)
    assert err.value.field == "arrival_s"
    assert f"row {row} has {value!r}, neither seconds nor an ISO datetime" in str(err.value)


# -- integration -----------------------------------------------------------------------------


def test_fitted_yaml_loads_and_simulates(tmp_path: Path) -> None:
    """The YAML written for a fit loads with load_mix and simulates for 20 s."""
    fit = fit_trace_report(TRACES / "mooncake.jsonl", slo={"ttft_p99_s": 2.0})
    path = tmp_path / "mix.yaml"
    path.write_text(to_yaml(fit))
    mix = load_mix(path)
    assert mix.workloads[0].prefix == fit.mix.workloads[0].prefix
    assert mix.workloads[0].slo.targets[0].limit_s == 2.0
    res = simulate(mix, "default", 1, duration_s=20)
    assert res.workloads[0].requests > 50


def test_cli_writes_yaml_and_summary(tmp_path: Path) -> None:
    """`traffic from-trace --out` writes a loadable YAML and prints a summary table."""
    out = tmp_path / "m.yaml"
    res = CliRunner().invoke(
        traffic, ["from-trace", str(TRACES / "mooncake.jsonl"), "--out", str(out),
                  "--pool", "chat"]
    )
    assert res.exit_code == 0, res.output
    assert "mooncake" in res.output and "prefix hit" in res.output
    assert load_mix(out).workloads[0].pool == "chat"
    stdout = CliRunner().invoke(traffic, ["from-trace", str(TRACES / "vllm_bench.json")])
    assert stdout.output.startswith("# Fitted by")


def test_registered_under_capplan(monkeypatch: pytest.MonkeyPatch) -> None:
    """`capplan.tracefit.cli:traffic` works as a lazy subcommand of `capplan` (how the lead
    registers it) and a bad input still ends in one red line with the ConfigError code."""
    from capplan.cli import main

    monkeypatch.setitem(main.lazy, "traffic", "capplan.tracefit.cli:traffic")  # type: ignore[attr-defined]
    runner = CliRunner()
    ok = runner.invoke(main, ["traffic", "from-trace", str(TRACES / "vllm_bench_closed.json")])
    assert ok.exit_code == 0 and "kind: closed" in ok.output
    bad = runner.invoke(main, ["traffic", "from-trace", "nope.csv"])
    assert bad.exit_code == 2 and "trace file not found" in bad.output


def test_large_parquet_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 M-row parquet log is fitted with every collect on the streaming engine and no
    collected frame larger than a histogram or an hour's gaps summary: nothing loads whole."""
    rng = np.random.default_rng(9)
    n = 2_000_000
    path = _write(
        tmp_path / "big.parquet",
        np.cumsum(rng.exponential(1 / 500, n)),
        _lognormal(rng, 1000, 0.6, n),
        _lognormal(rng, 150, 0.6, n),
    )
    seen: list[tuple[object, int]] = []
    original = pl.LazyFrame.collect

    def spy(self: pl.LazyFrame, *args: object, **kwargs: object) -> pl.DataFrame:
        df = original(self, *args, **kwargs)  # type: ignore[arg-type]
        seen.append((kwargs.get("engine"), df.height))
        return df

    monkeypatch.setattr(pl.LazyFrame, "collect", spy)
    mix = fit_trace(path)
    assert seen and all(engine == "streaming" for engine, _ in seen)
    assert max(height for _, height in seen) < 50_000
    assert mix.workloads[0].arrival.rate_rps == pytest.approx(500, rel=0.02)  # type: ignore[union-attr]
