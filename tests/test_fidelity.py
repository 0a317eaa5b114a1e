"""What a plan quotes of the simulator's validated error (capplan/fidelity.py)."""

from __future__ import annotations

import pytest

from capplan.fidelity import margin_after, summarise
from capplan.solve.plan import fidelity_of
from capplan.validate.compare import Row


def _row(profile: str, measured: float, predicted: float, arrival: str = "poisson") -> Row:
    m = {k: measured for k in ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s",
                               "itl_p99_s", "e2e_p99_s")}
    return Row("e", "m", "bf16", "x", "x", "w", (), m, {k: predicted for k in m},
               profile=profile, arrival=arrival)


def test_summary_is_the_signed_errors_spread_per_profile() -> None:
    rows = [_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1, 1.2)]
    rows.append(_row("h200/m/fp8", 2.0, 2.0))
    rows.append(_row("", 1.0, 9.0))  # no profile: left out
    rows.append(_row("h200/m/fp8", 0.0, 1.0))  # no finite error: left out
    rows.append(_row("h200/m/bf16", 1.0, 0.1, arrival="closed"))  # closed loop: left out
    t = summarise(rows)
    assert set(t) == {"h200/m/bf16", "h200/m/fp8"}
    s = t["h200/m/bf16"]["ttft_p99_s"]
    assert s["rows"] == 5 and s["min"] == -0.5 and s["max"] == 0.2 and s["p50"] == 0.0
    assert s["p10"] == pytest.approx(-0.34) and s["p90"] == pytest.approx(0.16)
    assert t["h200/m/fp8"]["itl_p99_s"]["rows"] == 1


def test_margin_after_an_under_prediction() -> None:
    """Predicted 0.5 s against a 1 s limit is a 50 % margin; a prediction 20 % under the
    engine means the engine took 0.625 s, a 37.5 % margin."""
    assert margin_after(0.5, 0.0) == pytest.approx(0.5)
    assert margin_after(0.5, -0.2) == pytest.approx(1 - 0.5 / 0.8)
    assert margin_after(0.5, -0.5) == pytest.approx(0.0)
    assert margin_after(0.5, -0.6) < 0  # the SLO would fail


def test_a_plan_quotes_its_binding_metric_only_where_rows_exist() -> None:
    table = summarise([_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1, 1.2)])
    f = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table)
    assert f is not None and f.rows == 5 and f.worst_under == -0.5
    assert f.margin_after_worst == pytest.approx(margin_after(0.6, -0.5))
    assert f.margin_after_p10 == pytest.approx(margin_after(0.6, -0.34))
    assert fidelity_of("h200/m/fp8", "ttft_p99_s", 0.6, table) is None
    assert fidelity_of("h200/m/bf16", "ttft_p95_s", 0.6, table) is None
    # too few rows for a spread: the plan quotes their range and the worst margin, no p10
    few = summarise([_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1)])
    h = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, few)
    assert h is not None and h.few and h.rows == 4 and h.margin_after_p10 is None
    assert (h.p10, h.p90) == (pytest.approx(-0.5), pytest.approx(0.1))
    assert h.margin_after_worst == pytest.approx(margin_after(0.6, -0.5))
    assert not f.few
    over = summarise([_row("h200/m/bf16", 1.0, 1.2)] * 5)  # never under: nothing to take off
    g = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, over)
    assert g is not None and g.worst_under == 0.0 and g.margin_after_worst == pytest.approx(0.6)


def test_the_summary_counts_predictions_within_the_measurements_noise() -> None:
    """A row whose prediction lies in its measured figure's sampling interval counts as
    within noise, and the plan's Fidelity carries the count; a summary written before the
    count existed gives none."""
    from dataclasses import replace

    rows = [_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1, 1.2)]
    rows[1] = replace(rows[1], noise={"ttft_p99_s": (0.85, 1.05)})
    table = summarise(rows)
    assert table["h200/m/bf16"]["ttft_p99_s"]["within_noise"] == 1
    assert table["h200/m/bf16"]["itl_p99_s"]["within_noise"] == 0
    f = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table)
    assert f is not None and f.within_noise == 1
    del table["h200/m/bf16"]["ttft_p99_s"]["within_noise"]
    old = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table)
    assert old is not None and old.within_noise is None


