"""`gpu: auto`: a pool priced per GPU type (`price_per_gpu_hour: {h100: ..., h200: ...}`) is
sized on each GPU's profiles and the cheapest configuration that holds every SLO is kept;
a fixed pool takes its GPU's price from the same mapping; bad prices are one-line errors."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.cli import main
from capplan.deploy import PoolDeploy
from capplan.errors import ConfigError
from capplan.mix import TrafficMix, load_mix
from capplan.pool import Pool
from capplan.report.runs import planned_mix
from capplan.solve.choose import candidates, label
from capplan.solve.options import size_mix, with_pool
from capplan.solve.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "tests" / "data" / "size-gpu.yaml"


@cache
def gpu_mix() -> TrafficMix:
    return load_mix(GPU)


@cache
def gpu_plan() -> Plan:
    return size_mix(gpu_mix(), quick=True, advice=False)


def _write(tmp_path: Path, old: str, new: str) -> Path:
    text = GPU.read_text()
    assert old in text
    out = tmp_path / GPU.name
    out.write_text(text.replace(old, new))
    return out


@pytest.mark.parametrize(
    ("old", "new", "fix"),
    [
        ("    price_per_gpu_hour: {h100: 2.0, h200: 3.0}\n", "", "give it per GPU type"),
        ("{h100: 2.0, h200: 3.0}", "{h100: 2.0, a100: 3.0}", "unknown gpu 'a100'"),
        ("{h100: 2.0, h200: 3.0}", "{}", "price at least one GPU"),
        ("{h100: 2.0, h200: 3.0}", "{h100: -1, h200: 3.0}", "must be >= 0"),
        ("gpu: auto", "gpu: b200", "unknown gpu 'b200'"),
    ],
)
def test_bad_gpu_or_prices_are_one_line_errors(tmp_path: Path, old: str, new: str,
                                               fix: str) -> None:
    """gpu auto without prices per GPU, a price for an unknown GPU, no price, a negative one:
    one line naming the file, the pool and what to write; exit 2 from `capplan size`."""
    bad = _write(tmp_path, old, new)
    with pytest.raises(ConfigError) as e:
        load_mix(bad)
    assert str(e.value).startswith(f"{bad}: pools.0") and "\n" not in str(e.value)
    assert fix in str(e.value)
    r = CliRunner().invoke(main, ["size", "--traffic", str(bad), "--quick"])
    assert r.exit_code == 2
    assert len([x for x in r.output.splitlines() if x.strip()]) == 1


def test_a_fixed_gpu_takes_its_price_from_the_mapping(tmp_path: Path) -> None:
    """A pool on one GPU may keep the mix's price list: it pays its GPU's price, and a list
    without its GPU is refused with the fix."""
    pool = load_mix(_write(tmp_path, "gpu: auto", "gpu: h200")).pool("chat")
    assert (pool.gpu, pool.price, pool.open_settings) == ("h200", 3.0, [])
    bad = tmp_path / "fixed.yaml"
    bad.write_text(GPU.read_text().replace("gpu: auto", "gpu: h200")
                   .replace("{h100: 2.0, h200: 3.0}", "{h100: 2.0}"))
    with pytest.raises(ConfigError, match="no price for the pool's gpu 'h200'"):
        load_mix(bad)


def test_candidates_span_the_priced_gpus_cheapest_first() -> None:
    """Each candidate is fixed on one GPU at that GPU's price, the cheapest GPU's first (ties
    keep the earlier); speculative: auto takes the drafters measured on that GPU."""
    pool = gpu_mix().pool("chat")
    assert pool.open_settings == ["gpu"] and pool.gpu_prices == {"h100": 2.0, "h200": 3.0}
    cands = candidates(pool)
    assert [(c.gpu, c.price) for c in cands] == [("h100", 2.0), ("h200", 3.0)]
    assert all(not c.open_settings for c in cands)
    assert [label(c, pool.open_settings) for c in cands] == ["h100, bf16", "h200, bf16"]
    spec = pool.model_copy(update={"engine": pool.engine.model_validate(
        {**pool.engine.model_dump(mode="json"), "speculative": "auto"})})
    drafts = {(c.gpu, c.engine.speculative.num_speculative_tokens if c.engine.speculative
               else 0) for c in candidates(spec)}
    # the H200 measured draft_model k = 2 and 4 for Llama-3.1-8B BF16, the H100 k = 4
    assert drafts == {("h100", 0), ("h100", 4), ("h200", 0), ("h200", 2), ("h200", 4)}


def _fixed_usd(gpu: str, prices: dict[str, float]) -> float:
    mix = gpu_mix()
    pool = Pool.model_validate({**mix.pool("chat").model_dump(mode="json"), "gpu": gpu,
                                "price_per_gpu_hour": prices})
    return size_mix(with_pool(mix, pool), quick=True, advice=False).usd_per_month


@pytest.mark.parametrize("prices", [{"h100": 2.0, "h200": 3.0}, {"h100": 3.0, "h200": 2.0}])
def test_the_cheapest_gpu_wins(prices: dict[str, float]) -> None:
    """Property: with the GPU open, the plan costs no more than the same pool sized on each
    GPU alone (same search, same seeds), and it is the cheaper one's plan."""
    mix = gpu_mix()
    pool = mix.pool("chat").model_copy(update={"price_per_gpu_hour": prices})
    plan = size_mix(with_pool(mix, pool), quick=True, advice=False)
    alone = {g: _fixed_usd(g, prices) for g in prices}
    assert plan.usd_per_month == min(alone.values())
    p = plan.pools[0]
    assert p.gpu == min(alone, key=lambda g: (alone[g], prices[g]))
    assert p.auto == ["gpu"] and "lowest cost" in p.reasoning and p.gpu in p.reasoning
    assert [r.gpu for r in p.runners_up] == [g for g in prices if g != p.gpu]
    # each other GPU's best is confirmed: the plan says what it would cost
    assert all(r.note.startswith("confirmed") for r in p.runners_up)
    assert all(r.usd_per_month == alone[r.gpu] for r in p.runners_up)
    assert p.cost.usd_per_month == pytest.approx(p.gpus * 730.0 * prices[p.gpu])


