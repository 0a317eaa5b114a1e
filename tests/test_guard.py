"""`capplan size --guard`: SLO limits tightened by the simulator's validated error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan import fidelity
from capplan.cli import main
from capplan.mix import load_mix
from capplan.profiles import CALIBRATION_DIR
from capplan.solve.guard import guarded

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "examples" / "production-mix.yaml"


PROFILE = {"interactive": "h200/llama-3.1-8b/bf16", "vision": "h200/gemma-4-31b/fp8",
           "batch": "h200/llama-3.1-8b/bf16-draft_model4"}


@pytest.mark.parametrize(("guard", "stat"), [("p10", "p10"), ("worst", "min")])
def test_limits_tighten_by_the_profiles_error(guard: str, stat: str) -> None:
    """A pool whose profile has enough open-loop validation rows (the interactive pool's
    Llama-3.1-8B BF16, the vision pool's Gemma 4 FP8) has each limit scaled by 1 + its
    metric's error where that error is negative; the batch pool's draft-model profile, with
    fewer rows, keeps its limits and says why."""
    mix = load_mix(MIX)
    table = fidelity.load(fidelity.path_for(CALIBRATION_DIR, "h200"))
    out, lines = guarded(mix, guard)  # type: ignore[arg-type]
    before = {w.name: w for w in mix.workloads}
    n = 0
    for w in out.workloads:
        rows = table.get(PROFILE[w.pool], {})
        for t, t0 in zip(w.slo.targets, before[w.name].slo.targets, strict=True):
            f = rows.get(t.key)
            if f is not None and f["rows"] >= fidelity.MIN_ROWS and f[stat] < 0:
                assert t.limit_s == pytest.approx(t0.limit_s * (1 + f[stat]))
                n += 1
            else:
                assert t.limit_s == t0.limit_s
    tightened = [line for line in lines if " -> " in line]
    assert len(tightened) == n and n >= 6
    assert all(PROFILE["batch"] not in x for x in tightened)
    # the others say why they were kept
    kept = [line for line in lines if " kept at " in line]
    assert "summarise" in {x.split()[0] for x in kept}
    assert all("fewer than 5 validation rows" in x for x in kept if x.startswith("summarise"))


def test_an_analytic_profile_is_not_guarded() -> None:
    mix = load_mix(ROOT / "tests" / "data" / "size-small.yaml")
    out, lines = guarded(mix, "worst")
    assert out.workloads == mix.workloads
    assert lines and all(" kept at " in x and "a measured profile" in x for x in lines)


def test_cli_guarded_plan_says_so(tmp_path: Path) -> None:
    """The plan records the guard and each tightened limit (the interactive pool's six and
    the vision pool's two); its SLO lines carry the tightened limits, and it quotes no
    fidelity line beside them (the error is in the limits)."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(MIX), "--quick", "--guard", "p10",
                                  "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "guard p10: SLO limits tightened" in r.output and "fidelity:" not in r.output
    plan = json.loads(out.read_text())
    assert plan["guard"] == "p10" and sum(" -> " in x for x in plan["guarded"]) == 8
    inter = next(p for p in plan["pools"] if p["pool"] == "interactive")
    limits = {(w["name"], s["key"]): s["limit_s"] for w in inter["workloads"] for s in w["slo"]}
    assert limits[("agent", "ttft_p99_s")] < 1.0 and inter["fidelity"] is None


def test_report_says_the_plan_was_guarded(tmp_path: Path) -> None:
    from capplan.report import render_report
    from capplan.solve.plan import Plan

    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(MIX), "--quick", "--guard", "worst",
                                  "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0, r.output
    page = render_report(Plan.model_validate_json(out.read_text()), None)
    assert "Guarded (worst)" in page and "agent ttft_p99_s 1 -&gt;" in page


def test_report_of_a_guarded_plan_uses_its_limits(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`capplan report plan.json` on a guarded plan reads the mix with the plan's guard."""
    from capplan.report import cli as report_cli

    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(MIX), "--quick", "--guard", "p10",
                                  "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0, r.output
    seen: dict[str, object] = {}
    monkeypatch.setattr(report_cli, "write_report",
                        lambda plan, mix, path, **_: seen.setdefault("mix", mix) and 0)
    report_cli._build(out, MIX, tmp_path / "r.html", True, None, 1)
    mix = seen["mix"]
    agent = next(w for w in mix.workloads if w.name == "agent")  # type: ignore[attr-defined]
    assert agent.slo.targets[0].limit_s < 1.0
