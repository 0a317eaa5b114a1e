"""What the mix leaves open: a pool's candidate configurations, and the one chosen.

A pool may leave `gpu`, `precision`, `engine.speculative`, `engine.max_num_seqs` and
`engine.max_num_batched_tokens` `auto`. The candidates are the product of the open settings'
values: every GPU the pool prices (`price_per_gpu_hour` per GPU type); every precision (a
measured profile, else the analytic one); no speculation plus every speculative configuration
measured for the model on that GPU at that precision; the `max_num_seqs` ladder; the token
budget's ladder, less what vLLM refuses to start (a budget below the cap, one a draft model's
slots fill, or one below a picture's tokens where the pool takes pictures). The seeds' rule
decides: throughput *under the SLO*, not peak throughput, so the cheapest configuration that
meets every SLO wins (on one GPU type, the fewest GPUs), and among equal costs a measured
profile before the analytic roofline, then the best SLO margin (the most headroom for the
same money).

The product can be large (4 precisions x 3 drafters x 5 steps of each ladder), so with more
than FINALISTS candidates each is first sized by the quick search (`--quick`'s short probes),
and only the best FINALISTS get the full probe search, seeded with the quick answer.
Confirmation (every seed at confirmation length) runs on the leader and on every finalist
whose probe answer is cheaper than the best confirmed so far, or as cheap (to compare
margins); with `gpu: auto`, each GPU's best gets the full search and confirmation too, so
that the plan says what each GPU would cost.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from capplan.errors import ConfigError, InfeasibleError
from capplan.hardware import Precision
from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import EngineConfig, Pool, SpeculativeConfig
from capplan.profile import HOSTS
from capplan.profiles import measured_speculative
from capplan.sim.results import SimResult
from capplan.sim.run import PoolSetup, setup_pool
from capplan.solve.plan import HOURS_PER_MONTH, Candidate, Plan, PoolPlan, setting_text
from capplan.solve.search import PoolSizing, SearchSettings, Sizer

AUTO_PRECISIONS = (Precision.BF16, Precision.FP8, Precision.NVFP4, Precision.AWQ)

MAX_NUM_SEQS_LADDER = (64, 128, 256, 512, 1024)
"""`max_num_seqs: auto` tries these. 1024 is vLLM 0.26.0's `vllm serve` default on H200
(src/capplan/pool.py) and the largest: more concurrent sequences than that only deepen a
queue the SLOs already refuse. Doubling steps down to 64 span the batches where the cap binds
for latency-bound pools (a lower cap shortens decode steps, so ITL, at the price of queueing
before admission, so TTFT) while staying cheap to search: five candidates per other setting.
The shipped profiles were measured at batches up to 256 (64 with draft_model k=4); steps of
larger batches are extrapolated and the plan counts them (`extrapolated_steps`)."""

MAX_NUM_BATCHED_TOKENS_LADDER = (512, 1024, 2048, 4096, 8192)
"""`max_num_batched_tokens: auto` tries these. The budget is the largest prefill chunk a step
takes (vllm/v1/core/sched/scheduler.py, `token_budget`): a smaller one keeps a long prompt
from stalling the decodes beside it for a whole large chunk (ITL), at the price of more steps,
each paying the weights' read, to finish it (TTFT and throughput); the seeds' tuning primer
names this trade. 8192 is `vllm serve`'s default (src/capplan/pool.py) and the largest: the
shipped profiles timed prefill chunks up to 8,192 tokens, so a larger budget would price
steps outside their box. 512 is the smallest the validation suite served (the H200's
Llama-3.1-8B priority rows)."""

FINALISTS = 3
"""Candidates given the full probe search after the quick screen; also the most that are
confirmed only to compare margins at an equal GPU count."""


SHOWN_REASONS = 4
"""Candidates whose reason an infeasible pool's error gives (the first, in candidate order)."""


def with_pool(mix: TrafficMix, pool: Pool) -> TrafficMix:
    """The mix with `pool` replacing the pool of the same name."""
    return mix.model_copy(update={"pools": [pool if p.name == pool.name else p for p in mix.pools]})


