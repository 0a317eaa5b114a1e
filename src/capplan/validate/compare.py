"""Measured against predicted: every stored validation run, predicted again by the simulator.

Both sides are reduced by the same rules, those of `vllm bench serve`
(vllm/benchmarks/serve.py, calculate_metrics): TTFT and E2E percentiles over requests
(numpy's linear interpolation), ITL over every gap between consecutive streamed chunks,
output throughput = output tokens / (last completion - first send). The simulator's ITL
comes from its 0.1 %-bin histogram (capplan/sim/metrics.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.sim.results import PoolRunResult
from capplan.validate.store import load_run, stored_runs
from capplan.validate.suite import EngineRun, Experiment

METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s")
# Targets (issue: throughput and medians within 5 %, p99s within 10 %).
TARGETS = {"output_tok_s": 0.05, "ttft_p50_s": 0.05, "itl_p50_s": 0.05,
           "ttft_p99_s": 0.10, "itl_p99_s": 0.10, "e2e_p99_s": 0.10}
# A row whose run recorded a collection of the runner's own heap this long (runner.GcPauses)
# says so: every token due during it reached the client late, a pause `vllm serve` avoids
# by freezing its heap (the runner has frozen its own since 2026-12-01).
GC_NOTE_MS = 100.0


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan


def _throughput(send: np.ndarray, e2e: np.ndarray, out: np.ndarray) -> float:
    if not len(send):
        return math.nan
    span = float(np.max(send + e2e) - np.min(send))
    return float(out.sum()) / span if span > 0 else math.nan


def _figures(send: np.ndarray, ttft: np.ndarray, e2e: np.ndarray, out_tokens: np.ndarray,
             itl_p50: float, itl_p99: float, hit_rate: float) -> dict[str, float]:
    """The table's figures, reduced the same way for either side."""
    return {
        "requests": float(len(send)),
        "output_tok_s": _throughput(send, e2e, out_tokens),
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "itl_p50_s": itl_p50, "itl_p99_s": itl_p99,
        "e2e_p99_s": _pct(e2e, 99),
        "hit_rate": hit_rate,
    }


def _served(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(pl.col("ttft_s").is_not_null() & pl.col("error").is_null())


def _gaps(ok: pl.DataFrame) -> list[np.ndarray]:
    return [np.diff(np.asarray(t, dtype=np.float64)) for t in ok["chunk_t"].to_list()]


def measured_metrics(rows: pl.DataFrame) -> dict[str, float]:
    """The table's figures for one workload of one run, from its request rows."""
    ok = _served(rows)
    gaps = _gaps(ok)
    itl = np.concatenate(gaps) if gaps else np.empty(0)
    hit = float(ok["cached_tokens"].sum()) / max(float(ok["input_tokens"].sum()), 1.0)
    return _figures(ok["send_s"].to_numpy(), ok["ttft_s"].to_numpy(), ok["e2e_s"].to_numpy(),
                    ok["output_tokens"].to_numpy(), _pct(itl, 50), _pct(itl, 99), hit)


NOISE_LEVEL = 0.90
NOISE_RESAMPLES = 100


def measured_intervals(rows: pl.DataFrame, seed: int = 0) -> dict[str, tuple[float, float]]:
    """How far each measured percentile could move by which requests happened to be served:
    its central NOISE_LEVEL interval. TTFT and E2E are one figure a request, so the interval
    is the order statistics' (distribution-free: the q-quantile of n draws lies between the
    l-th and u-th smallest with the binomial's probability); a p99 of 30 requests spans
    their slowest few. ITL's gaps share their request's steps, so its interval is a
    bootstrap's over whole requests (NOISE_RESAMPLES, seeded). Throughput, a rate over the
    whole run, has none."""
    ok = _served(rows)
    n = ok.height
    if n < 2:
        return {}
    out: dict[str, tuple[float, float]] = {}
    for metric, column, q in (("ttft_p50_s", "ttft_s", 0.50), ("ttft_p99_s", "ttft_s", 0.99),
                              ("e2e_p99_s", "e2e_s", 0.99)):
        out[metric] = _order_interval(np.sort(ok[column].to_numpy().astype(np.float64)), q)
    gaps = _gaps(ok)
    sizes = np.array([len(g) for g in gaps])
    if sizes.sum():
        itl = np.concatenate(gaps)
        order = np.argsort(itl, kind="stable")
        xs, owner = itl[order], np.repeat(np.arange(n), sizes)[order]
        counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n),
                                                         size=NOISE_RESAMPLES)
        lo_q, hi_q = 50 * (1 - NOISE_LEVEL), 50 * (1 + NOISE_LEVEL)
        for metric, q in (("itl_p50_s", 0.50), ("itl_p99_s", 0.99)):
            f = _weighted_quantile(xs, owner, counts, q)
            out[metric] = (float(np.percentile(f, lo_q)), float(np.percentile(f, hi_q)))
    return out


