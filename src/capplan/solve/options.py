"""The plan of a whole mix: growth, spares, each pool's choice (`choose`), and advice.

Settings the mix leaves `auto` are chosen per pool by `capplan.solve.choose`. Pool advice is
computed by simulating the change.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np

from capplan.errors import ConfigError, InfeasibleError
from capplan.memory import failure_for
from capplan.mix import TrafficMix
from capplan.pool import EngineConfig, Pool, SpeculativeConfig
from capplan.profiles import measured_speculative
from capplan.sim.run import PoolSetup
from capplan.solve import jobs
from capplan.solve.choose import AUTO_PRECISIONS, PoolChoice, candidates, choose, with_pool
from capplan.solve.plan import Advice, InfeasiblePool, Plan, PoolPlan, pool_plan
from capplan.solve.search import SearchSettings, Sizer, worst_check
from capplan.steptime import StepTimer
from capplan.traffic import ClosedLoop, GammaArrival, PoissonArrival, Workload
from capplan.units import duration

__all__ = ["AUTO_PRECISIONS", "PoolChoice", "choose", "floors_of", "grown", "size_mix",
           "with_pool"]


def grown(mix: TrafficMix, growth: float) -> TrafficMix:
    """Closed-loop users scaled by `growth` (open-loop rates scale through `rate_scale`)."""
    if growth <= 0:
        raise ConfigError(f"growth must be positive, got {growth}", field="--growth")
    if growth == 1 or not any(isinstance(w.arrival, ClosedLoop) for w in mix.workloads):
        return mix
    wls = []
    for w in mix.workloads:
        if isinstance(w.arrival, ClosedLoop):
            users = max(1, math.ceil(w.arrival.concurrency * growth))
            arrival = w.arrival.model_copy(update={"concurrency": users})
            w = w.model_copy(update={"arrival": arrival})
        wls.append(w)
    return mix.model_copy(update={"workloads": wls})


def split_advice(mix: TrafficMix, choice: PoolChoice, settings: SearchSettings) -> Advice | None:
    """GPUs if the binding workload had a pool of its own (same configuration), by probe runs
    on both sides compared with the shared pool's probe answer."""
    sizer = choice.sizer
    if len(sizer.workloads) < 2:
        return None
    found = worst_check(choice.sizing.result)
    if found is None:
        return None
    wl = found[0]
    pool = choice.sizing.setup.pool
    own = pool.model_copy(update={"name": f"{pool.name}-{wl}"})
    split = mix.model_copy(update={
        "pools": [*mix.pools, own],
        "workloads": [
            w.model_copy(update={"pool": own.name}) if w.name == wl else w for w in mix.workloads
        ],
    })
    try:
        rest, alone = _both(
            settings,
            lambda s: Sizer(split, pool.name, s, setup=sizer.setup).search(),
            lambda s: Sizer(split, own.name, s, setup=replace(sizer.setup, pool=own)).search(),
        )
    except InfeasibleError as e:
        return Advice(kind="split", message=f"moving {wl} to its own pool: infeasible ({e})")
    return _split_advice("split", f"binding workload {wl} in its own pool", "it",
                         choice.probe_replicas, alone, rest, pool.tp)


def _both(
    settings: SearchSettings,
    first: Callable[[SearchSettings], int],
    second: Callable[[SearchSettings], int],
) -> tuple[int, int]:
    """first(settings), then second(settings): two independent searches of an advice. With
    worker processes they run side by side (each is a chain of probes, mostly waiting), and
    the log still tells first's lines, then second's, as one after the other would; the
    error raised is the one raised first in that order (second's is not seen when first
    fails, nor are its lines)."""
    if settings.processes < 2:
        return first(settings), second(settings)
    lines: list[str] = []
    later = replace(settings, log=None if settings.log is None else lines.append)
    out: list[int | BaseException] = []

    def run_second() -> None:
        try:
            out.append(second(later))
        except BaseException as e:
            out.append(e)

    thread = threading.Thread(target=run_second, name="capplan-advice", daemon=True)
    thread.start()
    try:
        a = first(settings)
    finally:
        thread.join()
    if settings.log is not None:
        for line in lines:
            settings.log(line)
    b = out[0]
    if isinstance(b, BaseException):
        raise b
    return a, b