def test_the_plan_deploys_and_resimulates_on_its_gpu() -> None:
    """The plan names one GPU (never `auto`); re-read from JSON, it deploys on that GPU and
    the report re-simulates the mix's pool on it at its price."""
    plan = gpu_plan()
    p = plan.pools[0]
    assert p.gpu in ("h100", "h200") and p.profile.startswith(f"{p.gpu}/")
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert PoolDeploy.from_pool_plan(again.pools[0]).gpu == p.gpu
    planned, setups, errors = planned_mix(plan, gpu_mix())
    assert not errors and set(setups) == {"chat"}
    chosen = planned.pool("chat")
    assert (chosen.gpu, chosen.price, chosen.open_settings) == (
        p.gpu, gpu_mix().pool("chat").gpu_prices[p.gpu], [])


def test_simulate_and_guard_refuse_an_open_gpu() -> None:
    """Nothing simulates `auto`; --guard, which tightens SLOs by one GPU's validated error,
    asks for the GPU to be chosen first. One line each, exit 2."""
    r = CliRunner().invoke(main, ["simulate", "--traffic", str(GPU), "--pool", "chat",
                                  "--replicas", "1"])
    assert r.exit_code == 2 and "pools.0.gpu" in r.output and "set one of h100, h200" in r.output
    r = CliRunner().invoke(main, ["size", "--traffic", str(GPU), "--quick", "--guard", "p10"])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "pools.0.gpu" in lines[0] and "leaves gpu auto" in lines[0]


def test_example_which_gpu_mix_loads() -> None:
    """examples/which-gpu.yaml leaves the GPU open between two GPUs whose Qwen3-32B FP8
    profiles are both measured."""
    from capplan.modelspec import load_model_spec
    from capplan.profiles import resolve_profile

    pool = load_mix(ROOT / "examples" / "which-gpu.yaml").pool("chat")
    assert pool.open_settings == ["gpu"]
    spec = load_model_spec(pool.model)
    assert {c.gpu: resolve_profile(c, spec).source for c in candidates(pool)} == {
        "h100": "measured", "h200": "measured"}


def test_each_gpu_is_confirmed_when_the_screen_picks_finalists() -> None:
    """With more candidates than finalists (gpu and precision open: 2 x 4), the quick screen
    picks the best few for the full search; each GPU's best gets it too, and confirmation, so
    the plan prices every GPU by a confirmed answer whichever GPU the best few were on."""
    mix = gpu_mix()
    # the H100 so cheap that its 4-bit candidates, at twice the GPUs, still undercut the
    # H200: the best three by the quick screen are all H100s
    pool = mix.pool("chat").model_copy(update={
        "precision": "auto", "price_per_gpu_hour": {"h100": 1.0, "h200": 3.0}})
    p = size_mix(with_pool(mix, pool), advice=False).pools[0]
    assert p.auto == ["gpu", "precision"] and "quick search" in p.reasoning
    assert p.gpu == "h100"
    h200 = [r for r in p.runners_up if r.gpu == "h200"]
    assert sum(r.note.startswith("confirmed") for r in h200) == 1
    assert min(r.usd_per_month for r in h200 if r.usd_per_month is not None) == next(
        r.usd_per_month for r in h200 if r.note.startswith("confirmed"))


