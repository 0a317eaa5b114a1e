"""Validation measurements on disk:
`calibration/<gpu>/vllm-<version>/<model>/validation/<engine run>/` holding
`run.json` (the engine configuration and its experiments, enough to predict them again),
`requests.parquet` (every measured request: send time, TTFT, E2E, streamed-chunk times as
microsecond deltas: `write_requests`, `read_requests`),
`measured.json` (per-run engine facts: KV capacity, draft acceptance), `provenance.json` and,
when the engine run traced them, `steps.parquet` (every engine step's composition).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.errors import CalibrationError
from capplan.tracefit.metrics import parse_metrics
from capplan.validate.suite import EngineRun

ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def validation_dir(root: Path, gpu: str, vllm_version: str, model: str, run: str) -> Path:
    return root / gpu / f"vllm-{vllm_version}" / model / "validation" / run


def stored_runs(root: Path = CALIBRATION_DIR) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/vllm-*/*/validation/*/run.json"))


def longest_start_s(root: Path, gpu: str, vllm_version: str, model: str) -> float | None:
    """The longest engine start of `model`'s stored validation runs (their provenance's
    starts), or None: what a GPU call must leave for a new start of it
    (scripts/gpu_validate.sh skips a job whose start and first experiment cannot fit)."""
    starts = [s.get("engine_start_s") or 0.0
              for f in (root / gpu / f"vllm-{vllm_version}" / model / "validation").glob(
                  "*/provenance.json")
              for s in json.loads(f.read_text()).get("starts", [])]
    return max(starts) if starts and max(starts) > 0 else None


def _counter(text: str, name: str) -> dict[str, float]:
    """Counter values by their `position` label ('' when unlabelled), summed over engines."""
    out: dict[str, float] = {}
    for s in parse_metrics(text).samples:
        if s.name == name:
            key = s.label("position") or ""
            out[key] = out.get(key, 0.0) + s.value
    return out


def draft_acceptance(before: str, after: str) -> dict[str, float] | None:
    """Speculative decoding between two scrapes: drafts, draft tokens, tokens accepted, and
    the acceptance of the first draft position (P(first draft token accepted))."""
    drafts = _counter(after, NUM_DRAFTS).get("", 0.0) - _counter(before, NUM_DRAFTS).get("", 0.0)
    if drafts <= 0:
        return None
    tok = _counter(after, DRAFT_TOKENS).get("", 0.0) - _counter(before, DRAFT_TOKENS).get("", 0.0)
    acc = _counter(after, ACCEPTED).get("", 0.0) - _counter(before, ACCEPTED).get("", 0.0)
    pos_a, pos_b = _counter(after, ACCEPTED_PER_POS), _counter(before, ACCEPTED_PER_POS)
    first = pos_a.get("0", 0.0) - pos_b.get("0", 0.0)
    return {"drafts": drafts, "draft_tokens": tok, "accepted_tokens": acc,
            "first_position_acceptance": first / drafts}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a runner's JSON-lines file (none if it was never written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished_in(raws: list[Path], metas: list[dict[str, Any]], run: EngineRun) -> dict[str, int]:
    """Each experiment run's folder (index into `raws`): the first whose engine.json says the
    run finished (a run cut off mid-way leaves a partial JSON-lines file behind)."""
    out: dict[str, int] = {}
    for exp in run.experiments:
        for name in exp.runs():
            for i, (raw, meta) in enumerate(zip(raws, metas, strict=True)):
                if "wall_s" in meta.get("experiments", {}).get(name, {}) and \
                        (raw / f"{name}.jsonl").exists():
                    out[name] = i
                    break
    return out


def read_raw_requests(raws: list[Path], run: EngineRun, source: dict[str, int]) -> pl.DataFrame:
    """Request rows of every run, each from its folder in `source` (see `finished_in`)."""
    frames = []
    for exp in run.experiments:
        for name in exp.runs():
            if name not in source:
                continue
            rows = _jsonl(raws[source[name]] / f"{name}.jsonl")
            if not rows:
                continue
            names = {i: w.name for i, w in enumerate(exp.workloads)}
            frame = pl.DataFrame({
                "experiment": [exp.name] * len(rows),
                "run": [name] * len(rows),
                "workload": [names[r["workload"]] for r in rows],
                "send_s": [r["send_s"] for r in rows],
                "ttft_s": [r["ttft_s"] for r in rows],
                "e2e_s": [r["e2e_s"] for r in rows],
                "input_tokens": [r["input_tokens"] for r in rows],
                "output_tokens": [r["output_tokens"] for r in rows],
                "max_tokens": [r["max_tokens"] for r in rows],
                "cached_tokens": [r["cached_tokens"] for r in rows],
                "prefix_group": [r["prefix_group"] for r in rows],
                "prefix_tokens": [r["prefix_tokens"] for r in rows],
                "priority": [r["priority"] for r in rows],
                "chunk_t": [r["chunk_t"] for r in rows],
                "chunk_k": [r["chunk_k"] for r in rows],
                "error": [r.get("error") for r in rows],
            }, schema_overrides={"chunk_t": pl.List(pl.Float64), "chunk_k": pl.List(pl.Int16),
                                 "error": pl.String, "ttft_s": pl.Float64, "e2e_s": pl.Float64})
            if "prep_s" in rows[0]:  # the runner's own time building the request inside its
                # send stamp (runners since the twenty-third session)
                frame = frame.with_columns(prep_s=pl.Series([r["prep_s"] for r in rows],
                                                            dtype=pl.Float64))
            frames.append(frame)
    if not frames:
        raise CalibrationError(f"{raws[0]}: no measured requests for engine run {run.name!r}")
    return pl.concat(frames, how="diagonal")


def read_raw_steps(raws: list[Path], run: EngineRun, source: dict[str, int]) -> pl.DataFrame | None:
    """Engine steps traced by the runner (`trace_steps`), one frame for every run; None if
    nothing was traced."""
    frames = []
    for exp in run.experiments:
        for name in exp.runs():
            rows = _jsonl(raws[source[name]] / f"{name}.steps.jsonl") if name in source else []
            if rows:
                frames.append(pl.DataFrame(rows).with_columns(pl.lit(name).alias("run")))
    return pl.concat(frames, how="diagonal") if frames else None


def stored_run_names(root: Path, run: EngineRun, *, gpu: str = "h200",
                     vllm_version: str = "0.26.0") -> frozenset[str]:
    """Experiment runs of `run` already measured and stored under `root`."""
    path = validation_dir(root, gpu, vllm_version, run.pool.model, run.name) / "measured.json"
    if not path.exists():
        return frozenset()
    return frozenset(json.loads(path.read_text()).get("runs", {}))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10, check=False)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def ingest(raws: Path | list[Path], run: EngineRun, root: Path = CALIBRATION_DIR, *,
           gpu: str = "h200", vllm_version: str = "0.26.0", command: str = "") -> Path:
    """Store one engine run's raw output (runner folders) under `root`; all or nothing.

    Several folders may hold the same engine configuration started more than once (a run
    cut short by its time budget, finished by a second start); each experiment run is taken
    from the first folder that has it, and the provenance lists every start. Runs already
    stored for this engine (`emit --missing` measured only the others) are kept unless the
    new folders measured them again; their starts stay first in the provenance. A folder
    whose engine never started is listed under the provenance's `failed_starts` when
    another folder started; alone, it is an error."""
    raws = [raws] if isinstance(raws, Path) else list(raws)
    metas, started, failed = [], [], []
    for raw in raws:
        meta_path = raw / "engine.json"
        if not meta_path.exists():
            raise CalibrationError(f"{raw}: no engine.json; is this a `capplan validate` "
                                   "runner output folder?")
        meta = json.loads(meta_path.read_text())
        if "engine" in meta:
            metas.append(meta)
            started.append(raw)
        else:  # a start that failed (a call's deadline inside the compile): nothing measured
            failed.append((meta_path, meta))
    if not metas:
        meta_path, meta = failed[0]
        raise CalibrationError(f"{meta_path}: the engine never started: {meta.get('error')}")
    raws = started
    dest = validation_dir(root, gpu, vllm_version, run.pool.model, run.name)
    source = finished_in(raws, metas, run)
    if not source:
        raise CalibrationError(f"{raws[0]}: no finished experiment for engine run {run.name!r}")
    reqs = read_raw_requests(raws, run, source)
    steps = read_raw_steps(raws, run, source)
    old_runs, old_starts, old_reqs, old_steps = _stored(dest, run)
    runs: dict[str, Any] = {}
    for name, i in source.items():
        raw = raws[i]
        info = dict(metas[i]["experiments"][name])
        m0, m1 = raw / f"{name}.metrics-0.txt", raw / f"{name}.metrics-1.txt"
        if m0.exists() and m1.exists():
            acc = draft_acceptance(m0.read_text(), m1.read_text())
            if acc is not None:
                info["spec"] = acc
        info["engine_start"] = i
        runs[name] = info
    kept = {n: info for n, info in old_runs.items() if n not in runs}
    if kept:
        for info in runs.values():
            info["engine_start"] += len(old_starts)
        runs = {n: (runs.get(n) or kept[n]) for e in run.experiments for n in e.runs()
                if n in runs or n in kept}
        reqs = pl.concat([old_reqs.filter(pl.col("run").is_in(list(kept))), reqs],
                         how="diagonal_relaxed")
        if old_steps is not None:
            old_steps = old_steps.filter(pl.col("run").is_in(list(kept)))
            steps = old_steps if steps is None else pl.concat([old_steps, steps],
                                                             how="diagonal_relaxed")
    else:
        old_starts = []
    v = metas[0].get("versions", {})
    prov = {
        "source": "measured",
        "gpu_name": v.get("gpu_name"), "driver": v.get("driver"), "cuda": v.get("cuda"),
        "torch": v.get("torch"), "vllm": v.get("vllm"), "python": v.get("python"),
        "starts": old_starts + [
            {"date": _iso(m.get("started_unix")), "finished": _iso(m.get("finished_unix")),
             "engine_start_s": m.get("engine_start_s"),
             **({"ready_s": m["ready_s"]} if m.get("ready_s") is not None else {}),
             "kv_tokens": m["engine"].get("kv_tokens"),
             **({"host": m["versions"]["host"]} if "host" in m.get("versions", {}) else {})}
            for m in metas],
        **({"failed_starts": [{"date": _iso(m.get("started_unix")), "error": m.get("error")}
                              for _, m in failed]} if failed else {}),
        "command": command or " ".join(metas[0].get("argv", [])),
        "git_commit": _git_commit(), "engine_kwargs": metas[0].get("engine_kwargs"),
    }
    measured = {"engine": metas[0]["engine"], "runs": runs}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run.name}.", dir=dest.parent))
    (tmp / "run.json").write_text(run.model_dump_json(indent=1, by_alias=True) + "\n")
    write_requests(reqs, tmp / "requests.parquet")
    if steps is not None:
        steps.write_parquet(tmp / "steps.parquet", compression="zstd", compression_level=19)
    (tmp / "measured.json").write_text(json.dumps(measured, indent=1) + "\n")
    (tmp / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        os.replace(dest, old)
        os.replace(tmp, dest)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        os.replace(tmp, dest)
    return dest


def _stored(dest: Path, run: EngineRun) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                  pl.DataFrame, pl.DataFrame | None]:
    """What is stored for this engine run already: runs still in the suite, the engine
    starts that measured them, their requests and steps (empty when nothing is stored)."""
    if not (dest / "measured.json").exists():
        return {}, [], pl.DataFrame(), None
    names = {n for e in run.experiments for n in e.runs()}
    runs = {n: info for n, info in json.loads((dest / "measured.json").read_text())
            .get("runs", {}).items() if n in names}
    starts = json.loads((dest / "provenance.json").read_text()).get("starts", [])
    steps = pl.read_parquet(dest / "steps.parquet") if (dest / "steps.parquet").exists() \
        else None
    return runs, starts, read_requests(dest), steps


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")


def write_requests(reqs: pl.DataFrame, path: Path) -> None:
    """Store requests (`chunk_t`: each request's streamed-chunk times, seconds after its
    send) with the chunk times as whole microseconds, each after the one before (`chunk_us`):
    the runner records them to the microsecond, and deltas compress to about a third of
    float32 seconds, which keeps the stored suite small enough to travel to the GPU host."""
    us = pl.element().mul(1e6).round().cast(pl.Int64)
    reqs.with_columns(pl.col("chunk_t").list.eval(us.diff().fill_null(us.first()).cast(pl.Int32))
                      .alias("chunk_t")).rename({"chunk_t": "chunk_us"}).write_parquet(
        path, compression="zstd", compression_level=19)


def read_requests(folder: Path) -> pl.DataFrame:
    """A stored engine run's requests, `chunk_t` in seconds after each send (write_requests;
    a folder stored before, with float `chunk_t`, reads the same)."""
    reqs = pl.read_parquet(folder / "requests.parquet")
    if "chunk_us" in reqs.columns:
        return reqs.with_columns(pl.col("chunk_us").list.eval(
            pl.element().cast(pl.Int64).cum_sum().cast(pl.Float64) / 1e6)).rename(
            {"chunk_us": "chunk_t"})
    return reqs.with_columns(pl.col("chunk_t").cast(pl.List(pl.Float64)))


def load_run(folder: Path) -> tuple[EngineRun, pl.DataFrame, dict[str, Any]]:
    run = EngineRun.model_validate_json((folder / "run.json").read_text())
    reqs = read_requests(folder)
    measured = json.loads((folder / "measured.json").read_text())
    return run, reqs, measured
