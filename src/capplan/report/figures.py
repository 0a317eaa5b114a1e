"""The report's figures, drawn with matplotlib's Agg backend and embedded as base64 PNG.

Each function returns one `<img>` tag (a data: URL, so the page needs no network) or "" when
there is nothing to draw.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullLocator,
    PercentFormatter,
)

from capplan.report.runs import PoolRuns
from capplan.sim.results import SimResult
from capplan.solve.plan import Plan, PoolPlan

DPI = 110
CDF_POINTS = 400
"""Points per CDF line: enough for a smooth curve, few enough for a small file."""
MARGIN_FLOOR = -1.0
"""Margins below this (including 'never finished') are drawn on the floor of the chart."""
COLORS = [f"C{i}" for i in range(10)]  # the default (tab10) cycle

_RC: Any = {
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "figure.facecolor": "white",
}


def _img(fig: Figure, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<img class="fig" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{data}">')


def _ms(v: float) -> str:
    return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.3g} s"


def _cdf(x: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their plotting positions; unfinished requests (total - len(x)) keep
    the curve below 1, as they count as infinitely late."""
    x = np.sort(x[np.isfinite(x)])
    n = max(total, len(x))
    y = (np.arange(1, len(x) + 1) - 0.5) / n
    if len(x) > CDF_POINTS:
        idx = np.unique(np.concatenate([
            np.linspace(0, len(x) - 1, CDF_POINTS).astype(int),
            np.arange(max(len(x) - 50, 0), len(x)),  # keep the tail exact
        ]))
        x, y = x[idx], y[idx]
    return x, y


_METRICS = (("ttft", "ttft_s", "TTFT"), ("e2e", "e2e_s", "end-to-end"),
            ("tpot", "tpot_s", "TPOT"))


