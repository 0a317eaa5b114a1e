"""Calibration data on disk, by path:
`calibration/<gpu>/vllm-<version>/<model>/<precision>[-kvfp8][-<method>K]/` holding
`profile.json` (the fit), `provenance.json` (where it came from) and `samples.parquet`
(every measured engine step, converted from the runner's JSONL)."""

from __future__ import annotations

import gzip
import json
import lzma
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from capplan.calibrate.fit import Samples, prefill_attn, step_times_gpu_s, step_times_s
from capplan.errors import CalibrationError
from capplan.steptime import window_pairs

CALIBRATION_DIR = Path(__file__).resolve().parents[3] / "calibration"
STEP_COLUMNS = ("tokens", "seqs", "decode_seqs", "decode_ctx", "spec_tokens", "drafting_seqs",
                "prefill_seqs", "prefill_tokens", "max_ctx")
PROVENANCE_KEYS = ("gpu_name", "driver", "cuda", "torch", "vllm", "date", "command",
                   "git_commit", "engine", "gpu_minutes")


def profile_dir(root: Path, gpu: str, vllm_version: str, model: str, key: str) -> Path:
    return root / gpu / f"vllm-{vllm_version}" / model / key


RAW_HOME_GPU = "h200"
"""The GPU whose raw runner output sits in `calibration/_raw` itself (the first measured)."""


def raw_dir(root: Path, gpu: str) -> Path:
    """Where the raw runner output of `gpu` lives under the calibration folder `root`: `_raw`
    for the H200, `_raw/<gpu>` for any other, since a run's name (`<model>--<key>`) does not
    name its GPU."""
    return root / "_raw" if gpu == RAW_HOME_GPU else root / "_raw" / gpu


def plans_dir(root: Path, gpu: str) -> Path:
    """Where `capplan calibrate --emit-queue` writes the sweep plans of `gpu` under the
    calibration folder `root`: `_plans` for the H200, `_plans/<gpu>` for any other, so that
    emitting another GPU's queue leaves the H200's stored plans as they were measured."""
    return root / "_plans" if gpu == RAW_HOME_GPU else root / "_plans" / gpu


def _text_lines(path: Path) -> list[str]:
    """A samples file's lines: plain, gzipped (as a GPU session brings it back) or xz'd (as
    shipped, a third smaller than gzip, so the tree travels to the GPU host:
    tests/test_tree_size.py)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    elif path.suffix == ".xz":
        data = lzma.decompress(data)
    return data.decode().splitlines()


def read_runner_jsonl(path: Path) -> pl.DataFrame:
    """Step records of complete points only (a crash leaves its last point incomplete)."""
    rows: list[dict[str, Any]] = []
    done: set[str] = set()
    try:
        lines = _text_lines(path)
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read samples ({e.strerror})") from e
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") == "point_done":
            done.add(rec["point"])
        elif rec.get("kind") == "step":
            rows.append(rec)
    rows = [r for r in rows if r["point"] in done]
    if not rows:
        raise CalibrationError(f"{path}: no complete points measured")
    df = pl.DataFrame({
        "point": [r["point"] for r in rows],
        "step": [r["step"] for r in rows],
        "t_sched0": [r["t_sched0"] for r in rows],
        "t_sched1": [r["t_sched1"] for r in rows],
        "t_done": [r["t_done"] for r in rows],
        # the GPU's own stamps, from runners of 2026-11-30 on (runner.py)
        "gpu_t0": [r.get("gpu_t0") for r in rows],
        "gpu_t1": [r.get("gpu_t1") for r in rows],
        **{c: [int(r[c]) for r in rows] for c in STEP_COLUMNS},
        "chunks": [[list(map(int, c)) for c in r["chunks"]] for r in rows],
    }, schema_overrides={"chunks": pl.List(pl.List(pl.Int64)), "gpu_t0": pl.Float64,
                         "gpu_t1": pl.Float64})
    if any("cpu_launch_s" in r for r in rows):
        # the engine core's CPU time launching and updating the step, from runners of the
        # fourteenth session on (runner.py)
        df = df.with_columns(pl.Series(c, [r.get(c) for r in rows], dtype=pl.Float64)
                             for c in ("cpu_launch_s", "cpu_update_s"))
    if any("gc_launch_s" in r for r in rows):
        # of cpu_launch_s, the garbage collector's seconds (runner.py GcClock, sixty-second
        # session on)
        df = df.with_columns(pl.Series("gc_launch_s", [r.get("gc_launch_s") for r in rows],
                                       dtype=pl.Float64))
    if any("alloc_counts" in r for r in rows):
        # torch's caching-allocator counters after the step's launch (runner.py --trace-core,
        # thirty-third session): retries, cudaMallocs, cudaFrees, all-stream syncs
        df = df.with_columns(pl.Series("alloc_counts", [r.get("alloc_counts") for r in rows],
                                       dtype=pl.List(pl.Int64)))
    if any("encoder_tokens" in r for r in rows):
        # image tokens whose encoder ran in the step (picture points, runner.py `describe`)
        df = df.with_columns(pl.Series("encoder_tokens",
                                       [int(r.get("encoder_tokens", 0)) for r in rows]))
    return with_derived(df)


def read_encoder_jsonl(path: Path) -> pl.DataFrame:
    """An encoder scan's timed passes (runner.py `Driver.encoder`), complete points only."""
    recs = [json.loads(x) for x in _text_lines(path) if x.strip()]
    done = {r["point"] for r in recs if r.get("kind") == "point_done"}
    rows = [r for r in recs if r.get("kind") == "encoder" and r["point"] in done]
    if not rows:
        raise CalibrationError(f"{path}: no complete encoder points measured")
    cols = ("point", "rep", "images", "image_tokens", "gpu_s", "launch_s", "wall_s",
            "tokens_out", "inputs")
    return pl.DataFrame({c: [r[c] for r in rows] for c in cols})


