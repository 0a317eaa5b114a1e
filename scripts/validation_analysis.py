"""The figures of docs/validation.md that are not in its generated table: the seeds'
experiments on the H200, the noise of repeated runs, and the engine steps reconstructed
from streamed-chunk times.

    python scripts/validation_analysis.py [seeds|noise|steps]   (default: all three)
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from capplan.calibrate.store import CALIBRATION_DIR
from capplan.profile import Profile, StepTimer
from capplan.validate.compare import Row, compare_all
from capplan.validate.store import stored_runs

SIDES = ("measured", "predicted")


def _rows() -> dict[tuple[str, str, str], Row]:
    return {(r.engine, r.run, r.workload): r for r in compare_all()}


def seeds(rows: dict[tuple[str, str, str], Row]) -> None:
    def g(e: str, run: str, w: str, m: str, side: str) -> float:
        r = rows.get((e, run, w))
        return getattr(r, side)[m] if r else float("nan")

    print("precision under the interactive SLO (TTFT p99 <= 0.5 s, ITL p99 <= 50 ms), chat")
    for e in ("llama-3.1-8b-bf16", "llama-3.1-8b-fp8", "qwen3-32b-bf16", "qwen3-32b-fp8"):
        for side in SIDES:
            best, c64 = None, g(e, "chat-c64", "chat", "output_tok_s", side)
            for c in (1, 4, 16, 64):
                run = "chat-c16-r1" if e == "llama-3.1-8b-bf16" and c == 16 else f"chat-c{c}"
                if (g(e, run, "chat", "ttft_p99_s", side) <= 0.5
                        and g(e, run, "chat", "itl_p99_s", side) <= 0.05):
                    best = (c, round(g(e, run, "chat", "output_tok_s", side)))
            print(f"  {e:20s} {side:9s} highest concurrency holding it {best}; c=64 {c64:.0f}")
    print("speculative decoding (draft model, k = 4) against none, chat")
    for c in (1, 8):
        for side in SIDES:
            b = [g("llama-3.1-8b-bf16", f"chat-c{c}", "chat", m, side)
                 for m in ("output_tok_s", "itl_p99_s")]
            d = [g("llama-3.1-8b-bf16-draft4", f"chat-c{c}", "chat", m, side)
                 for m in ("output_tok_s", "itl_p99_s")]
            print(f"  c={c} {side:9s} throughput {b[0]:.0f} -> {d[0]:.0f}, "
                  f"ITL p99 {b[1] * 1e3:.1f} -> {d[1] * 1e3:.1f} ms")
    print("prefix caching on / off, 90 % shared prefix")
    for e in ("llama-3.1-8b-bf16", "llama-3.1-8b-fp8", "qwen3-32b-bf16", "qwen3-32b-fp8"):
        for load in ("c16", "p20"):
            for side in SIDES:
                on = [g(e, f"prefix90-on-{load}", "prefix90", m, side)
                      for m in ("output_tok_s", "ttft_p99_s")]
                off = [g(e, f"prefix90-off-{load}", "prefix90", m, side)
                       for m in ("output_tok_s", "ttft_p99_s")]
                if np.isfinite(on[0]):
                    print(f"  {e:20s} {load} {side:9s} throughput x{on[0] / off[0]:.2f}, "
                          f"TTFT p99 x{off[1] / on[1]:.2f} better")
    print("max_num_seqs 8")
    for c in (4, 16, 32):
        for side in SIDES:
            f = [g("llama-3.1-8b-bf16-seqs8", f"chat-c{c}", "chat", m, side)
                 for m in ("output_tok_s", "ttft_p50_s")]
            print(f"  c={c} {side:9s} throughput {f[0]:.0f}, TTFT p50 {f[1] * 1e3:.0f} ms")
    print("priority against FCFS, mixed interactive + batch")
    for w in ("interactive", "batch"):
        for side in SIDES:
            f = g("llama-3.1-8b-bf16", "mixed-fcfs", w, "e2e_p99_s", side)
            p = g("llama-3.1-8b-bf16-priority", "mixed-priority", w, "e2e_p99_s", side)
            print(f"  {w:11s} {side:9s} E2E p99 {f:.2f} s (fcfs) -> {p:.2f} s (priority)")


def noise(rows: dict[tuple[str, str, str], Row]) -> None:
    print("three runs of the same requests (Llama-3.1-8B BF16, chat)")
    for base in ("chat-c16", "chat-p44"):
        for m in ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                  "e2e_p99_s"):
            v = np.array([rows[("llama-3.1-8b-bf16", f"{base}-r{i}", "chat")].measured[m]
                          for i in (1, 2, 3)])
            scale = 1 if m == "output_tok_s" else 1e3
            print(f"  {base} {m:12s} {np.round(v * scale, 1)} "
                  f"spread {(v.max() - v.min()) / v.mean():.1%}")


def steps() -> None:
    """Engine steps rebuilt from chunk times: chunks within 1.5 ms are one step; a step's
    duration is the gap to the previous one; first chunks mark prefills that completed."""
    prof = Profile.load(CALIBRATION_DIR / "h200/vllm-0.26.0/llama-3.1-8b/bf16/profile.json")
    timer = StepTimer(prof, max_num_seqs=1024, max_num_batched_tokens=8192)
    for decodes in (37, 79):  # one 512-token prompt, decodes at ~600 tokens of context
        t = timer.step_time_s(512 + decodes, 1 + decodes, 512 * 256, 600 * decodes, 0)
        print(f"profile: one 512-token prefill + {decodes} decodes = {t * 1e3:.1f} ms")
    folder = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16")
    df = pl.read_parquet(folder / "requests.parquet")
    for run in ("chat-c64", "chat-p28", "chat-p44-r1"):
        r = df.filter(pl.col("run") == run)
        t = np.concatenate([s + np.asarray(c, dtype=float)
                            for s, c in zip(r["send_s"], r["chunk_t"].to_list(), strict=True)])
        first = np.concatenate([np.arange(len(c)) == 0 for c in r["chunk_t"].to_list()])
        order = np.argsort(t)
        t, first = t[order], first[order]
        sid = np.cumsum(np.concatenate([[True], np.diff(t) > 0.0015])) - 1
        end = np.array([t[sid == k].max() for k in range(sid.max() + 1)])
        n_first = np.bincount(sid, weights=first).astype(int)[1:]
        n_all = np.bincount(sid)[1:]
        dur = np.diff(end)
        print(f"{run}: {len(dur)} steps")
        for k in range(3):
            m = n_first == k
            if m.any():
                print(f"  steps completing {k} prefill(s): n={m.sum()}, duration p10/50/90 "
                      f"{np.round(np.percentile(dur[m], [10, 50, 90]) * 1e3, 1)} ms, "
                      f"{np.mean(n_all[m] - k):.0f} decodes")
        if run == "chat-p28":
            starts = end[:-1]
            for t0 in np.arange(3.0, 7.0, 0.5):
                w = (starts >= t0) & (starts < t0 + 0.5)
                print(f"  mean step {t0:.1f}-{t0 + 0.5:.1f} s: {dur[w].mean() * 1e3:.1f} ms")


def main() -> None:
    what = sys.argv[1:] or ["seeds", "noise", "steps"]
    rows = _rows() if {"seeds", "noise"} & set(what) else {}
    for name in what:
        print(f"== {name}")
        if name == "seeds":
            seeds(rows)
        elif name == "noise":
            noise(rows)
        else:
            steps()


if __name__ == "__main__":
    main()
