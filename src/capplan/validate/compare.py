"""Measured against predicted: every stored validation run, predicted again by the simulator.

Both sides are reduced by the same rules, those of `vllm bench serve`
(vllm/benchmarks/serve.py, calculate_metrics): TTFT and E2E percentiles over requests
(numpy's linear interpolation), ITL over every gap between consecutive streamed chunks,
output throughput = output tokens / (last completion - first send). The simulator's ITL
comes from its 0.1 %-bin histogram (capplan/sim/metrics.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.sim.run import simulate
from capplan.validate.store import load_run, stored_runs
from capplan.validate.suite import EngineRun

METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s")
# Targets (issue: throughput and medians within 5 %, p99s within 10 %).
TARGETS = {"output_tok_s": 0.05, "ttft_p50_s": 0.05, "itl_p50_s": 0.05,
           "ttft_p99_s": 0.10, "itl_p99_s": 0.10, "e2e_p99_s": 0.10}


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


def measured_metrics(rows: pl.DataFrame) -> dict[str, float]:
    """The table's figures for one workload of one run, from its request rows."""
    ok = rows.filter(pl.col("ttft_s").is_not_null() & pl.col("error").is_null())
    gaps = [np.diff(np.asarray(t, dtype=np.float64)) for t in ok["chunk_t"].to_list()]
    itl = np.concatenate(gaps) if gaps else np.empty(0)
    hit = float(ok["cached_tokens"].sum()) / max(float(ok["input_tokens"].sum()), 1.0)
    return _figures(ok["send_s"].to_numpy(), ok["ttft_s"].to_numpy(), ok["e2e_s"].to_numpy(),
                    ok["output_tokens"].to_numpy(), _pct(itl, 50), _pct(itl, 99), hit)


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

    def error(self, metric: str) -> float:
        m, p = self.measured[metric], self.predicted[metric]
        if not (math.isfinite(m) and math.isfinite(p)) or m == 0:
            return math.inf
        return (p - m) / m


def predict(run: EngineRun, exp_name: str, acceptance: float | None) -> dict[str, dict[str, float]]:
    """Predicted figures per workload for one experiment of the run."""
    return _predict(run, exp_name, acceptance)[0]


def _predict(run: EngineRun, exp_name: str,
             acceptance: float | None) -> tuple[dict[str, dict[str, float]], str]:
    """predict(), and the profile it used."""
    exp = next(e for e in run.experiments if e.name == exp_name)
    mix = run.mix(exp, acceptance)
    res = simulate(mix, "validate", 1, keep_requests=True)
    reqs = res.requests()
    out: dict[str, dict[str, float]] = {}
    for w in res.workloads:
        r = reqs.filter(pl.col("workload") == w.name) if len(reqs) else None
        send, ttft, e2e, tokens = (r[c].to_numpy() if r is not None else np.empty(0)
                                   for c in ("arrival_s", "ttft_s", "e2e_s", "output_tokens"))
        out[w.name] = _figures(send, ttft, e2e, tokens, w.itl_p50_s, w.itl_p99_s,
                               w.prefix_hit_rate)
        out[w.name]["requests"] = float(w.completed)
    return out, res.pool.profile


def compare_run(folder: Path) -> list[Row]:
    run, reqs, measured = load_run(folder)
    rows: list[Row] = []
    cache: dict[tuple[str, float | None], tuple[dict[str, dict[str, float]], str]] = {}
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
            pred, profile = cache[key]
            for w in exp.workloads:
                wr = r.filter(pl.col("workload") == w.name)
                if not len(wr):
                    continue
                note = f"draft acceptance {acc:.3f} (measured)" if acc is not None else ""
                rows.append(Row(run.name, run.pool.model, str(run.pool.precision), exp.name,
                                name, w.name, tuple(exp.tags), measured_metrics(wr),
                                pred[w.name], note, profile, w.arrival.kind))
    return rows


def compare_all(root: Path = CALIBRATION_DIR, folders: Iterable[Path] | None = None) -> list[Row]:
    rows: list[Row] = []
    for f in folders if folders is not None else stored_runs(root):
        rows += compare_run(f)
    return rows


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
        d["hit_rate_measured"] = r.measured["hit_rate"]
        d["hit_rate_predicted"] = r.predicted["hit_rate"]
        data.append(d)
    return pl.DataFrame(data)
