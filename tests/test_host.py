"""A pool sized on the slowest traced host (Pool.host, Profile.on_host, `capplan size --host`):
the engine core's own times of the slowest host the calibration traced serving the model on
that GPU, in place of the median's."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.cli import main
from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profile import HostCore
from capplan.profiles import resolve_profile
from capplan.sim.run import setup_pool, simulate

LLAMA8 = load_model_spec("llama-3.1-8b")


def _pool(**kw: object) -> Pool:
    return Pool.model_validate({"name": "chat", "model": "llama-3.1-8b", "gpu": "h100",
                                "precision": "fp8", **kw})


def _mix(pool: Pool, rate: float, duration: float) -> TrafficMix:
    """Poisson chat (512 -> 128 tokens) at `rate` on `pool`."""
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [pool.model_dump(exclude_defaults=True)],
        "workloads": [{"pool": pool.name, "name": "chat",
                       "arrival": {"kind": "poisson", "rate_rps": rate},
                       "input_tokens": {"kind": "constant", "value": 512},
                       "output_tokens": {"kind": "constant", "value": 128}}],
        "simulation": {"duration_s": duration, "warmup_s": 2.0},
    })


def test_shipped_hosts_are_the_traced_engines_whose_median_the_profile_takes() -> None:
    """Every shipped profile with a graph-less core time carries the hosts it is the median
    of, read again from the core-launch file it was built from (scripts/core_launch.py)."""
    root = Path(__file__).resolve().parents[1] / "calibration"
    checked = 0
    for path in sorted(root.glob("*/vllm-0.26.0/*/*/profile.json")):
        prof = json.loads(path.read_text())
        gpu, model = path.parts[-5], path.parts[-3]
        raw = root / "_raw" / ("" if gpu == "h200" else gpu) / "core-launch" / "eager"
        eager = raw / f"{model}.json"
        if not prof["step"].get("core_eager_s"):
            assert not prof["hosts"], path
            continue
        engines = json.loads(eager.read_text())["engines"]
        assert [h["engine"] for h in prof["hosts"]] == [e["engine"] for e in engines], path
        assert prof["step"]["core_eager_s"] == pytest.approx(
            statistics.median(h["core_eager_s"] for h in prof["hosts"]), abs=1e-6), path
        checked += 1
    assert checked >= 10  # the H200's Llama-3.1-8B and Gemma 4, the H100's Llama and Qwen3-32B


def test_slowest_takes_the_slowest_hosts_own_core_times() -> None:
    median = resolve_profile(_pool(), LLAMA8)
    slow = median.on_host("slowest")
    host = max(median.hosts, key=lambda h: h.core_eager_s)
    assert len(median.hosts) >= 2 and host.core_eager_s > median.step.core_eager_s
    assert (slow.step.core_eager_s, slow.step.core_graph_s) == (host.core_eager_s,
                                                                host.core_graph_s)
    assert slow.step.eager_sigma == host.eager_sigma
    # a graph-less step's GPU terms, the launches' shadow here, at that host's pace
    ratio = host.core_eager_s / median.step.core_eager_s
    assert slow.step.eager_gpu_s == pytest.approx(median.step.eager_gpu_s * ratio)
    assert slow.step.eager_step_s == pytest.approx(median.step.eager_step_s * ratio)
    # the rest of the step, and the hosts themselves, as shipped
    keep = {"core_eager_s", "core_graph_s", "eager_sigma", "core_piecewise_s", "eager_gpu_s",
            "eager_step_s"}
    assert {k: v for k, v in slow.step if k not in keep} == {
        k: v for k, v in median.step if k not in keep}
    assert median.on_host("median") is median


def test_a_graph_less_steps_gpu_span_moves_with_the_host_only_where_it_is_the_launches() -> None:
    """Llama-3.1-8B FP8 on an H100: the median host's core takes longer over a graph-less step
    than the GPU spans it, so the GPU's span (and the calibration's jump past the largest
    graph) is the launches' shadow and takes the host's pace; Qwen3-32B FP8's GPU span is
    twice its core's time, the GPU's own, and stays as measured on every host."""
    llama = resolve_profile(_pool(), LLAMA8)
    assert 0 < llama.step.eager_gpu_s < llama.step.core_eager_s and llama.step.eager_step_s
    fast = llama.on_host("fastest").step
    assert fast.eager_gpu_s < llama.step.eager_gpu_s and fast.eager_step_s < (
        llama.step.eager_step_s)
    qwen = resolve_profile(_pool(model="qwen3-32b"), load_model_spec("qwen3-32b"))
    assert qwen.step.eager_gpu_s > qwen.step.core_eager_s > 0
    for host in ("fastest", "slowest"):
        moved = qwen.on_host(host).step
        assert moved.core_eager_s != qwen.step.core_eager_s
        assert (moved.eager_gpu_s, moved.eager_step_s) == (qwen.step.eager_gpu_s,
                                                           qwen.step.eager_step_s)


def test_a_hosts_piecewise_time_is_taken_where_its_trace_held_enough() -> None:
    prof = resolve_profile(_pool(), LLAMA8)
    hosts = (HostCore(engine="a", core_graph_s=0.003, core_eager_s=0.02),
             HostCore(engine="b", core_graph_s=0.005, core_eager_s=0.04, eager_sigma=0.3,
                      core_piecewise_s=0.02))
    slow = prof.model_copy(update={"hosts": hosts}).on_host("slowest").step
    assert (slow.core_eager_s, slow.core_graph_s, slow.eager_sigma,
            slow.core_piecewise_s) == (0.04, 0.005, 0.3, 0.02)
    fast = prof.model_copy(update={"hosts": hosts}).on_host("fastest").step
    assert (fast.core_eager_s, fast.core_graph_s) == (0.02, 0.003)
    without = prof.model_copy(update={"hosts": hosts[:1]}).on_host("slowest").step
    assert without.core_piecewise_s == prof.step.core_piecewise_s  # not traced: the profile's
    assert without.eager_sigma == prof.step.eager_sigma  # no spread recorded: the profile's


def test_a_profile_with_no_traced_host_prices_both_alike_and_says_so() -> None:
    """The H200's Qwen3-32B has no traced graph-less steps: slowest is the profile's core,
    and the plan's profile line says no host was traced."""
    qwen = Pool.model_validate({"name": "q", "model": "qwen3-32b", "precision": "fp8",
                                "host": "slowest"})
    st = setup_pool(qwen)
    assert st.profile.hosts == () and st.profile.step == setup_pool(
        qwen.model_copy(update={"host": "median"})).profile.step
    res = simulate(_mix(qwen, rate=1.0, duration=5.0), "q", 1)
    assert "slowest host: none traced" in res.pool.profile_source


