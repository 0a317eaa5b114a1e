"""The plan: per pool, the GPUs that hold every SLO, the configuration chosen, cost, and why.

JSON schema (`Plan.model_dump_json`), one object per pool under `pools`:
`pool, model, gpu, tp, precision, engine, router, replicas, replicas_for_slo, spare, gpus,
binding_workload, binding_slo, binding_margin, workloads[].slo[] (key, limit_s, value_s,
margin, met, beyond), workloads[] predicted percentiles, utilisation, prefix_hit_rate,
kv_usage_peak, kv_headroom, profile, profile_source, cost, confidence, runners_up, advice,
bracket, auto, reasoning`; a pool no replica count can size is not among them but under `infeasible`
(`pool, model, gpu, precision, reason`: which workload and SLO, and why).
`confidence.one_fewer_stopped_at_s`: the one-fewer check stopped there, its miss
certain. Margins are fractions of the limit (0.2: 20 % below it). `beyond`: the share of
the metric's observations past the limit, which a pN SLO allows up to 1 - N/100 of (a p99's
0.01; near a cliff in the distribution it is the closer measure of headroom). `value_s` null:
requests unfinished. Settings the mix left `auto` are listed under `auto`; `precision` and
`engine` hold the values chosen for them, `runners_up` the candidates that lost and
`reasoning` why.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capplan.sim.results import SimResult
from capplan.solve.search import PoolSizing, SearchSettings, worst_check
from capplan.traffic import DailyArrival, Workload, slo_allowed_share, slo_percentile

if TYPE_CHECKING:
    import polars as pl

_FROZEN = ConfigDict(frozen=True, extra="forbid")
HOURS_PER_MONTH = 730.0


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)


class SloLine(BaseModel):
    """One SLO target of one workload at the planned replica count."""

    model_config = _FROZEN
    key: str
    limit_s: float
    value_s: float | None
    margin: float | None
    met: bool
    beyond: float | None = Field(
        default=None,
        description="share of the metric's observations past the limit (SloCheck.beyond); a "
                    "p99 allows 0.01")

    @property
    def allowed(self) -> float | None:
        """The share of observations the SLO lets past its limit (0.01 for a p99)."""
        return slo_allowed_share(self.key)


class WorkloadLine(BaseModel):
    """A workload's predicted percentiles at the planned replica count (base seed)."""

    model_config = _FROZEN
    name: str
    requests: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    output_tokens_per_s: float
    prefix_hit_rate: float | None
    slo: list[SloLine]


class Cost(BaseModel):
    """Per month at the plan's GPU count; tokens at the average (not peak) traffic."""

    model_config = _FROZEN
    gpu_hours_per_month: float
    usd_per_month: float
    tokens_per_usd: float | None


TAIL_RULE = SearchSettings().confirm_tail_requests
"""Requests beyond a percentile that pin it, as the search confirms: a plan whose
confirmation held fewer, because the mix's duration_s capped it, says so."""


class Confidence(BaseModel):
    """How sure: seeds run at the answer, whether all passed, the smallest margin among them,
    and whether one replica fewer fails."""

    model_config = _FROZEN
    seeds: list[int]
    all_seeds_pass: bool
    worst_margin: float | None
    duration_s: float
    one_fewer_fails: bool | None
    one_fewer_stopped_at_s: float | None = Field(
        default=None,
        description="the one-fewer run was stopped at this simulated second, its miss "
        "already certain (its percentiles would be a partial run's; only the verdict is kept)",
    )
    simulations: int
    tail_requests: float | None = Field(
        default=None,
        description="the fewest measured requests beyond a workload's tightest SLO "
        "percentile in the base seed's run at the answer (requests x (1 - q/100)); the "
        "search confirms long enough for 50 where the mix's duration_s allows",
    )
    tail_workload: str | None = Field(default=None, description="whose tail that is")

    def thin_tail(self, quick: bool = False) -> str | None:
        """What a confirmation with fewer than TAIL_RULE requests beyond a percentile rests
        on and what would hold enough (a longer simulation.duration_s; under `--quick`, whose
        short probes ignore it, the full search); None when it held enough."""
        if self.tail_requests is None or self.tail_requests >= TAIL_RULE:
            return None
        n = f"~{self.tail_requests:.0f} request{'' if round(self.tail_requests) == 1 else 's'}"
        whose = f"{self.tail_workload}'" + ("" if str(self.tail_workload).endswith("s") else "s")
        text = (f"{whose} tightest percentile rests on {n} beyond it in "
                f"{self.duration_s:g} s (the search asks {TAIL_RULE}); ")
        if quick:
            return text + "size without --quick to confirm it at the mix's duration_s"
        need = self.duration_s * TAIL_RULE / max(self.tail_requests, 1e-9)
        return text + f"simulation.duration_s {need:,.0f} would steady it"



