"""The solver: brackets, the replica search, the plan, and `capplan size` / `sweep`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capplan.errors import InfeasibleError
from capplan.mix import TrafficMix, load_mix
from capplan.sim.run import setup_pool, simulate
from capplan.solve.bounds import bracket, decode_step_s, prefill_time_s
from capplan.solve.cli import size, sweep
from capplan.solve.options import size_mix, with_pool
from capplan.solve.plan import Plan
from capplan.solve.search import SearchSettings, Sizer
from capplan.traffic import Slo

DATA = Path(__file__).parent / "data"
SMALL = DATA / "size-small.yaml"
GOLDEN = DATA / "size-small-plan.yaml"


@cache
def small() -> TrafficMix:
    return load_mix(SMALL)


@cache
def small_plan(growth: float = 1.0) -> Plan:
    return size_mix(small(), growth=growth, quick=True, advice=False)


def with_slo(mix: TrafficMix, workload: str, **limits: float) -> TrafficMix:
    wls = []
    for w in mix.workloads:
        if w.name == workload:
            current = {t.key: t.limit_s for t in w.slo.targets}
            w = w.model_copy(update={"slo": Slo.model_validate({**current, **limits})})
        wls.append(w)
    return mix.model_copy(update={"workloads": wls})


# -- bounds ---------------------------------------------------------------------------------


def test_bracket_lower_bound_never_exceeds_the_answer() -> None:
    """The analytic floor (work, KV, seqs) is a floor: the simulated answer is at or above it."""
    mix = small()
    st_ = setup_pool(mix.pool("chat"))
    b = bracket(st_, mix.workloads_of("chat"), base_dir=mix.base_dir)
    assert 1 <= b.lower <= b.estimate
    assert b.lower <= small_plan().pools[0].replicas_for_slo


def test_bracket_grows_with_rate() -> None:
    """More traffic never lowers the analytic work bound."""
    mix = small()
    st_ = setup_pool(mix.pool("chat"))
    lo = bracket(st_, mix.workloads_of("chat"), rate_scale=1.0)
    hi = bracket(st_, mix.workloads_of("chat"), rate_scale=3.0)
    assert hi.busy_replicas == pytest.approx(3 * lo.busy_replicas)
    assert hi.lower >= lo.lower


def test_step_model_floors_are_ordered() -> None:
    """A longer prefill takes longer; a decode step at batch 1 is cheaper than one at 64."""
    st_ = setup_pool(small().pool("chat"))
    assert 0 < prefill_time_s(st_, 512) < prefill_time_s(st_, 4096)
    assert 0 < decode_step_s(st_, 1, 600) < decode_step_s(st_, 64, 600)


# -- golden ---------------------------------------------------------------------------------


def test_golden_plan_for_small_mix() -> None:
    """Same seed, same plan: the small mix's plan is pinned (refresh deliberately with
    CAPPLAN_UPDATE_GOLDEN=1 and review the diff)."""
    doc = small_plan().model_dump(mode="json", exclude={"source"})
    if os.environ.get("CAPPLAN_UPDATE_GOLDEN") or not GOLDEN.exists():
        GOLDEN.write_text(
            "# golden plan of size-small.yaml (size_mix quick, no advice); regenerate with\n"
            "# CAPPLAN_UPDATE_GOLDEN=1 pytest tests/test_solve.py and review the diff\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
    assert doc == yaml.safe_load(GOLDEN.read_text())


def test_same_seed_same_plan_bytes() -> None:
    """Rule 7: the same seed gives the same plan, byte for byte."""
    again = size_mix(small(), quick=True, advice=False)
    assert again.to_json() == small_plan().to_json()


def test_plan_json_round_trip_and_frames() -> None:
    """A plan survives JSON; to_polars/to_csv carry one row per (pool, workload, SLO)."""
    plan = small_plan()
    assert Plan.from_json(plan.to_json()) == plan
    df = plan.to_polars()
    n_slo = sum(len(w.slo.targets) for w in small().workloads)
    assert df.height == n_slo
    assert plan.to_csv().count("\n") == n_slo + 1
    p = plan.pools[0]
    # what to buy and run, on every row: the model, GPU type, TP and configuration
    assert df.select("model", "gpu", "tp", "configuration").unique().rows() == [
        (p.model, p.gpu, p.tp, p.label)]
    assert p.gpus == p.replicas * p.tp
    assert p.cost.gpu_hours_per_month == p.gpus * 730
    assert p.cost.usd_per_month == pytest.approx(p.gpus * 730 * 3.5)
    assert p.binding_margin == min(s.margin for w in p.workloads for s in w.slo)


# -- the search's promises ----------------------------------------------------------------------


def test_plan_resimulated_meets_slos_and_one_fewer_fails() -> None:
    """The plan (default, not --quick: confirmed with the mix's own drain) holds its SLOs when
    re-simulated at its own count, figure for figure; one replica fewer misses one (the
    binding ITL SLO of this mix is tight)."""
    plan = size_mix(small(), advice=False)
    p = plan.pools[0]
    d = p.confidence.duration_s
    res = simulate(small(), "chat", p.replicas_for_slo, duration_s=d, seed=plan.seed)
    assert res.slo_met
    for w in res.workloads:
        for c in w.slo:
            line = next(x for x in p.workloads if x.name == w.name)
            got = next(s.value_s for s in line.slo if s.key == c.key)
            assert got == pytest.approx(c.value_s, abs=1e-6)
    if p.replicas_for_slo > 1:
        assert p.confidence.one_fewer_fails
        seeds = p.confidence.seeds
        below = [
            simulate(small(), "chat", p.replicas_for_slo - 1, duration_s=d, seed=s) for s in seeds
        ]
        assert not all(r.slo_met for r in below)


def with_rates(mix: TrafficMix, duration_s: float, **rates_rps: float) -> TrafficMix:
    """`mix` at the given Poisson rates per workload, simulated for `duration_s`."""
    wls = [
        w.model_copy(update={"arrival": w.arrival.model_copy(
            update={"rate_rps": rates_rps[w.name]})}) if w.name in rates_rps else w
        for w in mix.workloads
    ]
    sim = mix.simulation.model_copy(update={"duration_s": duration_s})
    return mix.model_copy(update={"workloads": wls, "simulation": sim})


def test_confirmation_length_follows_the_tail_rule() -> None:
    """Confirmation lasts until every workload has 50 measured requests beyond its tightest
    percentile (5,000 for chat's p99, 500 for docs' p90; the first 10 % is warm-up), between
    the floor (30 s) and the mix's duration_s (the cap), never below the probes; --quick
    confirms at probe length."""
    low = Sizer(with_rates(small(), 120, chat=12, docs=2), "chat")
    assert low.confirm_s == 120  # docs needs 500 / (0.9 * 2) = 278 s: capped
    mid = Sizer(with_rates(small(), 120, chat=100, docs=20), "chat")
    assert mid.confirm_s == math.ceil(5000 / (0.9 * 100)) == 56  # chat binds
    # the same through growth (rate_scale), the way `--growth` gets there
    grown10 = Sizer(with_rates(small(), 120, chat=10, docs=2), "chat",
                    SearchSettings(rate_scale=10))
    assert grown10.confirm_s == 56
    high = Sizer(with_rates(small(), 120, chat=1000, docs=200), "chat")
    assert high.confirm_s == 30  # 5.6 s would do: the floor
    assert high.probe_s <= high.confirm_s < low.confirm_s
    # never shorter than the probes, and --quick confirms at probe length
    no_floor = Sizer(with_rates(small(), 120, chat=1000, docs=200), "chat",
                     SearchSettings(confirm_floor_s=1))
    assert no_floor.confirm_s == no_floor.probe_s > 5000 / (0.9 * 1000)
    quick = Sizer(with_rates(small(), 120, chat=12, docs=2), "chat", SearchSettings(quick=True))
    assert quick.confirm_s == quick.probe_s < 120


def test_plan_confirmed_below_the_cap_reports_and_reproduces_its_length() -> None:
    """A pool whose workloads each send 12 requests/s with p90 SLOs is confirmed for
    ceil(500 / (0.9 * 12)) = 47 s, not the mix's 120 s; the plan says so, and re-simulating
    its count for that long holds every SLO on every seed, figure for figure on the first."""
    mix = with_rates(small(), 120, chat=12, docs=12)
    p90 = {"chat": {"ttft_p90_s": 0.4, "itl_p90_s": 0.02}, "docs": {"e2e_p90_s": 10}}
    mix = mix.model_copy(update={"workloads": [
        w.model_copy(update={"slo": Slo.model_validate(p90[w.name])}) for w in mix.workloads
    ]})
    plan = size_mix(mix, advice=False)
    p = plan.pools[0]
    assert p.confidence.duration_s == 47 and p.confidence.all_seeds_pass
    for s in p.confidence.seeds:
        res = simulate(mix, "chat", p.replicas_for_slo, duration_s=47, seed=s)
        assert res.slo_met
        if s == plan.seed:
            for w in res.workloads:
                line = next(x for x in p.workloads if x.name == w.name)
                for c in w.slo:
                    got = next(x.value_s for x in line.slo if x.key == c.key)
                    assert got == pytest.approx(c.value_s, abs=1e-6)


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.floats(min_value=1.2, max_value=3.0))
def test_gpus_never_fall_when_rate_rises(growth: float) -> None:
    """Property: more traffic never needs fewer GPUs."""
    g = round(growth, 2)
    assert small_plan(g).gpus >= small_plan().gpus


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.floats(min_value=0.5, max_value=0.95))
def test_gpus_never_fall_when_slo_tightens(factor: float) -> None:
    """Property: a stricter SLO never needs fewer GPUs."""
    tight = with_slo(small(), "chat", itl_p99_s=round(0.03 * factor, 4))
    plan = size_mix(tight, quick=True, advice=False)
    if not plan.feasible:
        return  # infeasible is the limit of "more GPUs"
    assert plan.gpus >= small_plan().gpus


# -- infeasible is an answer ------------------------------------------------------------------


def _only_infeasible(plan: Plan, pool: str) -> str:
    """The reason of the plan's one infeasible pool, checked to be `pool`, with no GPUs."""
    assert not plan.feasible and [x.pool for x in plan.infeasible] == [pool]
    assert pool not in [p.pool for p in plan.pools]
    return plan.infeasible[0].reason


def test_ttft_below_one_prefill_is_infeasible_with_reason() -> None:
    """A TTFT SLO below one prefill of the prompt is ruled out before any simulation: the
    plan lists the pool as infeasible, naming the workload, the SLO and the floor."""
    bad = with_slo(small(), "docs", ttft_p99_s=0.001)
    msg = _only_infeasible(size_mix(bad, quick=True), "chat")
    assert "docs" in msg and "ttft_p99_s ≤ 0.001 s" in msg and "prefill" in msg
    assert "\n" not in msg


def test_itl_below_one_decode_step_is_infeasible() -> None:
    """An ITL SLO below a batch-1 decode step cannot be met by any replica count."""
    bad = with_slo(small(), "chat", itl_p99_s=0.0001)
    assert "decode step at batch 1" in _only_infeasible(size_mix(bad, quick=True), "chat")


def test_infeasible_at_cap_reports_best_value() -> None:
    """When even max_replicas misses, the reason gives the best value reached there."""
    mix = small()
    capped = with_pool(mix, mix.pool("chat").model_copy(update={"max_replicas": 1}))
    assert re.search(r"no replica count ≤ 1 meets .* best .* at 1",
                     _only_infeasible(size_mix(capped, quick=True), "chat"))


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_size_table_out_json_and_spares(tmp_path: Path) -> None:
    """`size --out plan.json --spare 1` exits 0, prints the table (binding SLO, profile
    source), writes the plan as JSON, and adds the N+k spare on top of the SLO count."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(size, ["--traffic", str(SMALL), "--quick", "--spare", "1",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "binding" in r.output and small_plan().pools[0].profile_source in r.output
    plan = Plan.from_json(out.read_text())
    p, base = plan.pools[0], small_plan().pools[0]
    assert p.replicas_for_slo == base.replicas_for_slo
    assert p.replicas == p.replicas_for_slo + 1 and p.gpus == base.gpus + 1
    assert json.loads(out.read_text())["pools"][0]["binding_slo"] == base.binding_slo


def test_print_plan_flags_analytic_profile_loudly() -> None:
    """The table says loudly when a pool's profile is analytic, not measured."""
    from io import StringIO

    from rich.console import Console

    from capplan.solve.cli import print_plan

    plan = small_plan()
    for source, loud in (("analytic", True), ("measured", False)):
        doc = plan.model_copy(update={"pools": [
            p.model_copy(update={"profile_source": source}) for p in plan.pools
        ]})
        buf = StringIO()
        print_plan(doc, Console(file=buf, width=200))
        assert ("ANALYTIC" in buf.getvalue()) is loud


def test_cli_infeasible_is_an_answer_and_exit_5(tmp_path: Path) -> None:
    """An infeasible SLO is printed as the plan's answer for that pool (why, on one line),
    written with --out, and exits with InfeasibleError's code; no traceback, no error line."""
    text = SMALL.read_text().replace("ttft_p99_s: 0.4", "ttft_p99_s: 0.0005")
    bad = tmp_path / "size-bad.yaml"
    bad.write_text(text)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(size, ["--traffic", str(bad), "--out", str(out)],
                           terminal_width=400)
    assert r.exit_code == InfeasibleError.exit_code
    why = [x for x in r.output.splitlines() if x.strip().startswith("infeasible: ")]
    assert len(why) == 1 and "no replica count" in why[0] and "ttft_p99_s" in why[0]
    assert "1 pool(s) infeasible: chat" in r.output
    assert "Traceback" not in r.output and "error:" not in r.output
    written = Plan.from_json(out.read_text())
    assert written.infeasible[0].pool == "chat"
    frame = written.to_polars()  # a sum over the frame cannot miss it
    assert frame["pool"].to_list() == ["chat"] and frame["gpus"].null_count() == 1
    assert frame["infeasible"][0] == written.infeasible[0].reason and not frame["met"][0]
    from capplan.deploy.cli import deploy

    d = CliRunner().invoke(deploy, [str(out)])
    assert d.exit_code == 0 and "pool chat: infeasible, not deployed: no replica count" in d.output


def test_cli_bad_input_exit_code(tmp_path: Path) -> None:
    """A missing traffic file is a ConfigError: exit 2, one line."""
    r = CliRunner().invoke(size, ["--traffic", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2
    assert r.output.startswith("error:") and r.output.count("\n") == 1


def test_cli_sweep_curve(tmp_path: Path) -> None:
    """`sweep` writes one CSV row per (growth, pool), GPUs non-decreasing in growth."""
    out = tmp_path / "curve.csv"
    r = CliRunner().invoke(
        sweep, ["--traffic", str(SMALL), "--growth", "1,2", "--quick", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    rows = out.read_text().splitlines()
    assert rows[0].startswith("growth,pool,gpus")
    gpus = [int(x.split(",")[2]) for x in rows[1:]]
    assert len(gpus) == 2 and gpus[0] <= gpus[1]


def test_cli_sweep_ends_where_a_pool_turns_infeasible(tmp_path: Path) -> None:
    """A growth no replica count up to the cap can carry ends the curve there, with the
    reason; the growths before it are written, it is a row marked infeasible with why, and
    the command exits 5 (InfeasibleError), as `capplan size` does."""
    capped = tmp_path / "capped.yaml"
    capped.write_text(SMALL.read_text().replace("max_replicas: 16", "max_replicas: 2"))
    out = tmp_path / "curve.csv"
    r = CliRunner().invoke(sweep, ["--traffic", str(capped), "--growth", "1,4", "--quick",
                                   "--out", str(out)], terminal_width=400)
    assert r.exit_code == 5, r.output
    assert "growth ×4 and above: infeasible: no replica count ≤ 2" in r.output
    curve = pl.read_csv(out)
    assert curve["growth"].to_list() == [1.0, 4.0]
    assert curve["gpus"][0] == 2 and curve["gpus"][1] is None
    assert curve["infeasible"][0] is None
    assert curve["infeasible"][1].startswith("no replica count ≤ 2")


# -- options ------------------------------------------------------------------------------------


def test_precision_auto_picks_the_cheapest_and_lists_runners_up() -> None:
    """precision: auto searches bf16/fp8/nvfp4/awq; the chosen one costs no more than any
    runner-up (the seeds' rule: choose by throughput under the SLO)."""
    plan = size_mix(load_mix(DATA / "size-auto.yaml"), quick=True, advice=False)
    p = plan.pools[0]
    assert p.precision in {"bf16", "fp8", "nvfp4", "awq"}
    assert {r.precision for r in p.runners_up} | {p.precision} == {"bf16", "fp8", "nvfp4", "awq"}
    for r in p.runners_up:
        assert r.usd_per_month is None or p.cost.usd_per_month <= r.usd_per_month


def test_text_only_advice_is_computed_from_the_profile() -> None:
    """A vision model's pool serving no images is told how much KV the encoder reservation
    costs it, from the profile's figures (not a constant)."""
    from capplan.pool import Pool
    from capplan.solve.options import text_only_advice

    base = small()
    pool = Pool(name="chat", model="gemma-4-31b", precision="fp8",
                engine={"max_model_len": 4096})  # type: ignore[arg-type]
    mix = with_pool(base, pool)
    st_ = setup_pool(pool)
    a = text_only_advice(mix, st_)
    assert a is not None and a.kv_gain is not None and a.kv_gain > 0
    kv = st_.profile.kv
    assert a.kv_gain == pytest.approx(kv.tokens(0.92) / kv.tokens(0.92, text_only=False) - 1,
                                      abs=1e-6)
    text_pool = pool.model_copy(update={"engine": pool.engine.model_copy(
        update={"limit_mm_per_prompt": {"image": 0}})})
    assert text_only_advice(with_pool(base, text_pool), setup_pool(text_pool)) is None


def test_split_advice_simulates_the_split() -> None:
    """For a pool with >1 workload, the advice gives the GPUs with the binding workload in its
    own pool, from simulating both pools."""
    plan = size_mix(small(), quick=True)
    advice = [a for a in plan.pools[0].advice if a.kind == "split"]
    assert len(advice) == 1 and advice[0].gpus_saved is not None
    assert plan.pools[0].binding_workload in advice[0].message


def test_a_thin_probe_moves_where_confirmation_starts_not_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Confirmation starts one replica up after a probe that passed narrowly
    (`search.THIN_MARGIN`); the walk comes down again when one fewer passes, so the plan is
    the one that starting at the probe's answer gives, whether every probe counts as thin or
    none does."""
    import capplan.solve.search as search

    def sized(thin: float) -> tuple[int, list[str]]:
        monkeypatch.setattr(search, "THIN_MARGIN", thin)
        p = size_mix(small(), advice=False).pools[0]
        return p.replicas_for_slo, [f"{s.key}={s.value_s:.6g}" for w in p.workloads
                                    for s in w.slo]

    assert sized(0.0) == sized(1.0)


def test_an_awaited_prefetch_goes_first() -> None:
    """A queued prefetched run that a search now waits for takes a search step's place at
    the head of the queue; a job already ahead of it, or not queued, is left alone."""
    import heapq
    import threading
    from concurrent.futures import Future

    from capplan.solve import jobs

    d = jobs._Dispatcher.__new__(jobs._Dispatcher)
    d._cond, d._queue = threading.Condition(), []
    futures = [Future[object]() for _ in range(3)]
    for i, (f, cost) in enumerate(zip(futures, (3.0, 2.0, 1.0), strict=True)):
        heapq.heappush(d._queue, (jobs.bulk(cost), i, f, print, ()))
    d.promote(futures[2])
    assert d._queue[0][2] is futures[2] and d._queue[0][0] == jobs.CHAIN
    d.promote(futures[1], jobs.bulk(0.5))  # not sooner than its own place: unchanged
    assert sorted(d._queue)[1][2] is futures[0]
    d.promote(Future())  # not queued: nothing happens
    assert len(d._queue) == 3


def test_a_vision_pool_bound_by_its_itl_says_what_the_encoder_stalls() -> None:
    """The production mix's vision pool binds on ITL p99, and Gemma 4's measured encoder
    pass (a lone picture: the pass's floor) is most of its 50 ms limit: the plan says so,
    with the replicas' image rate. With the limit loosened past the point where the pass
    matters the advice goes, as it does for a text-only workload."""
    from capplan.solve.options import encoder_advice
    from capplan.steptime import StepTimer

    mix = load_mix(Path(__file__).resolve().parents[1] / "examples" / "production-mix.yaml")
    (vision,) = size_mix(mix, quick=True, pools=["vision"]).pools
    (enc,) = [a for a in vision.advice if a.kind == "encoder"]
    setup = setup_pool(mix.pool("vision"))
    eng = setup.pool.engine
    stall = StepTimer(setup.profile, max_num_seqs=eng.max_num_seqs,
                      max_num_batched_tokens=eng.max_num_batched_tokens).encoder_pass_s(280, 1)
    around = setup.profile.step.encoder_step_s
    assert vision.binding_slo == "itl_p99_s" and stall > 0.2 * 0.05
    assert f"stalls every decode in it by {(stall + around) * 1e3:.1f} ms" in enc.message
    draws = setup.profile.step.encoder_step_draws_s
    p90 = stall + float(np.percentile(draws, 90))
    assert f"{p90 * 1e3:.1f} ms at p90 of its {len(draws)} measured steps" in enc.message
    assert (f"{vision.replicas_for_slo} replicas at {10 / vision.replicas_for_slo:.2f} image "
            "requests/s each behind least-outstanding routing") in enc.message
    # the step's own work around the pass: said to be unmeasured while the profile has none,
    # counted in the stall once it has
    assert ("not measured" in enc.message) == (setup.profile.step.encoder_step_s == 0)
    measured = setup.profile.model_copy(update={"step": setup.profile.step.model_copy(
        update={"encoder_step_s": 0.05, "encoder_step_draws_s": []})})
    around = encoder_advice(vision, mix.workloads_of("vision"),
                            dataclasses.replace(setup, profile=measured))
    assert around is not None and "not measured" not in around.message
    assert f"by {(stall + 0.05) * 1e3:.1f} ms" in around.message
    w = mix.workloads_of("vision")
    loose = [x.model_copy(update={"slo": Slo.model_validate({"itl_p99_s": 1.0})}) for x in w]
    assert encoder_advice(vision, loose, setup) is None
    text = [x.model_copy(update={"image": None}) for x in w]
    assert encoder_advice(vision, text, setup) is None
