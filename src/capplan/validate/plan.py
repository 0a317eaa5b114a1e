"""A plan's decision, put to the real engine: the validation suite that checks it.

`capplan size` gives a pool N replicas and says whether N - 1 would fail. One replica of the
pool, served the share of the pool's traffic that one of N replicas takes and then one of
N - 1, on a GPU, says whether the engine agrees (docs/validation.md, "The production plan's
decision, on the real engine", measured this way by hand first). `plan_suite` writes that
suite: per pool, one engine with the plan's configuration, and one experiment per replica
count with every Poisson or gamma workload's rate divided by it (as a random router spreads
it: harsher than least-outstanding routing, so a pass is on the safe side), then one per
replica count with the requests the pool's own router hands one replica (`routed`,
validate/suite.py Routed: the plan's decision as it will be served; in the twenty-fourth
session the simulator's share of a routed replica's stalled gaps came within 12 % of vLLM's).
`capplan validate emit` turns it into GPU jobs as for any suite.

A pool is left out, with the reason, where the runner cannot replay its traffic: arrivals
that are neither Poisson nor gamma (daily curves, replays), a target prefix hit rate instead
of shared prefixes, or a workload rate that the plan's growth factor scales. Image requests
are replayed: the runner builds their pictures (validate/runner.py Pictures). A pool with
speculative decoding is served with its drafts accepted at the rate the plan assumed, by vLLM's
synthetic rejection sampler (EngineRun.synthetic_acceptance): dummy weights accept almost none.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from capplan.mix import TrafficMix
from capplan.pool import Pool
from capplan.profiles import DEFAULT_DRAFT
from capplan.solve.choose import as_planned
from capplan.solve.plan import Plan
from capplan.traffic import GammaArrival, PoissonArrival, Workload
from capplan.validate.suite import EngineRun, Experiment, Suite

DURATION_S = 90.0
"""Long enough for a p99 of a few thousand requests a pool at typical plan loads; the
fourteenth session's runs took 90 s and repeated within 3 % at the failing load."""


def _share(w: Workload, replicas: int) -> Workload:
    """The workload as one of `replicas` replicas receives it (rate / replicas); other
    arrivals are left for Experiment to refuse."""
    a = w.arrival
    if isinstance(a, PoissonArrival | GammaArrival):
        a = a.model_copy(update={"rate_rps": a.rate_rps / replicas})
    return w.model_copy(update={"arrival": a, "pool": "validate"})


def _acceptance(pool: Pool, workloads: list[Workload]) -> float | None:
    """The draft acceptance the plan assumed for the pool, for vLLM's synthetic rejection
    sampler (dummy weights accept almost no drafts, so without it the engine would be held
    to a plan it was never sized for): one figure per engine, so where the workloads assume
    different ones, their mean weighted by request rate. None without speculative decoding."""
    spec = pool.engine.speculative
    if spec is None:
        return None
    acc = [(w.acceptance(spec),
            w.arrival.rate_rps if isinstance(w.arrival, PoissonArrival | GammaArrival) else 1.0)
           for w in workloads]
    return round(sum(a * r for a, r in acc) / sum(r for _, r in acc), 4) if acc else None


def plan_suite(mix: TrafficMix, plan: Plan, *, duration_s: float = DURATION_S
               ) -> tuple[Suite | None, dict[str, str]]:
    """The suite checking each pool's replica count (and one fewer), and why any pool was
    left out. None when no pool can be checked."""
    if plan.growth != 1:
        return None, {p.pool: f"the plan scales traffic by {plan.growth:g}; validate the "
                      "mix it was sized for (growth 1)" for p in plan.pools}
    engines: list[EngineRun] = []
    skipped = {x.pool: f"infeasible, nothing to check: {x.reason}" for x in plan.infeasible}
    for pp in plan.pools:
        pool = as_planned(mix.pool(pp.pool), pp, source=mix.source)
        workloads = [w for w in mix.workloads if w.pool == pool.name]
        n = pp.replicas_for_slo
        counts = [n, n - 1] if n > 1 else [n]
        try:  # what the runner can replay is Experiment's to say (suite.py: _replayable)
            experiments = [
                Experiment(name=f"{pp.pool}-of{k}", duration_s=duration_s, tags=["plan"],
                           workloads=[_share(w, k) for w in workloads])
                for k in counts
            ]
            if all(isinstance(w.arrival, PoissonArrival | GammaArrival) for w in workloads):
                whole = [w.model_copy(update={"pool": "validate"}) for w in workloads]
                experiments += [
                    Experiment(name=f"{pp.pool}-routed{k}", duration_s=duration_s,
                               tags=["plan", "routed"], workloads=whole,
                               routed={"replicas": k, "policy": pool.router})
                    for k in counts if k > 1
                ]
        except ValidationError as e:
            skipped[pp.pool] = str(e.errors()[0]["msg"]).removeprefix("Value error, ")
            continue
        spec = pool.engine.speculative
        draft = DEFAULT_DRAFT if spec is not None and spec.method == "draft_model" else None
        engines.append(EngineRun(name=f"plan-{mix.name}-{pp.pool}".replace(" ", "_"),
                                 pool=pool, draft_model=draft, experiments=experiments,
                                 synthetic_acceptance=_acceptance(pool, workloads)))
    if not engines:
        return None, skipped
    return Suite(schema_version=1, gpu=plan.pools[0].gpu, engines=engines), skipped


def suite_yaml(suite: Suite) -> dict[str, Any]:
    """The suite as the YAML a person keeps beside the plan (load_suite reads it back)."""
    out: dict[str, Any] = suite.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out
