"""The validation table in the docs, its plot, and the error bounds CI holds it to.

Bounds ratchet: a row's bound is its error today plus a small allowance, capped at the
target when today's error is within it; `capplan validate compare --ratchet` only ever
tightens a stored bound (a looser one needs `--loosen`, on purpose and in review).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from capplan.validate.compare import METRICS, NOISE_LEVEL, TARGETS, Row, repeated

ALLOWANCE = 0.02  # absolute error a harmless change may add to a row (2 percentage points)
BEGIN, END = "<!-- BEGIN GENERATED: capplan validate compare --write-docs -->", \
    "<!-- END GENERATED -->"
LABELS = {"output_tok_s": "throughput", "ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99",
          "itl_p50_s": "ITL p50", "itl_p99_s": "ITL p99", "e2e_p99_s": "E2E p99"}


def row_key(r: Row) -> str:
    return f"{r.engine}/{r.run}/{r.workload}"


def candidate_bound(err: float, metric: str) -> float:
    """The bound a row earns today: its error plus the allowance, at most the target when
    the row meets it."""
    e = abs(err)
    if not math.isfinite(e):
        return math.inf
    target = TARGETS[metric]
    return round(min(target, e + ALLOWANCE) if e <= target else e + ALLOWANCE, 4)


def ratchet(rows: list[Row], old: dict[str, dict[str, float]], *, loosen: bool = False
            ) -> dict[str, dict[str, float]]:
    """New bounds: each row's candidate, never looser than the stored one; with `loosen`,
    a row whose error today is past its stored bound gets its candidate instead (every other
    bound still only tightens)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        k = row_key(r)
        prev = old.get(k, {})
        out[k] = {}
        for m in METRICS:
            c = candidate_bound(r.error(m), m)
            b = prev.get(m)
            e = abs(r.error(m))
            if b is None or (loosen and not e <= b + 1e-9):
                out[k][m] = c
            else:
                out[k][m] = min(b, max(c, e))
    return out


def violations(rows: list[Row], bounds: dict[str, dict[str, float]]) -> list[str]:
    """Rows whose error grew past their bound, or that have no bound at all."""
    bad = []
    for r in rows:
        b = bounds.get(row_key(r))
        if b is None:
            bad.append(f"{row_key(r)}: no bound stored (run `capplan validate compare --ratchet`)")
            continue
        for m in METRICS:
            e = abs(r.error(m))
            if not e <= b.get(m, -1.0) + 1e-9:
                bad.append(f"{row_key(r)} {m}: error {e:.1%} > bound {b.get(m, math.nan):.1%}")
    return bad


def load_bounds(path: Path) -> dict[str, dict[str, float]]:
    return json.loads(path.read_text()) if path.exists() else {}


def save_bounds(path: Path, bounds: dict[str, dict[str, float]]) -> None:
    path.write_text(json.dumps(dict(sorted(bounds.items())), indent=1) + "\n")


# --- docs -----------------------------------------------------------------------------------


def _v(metric: str, v: float) -> str:
    if not math.isfinite(v):
        return "–"
    if metric == "output_tok_s":
        return f"{v:,.0f}"
    return f"{v * 1e3:,.1f}" if v < 10 else f"{v * 1e3:,.0f}"


def _cell(r: Row, m: str) -> str:
    err = r.error(m)
    mark = "" if abs(err) <= TARGETS[m] else " ✗°" if r.within_noise(m) else " ✗"
    return f"{_v(m, r.measured[m])} / {_v(m, r.predicted[m])} ({err:+.0%}){mark}"


