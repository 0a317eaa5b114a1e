"""How far the simulator has been from real vLLM, per profile and metric, for plans to quote.

`capplan validate compare --fidelity` summarises the stored validation rows' signed errors
(predicted / measured - 1, validate/compare.py: Row.error) by the profile the prediction used
and by metric, into `calibration/<gpu>/vllm-<version>/fidelity.json`. Only open-loop rows
(Poisson, gamma arrivals) count: plans size open-loop traffic, and a closed-loop row's tails
are the load generator's waves as much as the engine's (docs/validation.md). A plan then says, for
its binding SLO, how far predictions of that metric on that profile have been from the
engine, and whether its margin survives the error (`margin_after`): a predicted value that
is e under the engine's (e < 0) means the engine's is predicted / (1 + e).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.profiles import VLLM_VERSION

if TYPE_CHECKING:
    import polars as pl

    from capplan.validate.compare import Row

FILE = "fidelity.json"
TAILS_FILE = "fidelity-tails.parquet"
MIN_ROWS = 5
"""Fewer rows of a metric say too little of the error's spread to quote or to size by."""
GRID_S = np.geomspace(1e-3, 300.0, 96)
"""The thresholds (1 ms to 5 min, 14 % apart) at which each row's measured and predicted
shares past are stored (`tails`): an SLO's limit falls between two of them."""
NEAR = 4.0
"""A row speaks of an SLO's limit where the simulator put the share past that limit within
this factor of the share the percentile allows (1 % for a p99: 0.25-4 %)."""

Table = dict[str, dict[str, dict[str, float]]]