def test_measured_tails_are_the_shares_past_each_threshold() -> None:
    """A workload's measured shares past GRID_S: TTFT and E2E over its served requests, ITL
    over every streamed gap (a request that failed counts in neither)."""
    import numpy as np
    import polars as pl

    from capplan.fidelity import GRID_S, share_ratios, tails
    from capplan.validate.compare import measured_tails

    rows = pl.DataFrame({
        "ttft_s": [0.1, 0.2, 0.3, 0.4, None], "e2e_s": [1.0, 2.0, 3.0, 4.0, None],
        "error": [None, None, None, None, "boom"],
        "chunk_t": [[0.1, 0.11, 0.12], [0.2, 0.21, 0.30], [0.3, 0.31, 0.32],
                    [0.4, 0.41, 0.42], []]})
    got = measured_tails(rows)
    at = int(np.searchsorted(GRID_S, 0.15))  # the first threshold past 0.15 s
    assert got["ttft"][at] == 0.75 and got["e2e"][0] == 1.0 and got["e2e"][-1] == 0.0
    gaps = np.array([0.01, 0.01, 0.01, 0.09, 0.01, 0.01, 0.01, 0.01])
    x = int(np.searchsorted(GRID_S, 0.05))
    assert got["itl"][x] == pytest.approx(np.mean(gaps > GRID_S[x]))
    # a Row carrying them: one frame row per latency metric; closed-loop rows left out
    r = _row("h200/m/bf16", 1.0, 1.0)
    r.tails.update({m: (v, v * 0.5) for m, v in got.items()})
    closed = _row("h200/m/bf16", 1.0, 1.0, arrival="closed")
    closed.tails.update(r.tails)
    frame = tails([r, closed])
    assert frame.height == 3 and set(frame["metric"]) == {"ttft", "itl", "e2e"}
    # the engine ran twice the predicted share past 150 ms: a row near 25 % (a p75)
    assert share_ratios(frame, "h200/m/bf16", "ttft", 0.15, 0.25) == [
        (pytest.approx(2.0), "e/x/w")]
    assert share_ratios(frame, "h200/m/bf16", "ttft", 0.15, 0.01) == []  # 37 % is not near 1 %


def test_a_plan_quotes_the_share_past_its_limit_where_rows_came_near() -> None:
    """Beside the percentile's error, a plan's Fidelity says how far the engine's share past
    the binding SLO's limit ran from the simulator's on the rows whose prediction came near
    the limit (1.1x to 1.3x here), and what the plan's own share past it would be so; with
    fewer than five such rows, or no tails stored, it says nothing of the share."""
    import polars as pl

    from capplan.fidelity import GRID_S

    table = summarise([_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1, 1.2)])

    def tails(ratios: list[float]) -> pl.DataFrame:
        def curve(past: float) -> list[float]:
            return [past if x < 0.5 else 0.0 for x in GRID_S]
        return pl.DataFrame([{"profile": "h200/m/bf16", "metric": "ttft", "row": f"r{i}",
                              "measured": curve(0.01 * k), "predicted": curve(0.01)}
                             for i, k in enumerate(ratios)])

    f = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table, limit_s=0.3, beyond=0.008,
                    tails=tails([1.1, 1.1, 1.2, 1.2, 1.3]))
    assert f is not None and f.share_rows == 5
    assert f.share_max == pytest.approx(1.3) and f.share_p90 == pytest.approx(1.26)
    assert f.beyond_after_worst == pytest.approx(0.0104)
    assert f.beyond_after_p10 == pytest.approx(0.008 * 1.26)
    few = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table, limit_s=0.3, beyond=0.008,
                      tails=tails([1.1, 1.2]))
    assert few is not None and few.share_rows is None and few.beyond_after_worst is None
    assert fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table).share_rows is None  # type: ignore[union-attr]


def test_a_plan_says_what_the_engine_put_past_its_limit_unseen() -> None:
    """Rows whose prediction put almost nothing past the binding SLO's limit where the engine
    put more cannot be read as a ratio; the plan's Fidelity counts them and quotes the
    largest excess, and the CLI and report say it."""
    import polars as pl

    from capplan.fidelity import GRID_S
    from capplan.report.render import _share_fidelity

    table = summarise([_row("h200/m/bf16", 1.0, p) for p in (0.5, 0.9, 1.0, 1.1, 1.2)])

    def curve(past: float) -> list[float]:
        return [past if x < 0.5 else 0.0 for x in GRID_S]

    frame = pl.DataFrame([{"profile": "h200/m/bf16", "metric": "ttft", "row": f"r{i}",
                           "measured": curve(m), "predicted": curve(p)}
                          for i, (m, p) in enumerate([(0.004, 0.0), (0.006, 0.001),
                                                      (0.001, 0.0)])])
    f = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table, limit_s=0.3, tails=frame)
    assert f is not None and f.share_rows is None
    assert f.unseen_rows == 2 and f.unseen_max == pytest.approx(0.005)
    assert "on 2 rows where the prediction put almost nothing past the limit the engine " \
        "put up to 0.5 % more past it" in _share_fidelity(f)
    none = fidelity_of("h200/m/bf16", "ttft_p99_s", 0.6, table, limit_s=0.6, tails=frame)
    assert none is not None and none.unseen_rows is None and _share_fidelity(none) == ""
