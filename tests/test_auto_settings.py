"""Settings a traffic file leaves `auto` (`engine.speculative`, `engine.max_num_seqs`,
`engine.max_num_batched_tokens`, with `precision`): `auto` lives only in the YAML-facing
engine, the solver sizes the candidates calibrated profiles exist for and keeps the fewest
GPUs, then the widest SLO margin, and nothing simulates or deploys a placeholder."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.cli import main
from capplan.deploy import PoolDeploy, serve_command
from capplan.errors import ConfigError
from capplan.mix import TrafficMix, load_mix
from capplan.modelspec import load_model_spec
from capplan.pool import EngineConfig, Pool, SpeculativeConfig
from capplan.report.runs import planned_mix
from capplan.sim.run import setup_pool, simulate
from capplan.solve.choose import (
    MAX_NUM_BATCHED_TOKENS_LADDER,
    MAX_NUM_SEQS_LADDER,
    candidates,
    label,
)
from capplan.solve.options import floors_of, size_mix, with_pool
from capplan.solve.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
OPEN = DATA / "size-open.yaml"
SEQS = DATA / "size-open-seqs.yaml"
BUDGET = ROOT / "examples" / "token-budget.yaml"
DRAFTERS = ["no speculation", "draft_model k=2", "draft_model k=4"]


@cache
def open_mix() -> TrafficMix:
    return load_mix(OPEN)


@cache
def open_plan() -> Plan:
    return size_mix(open_mix(), quick=True, advice=False)


def _write(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    out = tmp_path / src.name
    out.write_text(text.replace(old, new))
    return out


# -- the schema ---------------------------------------------------------------------------------


def test_auto_is_only_in_the_yaml_facing_engine() -> None:
    """`auto` marks a setting open; the field keeps its type (an int, a SpeculativeConfig or
    None) with vLLM's default as a placeholder, dumps as `auto` and survives a round trip."""
    pool = open_mix().pool("docs")
    assert pool.open_settings == ["engine.speculative", "engine.max_num_seqs"]
    assert isinstance(pool.engine.max_num_seqs, int) and pool.engine.speculative is None
    dumped = pool.model_dump(mode="json")["engine"]
    assert dumped["max_num_seqs"] == "auto" and dumped["speculative"] == "auto"
    assert Pool.model_validate(pool.model_dump(mode="json")) == pool
    assert "max_num_seqs='auto'" in repr(pool.engine)


def test_fixing_a_setting_closes_it() -> None:
    """`fixed` and `model_copy(update=...)` give an open setting a value and close it; the
    others stay open."""
    engine = open_mix().pool("docs").engine
    one = engine.fixed(max_num_seqs=256)
    assert one.auto == {"speculative"} and one.max_num_seqs == 256
    assert one.model_dump(mode="json")["max_num_seqs"] == 256
    both = one.model_copy(update={"speculative": None})
    assert both.auto == frozenset() and both.model_dump(mode="json")["speculative"] is None
    with pytest.raises(ValueError, match="block_size"):
        engine.fixed(block_size=32)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("max_num_seqs: auto}", "max_num_seqs: many}", "pools.0.engine.max_num_seqs"),
        ("max_num_seqs: auto}", "max_num_seqs: 0}", "pools.0.engine.max_num_seqs"),
        ("max_num_seqs: auto}", "max_num_seqs: auto, max_num_batched_tokens: some}",
         "pools.0.engine.max_num_batched_tokens"),
        ("speculative: auto,", "speculative: sometimes,", "pools.0.engine.speculative"),
        ("max_replicas: 8", "max_replicas: 8\n    profile: h200/llama-3.1-8b/bf16", "pools.0"),
        # vLLM 0.26.0 refuses a token budget below the cap (vllm/config/scheduler.py)
        ("max_num_seqs: auto}", "max_num_seqs: 1024, max_num_batched_tokens: 512}",
         "pools.0.engine"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path: Path, old: str, new: str, field: str) -> None:
    """A bad value where `auto` is allowed (a word, a number out of range, `auto` beside a
    pinned profile) is one line naming the file, the field and what to write; exit 2."""
    bad = _write(tmp_path, OPEN, old, new)
    with pytest.raises(ConfigError) as e:
        load_mix(bad)
    assert str(e.value).startswith(f"{bad}: {field}: ") and "\n" not in str(e.value)
    r = CliRunner().invoke(main, ["size", "--traffic", str(bad), "--quick"])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0]


