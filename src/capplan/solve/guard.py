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
over-size such a pool. Rows whose prediction put almost nothing past L (under a / 4) while
the engine put more there say nothing as a ratio: their excess share (the engine's less the
simulator's), its 90th percentile or largest, comes off the share allowed instead, where that
is tighter (`fidelity.share_unseen`). Either way a prediction that ran high is not
loosened, and a plan sized so still holds its SLOs where the engine ran that far from the
prediction. A pool with settings left `auto` takes, per target, the most severe figure over
the profiles of its candidates; analytic profiles add nothing (the plan's fidelity lines say
where none was measured).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np

from capplan import fidelity
from capplan.errors import CapplanError, ConfigError
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
    or `kept at` with the reason; then `; then p99.1 -> p99.5 ...` where rows the
    prediction did not see past the limit take more of the share (`_unseen`)."""
    stat = "p10" if guard == "p10" else "min"
    for i, p in enumerate(mix.pools):
        if p.gpu == "auto":  # each GPU's validated error is its own (fidelity_table)
            raise ConfigError(
                f"--guard tightens SLOs by one GPU's validated error, and pool {p.name!r} "
                "leaves gpu auto: size without --guard to choose the GPU, then set it and guard",
                file=mix.source or None, field=f"pools.{i}.gpu")
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
            target, line = _guard_one(t, profiles[w.pool], table, tails, guard, stat)
            unseen = _unseen(t, target, profiles[w.pool], tails, guard)
            if unseen is not None:
                target, more = unseen
                line = f"{line}; then {more}"
            targets.append(target)
            lines.append(f"{w.name} {line}")
        changed = any(a is not b for a, b in zip(targets, w.slo.targets, strict=True))
        workloads.append(w.model_copy(update={"slo": w.slo.model_copy(
            update={"targets": targets})}) if changed else w)
    out = mix.model_copy(update={"workloads": workloads}).with_source(mix.source, mix.base_dir)
    return out, lines


def _guard_one(t: SloTarget, profiles: list[str], table: fidelity.Table,
               tails: pl.DataFrame | None, guard: Guard, stat: str) -> tuple[SloTarget, str]:
    """One target guarded by the share past its limit where enough rows came near it, else
    by the percentile's error, else kept; with its line."""
    share = _by_share(t, profiles, tails, guard)
    if share is not None:
        return share
    found = [(f[stat], int(f["rows"]), k) for k in profiles
             if (f := fidelity.lookup(table, k, t.key)) is not None]
    e, n, key = min(found) if found else (0.0, 0, "")
    if e >= 0:
        why = (f"never under-predicted over {n} rows of {key}" if found else
               f"fewer than {fidelity.MIN_ROWS} validation rows of it on "
               + (", ".join(profiles) or "a measured profile"))
        return t, f"{t.key} kept at {t.limit_s:g} s ({why})"
    e = max(e, FLOOR)
    limit = t.limit_s * (1 + e)
    return (t.model_copy(update={"limit_s": limit}),
            f"{t.key} {t.limit_s:g} -> {limit:.4g} s ({guard} error {e:+.0%} over {n} rows of "
            f"{key}; fewer than {fidelity.MIN_ROWS} near the limit to read the share past it)")


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
    pct = _percentile(share)
    return (t.model_copy(update={"percentile": pct}),
            f"{t.key} p{t.percentile:g} -> p{pct:g} at {t.limit_s:g} s ({guard}: the engine "
            f"ran {k:.2f}x the predicted share past the limit {near})")


def _unseen(t0: SloTarget, t: SloTarget, profiles: list[str], tails: pl.DataFrame | None,
            guard: Guard) -> tuple[SloTarget, str] | None:
    """The target `t` (`t0` as the mix gave it, guarded as above) with its allowed share
    lowered by the engine's excess past `t0`'s limit on the rows whose prediction put almost
    nothing there (fidelity.share_unseen: a tail the simulator does not have adds to the
    share, it does not scale it), its 90th percentile for `p10` and its largest for `worst`,
    with its line; None where no such row exists or `t` is already that tight."""
    if tails is None:
        return None
    allowed = 1 - t0.percentile / 100
    found = []
    for key in profiles:
        excess = [e for e, _ in fidelity.share_unseen(tails, key, t0.metric, t0.limit_s,
                                                      allowed)]
        if excess:
            e = float(np.percentile(excess, 90)) if guard == "p10" else max(excess)
            found.append((e, len(excess), key))
    if not found:
        return None
    e, n, key = max(found)
    share = max(allowed - e, allowed * (1 + FLOOR))
    if share >= 1 - t.percentile / 100:
        return None
    pct = _percentile(share)
    return (t.model_copy(update={"percentile": pct}),
            f"p{t.percentile:g} -> p{pct:g} at {t.limit_s:g} s ({guard}: the engine ran "
            f"{e:.2%} of {'gaps' if t.metric == 'itl' else 'requests'} past "
            f"{t0.limit_s:g} s beyond the prediction on {n} row{'s' if n > 1 else ''} of "
            f"{key} where it put almost none)")


def _percentile(share: float) -> float:
    """The percentile that leaves `share` past the limit, to 0.01 upwards."""
    return math.ceil((100 - 100 * share) * 100 - 1e-9) / 100