def thinnest_tail(res: SimResult) -> tuple[str, float] | None:
    """The workload whose tightest SLO percentile rests on the fewest measured requests
    beyond it in `res`, and how many (requests x (1 - q/100)); None without percentile SLOs."""
    best: tuple[str, float] | None = None
    for w in res.workloads:
        qs = [q for c in w.slo if (q := slo_percentile(c.key)) is not None]
        if not qs:
            continue
        n = w.requests * (1 - max(qs) / 100)
        if best is None or n < best[1]:
            best = (w.name, n)
    return best


def setting_text(key: str, value: Any) -> str:
    """One chosen setting as a person reads it (`draft_model k=4`, `max_num_seqs 256`)."""
    if key == "speculative":
        if value is None:
            return "no speculation"
        return f"{value['method']} k={value['num_speculative_tokens']}"
    return f"{key} {value}"


class Candidate(BaseModel):
    """A configuration searched but not chosen (settings left `auto`): its precision, the
    values of the open engine settings, and what the search found."""

    model_config = _FROZEN
    gpu: str | None = Field(default=None, description="the GPU, where the mix left gpu auto")
    precision: str
    engine: dict[str, Any] = Field(
        default_factory=dict, description="the open engine settings' values in this candidate"
    )
    replicas: int | None
    gpus: int | None
    usd_per_month: float | None
    margin: float | None = Field(
        default=None, description="worst SLO margin at its replica count (over seeds run)"
    )
    profile_source: str | None
    note: str

    @property
    def label(self) -> str:
        return ", ".join([*([self.gpu] if self.gpu else []), self.precision,
                          *(setting_text(k, v) for k, v in self.engine.items())])


class Advice(BaseModel):
    """A computed suggestion: what to change, and the GPUs or KV it saves (negative: costs)."""

    model_config = _FROZEN
    kind: Literal["split", "text_only", "batch_pool", "encoder", "memory", "token_budget"]
    message: str
    gpus_saved: int | None = None
    kv_gain: float | None = None