def test_slowest_host_serves_the_same_traffic_slower_and_says_whose() -> None:
    """Chat on the H100's Llama-3.1-8B FP8 near its knee, where steps past the largest CUDA
    graph hold the core: the slowest host's core puts first tokens later, and the pool's
    profile line names the host."""
    runs = {}
    for host in ("median", "slowest"):
        runs[host] = simulate(_mix(_pool(host=host), rate=20.0, duration=20.0), "chat", 1)
    med, slow = (runs[h].workloads[0] for h in ("median", "slowest"))
    assert slow.ttft_p50_s > 1.2 * med.ttft_p50_s
    assert "slowest of 8 traced hosts' core, llama-3.1-8b-fp8-h100-mix" in (
        runs["slowest"].pool.profile_source)
    assert runs["median"].pool.profile_source == "measured"


def test_an_unknown_host_is_one_line_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "mix.yaml"
    bad.write_text("schema_version: 1\npools: [{name: p, model: llama-3.1-8b, host: fast}]\n"
                   "workloads: [{name: w, pool: p, arrival: {kind: poisson, rate_rps: 1}, "
                   "input_tokens: {kind: constant, value: 100}, output_tokens: {kind: constant, "
                   "value: 10}, slo: {ttft_p99_s: 1}}]\n")
    r = CliRunner().invoke(main, ["size", "--traffic", str(bad)])
    assert r.exit_code != 0
    line = r.output.strip()
    assert "\n" not in line and "mix.yaml" in line and "host" in line
    assert "median" in line and "slowest" in line
    with pytest.raises(ValueError, match="unknown host"):
        resolve_profile(_pool(), LLAMA8).on_host("fast")


