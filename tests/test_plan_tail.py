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


def test_a_short_confirmation_says_how_long_would_pin_the_tail(tmp_path: Path) -> None:
    """--quick confirms at probe length: every pool of the production mix holds fewer than
    TAIL_RULE requests beyond its p99, and the table, the JSON and the report say so, with
    the duration that would hold enough."""
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
    vision = next(p for p in plan["pools"] if p["pool"] == "vision")["confidence"]
    need = vision["duration_s"] * TAIL_RULE / vision["tail_requests"]
    assert f"simulation.duration_s {need:,.0f} would steady it" in r.output
    page = render_report(Plan.model_validate_json(out.read_text()), None)
    assert "tightest percentile rests on" in page
