"""Sizing that allows for the simulator's own error: `capplan size --guard p10|worst`.

A pool's SLO limits are tightened by how far predictions of that metric, on the pool's
profile, have been under real vLLM in the stored validation runs (capplan/fidelity.py): with
`p10` a limit L becomes L x (1 + e) for the 10th percentile e of the signed errors (only when
e < 0: a prediction that has run high is not loosened), with `worst` for the most negative.
A plan sized so still holds its SLOs where the engine ran that much slower than predicted.
A pool with settings left `auto` takes, per target, the most negative error over the
profiles of its candidates; profiles with fewer than fidelity.MIN_ROWS rows of the metric,
and analytic ones, add nothing (the plan's fidelity lines say where none was measured).
"""

from __future__ import annotations

from typing import Literal

from capplan import fidelity
from capplan.errors import CapplanError
from capplan.mix import TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profiles import DEFAULT_DRAFT, resolve_profile
from capplan.solve.choose import candidates
from capplan.solve.plan import fidelity_table
from capplan.traffic import Workload

Guard = Literal["p10", "worst"]
FLOOR = -0.9
"""No limit is tightened below a tenth of itself."""


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
    """The mix with its SLO limits tightened (module docstring), and one line per limit:
    `<workload> <target> <old> -> <new> s (<guard> error <e> over <n> rows of <profile>)`,
    or `kept at` with the reason."""
    stat = "p10" if guard == "p10" else "min"
    lines: list[str] = []
    workloads: list[Workload] = []
    profiles = {p.name: _profiles(p) for p in mix.pools}
    gpus = {p.name: p.gpu for p in mix.pools}
    for w in mix.workloads:
        table = fidelity_table(gpus[w.pool])
        targets = []
        for t in w.slo.targets:
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
                         f"({guard} error {e:+.0%} over {n} rows of {key})")
        changed = any(a is not b for a, b in zip(targets, w.slo.targets, strict=True))
        workloads.append(w.model_copy(update={"slo": w.slo.model_copy(
            update={"targets": targets})}) if changed else w)
    out = mix.model_copy(update={"workloads": workloads}).with_source(mix.source, mix.base_dir)
    return out, lines