class Fidelity(BaseModel):
    """How far predictions of the binding SLO's metric on the pool's profile have been from
    real vLLM (capplan/fidelity.py): the stored validation rows' signed errors (predicted /
    measured - 1), and the binding margin were the prediction that far off."""

    model_config = _FROZEN
    metric: str
    rows: int = Field(description="validation rows of the profile and metric; under "
                      "fidelity.MIN_ROWS the plan quotes their range, not a spread (`few`)")
    p10: float = Field(description="the errors' 10th percentile (their least with `few` rows)")
    p90: float = Field(description="the errors' 90th percentile (their largest with `few` rows)")
    worst_under: float = Field(description="the most negative error (the engine's value "
                               "highest above the prediction)")
    margin_after_p10: float | None = Field(description="None with `few` rows")
    margin_after_worst: float | None
    within_noise: int | None = Field(
        default=None, description="of those rows, how many predictions lie within the "
        "measurement's own noise (its sampling interval, or the range the same experiment "
        "measured over its runs)")
    share_rows: int | None = Field(
        default=None, description="validation rows of this profile whose prediction put a "
        "share near the SLO's allowed one past its limit (capplan/fidelity.py: share_ratios); "
        "None where fewer than fidelity.MIN_ROWS")
    share_p90: float | None = Field(
        default=None, description="on those rows, the 90th percentile of the engine's share "
        "past the limit over the simulator's")
    share_max: float | None = Field(default=None, description="and the largest")
    beyond_after_p10: float | None = Field(
        default=None, description="the plan's share past the limit (its SLO line's `beyond`) "
        "were the engine's share_p90 times it")
    beyond_after_worst: float | None = Field(default=None, description="... share_max times it")
    unseen_rows: int | None = Field(
        default=None, description="validation rows of this profile whose prediction put "
        "almost nothing past the SLO's limit (under a quarter of the allowed share) where the "
        "engine put more (capplan/fidelity.py: share_unseen); None where none")
    unseen_max: float | None = Field(
        default=None, description="on those rows, the largest of the engine's share past the "
        "limit less the simulator's: a tail the prediction does not have, which adds to the "
        "plan's share past the limit (`--guard` takes it off the share allowed)")

    @property
    def few(self) -> bool:
        """Fewer rows than a spread needs (fidelity.MIN_ROWS): the plan quotes what they
        measured, and --guard does not read them."""
        from capplan.fidelity import MIN_ROWS

        return self.rows < MIN_ROWS


def fidelity_of(profile: str, slo: str, margin: float | None,
                table: dict[str, dict[str, dict[str, float]]], *,
                limit_s: float | None = None, beyond: float | None = None,
                tails: pl.DataFrame | None = None) -> Fidelity | None:
    """The binding SLO's Fidelity, where validation rows of that profile and metric exist:
    their spread where there are enough for one (capplan/fidelity.py: lookup), else their
    range (`Fidelity.few`: a plan on a configuration measured once or twice says so, rather
    than nothing); with the share the engine ran past the SLO's limit over the simulator's
    where enough rows came near it (`share_ratios`, given the limit and the stored `tails`),
    and the plan's share past the limit (`beyond`) scaled by it; and the engine's excess past
    the limit on rows the prediction put almost nothing past it (`share_unseen`)."""
    from capplan.fidelity import lookup, margin_after, share_spread, share_unseen

    f = lookup(table, profile, slo)
    few = f is None
    if f is None:
        f = table.get(profile, {}).get(slo)
        if f is None:
            return None

    def after(e: float) -> float | None:
        return None if margin is None else round(margin_after(margin, e), 6)

    noisy = f.get("within_noise")
    share: dict[str, Any] = {}
    allowed = slo_allowed_share(slo)
    if tails is not None and limit_s is not None and allowed is not None:
        spread = share_spread(tails, profile, slo.split("_")[0], limit_s, allowed)
        if spread is not None:
            p90, most, n = spread
            share = {"share_rows": n, "share_p90": round(p90, 4), "share_max": round(most, 4)}
            if beyond is not None:
                share |= {"beyond_after_p10": round(min(beyond * max(p90, 1.0), 1.0), 6),
                          "beyond_after_worst": round(min(beyond * max(most, 1.0), 1.0), 6)}
        unseen = [e for e, _ in share_unseen(tails, profile, slo.split("_")[0], limit_s,
                                             allowed)]
        if unseen:
            share |= {"unseen_rows": len(unseen), "unseen_max": round(max(unseen), 6)}
    lo, hi = (f["min"], f["max"]) if few else (f["p10"], f["p90"])
    return Fidelity(metric=slo, rows=int(f["rows"]), p10=lo, p90=hi,
                    worst_under=min(f["min"], 0.0),
                    margin_after_p10=None if few else after(min(f["p10"], 0.0)),
                    margin_after_worst=after(min(f["min"], 0.0)),
                    within_noise=None if noisy is None else int(noisy), **share)