def _split_advice(kind: Literal["split", "batch_pool"], what: str, them: str, shared: int,
                  alone: int, rest: int, tp: int) -> Advice:
    """GPUs after a split (probe runs on both sides) against the shared pool's."""
    now, after = shared * tp, (rest + alone) * tp
    saved = now - after
    verdict = f"saves {saved}" if saved > 0 else ("saves nothing" if saved == 0 else
                                                  f"costs {-saved} more")
    return Advice(
        kind=kind,
        message=(f"{what}: {alone * tp} GPUs for {them} + {rest * tp} for the rest = {after} "
                 f"vs {now} shared (probe runs): {verdict}"),
        gpus_saved=saved,
    )


def _batch_like(w: Workload) -> bool:
    """A workload promised only end-to-end latency (or nothing): no TTFT or per-token SLO."""
    return all(t.metric == "e2e" for t in w.slo.targets)


def _speculative_for(pool: Pool) -> SpeculativeConfig | None:
    """The drafter the seeds' batch pool uses, where capplan has a profile for it: a measured
    speculative profile of this model and precision (the largest k), else the shipped draft
    model for Llama targets (analytic)."""
    measured = measured_speculative(pool, pool.precision)
    if measured:
        return max(measured, key=lambda sc: sc.num_speculative_tokens)
    if pool.model.startswith("llama-3"):
        return SpeculativeConfig(method="draft_model", num_speculative_tokens=4)
    return None


def batch_pool_advice(
    mix: TrafficMix, choice: PoolChoice, settings: SearchSettings
) -> Advice | None:
    """The seeds' pool table, computed: batch workloads (end-to-end SLOs only) sharing a pool
    with latency-bound ones move to a batch pool with speculative decoding and low priority;
    GPUs of both pools by probe runs, against the shared pool's probe answer."""
    pool = choice.sizing.setup.pool
    wls = mix.workloads_of(pool.name)
    batch = [w.name for w in wls if _batch_like(w)]
    if not batch or len(batch) == len(wls) or pool.engine.speculative is not None:
        return None
    spec = _speculative_for(pool)
    if spec is None:
        return None
    engine = pool.engine.model_copy(update={"speculative": spec, "scheduling_policy": "priority"})
    bpool = pool.model_copy(update={"name": f"{pool.name}-batch", "engine": engine})
    low = max(w.priority for w in wls) + 1
    split = mix.model_copy(update={
        "pools": [*mix.pools, bpool],
        "workloads": [
            w.model_copy(update={"pool": bpool.name, "priority": low}) if w.name in batch else w
            for w in mix.workloads
        ],
    })
    try:
        rest, alone = _both(
            settings,
            lambda s: Sizer(split, pool.name, s, setup=choice.sizer.setup).search(),
            lambda s: Sizer(split, bpool.name, s).search(),
        )
    except InfeasibleError as e:
        return Advice(kind="batch_pool", message=f"a batch pool for {', '.join(batch)}: "
                      f"infeasible ({e})")
    what = (f"batch workload(s) {', '.join(batch)} in a batch pool ({spec.method} k = "
            f"{spec.num_speculative_tokens}, low priority)")
    return _split_advice("batch_pool", what, "them", choice.probe_replicas, alone, rest, pool.tp)


