"""The measured figures' sampling intervals (compare.measured_intervals) and the table's
mark for a miss inside one, on stored real runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.validate.compare import Row, measured_intervals, measured_metrics
from capplan.validate.report import _cell, summary_lines
from capplan.validate.store import load_run, stored_runs


def _requests(engine: str, run: str) -> pl.DataFrame:
    folder = next(p for p in stored_runs() if p.name == engine)
    _, reqs, _ = load_run(folder)
    return reqs.filter(pl.col("run") == run)


def test_each_interval_holds_its_measured_figure() -> None:
    """Every interval of a real run holds the figure measured from all its requests."""
    for engine, run in (("llama-3.1-8b-bf16", "chat-c1"), ("llama-3.1-8b-bf16", "chat-p28")):
        reqs = _requests(engine, run)
        measured, noise = measured_metrics(reqs), measured_intervals(reqs)
        assert set(noise) == {"ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s"}
        for metric, (lo, hi) in noise.items():
            assert lo <= measured[metric] <= hi, (engine, run, metric)


def test_a_p99_of_few_requests_spans_their_slowest() -> None:
    """A p99 of 32 requests is their slowest or second slowest (the 99th percentile lies
    below the second slowest with probability 0.04): its interval runs from the second
    slowest to the slowest, and the same requests' median interval is narrower."""
    reqs = _requests("llama-3.1-8b-bf16", "chat-c1")
    ttft = np.sort(reqs["ttft_s"].to_numpy())
    assert len(ttft) == 32
    lo, hi = measured_intervals(reqs)["ttft_p99_s"]
    assert (lo, hi) == (ttft[-2], ttft[-1])
    lo50, hi50 = measured_intervals(reqs)["ttft_p50_s"]
    assert hi50 - lo50 < hi - lo


def test_more_requests_narrow_the_interval() -> None:
    """Half the requests of a run give a wider TTFT p50 interval than all of them; the
    bootstrap of ITL is seeded (the same interval twice)."""
    reqs = _requests("llama-3.1-8b-bf16", "chat-p28")
    lo, hi = measured_intervals(reqs)["ttft_p50_s"]
    lo2, hi2 = measured_intervals(reqs.head(reqs.height // 2))["ttft_p50_s"]
    assert hi2 - lo2 > hi - lo
    assert measured_intervals(reqs)["itl_p99_s"] == measured_intervals(reqs)["itl_p99_s"]


def test_a_miss_inside_the_interval_is_marked_apart() -> None:
    """The table marks a miss ✗, and ✗° where the prediction lies inside the measured
    figure's interval; the summary counts the latter per metric."""
    measured = {"requests": 30.0, "output_tok_s": 100.0, "ttft_p50_s": 0.100,
                "ttft_p99_s": 0.200, "itl_p50_s": 0.010, "itl_p99_s": 0.020, "e2e_p99_s": 1.0}
    predicted = {**measured, "ttft_p50_s": 0.120, "ttft_p99_s": 0.240}
    noisy = Row("e", "m", "bf16", "x", "x", "w", (), measured, predicted,
                noise={"ttft_p50_s": (0.090, 0.125), "ttft_p99_s": (0.190, 0.210)})
    assert _cell(noisy, "ttft_p50_s").endswith("✗°")
    assert _cell(noisy, "ttft_p99_s").endswith("✗")
    assert not _cell(noisy, "itl_p50_s").endswith("✗")
    ttft_p50 = next(line for line in summary_lines([noisy]) if line.startswith("| TTFT p50"))
    assert ttft_p50.endswith("| 1 |")


def test_repeated_experiments_share_the_range_they_measured() -> None:
    """Rows of the same experiment (experiment_key: configuration, workloads, load and
    duration, not name or seed) carry the range all their runs measured, and a prediction
    inside it is within the measurement's noise; a longer run of the same load is another
    experiment."""
    from capplan.validate.compare import experiment_key, with_repeats
    from capplan.validate.suite import load_suite

    suite = load_suite(Path(__file__).resolve().parents[1] / "validation" / "h200.yaml")
    vision = suite.engine("gemma-4-31b-fp8-vision")
    vision3 = suite.engine("gemma-4-31b-fp8-vision3")
    image = next(e for e in vision.experiments if e.name == "image-c1")
    assert experiment_key(vision, image) == experiment_key(
        vision3, next(e for e in vision3.experiments if e.name == "image-c1"))
    longer = image.model_copy(update={"duration_s": image.duration_s * 2})
    assert experiment_key(vision, longer) != experiment_key(vision, image)
    assert experiment_key(vision, image.model_copy(update={"seed": 7, "name": "x"})) == \
        experiment_key(vision, image)

    base = {"requests": 30.0, "output_tok_s": 100.0, "ttft_p50_s": 0.100, "ttft_p99_s": 0.2,
            "itl_p50_s": 0.01, "itl_p99_s": 0.02, "e2e_p99_s": 1.0}
    predicted = {**base, "ttft_p50_s": 0.118}
    a = Row("e1", "m", "bf16", "x", "x", "w", (), base, predicted, key="k")
    b = Row("e2", "m", "bf16", "x", "x", "w", (), {**base, "ttft_p50_s": 0.120}, predicted,
            key="k")
    other = Row("e3", "m", "bf16", "y", "y", "w", (), base, predicted, key="j")
    a, b, other = with_repeats([a, b, other])
    assert a.repeats["ttft_p50_s"] == (0.100, 0.120) and not other.repeats
    assert a.within_noise("ttft_p50_s") and _cell(a, "ttft_p50_s").endswith("✗°")
    assert not other.within_noise("ttft_p50_s")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.01, 0.5, 0.9, 0.99, 1.0]))
