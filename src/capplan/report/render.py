"""One self-contained HTML page from a plan: inline CSS, figures as data: URLs, no script and
no network, so it can be mailed, attached to a ticket or opened offline."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from typing import Any

from capplan.mix import TrafficMix
from capplan.report import figures
from capplan.report.runs import (
    DURATION_S,
    GROWTHS,
    LOAD_SCALES,
    PoolRuns,
    run_all,
)
from capplan.sim.results import SimResult
from capplan.solve.plan import Fidelity, Plan, PoolPlan
from capplan.units import duration

_CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"DejaVu Sans",Helvetica,Arial,sans-serif;
 color:#1d232b;margin:0;background:#f4f6f8}
main{max-width:1240px;box-sizing:border-box;margin:0 auto;padding:20px 28px 60px;background:#fff}
h1{font-size:24px;margin:4px 0 2px}h2{font-size:19px;margin:30px 0 8px;
 border-bottom:2px solid #dfe3e8;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5b6673;margin:0 0 12px}
.kpis{display:flex;gap:14px;flex-wrap:wrap;margin:12px 0}
.kpi{background:#f0f4f9;border-radius:8px;padding:8px 16px;min-width:120px}
.kpi b{display:block;font-size:22px}.kpi span{color:#5b6673;font-size:12px}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
th,td{padding:4px 10px;border-bottom:1px solid #e4e7eb;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#137333;font-weight:600}.thin{color:#b06000;font-weight:700}.bad{color:#b3261e;font-weight:700}
.badge{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;font-weight:600}
.measured{background:#e6f4ea;color:#137333}.analytic{background:#b3261e;color:#fff}
.warn{background:#fdecea;border:2px solid #b3261e;border-radius:8px;padding:10px 14px;
 margin:12px 0;color:#7a1711}
.note{background:#fff8e1;border-left:4px solid #f9a825;padding:6px 12px;margin:8px 0;
 color:#5d4300}
.fig{max-width:100%;height:auto;display:block;margin:6px 0 2px}
figure{margin:10px 0 18px}figcaption{color:#5b6673;font-size:12.5px;max-width:980px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));gap:14px}
.card{border:1px solid #dfe3e8;border-radius:8px;padding:8px 14px;min-width:0}
.card table{width:100%;table-layout:fixed}.card td{overflow-wrap:anywhere}
.card td:first-child{width:30%}.card table.eng td:first-child{width:55%}
.card code{font-size:11.5px}
code{background:#f0f3f6;padding:0 3px;border-radius:3px;font-size:12.5px}
"""