class BracketLine(BaseModel):
    """The analytic bracket the search started from."""

    model_config = _FROZEN
    lower: int
    estimate: int
    work_replicas: float
    kv_replicas: float


class PoolPlan(BaseModel):
    """One pool's answer."""

    model_config = _FROZEN
    pool: str
    model: str
    gpu: str
    tp: int
    precision: str
    engine: dict[str, Any]
    router: str = Field(default="least_outstanding",
                        description="how the plan spread requests over the replicas "
                                    "(the mix's pools[].router): deploy the same")
    replicas_for_slo: int
    spare: int
    replicas: int
    gpus: int
    binding_workload: str
    binding_slo: str
    binding_margin: float | None
    workloads: list[WorkloadLine]
    utilisation: float
    prefix_hit_rate: float
    kv_usage_peak: float
    kv_headroom: float
    kv_tokens_per_replica: int
    extrapolated_steps: int
    profile: str
    profile_source: str
    host: str = Field(default="median", description="whose engine core the replicas were "
                      "sized on (the pool's `host`; for `any`, the one that needed the most)")
    cost: Cost
    confidence: Confidence
    bracket: BracketLine
    runners_up: list[Candidate] = Field(default_factory=list)
    advice: list[Advice] = Field(default_factory=list)
    auto: list[str] = Field(
        default_factory=list, description="settings the mix left auto (`engine.max_num_seqs`)"
    )
    reasoning: str = Field(default="", description="why this configuration, when one was chosen")
    fidelity: Fidelity | None = Field(
        default=None, description="the binding metric's validated error on this profile")

    @property
    def label(self) -> str:
        """Precision and the chosen values of the engine settings the mix left open."""
        keys = [a.removeprefix("engine.") for a in self.auto if a.startswith("engine.")]
        return ", ".join([self.precision, *(setting_text(k, self.engine.get(k)) for k in keys)])

    @property
    def candidate(self) -> str:
        """The chosen candidate as the search and its runners-up name it: the label, after
        the GPU where the mix left the GPU open (`h100, fp8`)."""
        return f"{self.gpu}, {self.label}" if "gpu" in self.auto else self.label


FRAME_COLUMNS = {
    "pool": "String", "gpus": "Int64", "replicas": "Int64", "precision": "String",
    "binding_workload": "String", "binding_slo": "String", "utilisation": "Float64",
    "usd_per_month": "Float64", "profile_source": "String", "workload": "String",
    "slo": "String", "limit_s": "Float64", "value_s": "Float64", "margin": "Float64",
    "met": "Boolean", "infeasible": "String", "model": "String", "gpu": "String", "tp": "Int64",
    "configuration": "String",
}
"""`Plan.to_polars`' columns and their polars dtypes, fixed so that a plan of infeasible
pools alone, or of none, has them too. The last four say what to buy and run: the model, the
GPU type (chosen, where the mix left `gpu: auto`), the tensor-parallel size and the
configuration (the precision and the values chosen for the engine settings left `auto`)."""


class InfeasiblePool(BaseModel):
    """A pool no replica count up to its cap can size: which workload and SLO, and why."""

    model_config = _FROZEN
    pool: str
    model: str
    gpu: str
    precision: str = Field(description="the pool's precision, or auto")
    reason: str