def test_simulate_refuses_an_open_setting_in_one_line() -> None:
    """`capplan simulate` on a pool with an `auto` setting: exit 2, one line naming the file,
    the field and the fix; the library refuses it too (nothing simulates a placeholder)."""
    r = CliRunner().invoke(main, ["simulate", "--traffic", str(OPEN), "--pool", "docs",
                                  "--replicas", "2"])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1
    assert f"{OPEN}: pools.0.engine.speculative:" in lines[0] and "set null" in lines[0]
    seqs = load_mix(SEQS)
    r = CliRunner().invoke(main, ["simulate", "--traffic", str(SEQS), "--pool", "chat",
                                  "--replicas", "2"])
    assert r.exit_code == 2 and "pools.0.engine.max_num_seqs" in r.output
    assert "set a number" in r.output
    with pytest.raises(ConfigError, match=r"engine\.max_num_seqs.*auto"):
        simulate(seqs, "chat", 2)
    with pytest.raises(ConfigError, match="auto"):
        setup_pool(seqs.pool("chat"))


def test_deploy_refuses_open_settings() -> None:
    """Deploying a pool straight from a mix, or a plan that still says `auto`, is refused:
    `vllm serve` never gets a placeholder."""
    with pytest.raises(ConfigError, match="max_num_seqs auto"):
        PoolDeploy.from_pool(load_mix(SEQS).pool("chat"), 1)
    pp = open_plan().pools[0]
    doc = pp.model_copy(update={"engine": {**pp.engine, "max_num_seqs": "auto"}})
    with pytest.raises(ConfigError, match="leaves max_num_seqs auto"):
        PoolDeploy.from_pool_plan(doc)


# -- the candidates -----------------------------------------------------------------------------


def test_candidates_are_the_product_of_what_profiles_exist_for() -> None:
    """speculative: auto tries no speculation plus every drafter measured for the model at
    that precision (llama-3.1-8b bf16: draft_model k = 2 and 4; fp8: none); max_num_seqs: auto
    the ladder. Every candidate is fixed: no placeholder reaches the search."""
    pool = open_mix().pool("docs")
    cands = candidates(pool)
    assert len(cands) == 3 * len(MAX_NUM_SEQS_LADDER)
    assert all(not c.open_settings for c in cands)
    labels = {label(c, pool.open_settings) for c in cands}
    assert labels == {f"bf16, {d}, max_num_seqs {n}" for d in DRAFTERS
                      for n in MAX_NUM_SEQS_LADDER}
    fp8 = pool.model_copy(update={"precision": "fp8"})
    assert {c.engine.speculative for c in candidates(fp8)} == {None}
    both = pool.model_copy(update={"precision": "auto"})
    assert len(candidates(both)) == (3 + 1 + 1 + 1) * len(MAX_NUM_SEQS_LADDER)
    fixed = with_pool(open_mix(), pool.model_copy(update={"engine": pool.engine.fixed(
        speculative=None, max_num_seqs=256)})).pool("docs")
    assert candidates(fixed) == [fixed]


def test_the_ladder_stops_at_the_token_budget(tmp_path: Path) -> None:
    """max_num_seqs: auto beside a 512-token budget tries no cap vLLM would refuse."""
    mix = load_mix(_write(tmp_path, OPEN, "max_num_seqs: auto}",
                          "max_num_seqs: auto, max_num_batched_tokens: 512}"))
    caps = {c.engine.max_num_seqs for c in candidates(mix.pool("docs"))}
    assert caps == {n for n in MAX_NUM_SEQS_LADDER if n <= 512} and 1024 not in caps


