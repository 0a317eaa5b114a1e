"""What the mix leaves open, and the headroom asked for: candidates, growth, spares, advice.

`precision: auto` is searched over every precision a profile exists for (measured, else the
analytic one); the cheapest that meets the SLOs wins, the seeds' rule: choose by throughput
*under the SLO*, not by peak throughput. Pool advice is computed by simulating the change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from capplan.errors import ConfigError, InfeasibleError
from capplan.hardware import Precision
from capplan.mix import TrafficMix
from capplan.pool import Pool, SpeculativeConfig
from capplan.profiles import list_profiles
from capplan.sim.run import PoolSetup, setup_pool
from capplan.solve.plan import Advice, Candidate, Plan, PoolPlan, pool_plan
from capplan.solve.search import PoolSizing, SearchSettings, Sizer, worst_check
from capplan.traffic import ClosedLoop, Workload

AUTO_PRECISIONS = (Precision.BF16, Precision.FP8, Precision.NVFP4, Precision.AWQ)


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


def with_pool(mix: TrafficMix, pool: Pool) -> TrafficMix:
    """The mix with `pool` replacing the pool of the same name."""
    return mix.model_copy(update={"pools": [pool if p.name == pool.name else p for p in mix.pools]})


def _precision(pool: Pool) -> str:
    return str(getattr(pool.precision, "value", pool.precision))


@dataclass(slots=True)
class _Option:
    pool: Pool
    setup: PoolSetup | None
    sizer: Sizer | None = None
    probe_replicas: int | None = None
    sizing: PoolSizing | None = None
    note: str = ""

    def cost(self, replicas: int | None) -> float:
        if replicas is None:
            return math.inf
        return replicas * self.pool.tp * max(self.pool.price_per_gpu_hour, 1e-12)


def _options(mix: TrafficMix, pool: Pool) -> list[_Option]:
    if pool.precision != "auto":
        return [_Option(pool, setup_pool(pool, source=mix.source))]
    out = []
    for p in AUTO_PRECISIONS:
        cand = pool.model_copy(update={"precision": p})
        try:
            out.append(_Option(cand, setup_pool(cand, source=mix.source)))
        except ConfigError as e:
            out.append(_Option(cand, None, note=f"cannot start: {e}"))
    return out


@dataclass(slots=True)
class PoolChoice:
    """The configuration chosen for a pool and the ones that lost."""

    sizing: PoolSizing
    sizer: Sizer
    probe_replicas: int
    runners_up: list[Candidate]


def choose(
    mix: TrafficMix,
    pool_name: str,
    settings: SearchSettings,
    *,
    spare: int = 0,
    floors: dict[tuple[str, str], int] | None = None,
) -> PoolChoice:
    """Search every candidate configuration of a pool at probe level, confirm the cheapest
    (and the next while confirmation makes the leader dearer than it), keep the cheapest."""
    opts = _options(mix, mix.pool(pool_name))
    errors: list[InfeasibleError] = []
    for o in opts:
        if o.setup is None:
            continue
        floor = (floors or {}).get((pool_name, _precision(o.pool)), 1)
        o.sizer = Sizer(with_pool(mix, o.pool), pool_name, settings, setup=o.setup, floor=floor)
        try:
            o.probe_replicas = o.sizer.search()
        except InfeasibleError as e:
            o.note = str(e)
            errors.append(e)
    live = sorted(
        (o for o in opts if o.probe_replicas is not None), key=lambda o: o.cost(o.probe_replicas)
    )
    if not live:
        if len(opts) == 1 and errors:
            raise errors[0]
        raise InfeasibleError(
            f"pool {pool_name}: no precision meets the SLOs: "
            + "; ".join(f"{_precision(o.pool)}: {o.note}" for o in opts)
        )
    best: _Option | None = None
    for o in live:
        if best is not None and best.sizing is not None and (
            best.cost(best.sizing.replicas) <= o.cost(o.probe_replicas)
        ):
            break
        assert o.sizer is not None and o.probe_replicas is not None
        o.sizing = o.sizer.confirm(o.probe_replicas)
        if best is None or best.sizing is None or (
            o.cost(o.sizing.replicas) < best.cost(best.sizing.replicas)
        ):
            best = o
    assert best is not None and best.sizing is not None and best.sizer is not None
    assert best.probe_replicas is not None
    runners = [_candidate(o, spare) for o in opts if o is not best] if len(opts) > 1 else []
    return PoolChoice(best.sizing, best.sizer, best.probe_replicas, runners)


def _candidate(o: _Option, spare: int) -> Candidate:
    """A runner-up, with the same N+k spares as the chosen configuration."""
    n = o.sizing.replicas if o.sizing else o.probe_replicas
    gpus = (n + spare) * o.pool.tp if n is not None else None
    usd = round(gpus * 730.0 * o.pool.price_per_gpu_hour, 2) if gpus is not None else None
    note = o.note or ("confirmed" if o.sizing else "probe estimate, not confirmed")
    return Candidate(
        precision=_precision(o.pool), replicas=None if n is None else n + spare, gpus=gpus,
        usd_per_month=usd,
        profile_source=o.setup.profile.source if o.setup else None, note=note,
    )


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
        rest = Sizer(split, pool.name, settings, setup=sizer.setup).search()
        alone = Sizer(split, own.name, settings, setup=replace(sizer.setup, pool=own)).search()
    except InfeasibleError as e:
        return Advice(kind="split", message=f"moving {wl} to its own pool: infeasible ({e})")
    return _split_advice("split", f"binding workload {wl} in its own pool", "it",
                         choice.probe_replicas, alone, rest, pool.tp)


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
    measured = [
        p for p in list_profiles()
        if p.spec_k and p.model == pool.model and p.precision == pool.precision
        and p.gpu == pool.gpu and p.tp == pool.tp and p.spec_method
    ]
    if measured:
        best = max(measured, key=lambda p: p.spec_k)
        return SpeculativeConfig(method=best.spec_method,
                                 num_speculative_tokens=best.spec_k)
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
        rest = Sizer(split, pool.name, settings, setup=choice.sizer.setup).search()
        alone = Sizer(split, bpool.name, settings).search()
    except InfeasibleError as e:
        return Advice(kind="batch_pool", message=f"a batch pool for {', '.join(batch)}: "
                      f"infeasible ({e})")
    what = (f"batch workload(s) {', '.join(batch)} in a batch pool ({spec.method} k = "
            f"{spec.num_speculative_tokens}, low priority)")
    return _split_advice("batch_pool", what, "them", choice.probe_replicas, alone, rest, pool.tp)


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
) -> Plan:
    """Size every pool of `mix` (or those named) at peak traffic x `growth`, plus `spare`
    replicas each for failures. `floors[(pool, precision)]`: replicas known to be needed
    (see `floors_of`). `log` is told every simulation of the search; `on_pool(name, i, n)`
    when pool i of n starts."""
    if spare < 0:
        raise ConfigError(f"spare must be >= 0, got {spare}", field="--spare")
    settings = SearchSettings(seed=seed, rate_scale=growth, quick=quick, log=log)
    m = grown(mix, growth)
    plans: list[PoolPlan] = []
    todo = [
        p for p in m.pools
        if (pools is None or p.name in pools) and m.workloads_of(p.name)
    ]
    for i, pool in enumerate(todo):
        if on_pool is not None:
            on_pool(pool.name, i, len(todo))
        choice = choose(m, pool.name, settings, spare=spare, floors=floors)
        notes: list[Advice] = []
        if advice:
            chosen = with_pool(m, choice.sizing.setup.pool)
            for a in (split_advice(chosen, choice, settings),
                      batch_pool_advice(chosen, choice, settings),
                      text_only_advice(chosen, choice.sizing.setup)):
                if a is not None:
                    notes.append(a)
        plans.append(pool_plan(
            choice.sizing, m.workloads_of(pool.name), spare=spare,
            runners_up=choice.runners_up, advice=notes,
        ))
    return Plan(
        mix=mix.name, source=mix.source, growth=growth, spare=spare,
        seed=mix.simulation.seed if seed is None else seed, quick=quick, pools=plans,
    )


def floors_of(plan: Plan) -> dict[tuple[str, str], int]:
    """Replicas each (pool, precision) of `plan` needed: the floor at higher traffic."""
    out = {(p.pool, p.precision): p.replicas_for_slo for p in plan.pools}
    for p in plan.pools:
        for r in p.runners_up:
            if r.replicas is not None and r.note == "confirmed":
                out[(p.pool, r.precision)] = r.replicas - p.spare
    return out
