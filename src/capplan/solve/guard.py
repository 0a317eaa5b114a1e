"""Sizing that allows for the simulator's own error: `capplan size --guard p10|worst`.

An SLO `metric_pQ <= L` bounds the share of requests (or, for ITL, of gaps) past L at
a = 1 - Q/100. Where the stored validation runs (capplan/fidelity.py) hold at least
fidelity.MIN_ROWS rows of the pool's profile whose prediction put a share near a past L,
the guard reads the engine's share past L over the simulator's on those rows (its 90th
percentile for `p10`, its largest for `worst`) and, where the engine ran more past the
limit than predicted (k > 1), tightens the share allowed to a / k: the percentile Q becomes
100 - 100 a / k, the limit stays. Where too few rows came near L, it falls back on the
signed errors of the percentile itself: L becomes L x (1 + e) for their 10th percentile
(`p10`) or most negative (`worst`) e, where e < 0. The share is what the SLO bounds: a
percentile on a cliff (about 1 % of gaps stalled) misses by half where the share past the
limit misses by a tenth (docs/validation.md, twenty-fifth session), so the fallback would
over-size such a pool. Either way a prediction that ran high is not loosened, and a plan
sized so still holds its SLOs where the engine ran that far from the prediction. A pool with
settings left `auto` takes, per target, the most severe figure over the profiles of its
candidates; analytic profiles add nothing (the plan's fidelity lines say where none was
measured).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from capplan import fidelity
from capplan.errors import CapplanError
from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profiles import DEFAULT_DRAFT, resolve_profile
from capplan.solve.choose import candidates
from capplan.solve.plan import fidelity_table, fidelity_tails
from capplan.traffic import SloTarget, Workload

if TYPE_CHECKING:
    import polars as pl

Guard = Literal["p10", "worst"]
FLOOR = -0.9
"""No limit is tightened below a tenth of itself, nor the share a percentile allows."""


def _profiles(pool: Pool) -> list[str]:
    """The measured profiles (as plans name them) the pool's candidates would run on."""
    spec = load_model_spec(pool.model)
    out = []
    for c in candidates(pool):
        sc = c.engine.speculative
        draft = (load_model_spec(DEFAULT_DRAFT)
                 if sc is not None and sc.method == "draft_model" else None)
        try:
            p = resolve_profile(c, spec, draft=draft)
        except CapplanError:
            continue
        if p.source == "measured":
            out.append(f"{p.gpu}/{p.model}/{p.key}")
    return sorted(set(out))


def guarded(mix: TrafficMix, guard: Guard) -> tuple[TrafficMix, list[str]]:
    """The mix with its SLOs tightened (module docstring), and one line per target:
    `<workload> <target> p99 -> p99.1 at <limit> s (...)` where the share past the limit
    decided, `<workload> <target> <old> -> <new> s (...)` where the percentile's error did,
    or `kept at` with the reason."""
    stat = "p10" if guard == "p10" else "min"
    lines: list[str] = []
    workloads: list[Workload] = []
    profiles = {p.name: _profiles(p) for p in mix.pools}
    gpus = {p.name: p.gpu for p in mix.pools}
    for w in mix.workloads:
        gpu = gpus[w.pool]
        table = fidelity_table(gpu)
        tails = fidelity_tails(gpu)
        targets = []
        for t in w.slo.targets:
            share = _by_share(t, profiles[w.pool], tails, guard)
            if share is not None:
                target, line = share
                targets.append(target)
                lines.append(f"{w.name} {line}")
                continue
            found = [(f[stat], int(f["rows"]), k) for k in profiles[w.pool]
                     if (f := fidelity.lookup(table, k, t.key)) is not None]
            e, n, key = min(found) if found else (0.0, 0, "")
            if e >= 0:
                targets.append(t)
                why = (f"never under-predicted over {n} rows of {key}" if found else
                       f"fewer than {fidelity.MIN_ROWS} validation rows of it on "
                       + (", ".join(profiles[w.pool]) or "a measured profile"))
                lines.append(f"{w.name} {t.key} kept at {t.limit_s:g} s ({why})")
                continue
            e = max(e, FLOOR)
            limit = t.limit_s * (1 + e)
            targets.append(t.model_copy(update={"limit_s": limit}))
            lines.append(f"{w.name} {t.key} {t.limit_s:g} -> {limit:.4g} s "
                         f"({guard} error {e:+.0%} over {n} rows of {key}; fewer than "
                         f"{fidelity.MIN_ROWS} near the limit to read the share past it)")
        changed = any(a is not b for a, b in zip(targets, w.slo.targets, strict=True))
        workloads.append(w.model_copy(update={"slo": w.slo.model_copy(
            update={"targets": targets})}) if changed else w)
    out = mix.model_copy(update={"workloads": workloads}).with_source(mix.source, mix.base_dir)
    return out, lines


def _by_share(t: SloTarget, profiles: list[str], tails: pl.DataFrame | None,
              guard: Guard) -> tuple[SloTarget, str] | None:
    """The target guarded by the share past its limit, and its line; None where no profile
    has fidelity.MIN_ROWS rows near the limit (the caller falls back on the error)."""
    if tails is None:
        return None
    allowed = 1 - t.percentile / 100
    found = []
    for key in profiles:
        spread = fidelity.share_spread(tails, key, t.metric, t.limit_s, allowed)
        if spread is not None:
            p90, most, n = spread
            found.append((p90 if guard == "p10" else most, n, key))
    if not found:
        return None
    k, n, key = max(found)
    near = f"over {n} rows of {key} near {t.limit_s:g} s"
    if k <= 1:
        return t, (f"{t.key} kept at p{t.percentile:g} ({guard}: the engine ran "
                   f"{k:.2f}x the predicted share past the limit {near})")
    share = max(allowed / k, allowed * (1 + FLOOR))
    pct = math.ceil((100 - 100 * share) * 100 - 1e-9) / 100  # to 0.01, upwards
    return (t.model_copy(update={"percentile": pct}),
            f"{t.key} p{t.percentile:g} -> p{pct:g} at {t.limit_s:g} s ({guard}: the engine "
            f"ran {k:.2f}x the predicted share past the limit {near})")