def latency_cdfs(pp: PoolPlan, res: SimResult, mix_slos: dict[str, list[Any]]) -> str:
    """Per workload of a pool: TTFT and E2E CDFs (TPOT too if an SLO names it), each SLO
    limit a vertical line and its percentile a horizontal one: the curve must pass left of
    their crossing."""
    req = res.requests()
    if req.is_empty():
        return ""
    names = [w.name for w in res.workloads]
    metrics = [m for m in _METRICS[:2]]
    if any(t.metric == "tpot" for ts in mix_slos.values() for t in ts):
        metrics.append(_METRICS[2])
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(len(names), len(metrics), squeeze=False,
                                 figsize=(4.6 * len(metrics), 2.2 * len(names) + 0.4))
        for i, name in enumerate(names):
            wr = res.workload(name)
            rows = req.filter(req["workload"] == name)
            cols = {"ttft_s": rows["ttft_s"].to_numpy(), "e2e_s": rows["e2e_s"].to_numpy()}
            out = rows["output_tokens"].to_numpy()
            ok = out > 1
            cols["tpot_s"] = (cols["e2e_s"][ok] - cols["ttft_s"][ok]) / (out[ok] - 1)
            for j, (metric, col, label) in enumerate(metrics):
                ax = axes[i][j]
                x, y = _cdf(cols[col], wr.requests if metric != "tpot" else int(ok.sum()))
                if len(x):
                    ax.step(x, y, where="post", color=COLORS[i % 10], lw=1.6)
                    ax.set_xscale("log")
                    ax.xaxis.set_major_locator(LogLocator(10, subs=(1.0, 2.0, 5.0)))
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _ms(v)))
                    ax.xaxis.set_minor_locator(NullLocator())
                ax.set_yscale("logit")
                ax.set_ylim(0.005, 0.999)
                ax.set_yticks([0.01, 0.1, 0.5, 0.9, 0.99, 0.999])
                ax.set_yticklabels(["1%", "10%", "50%", "90%", "99%", "99.9%"])
                ax.yaxis.set_minor_locator(NullLocator())
                labels = []
                for t in mix_slos.get(name, []):
                    if t.metric != metric:
                        continue
                    q = t.percentile / 100
                    ax.axvline(t.limit_s, color="crimson", ls="--", lw=1.2)
                    ax.axhline(q, color="crimson", ls=":", lw=0.9)
                    seen = next((c.value_s for c in wr.slo if c.key == t.key), math.nan)
                    here = _ms(seen) if math.isfinite(seen) else "unfinished"
                    labels.append(f"SLO p{t.percentile:g} ≤ {_ms(t.limit_s)}: here {here}")
                    if len(x):
                        lo, hi = ax.get_xlim()
                        ax.set_xlim(min(lo, t.limit_s / 2), max(hi, t.limit_s * 1.5))
                if labels:
                    ax.text(0.02, 0.97, "\n".join(labels), transform=ax.transAxes, va="top",
                            color="crimson", fontsize=8,
                            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
                ax.set_title(f"{name}: {label}", loc="left")
                if i == len(names) - 1:
                    ax.set_xlabel("latency (log scale)")
                if j == 0:
                    ax.set_ylabel("requests at or below")
        fig.suptitle(f"pool {pp.pool}: latency CDFs at {pp.replicas} replica(s)",
                     x=0.01, ha="left", fontsize=11, fontweight="bold")
        fig.tight_layout()
        return _img(fig, f"latency CDFs of pool {pp.pool}")


def attainment_vs_load(pools: list[PoolPlan], runs: dict[str, PoolRuns]) -> str:
    """Per pool: each SLO's margin at its planned replicas as load scales; below zero the SLO
    is missed, so the first crossing is the knee."""
    drawn = [p for p in pools if runs.get(p.pool) and runs[p.pool].load]
    if not drawn:
        return ""
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(1, len(drawn), squeeze=False,
                                 figsize=(max(4.2 * len(drawn), 6), 3.6), sharey=True)
        for ax, pp in zip(axes[0], drawn, strict=True):
            r = runs[pp.pool]
            pts = sorted(r.load, key=lambda p: p.scale)
            xs = [p.scale for p in pts]
            keys = list(pts[0].margins)
            for k, key in enumerate(keys):
                ms = np.array([p.margins.get(key, math.nan) for p in pts])
                never = ~np.isfinite(ms) & ~np.isnan(ms)
                ys = np.clip(np.where(never, MARGIN_FLOOR, ms), MARGIN_FLOOR, 1)
                ax.plot(xs, ys, marker="o", ms=4, color=COLORS[k % 10], label=key)
                if never.any():
                    ax.scatter(np.array(xs)[never], ys[never], marker="x", s=60,
                               color=COLORS[k % 10], zorder=3)
            ax.axhline(0, color="black", lw=1)
            ax.axhspan(MARGIN_FLOOR - 0.05, 0, color="crimson", alpha=0.07)
            ax.axvline(1.0, color="grey", ls=":", lw=1)
            ok, bad, key = r.knee
            if bad is not None:
                ax.axvspan(ok if ok is not None else min(xs), bad, color="orange", alpha=0.15)
                where = f"knee between ×{ok:g} and ×{bad:g}" if ok else f"misses at ×{bad:g}"
            else:
                where = f"holds to ×{max(xs):g}"
            ax.set_title(f"{pp.pool} ({pp.replicas} replicas): {where}", loc="left")
            ax.set_xlabel("load (× planned traffic)")
            ax.set_xticks(xs)
            ax.set_ylim(MARGIN_FLOOR - 0.05, 1.02)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.legend(loc="lower left", fontsize=7)
        axes[0][0].set_ylabel("SLO margin (below 0: missed; × never finished)")
        fig.tight_layout()
        return _img(fig, "SLO margin versus load per pool")


def gpus_vs_growth(plan: Plan, runs: dict[str, PoolRuns]) -> str:
    """GPUs per pool as traffic grows: the plan scaled linearly (solid), the analytic floor
    (dotted), simulated sweep points when given (squares), and the plan itself (star)."""
    drawn = [p for p in plan.pools if runs.get(p.pool) and runs[p.pool].growth]
    if not drawn:
        return ""
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(7.5, 3.8))
        total: dict[float, int] = {}
        for k, pp in enumerate(drawn):
            r = runs[pp.pool]
            c = COLORS[k % 10]
            g = [p.growth for p in r.growth]
            est = [p.estimate_gpus for p in r.growth]
            # earlier pools drawn wider, so a pool hidden under another's equal line shows
            lw = max(1.2, 3.6 - 1.0 * k)
            ax.plot(g, est, marker="osD^v"[k % 5], ms=4, lw=lw, color=c,
                    label=f"{pp.pool}: plan scaled")
            ax.plot(g, [p.floor_gpus for p in r.growth], ls=":", color=c,
                    label=f"{pp.pool}: analytic floor")
            if r.sweep:
                sg = sorted(r.sweep)
                ax.plot(sg, [r.sweep[x] for x in sg], marker="s", ls="--", color=c,
                        label=f"{pp.pool}: simulated (sweep)")
            ax.plot([1.0], [pp.gpus], marker="*", ms=12, color=c, ls="none")
            for p in r.growth:
                total[p.growth] = total.get(p.growth, 0) + p.estimate_gpus
        if len(drawn) > 1:
            ax.plot(list(total), list(total.values()), color="black", marker="o", ms=4,
                    label="total: plan scaled")
        ax.set_xlabel(f"traffic growth (× the plan's traffic, itself ×{plan.growth:g} peak)")
        ax.set_ylabel("GPUs")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, ncol=2 if len(drawn) > 1 else 1, loc="upper left")
        ax.set_title("GPUs versus traffic growth (★ the plan)", loc="left")
        fig.tight_layout()
        return _img(fig, "GPUs versus traffic growth")