def test_sweep_names_the_gpu_and_floors_match_the_candidates(tmp_path: Path) -> None:
    """The floors a sweep carries to higher growth are keyed as the search names its
    candidates (`h100, bf16`), so they are found again; the curve says which GPU each pool
    took at each growth."""
    from capplan.solve.options import floors_of

    plan = gpu_plan()
    p = plan.pools[0]
    names = {label(c, ["gpu"]) for c in candidates(gpu_mix().pool("chat"))}
    assert {k for pool, k in floors_of(plan)} <= names
    assert ("chat", f"{p.gpu}, bf16") in floors_of(plan)
    out = tmp_path / "curve.csv"
    r = CliRunner().invoke(main, ["sweep", "--traffic", str(GPU), "--quick", "--growth", "1",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"{p.gpus} {p.gpu}" in r.output
    assert f'"{p.gpu}, bf16"' in out.read_text()


def test_a_runner_up_on_the_analytic_profile_says_so(tmp_path: Path) -> None:
    """Gemma 4 31B is measured on the H200 only: its H100 candidate runs on the datasheet
    roofline, and the runner-up line says so (its cost is an estimate, not a measurement's)."""
    mix = tmp_path / "gemma.yaml"
    mix.write_text(GPU.read_text().replace("model: llama-3.1-8b", "model: gemma-4-31b")
                   .replace("precision: bf16", "precision: fp8")
                   .replace("rate_rps: 12", "rate_rps: 2")
                   .replace("{h100: 2.0, h200: 3.0}", "{h100: 3.0, h200: 3.0}"))
    plan = size_mix(load_mix(mix), quick=True, advice=False)
    p = plan.pools[0]
    assert (p.gpu, p.profile_source) == ("h200", "measured")
    assert [(r.gpu, r.profile_source) for r in p.runners_up] == [("h100", "analytic")]
    r = CliRunner().invoke(main, ["size", "--traffic", str(mix), "--quick"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "runner-up" in x)
    assert "runner-up h100, fp8" in line and "ANALYTIC profile" in line


def test_at_equal_cost_a_measured_profile_beats_the_roofline(tmp_path: Path) -> None:
    """Priced so that Gemma 4 on the H100 (analytic: no H100 profile) costs what it costs on
    the H200 (measured), the measured one wins whatever the roofline's margin, and the plan
    says why."""
    mix = tmp_path / "gemma.yaml"
    mix.write_text(GPU.read_text().replace("model: llama-3.1-8b", "model: gemma-4-31b")
                   .replace("precision: bf16", "precision: fp8")
                   .replace("rate_rps: 12", "rate_rps: 2"))
    base = load_mix(mix)
    reps = {}
    for gpu in ("h100", "h200"):
        pool = Pool.model_validate({**base.pool("chat").model_dump(mode="json"), "gpu": gpu})
        reps[gpu] = size_mix(with_pool(base, pool), quick=True, advice=False).pools[0].gpus
    tied = {g: 6.0 / n for g, n in reps.items()}  # every GPU's answer costs $6 an hour
    pool = base.pool("chat").model_copy(update={"price_per_gpu_hour": tied})
    p = size_mix(with_pool(base, pool), quick=True, advice=False).pools[0]
    assert (p.gpu, p.profile_source) == ("h200", "measured")
    (r,) = p.runners_up
    assert r.gpu == "h100" and r.profile_source == "analytic"
    assert r.usd_per_month == pytest.approx(p.cost.usd_per_month)
    assert "on the analytic profile" in r.note and "measured profile wins" in p.reasoning


def test_no_gpu_meets_the_slo_is_an_answer(tmp_path: Path) -> None:
    """An SLO no GPU can meet is an infeasible pool naming the GPUs tried and each one's
    reason, not a crash."""
    bad = _write(tmp_path, "itl_p99_s: 0.04", "itl_p99_s: 0.001")
    plan = size_mix(load_mix(bad), quick=True, advice=False)
    (x,) = plan.infeasible
    assert x.gpu == "h100 or h200" and not plan.pools
    assert "h100, bf16: " in x.reason and "h200, bf16: " in x.reason
