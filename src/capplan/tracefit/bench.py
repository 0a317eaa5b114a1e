"""`vllm bench serve --save-result` files as workloads.

Keys as vLLM 0.26.0 writes them (vllm/benchmarks/serve.py: `result_json` in main and
`result` in benchmark): `request_rate` (a number, or "inf"), `burstiness` (gamma shape of
the gaps, 1 = Poisson), `max_concurrency`, `num_prompts`, `completed`,
`total_input_tokens`, `total_output_tokens`, and only with `--save-detailed` the per-request
`input_lens`, `output_lens` (0 for a failed request), `errors`, `ttfts`.
`--append-result` files hold one JSON object per line; each becomes a workload.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from capplan._yaml import read_utf8
from capplan.distributions import Constant, LengthDist
from capplan.errors import ConfigError
from capplan.tracefit.lengths import histogram_dist
from capplan.tracefit.result import SloLike, TraceFit, WorkloadFit, build_mix
from capplan.tracefit.scan import workload_name
from capplan.traffic import Arrival, ClosedLoop, GammaArrival, PoissonArrival

__all__ = ["fit_vllm_bench", "read_vllm_bench"]


def read_vllm_bench(path: str | Path) -> list[dict[str, Any]]:
    """The result objects of a `--save-result` (one object) or `--append-result` file."""
    p = Path(path)
    try:
        text = read_utf8(p)
    except OSError as e:
        raise ConfigError(f"cannot read file ({e.strerror}); check the path", file=str(p)) from e
    try:
        records = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON ({e.msg}, line {e.lineno})", file=str(p)) from e
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "completed" not in r or "request_rate" not in r:
            raise ConfigError(
                "not a `vllm bench serve --save-result` file (keys completed and request_rate "
                "missing); pass --format for other files",
                file=str(p),
                field=f"record {i}",
            )
    return records


def _lengths(r: dict[str, Any], key: str, total_key: str, ok: np.ndarray | None) -> LengthDist:
    if key in r and ok is not None:
        x = np.asarray(r[key], dtype=np.int64)[ok]
        values, counts = np.unique(np.maximum(x, 1), return_counts=True)
        return histogram_dist(values, counts)
    return Constant(value=max(1, round(r[total_key] / max(r["completed"], 1))))


def _arrival(r: dict[str, Any]) -> tuple[Arrival, str]:
    rate: Any = r.get("ramp_up_end_rps") if r.get("ramp_up_strategy") else r["request_rate"]
    conc = r.get("max_concurrency")
    finite = isinstance(rate, int | float) and math.isfinite(rate) and rate > 0
    if not finite:
        users = int(conc or r.get("num_prompts") or r["completed"])
        how = (
            f"request_rate inf with max_concurrency {conc} -> closed loop of {users} users"
            if conc
            else f"request_rate inf, no concurrency cap: all {users} prompts at once -> "
            "closed loop of that many users"
        )
        return ClosedLoop(concurrency=users), how
    burst = float(r.get("burstiness") or 1.0)
    how = f"request_rate {rate} req/s, burstiness {burst:g}"
    if r.get("ramp_up_strategy"):
        how += f" (ramp-up {r['ramp_up_strategy']}: its end rate)"
    if conc:
        how += f"; the client also capped concurrency at {conc}, which open loop ignores"
    if burst == 1.0:
        return PoissonArrival(rate_rps=float(rate)), how + " -> poisson"
    cv = 1.0 / math.sqrt(burst)  # gamma gaps of shape `burstiness` (serve.py get_request)
    return GammaArrival(rate_rps=float(rate), cv=round(cv, 4)), how + f" -> gamma cv {cv:.3f}"


def _observed(r: dict[str, Any]) -> str:
    parts = [
        f"{name} p99 {r[key]:.1f} ms"
        for name, key in (("TTFT", "p99_ttft_ms"), ("ITL", "p99_itl_ms"), ("TPOT", "p99_tpot_ms"))
        if isinstance(r.get(key), int | float)
    ]
    return "observed on the benchmarked server: " + ", ".join(parts) if parts else ""


def fit_vllm_bench(
    path: str | Path, *, pool: str = "default", model: str = "llama-3.1-8b", slo: SloLike = None
) -> TraceFit:
    """One workload per bench result: its arrival and empirical lengths of the completed
    requests (constant means when the file was saved without --save-detailed)."""
    file = str(path)
    records = read_vllm_bench(path)
    specs: list[dict[str, Any]] = []
    fits: list[WorkloadFit] = []
    for i, r in enumerate(records):
        base = workload_name(str(r.get("label") or "bench"))
        name = base if len(records) == 1 else f"{base}-{i}"
        ok = None
        if "input_lens" in r and "output_lens" in r:
            out = np.asarray(r["output_lens"], dtype=np.int64)
            errors = r.get("errors") or [""] * len(out)
            ok = (out > 0) & np.asarray([not e for e in errors], dtype=bool)
            if not ok.any():
                raise ConfigError("no request completed", file=file, field=f"record {i}")
        inp = _lengths(r, "input_lens", "total_input_tokens", ok)
        outp = _lengths(r, "output_lens", "total_output_tokens", ok)
        arrival, how = _arrival(r)
        detail = (
            "empirical histogram of the completed requests"
            if ok is not None
            else "constant at the mean (saved without --save-detailed; rerun with it for "
            "distributions)"
        )
        notes = [f"arrival: {how}", f"lengths: {detail}"]
        if _observed(r):
            notes.append(_observed(r))
        specs.append(
            {"name": name, "arrival": arrival, "input_tokens": inp, "output_tokens": outp}
        )
        rate = arrival.rate_rps if isinstance(arrival, PoissonArrival | GammaArrival) else None
        cv = arrival.cv if isinstance(arrival, GammaArrival) else (1.0 if rate else None)
        fits.append(
            WorkloadFit(
                name, int(r["completed"]), rate, cv, inp.mean, outp.mean, None, tuple(notes)
            )
        )
    mix = build_mix(
        workload_name(Path(file).stem),
        f"fitted from {Path(file).name} (vllm bench serve result) by capplan traffic from-trace",
        specs,
        pool=pool,
        model=model,
        slo=slo,
        source=file,
    )
    return TraceFit(mix, file, "vllm-bench", tuple(fits))