def _size(tmp_path: Path, host: str) -> dict[str, object]:
    """`capplan size --host HOST --quick` on Poisson chat at 24 req/s on the H100's Llama-3.1-8B
    FP8, a TTFT p50 SLO of 60 ms: the plan's one pool."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "schema_version: 1\nsimulation: {duration_s: 30, drain_s: 10}\n"
        "pools: [{name: p, model: llama-3.1-8b, gpu: h100, precision: fp8, max_replicas: 8, "
        "engine: {max_model_len: 4096}}]\n"
        "workloads: [{name: w, pool: p, arrival: {kind: poisson, rate_rps: 24}, "
        "input_tokens: {kind: constant, value: 512}, output_tokens: {kind: constant, "
        "value: 64}, slo: {ttft_p50_s: 0.06}}]\n")
    out = tmp_path / f"plan-{host}.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(mix), "--host", host, "--quick",
                                  "--workers", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    pool: dict[str, object] = json.loads(out.read_text())["pools"][0]
    return pool


def test_size_host_flag_prices_every_pool_on_it(tmp_path: Path) -> None:
    """--host slowest names the host in the plan; --host any sizes on the median and both
    ends, keeps the most GPUs and says each."""
    plans = {h: _size(tmp_path, h) for h in ("median", "slowest", "fastest", "any")}
    assert "slowest of 8 traced hosts' core" in str(plans["slowest"]["profile_source"])
    assert "fastest of 8 traced hosts' core" in str(plans["fastest"]["profile_source"])
    assert plans["median"]["profile_source"] == "measured"
    ends = [int(plans[h]["gpus"]) for h in ("median", "slowest", "fastest")]  # type: ignore[call-overload]
    assert plans["any"]["gpus"] == max(ends)
    assert "host any: " in str(plans["any"]["reasoning"])
    for h, n in zip(("median", "slowest", "fastest"), ends, strict=True):
        assert f"{n} GPUs on the {h} host's core" in str(plans["any"]["reasoning"])
        assert plans[h]["host"] == h
    # the plan names the host it was sized on, and the pool as planned runs on it
    kept = str(plans["any"]["host"])
    assert str(plans["any"]["reasoning"]).endswith(f"sized on the {kept}")
    from capplan.solve.choose import as_planned
    from capplan.solve.plan import PoolPlan

    planned = PoolPlan.model_validate(plans["any"])
    mine = _pool(name="p", host="any", engine={"max_model_len": 4096})
    assert as_planned(mine, planned).host == kept


def test_host_any_chooses_among_candidates_on_their_costliest_host(tmp_path: Path) -> None:
    """With the GPU left open, each candidate is sized on every host's core and priced at the
    most it needs there; the plan keeps the cheapest of those (examples/which-gpu.yaml:
    Qwen3-32B FP8 on an H100, seven traced hosts, or an H200, none)."""
    import re

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["size", "--traffic", str(root / "examples/which-gpu.yaml"),
                                  "--host", "any", "--quick", "--workers", "1",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    pool = json.loads(out.read_text())["pools"][0]

    def most(text: str) -> int:
        found = [int(n) for n in re.findall(r"(\d+) GPUs on the \w+ host's core", text)]
        assert len(found) == 3, text
        return max(found)

    assert pool["gpus"] == most(pool["reasoning"])
    for runner in pool["runners_up"]:
        assert runner["gpus"] == most(runner["note"])
        assert runner["usd_per_month"] >= pool["cost"]["usd_per_month"]


def test_a_mix_on_a_host_sets_every_pool_and_keeps_its_file() -> None:
    from capplan.errors import ConfigError
    from capplan.mix import load_mix

    root = Path(__file__).resolve().parents[1]
    mix = load_mix(root / "examples/production-mix.yaml")
    anywhere = mix.on_host("any")
    assert {p.host for p in anywhere.pools} == {"any"} and {p.host for p in mix.pools} == {
        "median"}
    assert anywhere.source == mix.source
    with pytest.raises(ConfigError, match="unknown host 'fast'"):
        mix.on_host("fast")


def test_a_draft_pool_on_one_end_takes_that_drafters_pace_and_says_whose() -> None:
    """A draft-model profile carries each traced draft engine's pace (Profile.drafter_hosts):
    `slowest` and `fastest` take the ends' drafter scales with the text hosts' core times,
    the median is the profile as shipped, and a lone request's decode slows with the host."""
    pool = Pool.model_validate({"name": "d", "model": "llama-3.1-8b", "precision": "bf16",
                                "engine": {"speculative": {"method": "draft_model",
                                                           "num_speculative_tokens": 4}}})
    prof = setup_pool(pool).profile
    scales = [h.draft_serving_scale for h in prof.drafter_hosts]
    assert len(scales) >= 2
    assert prof.on_host("median") == prof
    assert prof.on_host("slowest").step.draft_serving_scale == max(scales)
    assert prof.on_host("fastest").step.draft_serving_scale == min(scales)
    assert min(scales) < prof.step.draft_serving_scale < max(scales)
    itl = {}
    for host in ("fastest", "median", "slowest"):
        res = simulate(_mix(pool.model_copy(update={"host": host}), rate=0.5, duration=20.0),
                       "d", 1)
        itl[host] = res.workloads[0].itl_p50_s
        if host == "slowest":
            assert "slowest of 10 traced drafters' pace" in res.pool.profile_source
    assert itl["fastest"] < itl["median"] < itl["slowest"]


def test_a_draft_models_pass_is_drawn_every_step_so_its_gaps_have_a_tail() -> None:
    """With the drafter's spread (StepModel.draft_sigma, from the serving traces) a lone
    request's inter-token gaps spread about the same median: its ITL p99 stands above its
    p50 as the engine's did (docs/validation.md), where without it every gap is the same."""
    pool = Pool.model_validate({"name": "d", "model": "llama-3.1-8b", "precision": "bf16",
                                "engine": {"speculative": {"method": "draft_model",
                                                           "num_speculative_tokens": 4}}})
    prof = setup_pool(pool).profile
    assert prof.step.draft_sigma > 0
    flat = prof.model_copy(update={"step": prof.step.model_copy(update={"draft_sigma": 0.0})})
    mix = _mix(pool, rate=0.5, duration=30.0)
    drawn = simulate(mix, "d", 1).workloads[0]
    fixed = simulate(mix, "d", 1, profile=flat).workloads[0]
    assert drawn.itl_p99_s > 1.2 * drawn.itl_p50_s
    assert fixed.itl_p99_s < 1.1 * fixed.itl_p50_s
    assert drawn.itl_p50_s == pytest.approx(fixed.itl_p50_s, rel=0.1)