def test_the_budget_ladder_keeps_what_vllm_starts(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """max_num_batched_tokens: auto tries the ladder, largest first, less what vLLM 0.26.0
    refuses to start: a budget below max_num_seqs (fixed at 1024 here, or each step of its
    own ladder), one a draft model's slots fill (vllm/config/vllm.py), one below a picture's
    tokens where the pool takes pictures."""
    pool = load_mix(BUDGET).pool("rag")
    assert pool.open_settings == ["engine.max_num_batched_tokens"]
    cands = candidates(pool)
    assert [c.engine.max_num_batched_tokens for c in cands] == [8192, 4096, 2048, 1024]
    assert [label(c, pool.open_settings) for c in cands][-1] == "fp8, max_num_batched_tokens 1024"
    both = load_mix(_write(tmp_path, OPEN, "max_num_seqs: auto}",
                           "max_num_seqs: auto, max_num_batched_tokens: auto}")).pool("docs")
    pairs = [(c.engine.speculative, c.engine.max_num_seqs, c.engine.max_num_batched_tokens)
             for c in candidates(both)]
    assert all(b >= n for _, n, b in pairs) and (None, 512, 512) in pairs
    drafted = [(n, b) for sc, n, b in pairs if sc is not None]
    assert drafted and all(b > n for n, b in drafted) and (512, 1024) in drafted
    assert len(pairs) == len(set(pairs))
    # Gemma 4's pictures are 280 tokens, under every step; one of 1,100 tokens loses three
    gemma = load_mix(_write(tmp_path, BUDGET, "model: llama-3.1-8b", "model: gemma-4-31b"))
    spec = load_model_spec("gemma-4-31b")
    assert spec.images_whole and spec.image_tokens_per_image < min(MAX_NUM_BATCHED_TOKENS_LADDER)
    big = spec.model_copy(update={"image_tokens_per_image": 1100})
    monkeypatch.setattr("capplan.solve.choose.load_model_spec", lambda _: big)
    engine = gemma.pool("rag").engine.model_copy(update={"max_num_seqs": 256})
    for e, want in ((engine, {2048, 4096, 8192}),
                    (engine.model_copy(update={"limit_mm_per_prompt": {"image": 0}}),
                     set(MAX_NUM_BATCHED_TOKENS_LADDER))):
        pool = gemma.pool("rag").model_copy(update={"engine": e})
        assert {c.engine.max_num_batched_tokens for c in candidates(pool)} == want


@settings(max_examples=60, deadline=None)
@given(seqs=st.one_of(st.just("auto"), st.integers(1, 9000)),
       budget=st.one_of(st.just("auto"), st.integers(16, 9000)),
       spec=st.sampled_from(["auto", None, {"method": "draft_model", "num_speculative_tokens": 4}]))
def test_every_candidate_is_an_engine_vllm_starts(seqs: object, budget: object,
                                                  spec: object) -> None:
    """Property: whatever the mix fixes or leaves open among the cap, the budget and the
    drafter, every candidate closes them all at values vLLM 0.26.0 starts with: a budget of
    at least the cap, leaving a draft model's slots room to schedule a token."""
    if isinstance(seqs, int) and isinstance(budget, int) and budget < seqs:
        return  # a mix vLLM refuses: the schema says so (test_bad_values_are_one_line_errors)
    engine = EngineConfig.model_validate({"max_model_len": 8192, "max_num_seqs": seqs,
                                          "max_num_batched_tokens": budget, "speculative": spec})
    pool = open_mix().pool("docs").model_copy(update={"engine": engine})
    cands = candidates(pool)
    if not pool.open_settings:
        assert cands == [pool]  # a fixed pool vLLM refuses is the user's to fix (sim/run.py)
        return
    for c in cands:
        e = c.engine
        assert not c.open_settings
        assert e.max_num_batched_tokens >= e.max_num_seqs and e.max_num_scheduled_tokens > 0
        if budget == "auto":
            assert e.max_num_batched_tokens in MAX_NUM_BATCHED_TOKENS_LADDER
        if seqs == "auto":
            assert e.max_num_seqs in MAX_NUM_SEQS_LADDER


def test_ladders_that_leave_nothing_vllm_starts_are_one_line(tmp_path: Path) -> None:
    """A cap above every budget the ladder tries: not an infeasible plan but bad input, one
    line naming the file, the pool's engine and the fix (exit 2), nothing written."""
    bad = _write(tmp_path, BUDGET, "max_num_batched_tokens: auto}",
                 "max_num_batched_tokens: auto, max_num_seqs: 9000}")
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(bad), "--quick", "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: pools.0.engine: ")
    assert "lower max_num_seqs" in lines[0] and not out.exists()