def as_planned(pool: Pool, planned: PoolPlan, *, source: str | None = None) -> Pool:
    """The mix's pool on the plan's GPU (at its price), at the plan's precision and with the
    values the plan chose for the engine settings the pool leaves open, on the host whose
    core a pool on `host: any` was sized on. A mix whose pool fixes something else than the
    plan has (another model, TP, GPU, precision or engine setting) is not the mix the plan
    was sized for: a ConfigError says which (naming the mix's file, `source`)."""
    check_planned(pool, planned, source=source)
    update: dict[str, Any] = {}
    if pool.host == "any":
        update["host"] = planned.host
    if pool.gpu != planned.gpu:
        update.update(gpu=planned.gpu, price_per_gpu_hour=pool.gpu_prices[planned.gpu])
    if precision_of(pool) != planned.precision:
        update["precision"] = Precision(planned.precision)
    if pool.engine.auto:
        chosen = {k: planned.engine[k] for k in pool.engine.auto if k in planned.engine}
        update["engine"] = EngineConfig.model_validate(
            {**pool.engine.model_dump(mode="json"), **chosen})
    return pool.model_copy(update=update) if update else pool


def check_plan_mix(plan: Plan, mix: TrafficMix) -> None:
    """A ConfigError naming the mix's file unless it is a mix the plan was sized for: it has
    every pool of the plan, each fixing nothing the plan has otherwise (`check_planned`).
    `report` and `deploy` read a plan with such a mix; a pool it lacked was dropped, so that
    `report --traffic` of another mix wrote a page without figures."""
    pools = {p.name: p for p in mix.pools}
    for pp in plan.pools:
        if pp.pool not in pools:
            raise ConfigError(f"pool {pp.pool!r} of the plan is not in the mix; give the "
                              "traffic mix the plan was sized for", file=mix.source)
        check_planned(pools[pp.pool], pp, source=mix.source)


def check_planned(pool: Pool, planned: PoolPlan, *, source: str | None = None) -> None:
    """A ConfigError naming the mix (`source`) when its pool fixes something else than the
    plan has: it is not the mix the plan was sized for."""
    differs = _contradiction(pool, planned)
    if differs is not None:
        raise ConfigError(f"pool {pool.name!r}: {differs}; give the traffic mix the plan was "
                          "sized for, or size this one", file=source)


def _contradiction(pool: Pool, planned: PoolPlan) -> str | None:
    """What the mix's pool fixes that the plan has otherwise, or None."""
    pairs = [("model", pool.model, planned.model), ("tp", pool.tp, planned.tp)]
    if pool.gpu != "auto":
        pairs.append(("gpu", pool.gpu, planned.gpu))
    if pool.precision != "auto":
        pairs.append(("precision", precision_of(pool), planned.precision))
    fixed = pool.engine.model_dump(mode="json")
    pairs += [(f"engine.{k}", v, planned.engine[k]) for k, v in fixed.items()
              if k not in pool.engine.auto and k in planned.engine]
    for what, mine, theirs in pairs:
        if mine != theirs:
            return f"{what} is {theirs!r} in the plan and {mine!r} in the mix"
    return None


def precision_of(pool: Pool) -> str:
    return str(getattr(pool.precision, "value", pool.precision))


def label(pool: Pool, opened: list[str]) -> str:
    """The candidate's GPU where the mix left it open, its precision and the values of its
    open engine settings (`h100, bf16, draft_model k=4, max_num_seqs 256`); the precision
    alone when nothing else is open."""
    engine = pool.engine.model_dump(mode="json")
    keys = [f.removeprefix("engine.") for f in opened if f.startswith("engine.")]
    gpu = [pool.gpu] if "gpu" in opened else []
    return ", ".join([*gpu, precision_of(pool), *(setting_text(k, engine[k]) for k in keys)])