def budget_advice(mix: TrafficMix, choice: PoolChoice, settings: SearchSettings) -> Advice | None:
    """Where an inter-token SLO binds a pool whose token budget the mix fixed: the GPUs at the
    smaller budgets `max_num_batched_tokens: auto` would try (solve/choose.py: a prompt's
    chunk stalls the decodes beside it for a step of up to the budget), found by probe runs
    against the pool's probe answer, the best then confirmed as the plan's answer was and set
    against it; said only where one saves GPUs (the fewest GPUs, then the larger budget)."""
    pool = choice.sizing.setup.pool
    found = worst_check(choice.sizing.result)
    if found is None or not found[1].key.startswith(("itl", "tpot")):
        return None
    if "engine.max_num_batched_tokens" in choice.auto:
        return None  # searched already: the plan's runners-up say what each budget needs
    now = pool.engine.max_num_batched_tokens
    opened = pool.model_copy(update={"engine": EngineConfig.model_validate(
        {**pool.engine.model_dump(mode="json"), "max_num_batched_tokens": "auto"})})
    best: tuple[int, int, Sizer] | None = None
    for cand in candidates(opened):
        budget = cand.engine.max_num_batched_tokens
        if budget >= now:
            continue
        sizer = Sizer(with_pool(mix, cand), pool.name, settings)
        try:
            n = sizer.search()
        except InfeasibleError:
            continue
        if best is None or n < best[1]:
            best = (budget, n, sizer)
    if best is None or best[1] >= choice.probe_replicas:
        return None
    budget, _, sizer = best
    # confirmed as the plan's own answer was (its seeds, its length), so that the advice's
    # count stands beside the plan's: a probe answer can sit one above what confirmation
    # keeps (examples/which-gpu.yaml once said "against 5 at 8192" beside a plan of 4)
    try:
        sizing = sizer.confirm(best[1])
    except InfeasibleError:
        return None
    n, plan_n = sizing.replicas, choice.sizing.replicas
    if n >= plan_n:
        return None
    # what the smaller chunks cost: its tightest SLO there (TTFT, most often)
    tight = worst_check(sizing.result)
    there = "" if tight is None else (f"; its tightest there {tight[0]} {tight[1].key} "
                                      f"{duration(tight[1].value_s)}, margin "
                                      f"{tight[1].margin:.1%}")
    saved = (plan_n - n) * pool.tp
    return Advice(
        kind="token_budget",
        message=(f"token budget: engine.max_num_batched_tokens {budget} (or auto) needs "
                 f"{n * pool.tp} GPUs against {plan_n * pool.tp} at {now} (sized as the plan "
                 f"is{there}): a prompt's chunk stalls the decodes beside it for less; "
                 f"saves {saved}"),
        gpus_saved=saved,
    )


def text_only_advice(mix: TrafficMix, setup: PoolSetup) -> Advice | None:
    """A pool with no image workload that still reserves the vision encoder's memory."""
    pool = setup.pool
    if pool.engine.text_only or any(w.image for w in mix.workloads_of(pool.name)):
        return None
    kv = setup.profile.kv
    util = pool.engine.gpu_memory_utilization
    with_images, text = kv.tokens(util, text_only=False), kv.tokens(util, text_only=True)
    if text <= with_images or with_images <= 0:
        return None
    gain = text / with_images - 1
    return Advice(
        kind="text_only",
        message=(
            f"text-only pool: engine.limit_mm_per_prompt {{image: 0}} frees the image-encoder "
            f"reservation: +{gain:.1%} KV tokens per replica ({with_images:,} → {text:,})"
        ),
        kv_gain=round(gain, 6),
    )


def memory_advice(setup: PoolSetup) -> Advice | None:
    """A pool whose engine settings reach a configuration measured to run out of GPU
    memory under load (capplan/memory.py), with the highest utilisation measured to serve
    and the KV it gives up."""
    pool, kv = setup.pool, setup.profile.kv
    run = failure_for(pool, setup.profile)
    if run is None:
        return None
    util = pool.engine.gpu_memory_utilization
    message = (f"gpu_memory_utilization {util:g}: vLLM {setup.profile.vllm_version} ran out of "
               f"GPU memory serving {run.model} {run.precision} on {setup.profile.gpu} at "
               f"{run.gpu_memory_utilization:g} ({run.engine}, {run.logs[0]}): the CUDA graphs "
               "and the API process must fit in what the utilisation leaves")
    safe = [u for u in run.served_at if u < run.gpu_memory_utilization]
    if not safe:
        return Advice(kind="memory", message=message)
    best = max(safe)
    gain = kv.tokens(best) / kv.tokens(util) - 1
    return Advice(kind="memory", kv_gain=round(gain, 6),
                  message=f"{message}; {best:g} was measured to serve ({gain:+.1%} KV tokens "
                          f"per replica, {kv.tokens(util):,} → {kv.tokens(best):,})")


ENCODER_SHARE = 0.2
"""An encoder pass of at least this share of a binding inter-token limit gets advice."""


