"""A plan says when its confirmation held too few requests beyond a percentile to pin it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from capplan.cli import main
from capplan.solve.plan import TAIL_RULE, thinnest_tail

MIX = Path(__file__).resolve().parents[1] / "examples" / "production-mix.yaml"


def _result(*workloads: tuple[str, int, list[str]]) -> SimpleNamespace:
    return SimpleNamespace(workloads=[
        SimpleNamespace(name=n, requests=r, slo=[SimpleNamespace(key=k) for k in keys])
        for n, r, keys in workloads])


def test_the_thinnest_tail_is_the_fewest_requests_beyond_a_tightest_percentile() -> None:
    """requests x (1 - q/100) with q each workload's tightest percentile: 1,000 requests
    under a p99 leave 10 beyond it, 300 under a p90 (and a p50) leave 30; a workload with
    no percentile SLO has no tail to pin."""
    res = _result(("chat", 300, ["ttft_p50_s", "itl_p90_s"]),
                  ("vision", 1000, ["ttft_p99_s", "itl_p99_s"]), ("batch", 5, []))
    assert thinnest_tail(res) == ("vision", pytest.approx(10.0))  # type: ignore[arg-type]
    assert thinnest_tail(_result(("batch", 5, []))) is None  # type: ignore[arg-type]
    deep = _result(("chat", 20_000, ["itl_p99.9_s"]), ("rag", 1000, ["ttft_p90_s"]))
    assert thinnest_tail(deep) == ("chat", pytest.approx(20.0))  # type: ignore[arg-type]


def test_a_short_confirmation_says_how_long_would_pin_the_tail() -> None:
    """A full search confirms at the mix's duration_s: where that holds too few requests
    beyond a percentile, the line gives the duration that would hold TAIL_RULE; under
    --quick, whose probes ignore duration_s, it says to size without --quick (it named a
    duration_s that changed nothing)."""
    from capplan.solve.plan import Confidence

    c = Confidence(seeds=[0], all_seeds_pass=True, worst_margin=0.2, duration_s=100,
                   one_fewer_fails=True, simulations=3, tail_requests=10, tail_workload="chat")
    assert c.thin_tail() == ("chat's tightest percentile rests on ~10 requests beyond it in "
                             f"100 s (the search asks {TAIL_RULE}); simulation.duration_s "
                             f"{100 * TAIL_RULE / 10:,.0f} would steady it")
    one = c.model_copy(update={"tail_requests": 1.2})
    assert "rests on ~1 request beyond it" in (one.thin_tail(quick=True) or "")
    assert (one.thin_tail(quick=True) or "").endswith(
        "size without --quick to confirm it at the mix's duration_s")
    assert c.model_copy(update={"tail_requests": TAIL_RULE}).thin_tail() is None
    fitted = c.model_copy(update={"tail_workload": "requests"})  # from-trace's name for it
    assert (fitted.thin_tail() or "").startswith("requests' tightest percentile")


def test_a_quick_confirmation_says_its_tail_is_thin(tmp_path: Path) -> None:
    """--quick confirms at probe length: every pool of the production mix holds fewer than
    TAIL_RULE requests beyond its p99, and the table, the JSON and the report say so."""
    from capplan.report import render_report
    from capplan.solve.plan import Plan

    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(MIX), "--quick", "--out", str(out),
                                  "--workers", "1"])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    tails = [p["confidence"]["tail_requests"] for p in plan["pools"]]
    assert all(0 < t < TAIL_RULE for t in tails)
    assert r.output.count("tightest percentile rests on") == len(plan["pools"])
    assert r.output.count("size without --quick to confirm it") == len(plan["pools"])
    assert "would steady it" not in r.output
    page = render_report(Plan.model_validate_json(out.read_text()), None)
    assert "tightest percentile rests on" in page and "size without --quick" in page


def test_a_percentile_met_with_more_than_its_share_past_says_why() -> None:
    """A short run's p99 of 86 requests ranks below the largest, so one request past the
    limit is 1.2 % and the p99 still meets it: the SLO line says how many of how many
    (it read '✓ ... 1.2 % past (1 %)', which looks self-contradictory)."""
    from capplan.solve.cli import _past
    from capplan.solve.plan import SloLine

    line = SloLine(key="e2e_p99_s", limit_s=30, value_s=29, margin=0.03, met=True,
                   beyond=1 / 86)
    assert _past(line, 86) == (" · 1.2 % past (1 %; 1 of 86 requests: too few for the p99 "
                               "to rank among them)")
    assert _past(line.model_copy(update={"met": False}), 86) == " · 1.2 % past (1 %)"
    within = line.model_copy(update={"beyond": 0.0082})
    assert _past(within, 86) == " · 0.82 % past (1 %)"
    itl = line.model_copy(update={"key": "itl_p99_s"})
    assert _past(itl, 86).endswith("1.2 % past (1 %; to the histogram's resolution)")