def candidates(pool: Pool) -> list[Pool]:
    """Every configuration the pool's open settings allow, fixed; the pool itself if none."""
    if not pool.open_settings:
        return [pool]
    auto = pool.engine.auto
    # a picture's tokens are scheduled in one step (sim/run.py setup_pool: vLLM refuses a
    # budget below them where the pool takes pictures)
    spec = load_model_spec(pool.model)
    least = (spec.image_tokens_per_image
             if spec.images_whole and not pool.engine.text_only else 0)
    precisions = AUTO_PRECISIONS if pool.precision == "auto" else (Precision(pool.precision),)
    out = []
    # cheapest GPU first: ties in cost and margin keep the earlier candidate
    gpus = sorted(pool.gpu_prices.items(), key=lambda kv: (kv[1], kv[0]))
    for (gpu, price), precision in itertools.product(gpus, precisions):
        on_gpu = pool.model_copy(update={"gpu": gpu, "price_per_gpu_hour": price})
        drafters: list[SpeculativeConfig | None] = (
            [None, *measured_speculative(on_gpu, precision)] if "speculative" in auto
            else [pool.engine.speculative]
        )
        # largest first: among candidates equal in GPUs and margin the earlier one is kept, and
        # a cap or a budget that does not bind is best left high (vLLM's default, room for
        # bursts, fewer steps a prompt)
        seqs = (tuple(reversed(MAX_NUM_SEQS_LADDER)) if "max_num_seqs" in auto
                else (pool.engine.max_num_seqs,))
        budgets = (tuple(b for b in reversed(MAX_NUM_BATCHED_TOKENS_LADDER) if b >= least)
                   if "max_num_batched_tokens" in auto else (pool.engine.max_num_batched_tokens,))
        for sc, n, b in itertools.product(drafters, seqs, budgets):
            if b < n:  # vLLM refuses a cap above the token budget (pool.py: EngineConfig)
                continue
            values: dict[str, Any] = {"speculative": sc, "max_num_seqs": n,
                                      "max_num_batched_tokens": b}
            engine = pool.engine.fixed(**{k: v for k, v in values.items() if k in auto})
            if engine.max_num_scheduled_tokens <= 0:
                # a draft model's slots take the whole budget: vLLM refuses to start
                # (vllm/config/vllm.py, VllmConfig._set_max_num_scheduled_tokens)
                continue
            out.append(on_gpu.model_copy(update={"precision": precision, "engine": engine}))
    return out


def worst_margin(results: list[SimResult]) -> float:
    """The smallest SLO margin over every run, workload and target (-inf: nothing ran)."""
    return min((c.margin for r in results for w in r.workloads for c in w.slo), default=-math.inf)


@dataclass(slots=True)
class _Option:
    pool: Pool
    label: str
    setup: PoolSetup | None
    sizer: Sizer | None = None
    replicas: int | None = None
    """The latest answer: the quick screen's, then the probe search's, then confirmed."""
    probe_replicas: int | None = None
    screen_replicas: int | None = None
    margin: float = -math.inf
    extrapolated: int = 0
    """Steps outside the profile's calibrated box in the runs behind `replicas`."""
    level: str = ""
    sizing: PoolSizing | None = None
    error: InfeasibleError | None = None
    note: str = ""
    ends: dict[str, PoolSetup] = field(default_factory=dict)
    """For a pool on `host: any`, its setup on each host's engine core (Pool.host): the
    option is sized on each and takes the most replicas."""
    by_host: dict[str, int] = field(default_factory=dict)
    """The replicas each host's core needs, from the latest search or confirmation."""
    sizers: dict[str, Sizer] = field(default_factory=dict)

    def cost(self) -> float:
        if self.replicas is None:
            return math.inf
        return self.replicas * self.pool.tp * max(self.pool.price, 1e-12)

    @property
    def analytic(self) -> bool:
        """Its step times are the datasheet roofline's: no profile was measured for it."""
        return self.setup is not None and self.setup.profile.source == "analytic"

    def rank(self) -> tuple[float, bool, float, bool]:
        """Cheapest first (on one GPU type the fewest GPUs: its price is the same for every
        candidate), then a measured profile before the analytic roofline (a margin on the
        roofline is no measurement's), then the widest SLO margin (to 0.01 %: closer is a
        tie), then step times inside the calibrated box; further ties keep the candidates'
        order (the cheapest GPU, no speculation, the largest max_num_seqs, then the largest
        token budget first)."""
        return self.cost(), self.analytic, -round(self.margin, 4), self.extrapolated > 0

    def size(self, mix: TrafficMix, settings: SearchSettings, *, level: str, floor: int,
             start: int | None = None, label: str | None = None) -> None:
        """Search this candidate (on each host's core for `host: any`, keeping the most
        replicas, then the smallest margin); an infeasible one keeps the reason."""
        assert self.setup is not None
        best: tuple[tuple[int, float], str, Sizer, SimResult] | None = None
        for host, setup in (self.ends or {"": self.setup}).items():
            sizer = Sizer(with_pool(mix, setup.pool), self.pool.name, settings, setup=setup,
                          floor=floor, start=start, label=label)
            try:
                n = sizer.search()
            except InfeasibleError as e:
                self.replicas, self.level, self.error = None, "", e
                self.note = f"on the {host} host's core: {e}" if host else str(e)
                return
            run = sizer.run(n, sizer.probe_s, sizer.seed, probe=True)
            key = (n, -worst_margin([run]))
            if host:
                self.by_host[host], self.sizers[host] = n, sizer
            if best is None or key > best[0]:
                best = (key, host, sizer, run)
        assert best is not None
        (n, _), _, self.sizer, run = best
        self.replicas, self.level = n, level
        if level == "probe":
            self.probe_replicas = n
        else:
            self.screen_replicas = n
        self._judge([run])

    def confirm(self) -> None:
        assert self.sizer is not None and self.replicas is not None
        if not self.ends:
            self.sizing = self.sizer.confirm(self.replicas)
        else:  # each host's core confirmed from the most any needed; the most replicas kept
            confirmed = {h: (z, z.confirm(self.replicas)) for h, z in self.sizers.items()}
            self.by_host = {h: sizing.replicas for h, (_, sizing) in confirmed.items()}
            self.sizer, self.sizing = max(
                confirmed.values(),
                key=lambda zs: (zs[1].replicas, -worst_margin(zs[1].seed_results)))
        self.replicas, self.level = self.sizing.replicas, "confirmed"
        self._judge(self.sizing.seed_results)

    def host_note(self) -> str:
        """For `host: any`: the replicas each host's core needs, and which was kept."""
        if not self.by_host:
            return ""
        kept = next(h for h, z in self.sizers.items() if z is self.sizer)
        return ("host any: " + ", ".join(f"{n * self.pool.tp} GPUs on the {h} host's core"
                                         for h, n in self.by_host.items())
                + f"; sized on the {kept}")

    def _judge(self, results: list[SimResult]) -> None:
        self.margin = worst_margin(results)
        self.extrapolated = sum(r.pool.extrapolated_steps for r in results)