def encoder_advice(plan: PoolPlan, workloads: list[Workload], setup: PoolSetup) -> Advice | None:
    """A pool whose binding SLO is an image workload's inter-token percentile, on a profile
    whose vision encoder stalls a step by a sizeable share of that limit: vLLM encodes a
    step's pictures before its forward, so every decode of that step waits for the pass
    (steptime.py StepTimer.encoder_pass_s), and the percentile counts those steps once they
    are that common, which the router moves (it decides how many decodes a picture's step
    stalls). Says what one picture's pass costs, the image requests a replica takes at this
    size, and behind which router."""
    w = next((w for w in workloads if w.name == plan.binding_workload), None)
    if w is None or w.image is None or not plan.binding_slo.startswith("itl_"):
        return None
    target = next((t for t in w.slo.targets if t.key == plan.binding_slo), None)
    if target is None:
        return None
    eng = setup.pool.engine
    timer = StepTimer(setup.profile, max_num_seqs=eng.max_num_seqs,
                      max_num_batched_tokens=eng.max_num_batched_tokens)
    img = w.image
    around = setup.profile.step.encoder_step_s
    pass_s = timer.encoder_pass_s(img.images_per_request * img.tokens_per_image,
                                  img.images_per_request)
    stall = pass_s + around
    draws = setup.profile.step.encoder_step_draws_s
    if stall < ENCODER_SHARE * target.limit_s:
        return None
    rates = [x.arrival.rate_rps for x in workloads
             if x.image and isinstance(x.arrival, PoissonArrival | GammaArrival)]
    per_replica = (f" at {sum(rates) / plan.replicas_for_slo:.2f} image requests/s each"
                   if len(rates) == sum(1 for x in workloads if x.image) else "")
    return Advice(
        kind="encoder",
        message=(
            f"{w.name} {plan.binding_slo}: each step that encodes a request's "
            f"{img.images_per_request} x {img.tokens_per_image}-token picture(s) stalls "
            f"every decode in it by {stall * 1e3:.1f} ms ({setup.profile.source} encoder "
            f"pass{' and the step around it' if around else ''}"
            + (f", the median: {(pass_s + float(np.percentile(draws, 90))) * 1e3:.1f} ms at "
               f"p90 of its {len(draws)} measured steps" if draws else "")
            + f", {stall / target.limit_s:.0%} of the {target.limit_s * 1e3:g} ms limit), and "
            f"the percentile counts those steps: "
            f"{plan.replicas_for_slo} replicas{per_replica} behind "
            f"{setup.pool.router.replace('_', '-')} routing"
            + ("" if around else
               "; the step's own work around the pass is not measured for this profile "
               "(encoder_step_s: the encoder engine's picture points), and served pictures "
               "took longer than this (docs/validation.md, served pictures)")
        ),
    )