def runner_jsonl(raw: Path, name: str) -> Path | None:
    """The run's samples file: `<name>.jsonl`, or compressed (`.xz` as shipped, `.gz`)."""
    for p in (raw / f"{name}.jsonl", raw / f"{name}.jsonl.xz", raw / f"{name}.jsonl.gz"):
        if p.exists():
            return p
    return None


def with_derived(df: pl.DataFrame) -> pl.DataFrame:
    """Columns computed from the raw record: step time (by the GPU's stamps where every
    step has them, else by the CPU's), attention pairs, warm-up flag."""
    point = df["point"].to_numpy()
    t_sched0, t_done = df["t_sched0"].to_numpy(), df["t_done"].to_numpy()
    # scheduled before the step ahead of it came back: the engine was busy throughout
    pipelined = np.r_[False, (point[1:] == point[:-1]) & (t_sched0[1:] < t_done[:-1])]
    gpu = "gpu_t1" in df.columns and len(df) > 0 and df["gpu_t1"].null_count() == 0
    if gpu:
        step_s = step_times_gpu_s(point, pipelined, df["gpu_t0"].to_numpy(),
                                  df["gpu_t1"].to_numpy())
    else:
        step_s = step_times_s(point, t_sched0, t_done)
    return df.with_columns(
        pl.Series("step_s", step_s),
        pl.Series("pipelined", pipelined),
        pl.lit(gpu).alias("gpu_clock"),
        pl.Series("prefill_attn", prefill_attn(df["chunks"].to_list())),
        pl.col("point").str.starts_with("warmup").alias("warmup"),
    )


def samples_of(df: pl.DataFrame, window_tokens: int = 0) -> Samples:
    """The fit's arrays; with a sliding window, also each step's prefill pairs capped at it
    (`profile.window_pairs`, summed over the step's chunks)."""
    cols = ("point", "step_s", "prefill_attn", "warmup", *STEP_COLUMNS)
    s = {c: df[c].to_numpy() for c in cols}
    if window_tokens:
        s["prefill_attn_window"] = np.array(
            [sum(window_pairs(c, x, window_tokens) for c, x in step)
             for step in df["chunks"].to_list()], dtype=float)
    # samples stored before the runner had the GPU's stamps lack the column
    s["gpu_clock"] = (df["gpu_clock"].to_numpy() if "gpu_clock" in df.columns
                      else np.zeros(len(df), dtype=bool))
    s["gpu_gap_s"] = gpu_gap_s(df)
    return s


def gpu_gap_s(df: pl.DataFrame) -> np.ndarray:
    """How long the GPU sat idle before each step: its start stamp less the end stamp of
    the step before it in the same point and run, where that step was still queued when
    this one was scheduled (`pipelined`). 0 where the stream ran the two back to back, and
    where the stamps or a step before are missing."""
    n = len(df)
    if n == 0 or "gpu_t0" not in df.columns or "pipelined" not in df.columns:
        return np.zeros(n)
    t0 = df["gpu_t0"].to_numpy().astype(float)
    t1 = df["gpu_t1"].to_numpy().astype(float)
    point = df["point"].to_numpy()
    same = np.r_[False, point[1:] == point[:-1]] & df["pipelined"].to_numpy()
    if "run" in df.columns:
        run = df["run"].to_numpy()
        same &= np.r_[False, run[1:] == run[:-1]]
    gap = np.where(same, t0 - np.r_[np.nan, t1[:-1]], 0.0)
    return np.nan_to_num(np.maximum(gap, 0.0))