def _order_interval(xs: np.ndarray, q: float) -> tuple[float, float]:
    """The distribution-free NOISE_LEVEL interval of the q-quantile of the sorted draws
    `xs`: from the l-th to the u-th order statistic, l and u the binomial(n, q)'s tails."""
    from scipy.stats import binom

    n = len(xs)
    tail = (1 - NOISE_LEVEL) / 2
    lo = int(binom.ppf(tail, n, q))  # order statistics counted from 1
    hi = int(binom.ppf(1 - tail, n, q)) + 1
    return float(xs[max(lo, 1) - 1]), float(xs[min(hi, n) - 1])


def _weighted_quantile(xs: np.ndarray, owner: np.ndarray, counts: np.ndarray, q: float,
                       window: float = 0.05) -> np.ndarray:
    """The q-quantile of the sorted values `xs` (value k belonging to request owner[k])
    under each row of `counts` (each request's multiplicity in a bootstrap resample), by the
    inverted CDF: one figure per row. Resampled quantiles stay near the sample's own, so
    the weights are summed within `window` of quantile around it only (what lies below
    counted per request); a row whose quantile falls outside is summed in full."""
    g = len(xs)
    a = int(max(q - window, 0.0) * g)
    b = min(int(np.ceil(min(q + window, 1.0) * g)), g)
    n = counts.shape[1]
    below = counts @ np.bincount(owner[:a], minlength=n)  # each row's weight under a
    target = q * (counts @ np.bincount(owner, minlength=n))
    cum = below[:, None] + np.cumsum(counts[:, owner[a:b]], axis=1)
    at = a + (cum < target[:, None]).sum(axis=1)
    inside = (below < target) & (cum[:, -1] >= target) if b > a else np.zeros(len(counts), bool)
    out: np.ndarray = xs[np.minimum(at, g - 1)].astype(np.float64)
    for i in np.flatnonzero(~inside):  # rare: the whole cumulative weight
        full = np.cumsum(counts[i, owner])
        out[i] = xs[min(int(np.searchsorted(full, target[i])), g - 1)]
    return out


@dataclass(frozen=True)
class Row:
    engine: str
    model: str
    precision: str
    experiment: str
    run: str
    workload: str
    tags: tuple[str, ...]
    measured: dict[str, float]
    predicted: dict[str, float]
    note: str = ""
    profile: str = ""
    """The profile the prediction used, as a plan names it (`h200/llama-3.1-8b/bf16`)."""
    arrival: str = ""
    """The workload's arrival kind (`closed`, `poisson`, `gamma`)."""
    noise: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per metric, the measured figure's sampling interval (`measured_intervals`)."""
    key: str = ""
    """The experiment as measured (`experiment_key`): rows with the same key measured the
    same configuration, workloads and load, on one engine start or several."""
    repeats: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per metric, the range the same experiment measured over all its runs where it ran
    more than once (`with_repeats`)."""
    tails: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per latency metric (`ttft`, `itl`, `e2e`), the share of the requests (or, for ITL,
    of the streamed gaps) past each of fidelity.GRID_S's thresholds: (measured, predicted).
    What an SLO of any limit bounds, for `capplan size --guard` (solve/guard.py)."""

    def within_noise(self, metric: str) -> bool:
        """Whether the prediction lies inside the measurement's own noise: the figure's
        sampling interval, or the range its experiment's repeated runs measured."""
        p = self.predicted[metric]
        lo, hi = self.noise.get(metric, (math.nan, math.nan))
        rlo, rhi = self.repeats.get(metric, (math.nan, math.nan))
        return lo <= p <= hi or rlo <= p <= rhi

    def error(self, metric: str) -> float:
        m, p = self.measured[metric], self.predicted[metric]
        if not (math.isfinite(m) and math.isfinite(p)) or m == 0:
            return math.inf
        return (p - m) / m