@dataclass(slots=True)
class PoolChoice:
    """The configuration chosen for a pool, the ones that lost, and why."""

    sizing: PoolSizing
    sizer: Sizer
    probe_replicas: int
    runners_up: list[Candidate]
    auto: list[str]
    reasoning: str = ""


def _option(mix: TrafficMix, cand: Pool, name: str) -> _Option:
    """A candidate and its setup; on `host: any`, its setup on each host's core
    (profile.HOSTS: the median and each end of the traced hosts)."""
    if cand.host != "any":
        return _Option(cand, name, setup_pool(cand, source=mix.source))
    ends = {h: setup_pool(cand.model_copy(update={"host": h}), source=mix.source)
            for h in HOSTS}
    return _Option(cand, name, ends["median"], ends=ends)


def _options(mix: TrafficMix, pool: Pool) -> list[_Option]:
    opened = pool.open_settings
    if not opened:  # a fixed pool that cannot start is the user's error, not a lost candidate
        return [_option(mix, pool, label(pool, []))]
    cands = candidates(pool)
    if not cands:  # the ladders left nothing vLLM starts beside what the mix fixed
        i = [p.name for p in mix.pools].index(pool.name)
        raise ConfigError(
            f"no value of {', '.join(f.removeprefix('engine.') for f in opened)} left auto "
            "gives an engine vLLM 0.26.0 starts: it needs max_num_batched_tokens >= "
            "max_num_seqs (above it with a draft model, at least a picture's tokens where "
            "pictures come); lower max_num_seqs, or set max_num_batched_tokens at or above it",
            file=mix.source, field=f"pools.{i}.engine")
    out = []
    for cand in cands:
        name = label(cand, opened)
        try:
            out.append(_option(mix, cand, name))
        except ConfigError as e:
            out.append(_Option(cand, name, None, note=f"cannot start: {e}"))
    return out