THIN_MARGIN = 0.1
"""Binding margins below this are shown in amber: one noisy hour could cross the line."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("capplan")
    except PackageNotFoundError:
        return "(not installed)"


def _e(v: Any) -> str:
    return html.escape(str(v))


def _pct(v: float | None) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.1%}"


def _usd(v: float | None) -> str:
    return "–" if v is None else f"${v:,.0f}"


def _table(head: Iterable[str] | None, rows: Iterable[Iterable[str]],
           num: Iterable[int] = (), cls: str = "") -> str:
    """A table; cells are trusted HTML (escape before), columns in `num` align right."""
    num = set(num)
    h = "".join(f'<th class="n">{c}</th>' if i in num else f"<th>{c}</th>"
                for i, c in enumerate(head or ()))
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in num else f"<td>{c}</td>"
                         for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    thead = f"<thead><tr>{h}</tr></thead>" if h else ""
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}>{thead}<tbody>{body}</tbody></table>"


def _fidelity(f: Fidelity, margin: float | None) -> str:
    """The fidelity row: the binding metric's validated error on the pool's profile (their
    range where too few rows for a spread) and the margin were the prediction that far off."""
    head = f"<code>{_e(f.metric)}</code> on {f.rows} validation rows of this profile: "
    if f.few:
        return (head + f"predicted {f.p10:+.0%} to {f.p90:+.0%} of vLLM's (too few rows for a "
                f"spread: their range); margin {_pct(margin)} could be "
                f"{_pct(f.margin_after_worst)} (the worst of them)" + _share_fidelity(f))
    return (head + f"predicted {f.p10:+.0%} to {f.p90:+.0%} of vLLM's (p10–p90), worst "
            f"{f.worst_under:+.0%}; margin {_pct(margin)} could be "
            f"{_pct(f.margin_after_p10)} (p10) or {_pct(f.margin_after_worst)} (worst)"
            + _share_fidelity(f))


def _share_fidelity(f: Fidelity) -> str:
    """The fidelity row's second half: the engine's share past the SLO's limit over the
    prediction's on the rows near it, the plan's share past it scaled so, and the engine's
    excess on rows the prediction put almost nothing past it."""
    unseen = ""
    if f.unseen_rows and f.unseen_max is not None:
        unseen = (f"; on {f.unseen_rows} row{'s' * (f.unseen_rows != 1)} where the prediction "
                  f"put almost nothing past the limit the engine put up to "
                  f"{f.unseen_max * 100:.2g} % more past it")
    if f.share_rows is None or f.share_p90 is None or f.share_max is None:
        return unseen
    out = (f"; the engine's share past the limit ran {f.share_p90:.2f}× (p10) to "
           f"{f.share_max:.2f}× (worst) the prediction's on the {f.share_rows} rows near it")
    if f.beyond_after_p10 and f.beyond_after_worst:
        out += (f": {f.beyond_after_p10 * 100:.2g} % or {f.beyond_after_worst * 100:.2g} % "
                "past it")
    return out + unseen


def _source_badge(p: PoolPlan) -> str:
    if p.profile_source == "analytic":
        return ('<span class="badge analytic" title="datasheet roofline, not measured">'
                "ANALYTIC – not measured</span>")
    return f'<span class="badge measured">{_e(p.profile_source)}</span>'


def _figure(img: str, caption: str) -> str:
    if not img:
        return f'<p class="note">{caption} (nothing to draw)</p>'
    return f"<figure>{img}<figcaption>{caption}</figcaption></figure>"


def _header(plan: Plan, description: str = "") -> str:
    kpis = [
        (str(plan.gpus), "GPUs in all" if plan.feasible
         else f"GPUs, {len(plan.infeasible)} pool(s) infeasible"),
        (_usd(plan.usd_per_month), "per month"),
        (str(len(plan.pools)), "pools"),
        (f"×{plan.growth:g}", "traffic growth"),
        (f"N+{plan.spare}", "spare replicas"),
    ]
    k = "".join(f'<div class="kpi"><b>{_e(a)}</b><span>{_e(b)}</span></div>' for a, b in kpis)
    sub = (f"{_e(description)}<br>" if description else "") + (
        f"traffic <code>{_e(plan.source)}</code> · seed {plan.seed}"
        + (" · <b>quick</b> search (rougher)" if plan.quick else ""))
    out = (f"<h1>Capacity plan: {_e(plan.mix)}</h1><p class='sub'>{sub}</p>"
           f"<div class='kpis'>{k}</div>")
    analytic = [p for p in plan.pools if p.profile_source == "analytic"]
    if analytic:
        names = ", ".join(f"<b>{_e(p.pool)}</b> (<code>{_e(p.profile)}</code>)" for p in analytic)
        out += (f'<div class="warn"><b>⚠ Analytic profile:</b> {names} sized from a datasheet '
                "roofline, not from step times measured on the GPU. Treat these GPU counts as "
                "estimates; run <code>capplan calibrate</code> for a measured profile.</div>")
    if plan.guard != "none":
        items = "".join(f"<li>{_e(line)}</li>" for line in plan.guarded)
        out += (f"<div class='note'><b>Guarded ({_e(plan.guard)}):</b> SLOs tightened by "
                "how far the simulator has run under real vLLM on each pool's profile (a "
                "percentile raised where the share past the limit decided, a limit lowered "
                f"where the percentile's error did); the targets below are the tightened ones."
                f"<ul>{items}</ul></div>")
    if plan.infeasible:
        items = "".join(f"<li><b>{_e(x.pool)}</b> ({_e(x.model)} on {_e(x.gpu)}, "
                        f"{_e(x.precision)}): {_e(x.reason)}</li>" for x in plan.infeasible)
        out += ("<div class='warn'><b>✗ Infeasible:</b> no replica count up to the cap sizes "
                f"these pools; their GPUs are not in the totals.<ul>{items}</ul></div>")
    extrap = [p for p in plan.pools if p.extrapolated_steps]
    if extrap:
        names = ", ".join(f"<b>{_e(p.pool)}</b> ({p.extrapolated_steps:,} steps)" for p in extrap)
        out += (f'<div class="warn"><b>⚠ Extrapolated:</b> {names} ran steps outside the box '
                "their profile was calibrated on.</div>")
    return out


def _plan_table(plan: Plan) -> str:
    rows = []
    for p in plan.pools:
        reps = f"{p.replicas}" + (f" ({p.replicas_for_slo}+{p.spare})" if p.spare else "")
        m = p.binding_margin
        cls = "bad" if m is None or m < 0 else "thin" if m < THIN_MARGIN else "ok"
        margin = f'<span class="{cls}">{_pct(m)}</span>'
        rows.append([
            f"<b>{_e(p.pool)}</b>", _e(p.model), f"{_e(p.gpu)} ×TP{p.tp}", reps, str(p.gpus),
            _e(p.precision), f"{_e(p.binding_workload)} / {_e(p.binding_slo)}", margin,
            _pct(p.utilisation), _usd(p.cost.usd_per_month),
            f"<code>{_e(p.profile)}</code> {_source_badge(p)}",
        ])
    rows.append(["<b>total</b>", "", "", "", f"<b>{plan.gpus}</b>", "", "", "", "",
                 f"<b>{_usd(plan.usd_per_month)}</b>", ""])
    return _table(
        ["pool", "model", "GPU", "replicas", "GPUs", "precision", "binding workload / SLO",
         "margin", "busy", "$/month", "profile (source)"],
        rows, num={3, 4, 7, 8, 9},
    )


def _slo_table(plan: Plan) -> str:
    rows = []
    for p in plan.pools:
        for w in p.workloads:
            for line in w.slo:
                mark = '<span class="ok">✓</span>' if line.met else '<span class="bad">✗</span>'
                bind = (" ← binding" if (w.name, line.key) == (p.binding_workload, p.binding_slo)
                        else "")
                past = ("–" if line.beyond is None or line.allowed is None else
                        f"{line.beyond * 100:.2g} % of {line.allowed * 100:.2g} %")
                rows.append([_e(p.pool), _e(w.name), f"<code>{_e(line.key)}</code>",
                             duration(line.value_s), duration(line.limit_s),
                             _pct(line.margin), past,
                             mark + bind, _pct(w.prefix_hit_rate)])
    return _table(["pool", "workload", "SLO", "predicted", "limit", "margin",
                   "past the limit (allowed)", "met", "prefix hit"], rows, num={3, 4, 5, 6, 8})


def _knee_text(pp: PoolPlan, r: PoolRuns) -> str:
    ok, bad, key = r.knee
    if not r.load:
        return ""
    if bad is None:
        return (f"<li><b>{_e(pp.pool)}</b>: every SLO holds up to ×{ok:g} the planned "
                f"traffic at {pp.replicas} replica(s).</li>")
    if ok is None:
        return (f"<li><b>{_e(pp.pool)}</b>: <span class='bad'>misses {_e(key)} already at "
                f"×{bad:g}</span> in the short re-simulation.</li>")
    return (f"<li><b>{_e(pp.pool)}</b>: holds to ×{ok:g}; first miss at ×{bad:g} "
            f"(<code>{_e(key)}</code>): the knee lies between.</li>")


def _config(p: PoolPlan, quick: bool = False) -> str:
    eng = [[f"<code>{_e(k)}</code>", _e(json.dumps(v) if not isinstance(v, str) else v)]
           for k, v in p.engine.items() if v is not None]
    c = p.confidence
    fewer = {True: "one replica fewer fails", False: "one replica fewer passes too",
             None: "already at the minimum"}[c.one_fewer_fails]
    if c.one_fewer_stopped_at_s is not None:
        fewer += f" (certain at {c.one_fewer_stopped_at_s:g} s of its run, stopped there)"
    facts = [
        ["model", f"{_e(p.model)} on {_e(p.gpu)}, TP={p.tp}, {_e(p.label)}"],
        ["profile", f"<code>{_e(p.profile)}</code> {_source_badge(p)}"],
        ["replicas", f"{p.replicas_for_slo} for the SLOs + {p.spare} spare = {p.replicas}"],
        ["confidence", f"seeds {_e(c.seeds)} "
         + ("<span class='ok'>all pass</span>" if c.all_seeds_pass
            else "<span class='bad'>NOT all pass</span>")
         + f", worst margin {_pct(c.worst_margin)}, {c.duration_s:g} s simulated, {fewer}"
         + (f"; <span class='thin'>{_e(tail)}</span>" if (tail := c.thin_tail(quick)) else "")],
        *([["fidelity", _fidelity(p.fidelity, p.binding_margin)]] if p.fidelity else []),
        ["analytic bracket", f"floor {p.bracket.lower}, estimate {p.bracket.estimate} "
         f"(work {p.bracket.work_replicas:.2f}, KV {p.bracket.kv_replicas:.2f} replicas)"],
        ["KV", f"{p.kv_tokens_per_replica:,} tokens per replica, peak {_pct(p.kv_usage_peak)}, "
         f"headroom {_pct(p.kv_headroom)}"],
        ["cost", f"{_usd(p.cost.usd_per_month)}/month, {p.cost.gpu_hours_per_month:,.0f} "
         "GPU-h/month" + (f", {p.cost.tokens_per_usd:,.0f} tokens/$"
                          if p.cost.tokens_per_usd else "")],
    ]
    out = f"<div class='card'><h3>{_e(p.pool)}</h3>" + _table(None, facts)
    out += "<b>engine</b>" + _table(["setting", "value"], eng, cls="eng")
    if p.reasoning:
        out += f"<p class='note'><b>chosen</b>: {_e(p.reasoning)}</p>"
    if p.runners_up:
        rows = [[_e(r.label), _e(r.replicas if r.replicas is not None else "–"),
                 _e(r.gpus if r.gpus is not None else "–"), _usd(r.usd_per_month),
                 _pct(r.margin), _e(r.profile_source or "–"), _e(r.note)] for r in p.runners_up]
        out += "<b>runners-up</b>" + _table(
            ["configuration", "replicas", "GPUs", "$/month", "SLO margin", "profile", "why not"],
            rows, {1, 2, 3, 4})
    else:
        out += "<p class='sub'>runners-up: none (the mix fixes this pool's configuration)</p>"
    for a in p.advice:
        saved = "" if a.gpus_saved is None else f" (GPUs saved: {a.gpus_saved})"
        label = "warning" if a.kind == "memory" else "advice"  # a crash, not a suggestion
        out += f"<p class='note'><b>{label} ({_e(a.kind)})</b>: {_e(a.message)}{saved}</p>"
    return out + "</div>"


def render_report(
    plan: Plan,
    mix: TrafficMix | None,
    *,
    sims: dict[str, SimResult] | None = None,
    duration_s: float = DURATION_S,
    scales: tuple[float, ...] = LOAD_SCALES,
    growths: tuple[float, ...] = GROWTHS,
    sweep: list[dict[str, Any]] | None = None,
    workers: int = 1,
) -> str:
    """The plan as one self-contained HTML page.

    With `mix`, each pool is re-simulated at its planned replicas for `duration_s` (at the
    planned load unless `sims` gives that run, and at `scales` x it) to draw the figures;
    without it the page holds the plan's tables only. `sweep`: rows of `capplan sweep --out`
    (growth, pool, gpus) drawn as simulated points on the growth curve. `workers` > 1 runs
    the re-simulations in that many spawned processes (call from under `__main__` guard)."""
    runs: dict[str, PoolRuns] = {}
    desc = mix.description if mix is not None else ""
    notes: list[str] = []
    if mix is not None:
        runs = run_all(plan, mix, sims=sims, duration_s=duration_s, scales=scales,
                       growths=growths, sweep=sweep, workers=workers)
        notes += [f"{name}: {n}" for name, r in runs.items() for n in r.notes]
    else:
        notes.append("no traffic mix given: figures need one (capplan report --traffic)")
    slos = {w.name: list(w.slo.targets) for w in mix.workloads} if mix is not None else {}

    parts = [_header(plan, desc), "<h2>Plan</h2>", _plan_table(plan),
             "<h3>Every SLO at the planned replicas</h3>", _slo_table(plan)]

    parts.append("<h2>Latency against the SLOs</h2>")
    for p in plan.pools:
        r = runs.get(p.pool)
        if r is None or r.base is None:
            continue
        parts.append(_figure(
            figures.latency_cdfs(p, r.base, slos),
            f"Pool <b>{_e(p.pool)}</b>: per workload, the share of requests whose TTFT / "
            "end-to-end latency is at or below x (logit scale, so the 99 % tail is visible). "
            "Red dashed: the SLO limit; red dotted: its percentile. The SLO holds when the "
            "curve crosses the dotted line left of the dashed one. ITL SLOs are per token and "
            "appear in the table above. Requests still unfinished keep the curve below 100 %."
        ))

    parts.append("<h2>SLO attainment versus load: where the knee is</h2>")
    parts.append(_figure(
        figures.attainment_vs_load(plan.pools, runs),
        "Each pool kept at its planned replicas while its traffic is scaled. Each line is one "
        "workload's SLO margin (1 − value / limit); below zero the SLO is missed. The orange "
        "band brackets the knee; the dotted line is the planned load."
    ))
    knees = "".join(_knee_text(p, runs[p.pool]) for p in plan.pools if p.pool in runs)
    if knees:
        parts.append(f"<ul>{knees}</ul>")

    parts.append("<h2>GPUs versus traffic growth</h2>")
    parts.append(_figure(
        figures.gpus_vs_growth(plan, runs),
        "Solid: the plan's SLO replicas scaled in proportion to traffic (plus spares), an upper "
        "estimate since bigger pools absorb bursts better. Dotted: the analytic floor (GPU "
        "work, KV and sequence bounds); no count below it can hold the traffic. ★: the plan. "
        + ("Squares: simulated by <code>capplan sweep</code>."
           if any(r.sweep for r in runs.values())
           else "For simulated points run <code>capplan sweep --out curve.csv</code> and pass "
                "<code>--sweep curve.csv</code>.")
    ))

    parts.append("<h2>KV cache and prefix caching</h2>")
    for p in plan.pools:
        r = runs.get(p.pool)
        if r is None or r.base is None:
            continue
        parts.append(_figure(
            figures.kv_and_prefix(p, r.base),
            f"Pool <b>{_e(p.pool)}</b> at {p.replicas} replica(s), sampled once a simulated "
            "second: the share of each replica's KV blocks in use (at 100 % vLLM preempts), "
            "the requests each replica is running, and each workload's prefix-cache hit rate "
            "(share of prompt tokens served from cache) in the plan's run."
        ))

    parts.append("<h2>Configuration chosen</h2>")
    parts.append("<div class='cards'>" + "".join(_config(p, plan.quick) for p in plan.pools)
                 + "</div>")

    method = (f"Figures come from re-simulating each pool for {duration_s:g} s (seed "
              f"{plan.seed}) at loads ×{', ×'.join(f'{s:g}' for s in scales)}; the tables hold "
              "the plan's own figures (longer runs, several seeds), so the two differ slightly.")
    parts.append("<h2>Method and notes</h2><p>" + _e(method) + "</p>")
    parts += [f"<p class='note'>{_e(n)}</p>" for n in notes]
    parts.append(f"<p class='sub'>capplan {_e(_version())}</p>")
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>capplan report: {_e(plan.mix)}</title><style>{_CSS}</style></head>"
        f"<body><main>\n{body}\n</main></body></html>\n"
    )