class Plan(BaseModel):
    """The answer to `capplan size`: the pools sized, and those no replica count can size
    (`infeasible`, with why; they add no GPUs)."""

    model_config = _FROZEN
    schema_version: Literal[1] = 1
    mix: str
    source: str
    growth: float
    spare: int
    seed: int
    quick: bool
    pools: list[PoolPlan]
    guard: Literal["none", "p10", "worst"] = Field(
        default="none", description="SLOs tightened by the simulator's validated error "
        "(capplan/solve/guard.py); the pools' SLO keys and limit_s are the tightened ones")
    guarded: list[str] = Field(default_factory=list, description="each target tightened, why")
    infeasible: list[InfeasiblePool] = Field(
        default_factory=list, description="pools that no replica count up to their cap can "
        "size, with why: an answer, not an error (their GPUs are not in the totals)")

    @property
    def feasible(self) -> bool:
        """Every pool sized."""
        return not self.infeasible

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def usd_per_month(self) -> float:
        return sum(p.cost.usd_per_month for p in self.pools)

    def pool(self, name: str) -> PoolPlan:
        return next(p for p in self.pools if p.pool == name)

    def to_polars(self) -> pl.DataFrame:
        """One row per (pool, workload, SLO); an infeasible pool is one row with no GPUs,
        `met` false and its reason under `infeasible` (null on the sized pools' rows), so
        that a sum over the frame cannot pass for the whole plan unnoticed."""
        import polars as pl

        rows = []
        for p in self.pools:
            for w in p.workloads:
                for s in w.slo:
                    rows.append({
                        "pool": p.pool, "gpus": p.gpus, "replicas": p.replicas,
                        "precision": p.precision, "binding_workload": p.binding_workload,
                        "binding_slo": p.binding_slo, "utilisation": p.utilisation,
                        "usd_per_month": p.cost.usd_per_month, "profile_source": p.profile_source,
                        "workload": w.name, "slo": s.key, "limit_s": s.limit_s,
                        "value_s": s.value_s, "margin": s.margin, "met": s.met,
                        "infeasible": None, "model": p.model, "gpu": p.gpu, "tp": p.tp,
                        "configuration": p.label,
                    })
        for x in self.infeasible:
            rows.append({
                "pool": x.pool, "gpus": None, "replicas": None, "precision": x.precision,
                "binding_workload": None, "binding_slo": None, "utilisation": None,
                "usd_per_month": None, "profile_source": None, "workload": None, "slo": None,
                "limit_s": None, "value_s": None, "margin": None, "met": False,
                "infeasible": x.reason, "model": x.model, "gpu": x.gpu, "tp": None,
                "configuration": None,
            })
        return pl.DataFrame(rows, schema={k: getattr(pl, t) for k, t in FRAME_COLUMNS.items()})

    def to_csv(self, path: str | Path | None = None) -> str:
        """The `to_polars` rows as CSV; written to `path` when given."""
        df = self.to_polars()
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(df.columns)
        for row in df.iter_rows():
            w.writerow(["" if v is None else v for v in row])
        text = buf.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.model_validate_json(text)


def average_fraction(w: Workload) -> float:
    """Average over the day of a workload's rate as a fraction of the peak the plan sizes for."""
    if isinstance(w.arrival, DailyArrival):
        return sum(w.arrival.hourly_fraction) / 24
    return 1.0


def workload_lines(res: SimResult) -> list[WorkloadLine]:
    out = []
    for w in res.workloads:
        out.append(WorkloadLine(
            name=w.name, requests=w.requests,
            ttft_p50_s=_finite(w.ttft_p50_s), ttft_p99_s=_finite(w.ttft_p99_s),
            itl_p50_s=_finite(w.itl_p50_s), itl_p99_s=_finite(w.itl_p99_s),
            tpot_p99_s=_finite(w.tpot_p99_s), e2e_p50_s=_finite(w.e2e_p50_s),
            e2e_p99_s=_finite(w.e2e_p99_s), output_tokens_per_s=round(w.output_tokens_per_s, 3),
            prefix_hit_rate=_finite(w.prefix_hit_rate),
            slo=[
                SloLine(key=c.key, limit_s=c.limit_s, value_s=_finite(c.value_s),
                        margin=_finite(c.margin), met=c.met, beyond=c.beyond)
                for c in w.slo
            ],
        ))
    return out