def kv_and_prefix(pp: PoolPlan, res: SimResult) -> str:
    """One pool over time: KV cache usage and running requests per replica, and the prefix
    cache hit rate per workload."""
    kv = res.kv_series()
    if kv.is_empty():
        return ""
    with plt.rc_context(_RC):
        fig, (a_kv, a_run, a_hit) = plt.subplots(
            1, 3, figsize=(12, 2.9), gridspec_kw={"width_ratios": [2.2, 2.2, 1.3]})
        for rep in sorted(set(kv["replica"].to_list())):
            rows = kv.filter(kv["replica"] == rep)
            t = rows["time_s"].to_numpy()
            a_kv.plot(t, rows["kv_usage"].to_numpy(), lw=0.9, alpha=0.8,
                      color=COLORS[rep % 10], label=f"replica {rep}")
            a_run.plot(t, rows["running"].to_numpy(), lw=0.9, alpha=0.8,
                       color=COLORS[rep % 10])
        peak = float(kv["kv_usage"].max() or 0.0)  # type: ignore[arg-type]
        a_kv.axhline(1.0, color="crimson", ls="--", lw=1)
        a_kv.set_ylim(0, max(1.05, peak * 1.1))
        a_kv.yaxis.set_major_formatter(PercentFormatter(1.0))
        a_kv.set_title(f"KV cache in use (peak {peak:.1%} of {pp.kv_tokens_per_replica:,} "
                       "tokens)", loc="left")
        a_kv.set_xlabel("simulated time (s)")
        if kv["replica"].n_unique() <= 8:
            a_kv.legend(fontsize=7, ncol=2, loc="upper left")
        a_run.set_title("running requests per replica", loc="left")
        a_run.set_xlabel("simulated time (s)")
        a_run.set_ylim(bottom=0)
        names = [w.name for w in pp.workloads] or [w.name for w in res.workloads]
        hits = []
        for w in names:
            line = next((x for x in pp.workloads if x.name == w), None)
            v = line.prefix_hit_rate if line is not None else None
            if v is None:
                v = next((x.prefix_hit_rate for x in res.workloads if x.name == w), 0.0)
            hits.append(float(v) if v is not None and math.isfinite(v) else 0.0)
        labels = [*names, "pool"]
        hits.append(pp.prefix_hit_rate)
        bars = a_hit.barh(labels, hits, color=[*COLORS[: len(names)], "black"])
        a_hit.bar_label(bars, labels=[f"{h:.0%}" for h in hits], padding=2, fontsize=8)
        a_hit.set_xlim(0, 1.15)
        a_hit.xaxis.set_major_formatter(PercentFormatter(1.0))
        a_hit.invert_yaxis()
        a_hit.set_title("prefix-cache hit rate", loc="left")
        fig.suptitle(f"pool {pp.pool}: KV cache and prefix caching", x=0.01, ha="left",
                     fontsize=11, fontweight="bold")
        fig.tight_layout()
        return _img(fig, f"KV usage and prefix hit rate of pool {pp.pool}")