def by_gpu(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """The rows by the GPU of the profile their prediction used (`h100/llama-3.1-8b/bf16`:
    h100), each GPU's to its own file (`path_for`); rows naming no profile are left out."""
    out: defaultdict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.profile:
            out[r.profile.split("/")[0]].append(r)
    return dict(sorted(out.items()))


def summarise(rows: Iterable[Row]) -> Table:
    """{profile: {metric: {rows, p10, p50, p90, min, max, within_noise}}}: the signed
    errors' spread over the open-loop rows whose prediction used that profile (rows with no
    finite error left out), and how many of those predictions lie within the measurement's
    own noise (Row.within_noise: the figure's sampling interval, or the range the same
    experiment measured over its runs)."""
    from capplan.validate.compare import METRICS

    errors: defaultdict[str, defaultdict[str, list[tuple[float, bool]]]] = defaultdict(
        lambda: defaultdict(list))
    for r in filter(_open_loop, rows):
        for m in METRICS:
            e = r.error(m)
            if math.isfinite(e):
                errors[r.profile][m].append((e, r.within_noise(m)))
    out: Table = {}
    for profile in sorted(errors):
        out[profile] = {}
        for m, es in errors[profile].items():
            x = np.asarray([e for e, _ in es])
            p10, p50, p90 = np.percentile(x, [10, 50, 90])
            out[profile][m] = {"rows": len(x), "p10": round(float(p10), 4),
                               "p50": round(float(p50), 4), "p90": round(float(p90), 4),
                               "min": round(float(x.min()), 4), "max": round(float(x.max()), 4),
                               "within_noise": sum(noisy for _, noisy in es)}
    return out


def tails(rows: Iterable[Row]) -> pl.DataFrame:
    """One frame row per open-loop validation row, profile and latency metric: the measured
    and predicted shares past each of GRID_S's thresholds (Row.tails), for the guard's
    `share_ratios`."""
    import polars as pl

    out: list[dict[str, Any]] = []
    for r in filter(_open_loop, rows):
        for metric, (measured, predicted) in sorted(r.tails.items()):
            out.append({"profile": r.profile, "metric": metric,
                        "row": f"{r.engine}/{r.run}/{r.workload}",
                        "measured": [round(float(x), 6) for x in measured],
                        "predicted": [round(float(x), 6) for x in predicted]})
    return pl.DataFrame(out, schema={"profile": pl.String, "metric": pl.String,
                                     "row": pl.String, "measured": pl.List(pl.Float64),
                                     "predicted": pl.List(pl.Float64)})


def _at(shares: np.ndarray, limit_s: float) -> float:
    """A share-past curve on GRID_S read at `limit_s` (linear in the threshold's log)."""
    return float(np.interp(math.log(limit_s), np.log(GRID_S), shares))


def _shares_at(frame: pl.DataFrame, profile: str, metric: str,
               limit_s: float) -> list[tuple[str, float, float]]:
    """Each stored row of `profile` and `metric` with the engine's and the simulator's
    shares past `limit_s`, where both are finite."""
    import polars as pl

    out = []
    rows = frame.filter((pl.col("profile") == profile) & (pl.col("metric") == metric))
    for row, measured, predicted in rows.select("row", "measured", "predicted").iter_rows():
        m, p = _at(np.array(measured), limit_s), _at(np.array(predicted), limit_s)
        if math.isfinite(m) and math.isfinite(p):
            out.append((row, m, p))
    return out


def share_ratios(frame: pl.DataFrame, profile: str, metric: str, limit_s: float,
                 allowed: float) -> list[tuple[float, str]]:
    """Over the rows of `profile` whose prediction put a share near `allowed` past
    `limit_s` (within NEAR of it), the engine's share past the limit over the simulator's,
    with the row: above 1 where the engine ran more past the limit than predicted. What an
    SLO bounds is that share; a percentile on a cliff (a few long stalls among many short
    gaps) moves by half where the share moves by a tenth, and a narrow distribution by a
    few % where the share moves many-fold (docs/validation.md, twenty-fifth session)."""
    return [(m / p, row) for row, m, p in _shares_at(frame, profile, metric, limit_s)
            if allowed / NEAR <= p <= allowed * NEAR]


def share_unseen(frame: pl.DataFrame, profile: str, metric: str, limit_s: float,
                 allowed: float) -> list[tuple[float, str]]:
    """The rows `share_ratios` cannot read: the simulator put less than allowed / NEAR past
    `limit_s` (almost nothing, often none, so a ratio says nothing) and the engine put at
    least that much, more than the simulator; with each, the engine's excess share (its
    share less the simulator's). Such a row is an engine's tail the prediction does not
    have at all (a host's stall, a collection: docs/validation.md, "The CI gate"), which
    adds to the share past the limit rather than scaling it."""
    return [(m - p, row) for row, m, p in _shares_at(frame, profile, metric, limit_s)
            if p < allowed / NEAR <= m]


def share_spread(frame: pl.DataFrame, profile: str, metric: str, limit_s: float,
                 allowed: float) -> tuple[float, float, int] | None:
    """The 90th percentile and the largest of `share_ratios`, and how many rows, where at
    least MIN_ROWS came near the limit; None where fewer did."""
    k = [r for r, _ in share_ratios(frame, profile, metric, limit_s, allowed)]
    return (float(np.percentile(k, 90)), max(k), len(k)) if len(k) >= MIN_ROWS else None


def tails_path_for(calibration_dir: Path, gpu: str) -> Path:
    return path_for(calibration_dir, gpu).with_name(TAILS_FILE)


def load_tails(path: Path) -> pl.DataFrame | None:
    """The stored tails (`tails`); None where none was written."""
    import polars as pl

    return pl.read_parquet(path) if path.exists() else None


def _open_loop(r: Row) -> bool:
    """A row plans can be judged by: its prediction names its profile, and its arrivals are
    open-loop (module docstring)."""
    return bool(r.profile) and r.arrival != "closed"


def path_for(calibration_dir: Path, gpu: str) -> Path:
    return Path(calibration_dir) / gpu / f"vllm-{VLLM_VERSION}" / FILE


def save(path: Path, table: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def load(path: Path) -> Table:
    """The stored summary; empty where none was written (a GPU never validated)."""
    if not path.exists():
        return {}
    out: Table = json.loads(path.read_text())
    return out


def lookup(table: Table, profile: str, metric: str) -> dict[str, float] | None:
    """The metric's summary on the profile, where it has at least MIN_ROWS rows."""
    f = table.get(profile, {}).get(metric)
    return f if f is not None and f["rows"] >= MIN_ROWS else None


def margin_after(margin: float, error: float) -> float:
    """The SLO margin left if the prediction was `error` off the engine (1 - value / limit,
    with the engine's value = predicted / (1 + error))."""
    return 1.0 - (1.0 - margin) / (1.0 + error)