def choose(
    mix: TrafficMix,
    pool_name: str,
    settings: SearchSettings,
    *,
    spare: int = 0,
    floors: dict[tuple[str, str], int] | None = None,
) -> PoolChoice:
    """Size every candidate configuration of a pool (quick screen first when there are many),
    confirm the best, keep the fewest GPUs, then the widest margin. `floors[(pool, label)]`:
    replicas a candidate is known to need."""
    opened = mix.pool(pool_name).open_settings
    opts = _options(mix, mix.pool(pool_name))
    live = [o for o in opts if o.setup is not None]
    screen = len(live) > FINALISTS and not settings.quick
    first = replace(settings, quick=True) if screen else settings
    floor = {o.label: (floors or {}).get((pool_name, o.label), 1) for o in opts}
    tag = {o.label: o.label if opened else None for o in opts}
    for o in live:
        o.size(mix, first, level="quick screen" if screen else "probe", floor=floor[o.label],
               label=tag[o.label])
    ranked = sorted((o for o in live if o.replicas is not None), key=_Option.rank)
    if screen:  # the best few by the quick screen get the full probe search
        finalists: list[_Option] = []
        for o in ranked:
            if len(finalists) == FINALISTS:
                break
            o.size(mix, settings, level="probe", floor=floor[o.label], start=o.replicas,
                   label=tag[o.label])
            if o.replicas is not None:
                finalists.append(o)
        if "gpu" in opened:  # and each GPU's best, whichever GPU the best few are on
            for gpu in dict.fromkeys(o.pool.gpu for o in ranked):
                if any(f.pool.gpu == gpu for f in finalists):
                    continue
                for o in (x for x in ranked if x.pool.gpu == gpu):
                    o.size(mix, settings, level="probe", floor=floor[o.label],
                           start=o.replicas, label=tag[o.label])
                    if o.replicas is not None:
                        finalists.append(o)
                        break
        ranked = sorted(finalists, key=_Option.rank)
    if not ranked:
        if len(opts) == 1 and opts[0].error is not None:
            raise opts[0].error
        what = "precision" if opened == ["precision"] else "candidate configuration"
        why = [f"{o.label}: {o.note}" for o in opts]
        more = f"; and {len(why) - SHOWN_REASONS} more" if len(why) > SHOWN_REASONS else ""
        raise InfeasibleError(
            f"pool {pool_name}: no {what} meets the SLOs: "
            + "; ".join(why[:SHOWN_REASONS]) + more
        )
    best: _Option | None = None
    best_probe: tuple[float, bool, float, bool] | None = None
    equal = 0
    for o in ranked:
        if best is not None:
            if o.cost() > best.cost():
                break  # sorted by cost: nothing after it can be cheaper
            if o.cost() == best.cost():
                if equal == FINALISTS - 1:
                    break
                if o.rank() == best_probe:  # the setting that differs does not bind
                    o.note = "probe matched a confirmed candidate's GPUs and margin"
                    continue
                equal += 1
        probe_rank = o.rank()
        o.confirm()
        if best is None or o.rank() < best.rank():
            best, best_probe = o, probe_rank
    if "gpu" in opened and best is not None:
        # which GPU is the question: each other GPU's best is confirmed too, so the plan says
        # what it would cost, not a short probe's guess (and a confirmation that comes in
        # lower than its probe can still win)
        for gpu in dict.fromkeys(o.pool.gpu for o in ranked):
            o = min((x for x in ranked if x.pool.gpu == gpu), key=_Option.rank)
            if o.level != "confirmed":
                o.confirm()
                if o.rank() < best.rank():
                    best = o
    assert best is not None and best.sizing is not None and best.sizer is not None
    assert best.probe_replicas is not None
    # confirmed answers first, then probe estimates, then quick-screen ones: like with like
    order = {"confirmed": 0, "probe": 1, "quick screen": 2, "": 3}
    runners = sorted((o for o in opts if o is not best), key=lambda o: (order[o.level], o.rank()))
    return PoolChoice(
        best.sizing, best.sizer, best.probe_replicas,
        [_candidate(o, best, spare, opened) for o in runners] if len(opts) > 1 else [],
        opened, "; ".join(x for x in (_reasoning(best, opts, opened, screen), best.host_note())
                          if x),
    )


def _pct(m: float) -> str:
    return f"{m:.1%}" if math.isfinite(m) else "none"