def predict(run: EngineRun, exp_name: str, acceptance: float | None) -> dict[str, dict[str, float]]:
    """Predicted figures per workload for one experiment of the run."""
    return predict_pool(run, exp_name, acceptance)[0]


def predict_pool(run: EngineRun, exp_name: str, acceptance: float | None
                 ) -> tuple[dict[str, dict[str, float]], PoolRunResult]:
    """predict(), and the simulated pool's summary: the profile it used, its KV tokens."""
    out, pool, _ = _predict(run, exp_name, acceptance)
    return out, pool


TAIL_METRICS = ("ttft", "itl", "e2e")


def _predict(run: EngineRun, exp_name: str, acceptance: float | None
             ) -> tuple[dict[str, dict[str, float]], PoolRunResult,
                        dict[str, dict[str, np.ndarray]]]:
    """predict_pool(), and per workload and latency metric the predicted share past each of
    fidelity.GRID_S's thresholds. The shares are the simulation's own SLO
    checks (`SloCheck.beyond`), one target per threshold: an SLO decides nothing in the
    simulator, so the run is the one that predicts the figures."""
    from capplan.fidelity import GRID_S
    from capplan.traffic import Slo, SloTarget

    exp = next(e for e in run.experiments if e.name == exp_name)
    grid = Slo(targets=tuple(SloTarget(metric=m, percentile=99, limit_s=float(x))
                             for m in TAIL_METRICS for x in GRID_S))
    res = run.simulate(exp.model_copy(update={"workloads": [
        w.model_copy(update={"slo": grid}) for w in exp.workloads]}), acceptance)
    reqs = res.requests()
    out: dict[str, dict[str, float]] = {}
    tails: dict[str, dict[str, np.ndarray]] = {}
    for w in res.workloads:
        r = reqs.filter(pl.col("workload") == w.name) if len(reqs) else None
        send, ttft, e2e, tokens = (r[c].to_numpy() if r is not None else np.empty(0)
                                   for c in ("arrival_s", "ttft_s", "e2e_s", "output_tokens"))
        out[w.name] = _figures(send, ttft, e2e, tokens, w.itl_p50_s, w.itl_p99_s,
                               w.prefix_hit_rate)
        out[w.name]["requests"] = float(w.completed)
        tails[w.name] = {m: np.array([math.nan if c.beyond is None else c.beyond
                                      for c in w.slo[i * len(GRID_S):(i + 1) * len(GRID_S)]])
                         for i, m in enumerate(TAIL_METRICS)}
    return out, res.pool, tails


def latency_samples(rows: pl.DataFrame) -> dict[str, np.ndarray]:
    """A workload's measured latencies by metric: its served requests' TTFT and E2E, and
    every gap between their streamed chunks (ITL)."""
    ok = _served(rows)
    gaps = _gaps(ok)
    return {"ttft": ok["ttft_s"].to_numpy(), "e2e": ok["e2e_s"].to_numpy(),
            "itl": np.concatenate(gaps) if gaps else np.empty(0)}