def test_a_smaller_budget_can_need_fewer_gpus() -> None:
    """Long prompts under a tight ITL SLO: vLLM's default 8,192-token budget stalls the
    decodes beside a prompt's chunk; the plan picks a smaller budget, needs fewer GPUs than
    the default and says so, and deploy passes the chosen budget to `vllm serve`."""
    mix = load_mix(BUDGET)
    plan = size_mix(mix, quick=True, advice=False)
    p = plan.pools[0]
    chosen = p.engine["max_num_batched_tokens"]
    assert p.auto == ["engine.max_num_batched_tokens"] and chosen < 8192
    default = next(r for r in p.runners_up if r.engine["max_num_batched_tokens"] == 8192)
    assert default.gpus is not None and default.gpus > p.gpus
    pool = mix.pool("rag")
    fixed = with_pool(mix, pool.model_copy(update={"engine": pool.engine.fixed(
        max_num_batched_tokens=chosen)}))
    assert size_mix(fixed, quick=True, advice=False).gpus == p.gpus
    argv = serve_command(PoolDeploy.from_pool_plan(p), load_model_spec(p.model))
    assert argv[argv.index("--max-num-batched-tokens") + 1] == str(chosen)


# -- the choice ---------------------------------------------------------------------------------


def _fixed_gpus(engine: EngineConfig) -> int:
    mix = open_mix()
    pool = mix.pool("docs").model_copy(update={"engine": engine})
    return size_mix(with_pool(mix, pool), quick=True, advice=False).pools[0].gpus


def test_auto_never_needs_more_gpus_than_the_best_fixed_candidate() -> None:
    """Property: sizing with the settings open never yields more GPUs than the best of the
    same candidates fixed in the mix and sized one by one (same search, same seeds)."""
    plan = open_plan()
    engine = open_mix().pool("docs").engine
    fixed = {}
    for sc in (None, *(SpeculativeConfig(method="draft_model", num_speculative_tokens=k)
                       for k in (2, 4))):
        for n in MAX_NUM_SEQS_LADDER:
            fixed[(sc, n)] = _fixed_gpus(engine.fixed(speculative=sc, max_num_seqs=n))
    assert plan.gpus <= min(fixed.values())
    chosen = plan.pools[0]
    sc = chosen.engine["speculative"]
    key = (None if sc is None else SpeculativeConfig.model_validate(sc),
           chosen.engine["max_num_seqs"])
    assert fixed[key] == plan.gpus  # the chosen candidate, fixed, gives the same answer


def test_plan_names_the_choice_and_every_runner_up() -> None:
    """The plan lists the open settings, holds the chosen values in `engine` (never `auto`),
    says why, and lists every other candidate once; none confirmed is cheaper, and one as
    cheap has no wider margin."""
    p = open_plan().pools[0]
    assert p.auto == ["engine.speculative", "engine.max_num_seqs"]
    assert p.engine["max_num_seqs"] in MAX_NUM_SEQS_LADDER and p.engine["speculative"] != "auto"
    assert p.label in p.reasoning and "fewest GPUs" in p.reasoning
    assert len(p.runners_up) == 3 * len(MAX_NUM_SEQS_LADDER) - 1
    assert p.label not in {r.label for r in p.runners_up}
    assert len({r.label for r in p.runners_up}) == len(p.runners_up)
    worst = p.confidence.worst_margin
    assert worst is not None
    for r in p.runners_up:
        assert set(r.engine) == {"speculative", "max_num_seqs"}
        if r.note.startswith("confirmed"):
            assert r.gpus is not None and r.gpus >= p.gpus
            if r.gpus == p.gpus:
                assert r.margin is not None and r.margin <= worst + 1e-9
    if any(r.gpus == p.gpus and r.note.startswith("confirmed") for r in p.runners_up):
        assert "also need" in p.reasoning


def test_same_seed_same_auto_plan() -> None:
    """Rule 7 holds through the candidate search: same seed, same plan, byte for byte."""
    assert size_mix(open_mix(), quick=True, advice=False).to_json() == open_plan().to_json()
    assert Plan.from_json(open_plan().to_json()) == open_plan()