def summary_lines(rows: list[Row]) -> list[str]:
    """Per metric: rows within target, median and p90 absolute error."""
    import numpy as np

    lines = ["| metric | target | rows within | median abs. error | p90 abs. error | "
             "misses within the measurement's noise |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in METRICS:
        scored = [r for r in rows if math.isfinite(r.error(m))]
        errs = np.array([abs(r.error(m)) for r in scored])
        within = int((errs <= TARGETS[m]).sum())
        noise = ("–" if m == "output_tok_s" else
                 str(sum(abs(r.error(m)) > TARGETS[m] and r.within_noise(m) for r in scored)))
        lines.append(f"| {LABELS[m]} | ±{TARGETS[m]:.0%} | {within} / {len(errs)} | "
                     f"{np.median(errs):.1%} | {np.percentile(errs, 90):.1%} | {noise} |")
    return lines


def repeat_lines(rows: list[Row]) -> list[str]:
    """The experiments measured more than once (the same configuration, workloads and load:
    `compare.experiment_key`): per metric, how far apart their runs measured, as (max - min)
    / mean over each experiment's runs."""
    import numpy as np

    groups = repeated(rows)
    if not groups:
        return ["- none"]
    runs = sum(len(g) for g in groups)
    engines = len({r.engine for g in groups for r in g})
    lines = [f"{len(groups)} experiments were measured more than once ({runs} runs, on "
             f"{engines} engine starts); how far apart their runs measured, (max − min) ÷ mean:",
             "", "| metric | median spread | p90 spread | largest |", "| --- | --- | --- | --- |"]
    for m in METRICS:
        spread = []
        for g in groups:
            x = np.array([r.measured[m] for r in g])
            if np.isfinite(x).all() and x.mean() > 0:
                spread.append((x.max() - x.min()) / x.mean())
        lines.append(f"| {LABELS[m]} | {np.median(spread):.1%} | {np.percentile(spread, 90):.1%} "
                     f"| {max(spread):.1%} |")
    return lines


def queued_lines(rows: list[Row], recorded: dict[str, dict[str, Any]]) -> list[str]:
    """The measured rows of engines whose predictions were recorded before the run
    (validate/queued.py), held to those: per metric, rows within target and the median
    absolute error; which engines, recorded when and at which commit; and row by row, the
    measured figure against the recorded one, with today's prediction where it has moved."""
    import numpy as np

    held = [(r, recorded[r.engine]["predictions"][r.experiment][r.workload]) for r in rows
            if r.workload in recorded.get(r.engine, {}).get("predictions", {})
            .get(r.experiment, {})]
    if not held:
        return ["- none yet: `capplan validate predict SUITE --engine E --record "
                "validation/queued` records an engine's predictions before it is measured"]
    lines = [f"{len(held)} rows of {len({r.engine for r, _ in held})} engines, each held to "
             "the figures recorded before it was measured:", "",
             "| metric | target | rows within | median abs. error |", "| --- | --- | --- | --- |"]
    for m in METRICS:
        errs = np.array([abs(p[m] / r.measured[m] - 1) for r, p in held
                         if m in p and r.measured[m] and math.isfinite(r.measured[m])])
        if len(errs):
            lines.append(f"| {LABELS[m]} | ±{TARGETS[m]:.0%} | "
                         f"{int((errs <= TARGETS[m]).sum())} / {len(errs)} | "
                         f"{np.median(errs):.1%} |")
    lines += [""] + [f"- {e}: recorded {q['recorded']} at {str(q.get('git_commit'))[:7]}"
                     for e, q in sorted(recorded.items()) if e in {r.engine for r, _ in held}]
    lines += ["", "Measured / recorded before the run (error); today's prediction, where it "
              "differs from the recording by more than 1 %, after the arrow:", "",
              "| engine | run | workload | " + " | ".join(LABELS[m] for m in METRICS) + " |",
              "| --- | --- | --- | " + " | ".join("---" for _ in METRICS) + " |"]
    for r, p in sorted(held, key=lambda rp: (rp[0].engine, rp[0].run, rp[0].workload)):
        cells = []
        for m in METRICS:
            if m not in p or not r.measured[m]:
                cells.append("–")
                continue
            err = p[m] / r.measured[m] - 1
            cell = (f"{_v(m, r.measured[m])} / {_v(m, p[m])} ({err:+.0%})"
                    + ("" if abs(err) <= TARGETS[m] else " ✗"))
            if abs(r.predicted[m] / p[m] - 1) > 0.01:
                cell += f" → {_v(m, r.predicted[m])}"
            cells.append(cell)
        lines.append(f"| {r.engine} | {r.run} | {r.workload} | " + " | ".join(cells) + " |")
    return lines


def table_lines(rows: list[Row]) -> list[str]:
    by_engine: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_engine[r.engine].append(r)
    out: list[str] = []
    head = "| run | workload | n | " + " | ".join(LABELS[m] for m in METRICS) + " |"
    rule = "| --- | --- | --- | " + " | ".join("---" for _ in METRICS) + " |"
    for engine, rs in by_engine.items():
        out += ["", f"#### {engine}", "", head, rule]
        for r in rs:
            note = f" ({r.note})" if r.note else ""
            out.append(f"| {r.run} | {r.workload}{note} | {int(r.measured['requests'])} | "
                       + " | ".join(_cell(r, m) for m in METRICS) + " |")
    return out


def kv_lines(folders: list[Path]) -> list[str]:
    """KV capacity vLLM allocated at start against the profile's prediction, per engine,
    both as the pool's blocks x block size (vLLM's num_gpu_blocks x block_size; the
    prediction less the null block, as the simulator uses it). For an engine whose KV-cache
    groups share the pool (sliding-window layers), a note gives the layout and the tokens
    vLLM reports for the measured pool ("GPU KV cache size", requests at max_model_len)."""
    from capplan.kvlayout import max_in_flight_tokens
    from capplan.sim.run import setup_pool
    from capplan.validate.store import load_run

    lines = ["| engine | gpu_memory_utilization | measured KV blocks x block size | predicted | "
             "error |", "| --- | --- | --- | --- | --- |"]
    notes = []
    for f in folders:
        run, _, measured = load_run(f)
        real = measured["engine"]["kv_tokens"]
        st = setup_pool(run.pool)
        pred = st.block_tokens
        lines.append(f"| {run.name} | {run.pool.engine.gpu_memory_utilization} | {real:,} | "
                     f"{pred:,} | {(pred - real) / real:+.2%} |")
        lay = st.layout
        if lay is not None:
            eng = run.pool.engine
            blocks = measured["engine"].get("num_gpu_blocks") or real // eng.block_size
            vllm = lay.vllm_kv_tokens(blocks, st.max_model_len, max_in_flight_tokens(
                eng.max_num_batched_tokens, eng.async_scheduling))
            notes.append(
                f"- {run.name}: one pool of {blocks:,} blocks of {lay.block_bytes / 2**20:.2f} "
                f"MiB shared by {lay.full_groups} full-attention group ({lay.full_block_size}"
                f"-token blocks) and {lay.sliding_groups} sliding-window groups "
                f"({lay.sliding_block_size}-token blocks, window {lay.sliding_window}); vLLM "
                f"reports it as {vllm:,} tokens (requests at max_model_len "
                f"{st.max_model_len:,}), the simulator holds each request's own blocks")
    return lines + (["", *notes] if notes else [])


def unmeasured_lines(folders: list[Path]) -> list[str]:
    """Experiment runs of the suite that no engine start has measured yet."""
    from capplan.validate.store import load_run

    out = []
    for f in folders:
        run, reqs, _ = load_run(f)
        have = set(reqs["run"].unique().to_list())
        left = [n for e in run.experiments for n in e.runs() if n not in have]
        if left:
            out.append(f"- {run.name}: {', '.join(left)}")
    return out or ["- none"]


def generated_block(rows: list[Row], folders: list[Path] | None = None,
                    recorded: dict[str, dict[str, Any]] | None = None) -> str:
    from capplan.validate import queued
    from capplan.validate.store import stored_runs

    folders = stored_runs() if folders is None else folders
    recorded = queued.load() if recorded is None else recorded
    lines = [BEGIN, "", "### Summary", "", *summary_lines(rows), "",
             "Experiments in the suite not measured yet:", "", *unmeasured_lines(folders), "",
             "### Predicted before measured", "", *queued_lines(rows, recorded), "",
             "### The same experiment measured again", "", *repeat_lines(rows), "",
             "### KV capacity", "", *kv_lines(folders), "", "### Every row", "",
             "Measured / predicted (error). Times in ms, throughput in output tokens/s; "
             "✗ marks a miss of the target, ✗° one whose prediction lies within the "
             f"measurement's own noise: the measured figure's {NOISE_LEVEL:.0%} sampling "
             "interval (which requests happened to be served: `compare.measured_intervals`) "
             "or the range the same experiment measured over its runs (`compare.with_repeats`).",
             *table_lines(rows), "", END]
    return "\n".join(lines)


def write_docs(path: Path, rows: list[Row]) -> bool:
    """Replace the generated block of `path`; True if the file changed."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path}: no generated block ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + generated_block(rows) + tail
    if new != text:
        path.write_text(new)
        return True
    return False


def plot(rows: list[Row], path: Path) -> None:
    """Predicted against measured, one point per row and metric, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    groups = [("latency (s)", [m for m in METRICS if m != "output_tok_s"]),
              ("output throughput (tok/s)", ["output_tok_s"])]
    for ax, (label, metrics) in zip(axes, groups, strict=True):
        lo, hi = math.inf, 0.0
        for m in metrics:
            pts = [(r.measured[m], r.predicted[m]) for r in rows
                   if r.measured[m] > 0 and r.predicted[m] > 0
                   and math.isfinite(r.measured[m]) and math.isfinite(r.predicted[m])]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, s=14, alpha=0.75, label=LABELS[m])
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.2)
    fig.suptitle("capplan vs vLLM 0.26.0 on one H200 (dashed: ±10 %)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