def measured_tails(rows: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per latency metric, the share of the workload's measured requests (TTFT, E2E) or
    streamed gaps (ITL) past each of fidelity.GRID_S's thresholds (Row.tails)."""
    from capplan.fidelity import GRID_S

    out = {}
    for m, x in latency_samples(rows).items():
        xs = np.sort(x.astype(np.float64))
        out[m] = (1.0 - np.searchsorted(xs, GRID_S, side="right") / len(xs) if len(xs)
                  else np.full(len(GRID_S), math.nan))
    return out


def experiment_key(run: EngineRun, exp: Experiment) -> str:
    """What makes two measured runs the same experiment: the engine's configuration (the
    pool, less its name, the drafter and the acceptance its drafts were given) and the
    experiment's workloads, load, duration and prefix caching; not its name, tags or seed
    (the same process, sampled again). Duration counts: near saturation a queue that grows
    for 30 s is not the one of 15 s."""
    return json.dumps([run.pool.model_dump(mode="json", exclude={"name"}), run.draft_model,
                       exp.model_dump(mode="json", exclude={"name", "tags", "seed", "repeat"}),
                       run.synthetic_acceptance], sort_keys=True)


def repeated(rows: list[Row]) -> list[list[Row]]:
    """The rows of each workload of an experiment measured more than once (the same `key`),
    in the order they first appear."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.key, r.workload), []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def with_repeats(rows: list[Row]) -> list[Row]:
    """The rows, each of an experiment measured more than once carrying the range of every
    run's measured figures (`repeated`)."""
    ranges = {}
    for same in repeated(rows):
        span = {m: (min(x.measured[m] for x in same), max(x.measured[m] for x in same))
                for m in METRICS}
        ranges.update({id(x): span for x in same})
    return [replace(r, repeats=ranges[id(r)]) if id(r) in ranges else r for r in rows]


def compare_run(folder: Path) -> list[Row]:
    run, reqs, measured = load_run(folder)
    rows: list[Row] = []
    cache: dict[tuple[str, float | None], tuple[dict[str, dict[str, float]], PoolRunResult,
                                                dict[str, dict[str, np.ndarray]]]] = {}
    for exp in run.experiments:
        for name in exp.runs():
            r = reqs.filter(pl.col("run") == name)
            if not len(r):
                continue
            info = measured["runs"].get(name, {})
            spec = info.get("spec")
            acc = None
            if run.pool.engine.speculative is not None:
                acc = round(spec["first_position_acceptance"], 4) if spec else 0.0
            key = (exp.name, acc)
            if key not in cache:
                cache[key] = _predict(run, exp.name, acc)
            pred, pool, tails = cache[key]
            for w in exp.workloads:
                wr = r.filter(pl.col("workload") == w.name)
                if not len(wr):
                    continue
                notes = [f"draft acceptance {acc:.3f} (measured)"] if acc is not None else []
                notes += [f"the runner's own {ms:.0f} ms garbage collection at {t:.1f} s"
                          for t, ms, _ in info.get("gc_pauses", ()) if ms >= GC_NOTE_MS]
                note = "; ".join(notes)
                rows.append(Row(run.name, run.pool.model, str(run.pool.precision), exp.name,
                                name, w.name, tuple(exp.tags), measured_metrics(wr),
                                pred[w.name], note, pool.profile, w.arrival.kind,
                                measured_intervals(wr), experiment_key(run, exp),
                                tails={m: (x, tails[w.name][m])
                                       for m, x in measured_tails(wr).items()}))
    return rows


def compare_all(root: Path = CALIBRATION_DIR, folders: Iterable[Path] | None = None) -> list[Row]:
    rows: list[Row] = []
    for f in folders if folders is not None else stored_runs(root):
        rows += compare_run(f)
    return with_repeats(rows)


def to_frame(rows: list[Row]) -> pl.DataFrame:
    data: list[dict[str, Any]] = []
    for r in rows:
        d: dict[str, Any] = {"engine": r.engine, "model": r.model, "precision": r.precision,
                             "experiment": r.experiment, "run": r.run, "workload": r.workload,
                             "tags": ",".join(r.tags), "requests": int(r.measured["requests"]),
                             "note": r.note}
        for m in METRICS:
            d[f"{m}_measured"] = r.measured[m]
            d[f"{m}_predicted"] = r.predicted[m]
            d[f"{m}_error"] = r.error(m)
            if m != "output_tok_s":
                lo, hi = r.noise.get(m, (math.nan, math.nan))
                d[f"{m}_measured_lo"], d[f"{m}_measured_hi"] = lo, hi
        d["hit_rate_measured"] = r.measured["hit_rate"]
        d["hit_rate_predicted"] = r.predicted["hit_rate"]
        data.append(d)
    return pl.DataFrame(data)