def pool_plan(
    sz: PoolSizing,
    workloads: list[Workload],
    *,
    spare: int = 0,
    runners_up: list[Candidate] | None = None,
    advice: list[Advice] | None = None,
    auto: list[str] | None = None,
    reasoning: str = "",
) -> PoolPlan:
    """A PoolPlan from a search's answer (figures from the base-seed run at the answer)."""
    pool, res = sz.setup.pool, sz.result
    found = worst_check(res)
    wl, check = found if found else ("", None)
    replicas = sz.replicas + spare
    gpus = replicas * pool.tp
    usd = gpus * HOURS_PER_MONTH * pool.price
    avg = {w.name: average_fraction(w) for w in workloads}
    tokens_per_s = sum(
        (w.output_tokens_per_s + w.input_tokens_per_s) * avg.get(w.name, 1.0)
        for w in res.workloads
    )
    margins = [
        c.margin for r in sz.seed_results for w in r.workloads for c in w.slo
    ]
    return PoolPlan(
        pool=pool.name, model=pool.model, gpu=pool.gpu, tp=pool.tp,
        precision=str(getattr(pool.precision, "value", pool.precision)),
        engine=pool.engine.model_dump(mode="json"), router=pool.router,
        replicas_for_slo=sz.replicas, spare=spare, replicas=replicas, gpus=gpus,
        binding_workload=wl, binding_slo=check.key if check else "",
        binding_margin=_finite(check.margin) if check else None,
        workloads=workload_lines(res),
        utilisation=round(res.pool.utilisation, 6),
        prefix_hit_rate=round(res.pool.prefix_hit_rate, 6),
        kv_usage_peak=round(res.pool.kv_usage_peak, 6),
        kv_headroom=round(1 - res.pool.kv_usage_peak, 6),
        kv_tokens_per_replica=res.pool.kv_tokens_per_replica,
        extrapolated_steps=res.pool.extrapolated_steps,
        profile=res.pool.profile, profile_source=res.pool.profile_source, host=pool.host,
        cost=Cost(
            gpu_hours_per_month=gpus * HOURS_PER_MONTH,
            usd_per_month=round(usd, 2),
            tokens_per_usd=(
                round(tokens_per_s * 3600 * HOURS_PER_MONTH / usd, 3) if usd > 0 else None
            ),
        ),
        confidence=Confidence(
            seeds=sz.seeds, all_seeds_pass=sz.stable,
            worst_margin=_finite(min(margins)) if margins else None,
            duration_s=round(sz.duration_s, 3), one_fewer_fails=sz.below_fails,
            one_fewer_stopped_at_s=sz.below.stopped_at_s if sz.below is not None else None,
            simulations=sz.simulations,
            **({"tail_workload": tail[0], "tail_requests": round(tail[1], 1)}
               if (tail := thinnest_tail(res)) is not None else {}),
        ),
        bracket=BracketLine(
            lower=sz.bracket.lower, estimate=sz.bracket.estimate,
            work_replicas=round(sz.bracket.busy_replicas, 4),
            kv_replicas=round(sz.bracket.kv_replicas, 4),
        ),
        runners_up=runners_up or [],
        advice=advice or [],
        auto=auto or [],
        reasoning=reasoning,
        fidelity=(fidelity_of(res.pool.profile, check.key, _finite(check.margin),
                              fidelity_table(pool.gpu), limit_s=check.limit_s,
                              beyond=check.beyond, tails=fidelity_tails(pool.gpu))
                  if check and res.pool.profile_source.startswith("measured") else None),
    )


@functools.cache
def fidelity_tails(gpu: str) -> pl.DataFrame | None:
    """The shipped validation rows' shares past a grid of limits (fidelity.tails), read once."""
    from capplan import fidelity
    from capplan.profiles import CALIBRATION_DIR

    return fidelity.load_tails(fidelity.tails_path_for(CALIBRATION_DIR, gpu))


@functools.cache
def fidelity_table(gpu: str) -> dict[str, dict[str, dict[str, float]]]:
    """The shipped validation summary for `gpu` (capplan/fidelity.py), read once."""
    from capplan import fidelity
    from capplan.profiles import CALIBRATION_DIR

    return fidelity.load(fidelity.path_for(CALIBRATION_DIR, gpu))