def read_samples(path: Path) -> pl.DataFrame:
    p = path / "samples.parquet" if path.is_dir() else path
    try:
        return pl.read_parquet(p)
    except (OSError, pl.exceptions.PolarsError) as e:
        raise CalibrationError(f"{p}: cannot read samples ({e})") from e


def kv_tokens(kv: Mapping[str, Any]) -> float:
    """An engine's KV capacity in tokens as vLLM counts it (the "GPU KV cache size" it logs,
    vllm/v1/core/kv_cache_utils.py: get_kv_cache_capacity): blocks x block size for one KV
    cache group; with sliding-window groups (Gemma 4), requests at max_model_len, each window
    counted once. Runs recorded before the runner stored it have one group."""
    return float(kv.get("vllm_kv_tokens") or kv["kv_tokens"])


def pool_blocks(kv: Mapping[str, Any]) -> int:
    """An engine's pool of KV blocks, the null block included (vLLM's num_gpu_blocks)."""
    return int(kv.get("num_gpu_blocks") or kv["kv_tokens"] // kv["block_size"])


def kv_points(metas: Sequence[Mapping[str, Any]], utils: Sequence[float], *,
              with_blocks: bool = False) -> list[dict[str, float]]:
    """KV capacity at each utilisation: measured where an engine ran at it, else derived
    from the nearest measured engine's memory profile (vllm/v1/worker/gpu_worker.py:
    available KV bytes = util x total - non-KV usage, so Δbytes = Δutil x total).
    `with_blocks=True` adds the pool's blocks (num_gpu_blocks) to each point."""
    measured = {round(m["kv"]["gpu_memory_utilization"], 4): m for m in metas}
    out = []
    for u in utils:
        key = round(u, 4)
        if key in measured:
            kv = measured[key]["kv"]
            out.append({"gpu_memory_utilization": u, "tokens": kv_tokens(kv), "derived": 0.0})
            if with_blocks:
                out[-1]["blocks"] = float(pool_blocks(kv))
            continue
        ref = min(measured.values(), key=lambda m: abs(m["kv"]["gpu_memory_utilization"] - u))
        kv, total = ref["kv"], ref["versions"]["gpu_total_bytes"]
        blocks_ref = kv["kv_tokens"] / kv["block_size"]
        per_block = kv["kv_tensor_bytes"] / blocks_ref
        avail = kv["available_kv_bytes"] + (u - kv["gpu_memory_utilization"]) * total
        blocks = math.floor(avail / per_block)
        tokens = blocks * kv_tokens(kv) / blocks_ref  # vLLM's tokens per block, as measured
        out.append({"gpu_memory_utilization": u, "tokens": float(math.floor(tokens)),
                    "derived": 1.0})
        if with_blocks:
            out[-1]["blocks"] = float(blocks)
    return out


def provenance(meta: Mapping[str, Any], *, git_commit: str, gpu_seconds: float,
               note: str = "", extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything needed to say where a profile's numbers came from."""
    v = meta["versions"]
    return {
        "source": "measured",
        "note": note,
        "gpu_name": v.get("gpu_name"),
        "driver": v.get("driver"),
        "cuda": v.get("cuda"),
        "torch": v.get("torch"),
        "vllm": v.get("vllm"),
        "python": v.get("python"),
        "gpu_total_bytes": v.get("gpu_total_bytes"),
        "date": _iso(meta.get("started_unix")),
        "command": " ".join(meta.get("argv", [])),
        "git_commit": git_commit,
        "engine": meta.get("engine", {}),
        "engine_start_s": meta.get("engine_start_s"),
        "measure_s": meta.get("measure_s"),
        "gpu_minutes": round(gpu_seconds / 60, 2),
        # the host's CPU, from runners of the nineteenth session on (runner.py)
        **({"host": v["host"]} if v.get("host") else {}),
        **(dict(extra) if extra else {}),
    }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")


def write_profile_dir(out: Path, profile_json: Mapping[str, Any], prov: Mapping[str, Any],
                      samples: pl.DataFrame) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(profile_json, indent=1) + "\n")
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str) + "\n")
    samples.write_parquet(out / "samples.parquet", compression="zstd", statistics=False)
    return out


def shipped_profiles(root: Path = CALIBRATION_DIR) -> list[Path]:
    """Every measured profile folder under `root`."""
    return sorted(p.parent for p in root.glob("*/vllm-*/*/*/profile.json"))