def _candidate(o: _Option, best: _Option, spare: int, opened: list[str]) -> Candidate:
    """A runner-up, with the same N+k spares as the chosen configuration."""
    n = o.replicas
    gpus = (n + spare) * o.pool.tp if n is not None else None
    usd = round(gpus * HOURS_PER_MONTH * o.pool.price, 2) if gpus is not None else None
    if o.note and o.replicas is None:
        note = o.note
    elif o.level == "confirmed":
        note = "confirmed"
        same = "same cost" if "gpu" in opened else "same GPUs"  # GPU types differ in price
        if o.rank() == best.rank():
            note += (f": {same} and SLO margin ({_pct(o.margin)}); the chosen one is nearer "
                     "vLLM's defaults")
        elif o.rank()[:3] == best.rank()[:3]:
            note += (f": {same} and SLO margin ({_pct(o.margin)}), but {o.extrapolated} "
                     "step(s) outside the profile's calibrated box")
        elif o.cost() == best.cost():
            if o.analytic and not best.analytic:
                note += (f": {same}, but on the analytic profile (SLO margin {_pct(o.margin)}; "
                         "the chosen one's is measured)")
            else:
                note += (f": {same}, smaller SLO margin ({_pct(o.margin)} vs "
                         f"{_pct(best.margin)})")
        if o.by_host:
            note += f"; {o.host_note()}"
    elif o.level == "probe":
        note = f"{o.note or 'probe estimate'}, not confirmed"
    else:
        note = (f"quick screen only: {o.screen_replicas} replica(s) in short runs (the chosen "
                f"one: {best.screen_replicas}); not among the best {FINALISTS} searched in full")
    engine = o.pool.engine.model_dump(mode="json")
    return Candidate(
        gpu=o.pool.gpu if "gpu" in opened else None,
        precision=precision_of(o.pool),
        engine={k: engine[k] for k in (f.removeprefix("engine.") for f in opened
                                       if f.startswith("engine."))},
        replicas=None if n is None else n + spare, gpus=gpus, usd_per_month=usd,
        margin=round(o.margin, 6) if n is not None and math.isfinite(o.margin) else None,
        profile_source=o.setup.profile.source if o.setup else None, note=note,
    )


def _reasoning(best: _Option, opts: list[_Option], opened: list[str], screen: bool) -> str:
    """Why this candidate: its GPUs against the next, or its margin among equals."""
    if not opened:
        return ""
    gpus = best.replicas * best.pool.tp if best.replicas is not None else 0
    equal = [o for o in opts if o is not best and o.level == "confirmed"
             and o.cost() == best.cost()]
    gpus_text = f"{gpus} GPU{'s' * (gpus != 1)}"
    if "gpu" in opened:  # GPU types differ in price: the cost decides, not the count
        def month(o: _Option) -> str:
            return f"${o.cost() * HOURS_PER_MONTH:,.0f} a month"
        dearer = [f"{month(o)} ({o.label})" for o in sorted(opts, key=_Option.rank)
                  if o.replicas is not None and o.cost() > best.cost()]
        text = (f"{', '.join(opened)} auto: {len(opts)} candidate(s); chose {best.label}: the "
                f"lowest cost ({month(best)} on {gpus_text})")
        same = f"also cost {month(best)}"
    else:
        dearer = [str(n) for n in sorted(o.replicas * o.pool.tp for o in opts
                                         if o.replicas is not None and o.cost() > best.cost())]
        text = (f"{', '.join(opened)} auto: {len(opts)} candidate(s); chose {best.label}: the "
                f"fewest GPUs ({gpus})")
        same = f"also need {gpus_text}"
    if equal:
        runner = min(equal, key=_Option.rank)
        text += f"; {len(equal)} other(s) confirmed {same}"
        if runner.analytic and not best.analytic:
            text += (f", and among equal costs a measured profile wins over the analytic "
                     f"roofline ({runner.label}'s, SLO margin {_pct(runner.margin)})")
        elif runner.rank()[2] != best.rank()[2]:
            text += (f", and among equal costs the widest SLO margin wins "
                     f"({_pct(best.margin)} vs {_pct(runner.margin)} for {runner.label})")
        elif runner.rank() != best.rank():
            text += (f" with the same SLO margin ({_pct(best.margin)}); this one's steps stay "
                     f"inside the profile's calibrated box ({runner.label}'s do not)")
        else:
            text += (f" with the same SLO margin ({_pct(best.margin)}): the settings that differ "
                     "do not bind at this traffic, so the one nearest vLLM's defaults is kept")
    elif dearer:
        text += f"; the next best needs {dearer[0]}"
    if screen:
        confirmed = sum(o.level == "confirmed" for o in opts)
        text += (f" (every candidate sized by the quick search, the best {FINALISTS} by the "
                 f"full one, {confirmed} confirmed)")
    return text