def size_mix(
    mix: TrafficMix,
    *,
    growth: float = 1.0,
    spare: int = 0,
    seed: int | None = None,
    quick: bool = False,
    advice: bool = True,
    pools: list[str] | None = None,
    floors: dict[tuple[str, str], int] | None = None,
    log: Callable[[str], None] | None = None,
    on_pool: Callable[[str, int, int], None] | None = None,
    workers: int | None = None,
) -> Plan:
    """Size every pool of `mix` (or those named) at peak traffic x `growth`, plus `spare`
    replicas each for failures. `floors[(pool, label)]`: replicas known to be needed, by
    candidate label (see `floors_of`). `log` is told every simulation of the search;
    `on_pool(name, i, n)` when pool i of n starts. `workers` > 1 (None: $CAPPLAN_WORKERS,
    else 1) sizes the pools side by side, their simulations in that many processes: the
    same plan (call it under an `if __name__ == "__main__":` guard, as multiprocessing
    needs). A pool that no replica count up to its cap can size is an answer too: it is
    listed under the plan's `infeasible` with the reason (`Plan.feasible` is then False) and
    the other pools are sized all the same."""
    if spare < 0:
        raise ConfigError(f"spare must be >= 0, got {spare}", field="--spare")
    settings = SearchSettings(seed=seed, rate_scale=growth, quick=quick, log=log,
                              workers=workers)
    m = grown(mix, growth)
    todo = [
        p for p in m.pools
        if (pools is None or p.name in pools) and m.workloads_of(p.name)
    ]

    def plan_pool(pool: Pool, settings: SearchSettings) -> PoolPlan | InfeasiblePool:
        try:
            choice = choose(m, pool.name, settings, spare=spare, floors=floors)
        except InfeasibleError as e:
            if settings.log is not None:
                settings.log(f"infeasible: {e}")
            # an open GPU: the GPUs its candidates ran on (`h100 or h200`)
            gpu = " or ".join(pool.gpu_prices) if pool.gpu == "auto" else pool.gpu
            return InfeasiblePool(pool=pool.name, model=pool.model, gpu=gpu,
                                  precision=str(pool.precision), reason=str(e))
        # a crash is no suggestion: said whether or not advice was asked for
        oom = memory_advice(choice.sizing.setup)
        notes: list[Advice] = [] if oom is None else [oom]
        if advice:
            chosen = with_pool(m, choice.sizing.setup.pool)
            for a in (split_advice(chosen, choice, settings),
                      batch_pool_advice(chosen, choice, settings),
                      budget_advice(chosen, choice, settings),
                      text_only_advice(chosen, choice.sizing.setup)):
                if a is not None:
                    notes.append(a)
        pp = pool_plan(
            choice.sizing, m.workloads_of(pool.name), spare=spare,
            runners_up=choice.runners_up, advice=notes, auto=choice.auto,
            reasoning=choice.reasoning,
        )
        enc = encoder_advice(pp, m.workloads_of(pool.name), choice.sizing.setup) if advice else None
        return pp if enc is None else pp.model_copy(update={"advice": [*pp.advice, enc]})

    answers: list[PoolPlan | InfeasiblePool] = []
    workers = settings.processes
    if workers > 1 and len(todo) > 1:
        jobs.warm(workers)
        answers = _side_by_side(todo, plan_pool, settings, on_pool)
    else:
        for i, pool in enumerate(todo):
            if on_pool is not None:
                on_pool(pool.name, i, len(todo))
            answers.append(plan_pool(pool, settings))
    return Plan(
        mix=mix.name, source=mix.source, growth=growth, spare=spare,
        seed=mix.simulation.seed if seed is None else seed, quick=quick,
        pools=[a for a in answers if isinstance(a, PoolPlan)],
        infeasible=[a for a in answers if isinstance(a, InfeasiblePool)],
    )


def _side_by_side(
    todo: list[Pool],
    plan_pool: Callable[[Pool, SearchSettings], PoolPlan | InfeasiblePool],
    settings: SearchSettings,
    on_pool: Callable[[str, int, int], None] | None,
) -> list[PoolPlan | InfeasiblePool]:
    """Every pool at once, a thread each (their simulations run in worker processes): the
    same plans as one pool after another, and the same log and progress, in pool order; the
    first pool (in order) that fails raises, as it would have serially (an infeasible pool
    does not fail: it is an answer). Interrupted (Ctrl-C), the threads stop at their next
    simulation and the queued ones are dropped."""
    order = jobs.InOrder([p.name for p in todo], settings.log, on_pool)
    stop = threading.Event()
    out: list[PoolPlan | InfeasiblePool | BaseException | None] = [None] * len(todo)

    def one(i: int, pool: Pool) -> None:
        try:
            out[i] = plan_pool(pool, replace(settings, log=order.logger(i), stop=stop))
        except BaseException as e:
            out[i] = e
            order.finished(i, failed=True)
            return
        order.finished(i)

    threads = [threading.Thread(target=one, args=(i, p), name=f"capplan-{p.name}", daemon=True)
               for i, p in enumerate(todo)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:
        stop.set()
        jobs.drop_queued()
        raise
    plans = []
    for res in out:
        if isinstance(res, BaseException):
            raise res
        assert res is not None
        plans.append(res)
    return plans


def floors_of(plan: Plan) -> dict[tuple[str, str], int]:
    """Replicas each (pool, candidate label) of `plan` needed: the floor at higher traffic."""
    out = {(p.pool, p.candidate): p.replicas_for_slo for p in plan.pools}
    for p in plan.pools:
        for r in p.runners_up:
            if r.replicas is not None and r.note.startswith("confirmed"):
                out[(p.pool, r.label)] = r.replicas - p.spare
    return out