def test_the_windowed_bootstrap_quantile_is_the_full_sums(seed: int, q: float) -> None:
    """compare._weighted_quantile sums the resampled weights near the sample's quantile
    only; it gives what summing them all gives (searchsorted on the whole cumulative
    weight), whatever the requests' gap counts, including requests with none."""
    from capplan.validate.compare import _weighted_quantile

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    sizes = rng.integers(0, 30, n)
    sizes[0] += 1  # at least one gap
    owner = np.repeat(np.arange(n), sizes)
    x = rng.exponential(1.0, len(owner))
    order = np.argsort(x, kind="stable")
    xs, own = x[order], owner[order]
    counts = rng.multinomial(n, np.full(n, 1 / n), size=20)
    fast = _weighted_quantile(xs, own, counts, q)
    full = [xs[min(int(np.searchsorted(np.cumsum(c[own]), q * c[own].sum())), len(xs) - 1)]
            for c in counts]
    assert np.array_equal(fast, full)


def test_a_run_held_by_the_runners_own_collection_says_so() -> None:
    """The stall check (llama-3.1-8b-fp8-gc, chat at 44 req/s five times, before the runner
    froze its heap): the one run whose runner recorded a full collection of 390 ms carries it
    in its row's note, the four without one carry none."""
    from capplan.validate.compare import GC_NOTE_MS, compare_run

    folder = next(p for p in stored_runs() if p.name == "llama-3.1-8b-fp8-gc")
    _, _, measured = load_run(folder)
    long = {name for name, info in measured["runs"].items()
            if any(ms >= GC_NOTE_MS for _, ms, _ in info["gc_pauses"])}
    assert long == {"chat-p44-r4"}
    notes = {r.run: r.note for r in compare_run(folder)}
    assert notes["chat-p44-r4"] == "the runner's own 390 ms garbage collection at 1.8 s"
    assert not any(notes[r] for r in notes if r != "chat-p44-r4")


def test_the_compare_table_prints_each_rows_note(tmp_path: Path) -> None:
    """`capplan validate compare`'s table ends with the notes its rows carry (the CSV has
    them as a column), so the terminal reader sees the collection behind a tail too."""
    import shutil

    from click.testing import CliRunner

    from capplan.cli import main

    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-fp8-gc")
    root = tmp_path / "cal"
    shutil.copytree(src, root / "h200/vllm-0.26.0/llama-3.1-8b/validation" / src.name)
    out = CliRunner().invoke(main, ["validate", "compare", "--root", str(root)])
    assert out.exit_code == 0, out.output
    notes = out.output[out.output.index("notes:"):].splitlines()[1:]
    assert notes == ["  llama-3.1-8b-fp8-gc chat-p44-r4 chat: the runner's own 390 ms "
                     "garbage collection at 1.8 s"]