def test_chosen_plan_resimulates_within_its_slos() -> None:
    """The default search (quick screen, full search of the finalists, confirmation) gives a
    plan that, re-simulated at its own count with its chosen settings, holds every SLO and
    reproduces its figures."""
    mix = load_mix(SEQS)
    plan = size_mix(mix, advice=False)
    p = plan.pools[0]
    assert "quick search" in p.reasoning and len(p.runners_up) == len(MAX_NUM_SEQS_LADDER) - 1
    planned, setups, errors = planned_mix(plan, mix)
    assert set(setups) == {"chat"}
    assert not errors and not planned.pool("chat").open_settings
    assert planned.pool("chat").engine.max_num_seqs == p.engine["max_num_seqs"]
    res = simulate(planned, "chat", p.replicas_for_slo, duration_s=p.confidence.duration_s,
                   seed=plan.seed)
    assert res.slo_met
    for w in res.workloads:
        line = next(x for x in p.workloads if x.name == w.name)
        for c in w.slo:
            got = next(s.value_s for s in line.slo if s.key == c.key)
            assert got == pytest.approx(c.value_s, abs=1e-6)


def test_no_feasible_candidate_is_one_line() -> None:
    """When no candidate can meet an SLO, the answer names the pool and the first candidates'
    reasons on one line (the plan's infeasible pool; exit 5 from the CLI), not a traceback or
    a page."""
    mix = load_mix(OPEN)
    w = mix.workloads[0]
    tight = w.model_copy(update={"slo": w.slo.model_validate({"ttft_p99_s": 0.001})})
    bad = mix.model_copy(update={"workloads": [tight]})
    plan = size_mix(bad, quick=True, advice=False)
    assert not plan.pools and [x.pool for x in plan.infeasible] == ["docs"]
    msg = plan.infeasible[0].reason
    assert msg.startswith("pool docs: no candidate configuration meets the SLOs: ")
    assert "prefill" in msg and "and 11 more" in msg and "\n" not in msg


def test_floors_are_kept_per_candidate() -> None:
    """A sweep's floors are keyed by candidate label, so each candidate only starts at what
    it itself needed."""
    plan = open_plan()
    p = plan.pools[0]
    floors = floors_of(plan)
    assert floors[("docs", p.label)] == p.replicas_for_slo
    for r in p.runners_up:
        if r.note.startswith("confirmed"):
            assert floors[("docs", r.label)] == r.replicas


def test_sweep_with_open_settings(tmp_path: Path) -> None:
    """`capplan sweep` re-chooses the open settings at each growth (floors per candidate):
    GPUs never fall as traffic grows, and the curve names each growth's configuration."""
    out = tmp_path / "curve.csv"
    r = CliRunner().invoke(main, ["sweep", "--traffic", str(SEQS), "--growth", "1,2",
                                  "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = out.read_text().splitlines()
    assert rows[0].endswith(",configuration")
    assert all("max_num_seqs " in row for row in rows[1:])
    gpus = [int(x.split(",")[2]) for x in rows[1:]]
    assert len(gpus) == 2 and gpus[0] <= gpus[1]


# -- output -------------------------------------------------------------------------------------


def test_size_prints_the_choice_and_deploy_the_chosen_values(tmp_path: Path) -> None:
    """`capplan size` prints the chosen settings, why, and the runners-up; `capplan deploy`
    prints the chosen --max-num-seqs (and drafter), never `auto`."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(OPEN), "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    p = Plan.from_json(out.read_text()).pools[0]
    assert p.label in r.output and "chosen:" in r.output and "runner-up" in r.output
    assert json.loads(out.read_text())["pools"][0]["auto"] == p.auto
    d = CliRunner().invoke(main, ["deploy", str(out), "--traffic", str(OPEN)])
    assert d.exit_code == 0, d.output
    argv = serve_command(PoolDeploy.from_pool_plan(p), load_model_spec(p.model))
    assert argv[argv.index("--max-num-seqs") + 1] == str(p.engine["max_num_seqs"])
    assert f"--max-num-seqs {p.engine['max_num_seqs']}" in d.output and "auto" not in d.output
    assert ("--speculative-config" in d.output) == (p.engine["speculative"] is not None)


def test_example_open_settings_mix_loads() -> None:
    """The shipped example leaves engine settings open and loads; its pools are sizeable."""
    mix = load_mix(ROOT / "examples" / "open-settings.yaml")
    opened = {f for p in mix.pools for f in p.open_settings}
    assert {"engine.speculative", "engine.max_num_seqs"} <= opened
    doc = yaml.safe_load((ROOT / "examples" / "open-settings.yaml").read_text())
    assert any(p.get("engine", {}).get("max_num_seqs") == "auto" for p in doc["pools"])
