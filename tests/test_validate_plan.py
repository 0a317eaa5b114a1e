"""`capplan validate plan`: the suite that puts a plan's decision to real vLLM."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from capplan.cli import main
from capplan.errors import ConfigError
from capplan.mix import load_mix
from capplan.solve.options import size_mix
from capplan.solve.plan import Plan
from capplan.validate.plan import plan_suite, suite_yaml
from capplan.validate.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "examples" / "production-mix.yaml"


@cache
def plan() -> Plan:
    return size_mix(load_mix(MIX), quick=True, advice=False)


def _at(p: Plan, pool: str, replicas: int) -> Plan:
    pools = [q.model_copy(update={"replicas_for_slo": replicas}) if q.pool == pool else q
             for q in p.pools]
    return p.model_copy(update={"pools": pools})


def test_one_replica_at_the_share_of_n_and_of_n_minus_1() -> None:
    """Per pool one engine at the plan's configuration; each Poisson rate divided by N and by
    N - 1; the vision pool's image requests too (the runner builds their pictures); then the
    whole traffic, of which replica 0 serves what the pool's router hands it at N and N - 1."""
    mix = load_mix(MIX)
    suite, skipped = plan_suite(mix, _at(_at(plan(), "interactive", 5), "vision", 9))
    assert suite is not None and skipped == {}
    vision = next(e for e in suite.engines if e.pool.name == "vision")
    assert [x.name for x in vision.experiments] == ["vision-of9", "vision-of8",
                                                    "vision-routed9", "vision-routed8"]
    for x, n in zip(vision.experiments[:2], (9, 8), strict=True):
        (w,) = x.workloads
        assert w.image is not None and w.image.tokens_per_image == 280
        assert w.arrival.rate_rps == pytest.approx(10 / n, rel=1e-3)  # type: ignore[union-attr]
    for x, n in zip(vision.experiments[2:], (9, 8), strict=True):  # as the router hands out
        assert x.routed is not None and (x.routed.replicas, x.routed.replica) == (n, 0)
        assert x.routed.policy == vision.pool.router == "least_outstanding"
        assert x.workloads[0].arrival.rate_rps == pytest.approx(10)  # type: ignore[union-attr]
    inter = next(e for e in suite.engines if e.pool.name == "interactive")
    assert [x.name for x in inter.experiments][:2] == ["interactive-of5", "interactive-of4"]
    rates = {x.name: {w.name: w.arrival.rate_rps for w in x.workloads}  # type: ignore[union-attr]
             for x in inter.experiments[:2]}
    assert rates == {"interactive-of5": {"chat": 8.0, "rag": 4.0, "agent": 2.0},
                     "interactive-of4": {"chat": 10.0, "rag": 5.0, "agent": 2.5}}
    batch = next(e for e in suite.engines if e.pool.name == "batch")
    assert batch.draft_model == "llama-3.2-1b"
    # the plan assumed 70 % of drafts accepted; the engine is held to that, not to the
    # almost none its dummy weights would accept
    assert batch.synthetic_acceptance == pytest.approx(0.7)
    assert inter.synthetic_acceptance is None


def test_the_stored_plan_runs_are_this_suite() -> None:
    """The fourteenth session's hand-written runs of the production plan's interactive pool
    (validation/h200.yaml, llama-3.1-8b-bf16-plan5 / -plan4) are what the command writes:
    the same engine settings and the same workloads at the same rates."""
    suite, _ = plan_suite(load_mix(MIX), _at(plan(), "interactive", 5))
    assert suite is not None
    made = next(e for e in suite.engines if e.pool.name == "interactive")
    stored = load_suite(ROOT / "validation" / "h200.yaml")
    for name, exp in (("llama-3.1-8b-bf16-plan5", "interactive-of5"),
                      ("llama-3.1-8b-bf16-plan4", "interactive-of4")):
        run = stored.engine(name)
        assert run.pool.engine.model_dump() == made.pool.engine.model_dump()
        mine = next(x for x in made.experiments if x.name == exp)
        theirs = next(x for x in run.experiments if x.name == exp)
        strip = {"slo", "pool"}
        assert ([w.model_dump(exclude=strip) for w in mine.workloads]
                == [w.model_dump(exclude=strip) for w in theirs.workloads])


def test_the_suite_survives_yaml(tmp_path: Path) -> None:
    suite, _ = plan_suite(load_mix(MIX), plan())
    assert suite is not None
    out = tmp_path / "suite.yaml"
    out.write_text(yaml.safe_dump(suite_yaml(suite), sort_keys=False))
    assert load_suite(out) == suite


def test_a_grown_plan_is_not_replayed() -> None:
    grown = plan().model_copy(update={"growth": 2.0})
    suite, skipped = plan_suite(load_mix(MIX), grown)
    assert suite is None and all("growth" in why for why in skipped.values())


def test_cli_writes_the_suite_of_every_pool(tmp_path: Path) -> None:
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(plan().to_json())
    out = tmp_path / "suite.yaml"
    r = CliRunner().invoke(main, ["validate", "plan", "--traffic", str(MIX), "--plan",
                                  str(plan_json), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "left out" not in r.output
    assert {e.pool.name for e in load_suite(out).engines} == {"interactive", "batch", "vision"}


@pytest.mark.parametrize("mix", ["chat-only.yaml"])
def test_cli_plan_of_another_mix_is_one_line(tmp_path: Path, mix: str) -> None:
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(plan().to_json())
    r = CliRunner().invoke(main, ["validate", "plan", "--traffic", str(ROOT / "examples" / mix),
                                  "--plan", str(plan_json), "--out", str(tmp_path / "s.yaml")])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not in" in lines[0]
    assert not (tmp_path / "s.yaml").exists()


@pytest.mark.parametrize(("old", "new", "differs"), [
    ("max_model_len: 16384", "max_model_len: 12288", "engine.max_model_len is 16384 in the plan"),
    ("precision: fp8", "precision: bf16", "precision is 'fp8' in the plan and 'bf16'"),
])  # fmt: skip
def test_a_mix_that_fixes_otherwise_than_the_plan_is_refused(
    tmp_path: Path, old: str, new: str, differs: str
) -> None:
    """A pool of the same name that fixes another engine setting or precision than the plan
    is not the mix the plan was sized for: the suite (and the report, runs.planned_mix) would
    replay another configuration, so it is an error naming the mix, not a silent override."""
    from capplan.report.runs import planned_mix

    text = MIX.read_text()
    assert old in text
    other = tmp_path / "mix.yaml"
    other.write_text(text.replace(old, new, 1))
    mix = load_mix(other)
    for call in (lambda: plan_suite(mix, plan()), lambda: planned_mix(plan(), mix)):
        with pytest.raises(ConfigError, match=differs) as e:
            call()
        assert e.value.file == str(other)
