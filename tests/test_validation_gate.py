"""The fidelity gate: every stored measurement of real vLLM is predicted again, and no row's
error may grow past its bound in validation/bounds.json (which only ever tightens; see
capplan/validate/report.py). The docs table is regenerated from the same rows."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from capplan.validate import report
from capplan.validate.compare import METRICS, Row, compare_all
from capplan.validate.store import read_requests, stored_runs
from capplan.validate.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]
BOUNDS = ROOT / "validation" / "bounds.json"


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return compare_all()


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_every_suite_engine_was_measured_and_stored(gpu: str) -> None:
    """Every engine of validation/<gpu>.yaml is stored, under that GPU's folder."""
    suite = load_suite(ROOT / "validation" / f"{gpu}.yaml")
    assert suite.gpu == gpu
    stored = {p.name for p in stored_runs() if p.parts[-5] == gpu}
    assert {e.name for e in suite.engines} <= stored


@pytest.mark.parametrize("folder", stored_runs(), ids=lambda p: p.name)
def test_stored_runs_have_provenance_and_requests(folder: Path) -> None:
    prov = json.loads((folder / "provenance.json").read_text())
    for key in ("gpu_name", "driver", "cuda", "torch", "vllm", "starts", "git_commit",
                "engine_kwargs"):
        assert prov.get(key), f"{folder}: provenance lacks {key}"
    assert prov["vllm"] == "0.26.0"
    reqs = read_requests(folder)
    assert len(reqs) and reqs["error"].null_count() == len(reqs)
    assert (reqs["output_tokens"] == reqs["max_tokens"]).all()  # ignore_eos: every token came


def test_no_row_is_worse_than_its_bound(rows: list[Row]) -> None:
    bad = report.violations(rows, report.load_bounds(BOUNDS))
    assert not bad, "\n".join(bad)


def test_bounds_are_never_looser_than_needed(rows: list[Row]) -> None:
    """A bound within the target never exceeds it, and a row over its target is bounded at
    its error plus the allowance (so an improvement shows up as a ratchet opportunity)."""
    bounds = report.load_bounds(BOUNDS)
    for r in rows:
        for m in METRICS:
            b, e = bounds[report.row_key(r)][m], abs(r.error(m))
            if math.isfinite(e):
                assert b <= max(report.TARGETS[m], e + report.ALLOWANCE) + 1e-4  # rounding


def test_ratchet_only_tightens(rows: list[Row]) -> None:
    old = {report.row_key(r): {m: 0.0 for m in METRICS} for r in rows[:3]}
    new = report.ratchet(rows[:3], old)
    assert all(v == 0.0 for b in new.values() for v in b.values())  # never loosened
    assert report.violations(rows[:3], new)  # so the gate fails, as it must


def test_docs_table_is_current(rows: list[Row]) -> None:
    doc = ROOT / "docs" / "validation.md"
    text = doc.read_text()
    assert report.generated_block(rows) in text, (
        "docs/validation.md is stale: run `capplan validate compare --write-docs "
        "docs/validation.md`")


def test_shipped_fidelity_is_todays(rows: list[Row]) -> None:
    """calibration/<gpu>/vllm-0.26.0/fidelity.json, which plans quote, is what today's rows
    of that GPU give (capplan validate compare --fidelity calibration); every row names the
    profile it used."""
    from capplan import fidelity
    from capplan.profiles import CALIBRATION_DIR

    assert all(r.profile.split("/")[0] in ("h200", "h100") for r in rows)
    gpus = fidelity.by_gpu(rows)
    assert set(gpus) == {"h200", "h100"}
    for gpu, gpu_rows in gpus.items():
        shipped = fidelity.load(fidelity.path_for(CALIBRATION_DIR, gpu))
        assert shipped == json.loads(json.dumps(fidelity.summarise(gpu_rows))), (
            f"{gpu}'s fidelity.json is stale: run `capplan validate compare --fidelity "
            "calibration`")
        assert all(p.startswith(f"{gpu}/") for p in shipped)


def test_shipped_tails_are_todays(rows: list[Row]) -> None:
    """calibration/<gpu>/vllm-0.26.0/fidelity-tails.parquet, which `capplan size --guard`
    reads, holds today's rows' measured and predicted shares past each threshold, for the
    GPU's rows."""
    from capplan import fidelity
    from capplan.profiles import CALIBRATION_DIR

    for gpu, gpu_rows in fidelity.by_gpu(rows).items():
        shipped = fidelity.load_tails(fidelity.tails_path_for(CALIBRATION_DIR, gpu))
        assert shipped is not None
        assert shipped.equals(fidelity.tails(gpu_rows)), (
            f"{gpu}'s fidelity-tails.parquet is stale: run `capplan validate compare "
            "--fidelity calibration`")


@functools.cache
def _analysis() -> ModuleType:
    """scripts/validation_analysis.py, which prints the seeds' figures, as a module."""
    spec = importlib.util.spec_from_file_location(
        "validation_analysis", ROOT / "scripts" / "validation_analysis.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seeds_table() -> dict[str, str]:
    """docs/validation.md's seeds table: each finding's first words -> its predicted cell."""
    text = (ROOT / "docs" / "validation.md").read_text()
    section = text.split("## The seeds' experiments on the H200", 1)[1].split("\n## ", 1)[0]
    cells = {}
    for line in section.splitlines():
        if line.startswith("| **"):
            finding, _measured, predicted, *_ = line[2:].split(" | ")
            cells[finding.split("**")[1]] = predicted
    return cells


def _assert_quoted(expected: dict[str, list[str]], command: str) -> None:
    """Each finding's predicted cell holds every figure expected of it."""
    table = _seeds_table()
    stale = [f"{finding}: {want!r} is not in {table[finding]!r}"
             for finding, wants in expected.items() for want in wants
             if want not in table[finding]]
    assert not stale, ("docs/validation.md's seeds table is stale (`python "
                       f"scripts/validation_analysis.py {command}`):\n" + "\n".join(stale))


def test_seeds_table_quotes_todays_predictions(rows: list[Row]) -> None:
    """The seeds' table in docs/validation.md is written by hand; its predicted column, where
    it quotes the stored serving rows, must be what the simulator predicts for them today (the
    column once drifted from the profiles unnoticed). `python scripts/validation_analysis.py
    seeds` prints every figure checked here."""
    pred = {(r.engine, r.run, r.workload): r.predicted for r in rows}

    def p(engine: str, run: str, metric: str, workload: str = "chat") -> float:
        return pred[(engine, run, workload)][metric]

    def best(engine: str) -> str:
        held = _analysis().interactive_best(lambda run, m: p(engine, run, m), engine)
        return f"c={held[0]} ({held[1]:,.0f})" if held else ""

    def ratio(on: tuple[str, str, str], off: tuple[str, str, str], metric: str) -> float:
        return pred[on][metric] / pred[off][metric]

    def prefix(engine: str, load: str, metric: str = "output_tok_s") -> float:
        on, off = ((engine, f"prefix90-{s}-{load}", "prefix90") for s in ("on", "off"))
        return ratio(on, off, metric) if metric == "output_tok_s" else ratio(off, on, metric)

    def spread(values: list[float], digits: int) -> str:
        return f"{min(values):.{digits}f}–{max(values):.{digits}f} ×"

    four = ("llama-3.1-8b-bf16", "llama-3.1-8b-fp8", "qwen3-32b-bf16", "qwen3-32b-fp8")
    c64 = [p(f"{m}-fp8", "chat-c64", "output_tok_s") / p(f"{m}-bf16", "chat-c64", "output_tok_s")
           for m in ("llama-3.1-8b", "qwen3-32b")]
    awq, draft, seqs8 = "qwen3-32b-awq", "llama-3.1-8b-bf16-draft4", "llama-3.1-8b-bf16-seqs8"
    util = [p(e, "long-c256", "output_tok_s", "long")
            for e in ("llama-3.1-8b-bf16-u85", "llama-3.1-8b-bf16", "llama-3.1-8b-bf16-u95")]
    fcfs, prio = (p(e, r, "e2e_p99_s", w) for e, r, w in (
        ("llama-3.1-8b-bf16", "mixed-fcfs", "interactive"),
        ("llama-3.1-8b-bf16-priority", "mixed-priority", "interactive")))
    expected = {
        "Precision under the interactive SLO": [
            f"BF16 {best('llama-3.1-8b-bf16')}, FP8 {best('llama-3.1-8b-fp8')}",
            f"BF16 {best('qwen3-32b-bf16')}, FP8 {best('qwen3-32b-fp8')}"],
        "Precision at high concurrency": [f"{c64[0]:.2f} ×; {c64[1]:.2f} ×"],
        "4-bit on Hopper": [
            f"{p(awq, 'chat-c1', 'output_tok_s'):,.0f}; {p(awq, 'chat-c16', 'output_tok_s'):,.0f}"
            f", TTFT p99 {p(awq, 'chat-c16', 'ttft_p99_s') * 1e3:.0f} ms; "
            f"{p(awq, 'chat-c64', 'output_tok_s'):,.0f}"],
        "Speculative decoding's trade-off": [
            f"{p('llama-3.1-8b-bf16', 'chat-c1', 'output_tok_s'):,.0f} → "
            f"{p(draft, 'chat-c1', 'output_tok_s'):,.0f}; "
            f"{p('llama-3.1-8b-bf16', 'chat-c8', 'output_tok_s'):,.0f} → "
            f"{p(draft, 'chat-c8', 'output_tok_s'):,.0f}; "
            f"{p('llama-3.1-8b-bf16', 'chat-c1', 'itl_p99_s') * 1e3:.1f} → "
            f"{p(draft, 'chat-c1', 'itl_p99_s') * 1e3:.1f} ms"],
        "Prefix caching": [
            ", ".join(f"{prefix(e, 'c16'):.2f} ×" for e in four),
            spread([prefix(e, "c16", "ttft_p99_s") for e in four], 0),
            spread([prefix(e, "c1") for e in four], 2),
            spread([prefix(e, "c4") for e in four], 2),
            spread([prefix(e, "c64") for e in four], 1)],
        "`max_num_seqs` is a cap": [
            ", ".join(f"{p(seqs8, f'chat-c{c}', 'output_tok_s'):,.0f}" for c in (4, 16, 32)),
            " → ".join(f"{p(seqs8, f'chat-c{c}', 'ttft_p50_s') * 1e3:,.0f}"
                       for c in (4, 16, 32))],
        "`gpu_memory_utilization` only moves KV capacity": [
            f"throughput {p('llama-3.1-8b-bf16', 'chat-c64', 'output_tok_s'):,.0f} and "
            + " / ".join(f"{t:,.0f}" for t in util)],
        "Priority scheduling's tail effect": [
            f"{fcfs:.2f} s" if f"{fcfs:.2f}" == f"{prio:.2f}" else "a change"],
        "Hit rate sets per-GPU throughput": [f"{prefix('llama-3.1-8b-bf16', 'p20'):.2f} ×"],
    }
    _assert_quoted(expected, "seeds")


def test_seeds_table_quotes_todays_gemma_chat() -> None:
    """The seeds' table's Gemma 4 rows quote the simulated chat by precision
    (`python scripts/validation_analysis.py gemma`); they must be today's."""
    analysis = _analysis()
    chat = {name: [r.workloads[0] for r in results]
            for name, results in analysis.gemma_chat().items()}
    tput = {name: [w.output_tokens_per_s for w in ws] for name, ws in chat.items()}
    held = {c: all(ws[i].ttft_p99_s <= 0.5 and ws[i].itl_p99_s <= 0.05
                   for name, ws in chat.items() if name != "fp8 + MTP k=4")
            for i, c in enumerate(analysis.GEMMA_LOADS)}
    fp8, mtp = chat["fp8"], chat["fp8 + MTP k=4"]
    expected = {
        "Gemma 4 31B by precision": [
            "c=32 " + ", ".join(f"{p.upper()} {tput[p][2]:,.0f}"
                                for p in ("bf16", "fp8", "awq", "nvfp4")) + " tok/s",
            f"(NVFP4 = {tput['nvfp4'][2] / tput['bf16'][2]:.2f} × BF16 = "
            f"{tput['nvfp4'][2] / tput['fp8'][2]:.2f} × FP8)",
            f"FP8 TTFT p99 {fp8[2].ttft_p99_s * 1e3:,.0f} ms",
            "every precision holds to c=4, none to c=32" if held[4] and not held[32]
            else "a different answer"],
        "MTP k = 4 on Gemma 4": [
            f"{tput['fp8 + MTP k=4'][0] / tput['fp8'][0]:.2f} × at c=1 "
            f"({tput['fp8 + MTP k=4'][0]:,.0f} against {tput['fp8'][0]:,.0f} tok/s), "
            f"{tput['fp8 + MTP k=4'][2] / tput['fp8'][2]:.2f} × at c=32; ITL p99 "
            f"{fp8[1].itl_p99_s * 1e3:.1f} → {mtp[1].itl_p99_s * 1e3:.1f} ms at c=4"],
    }
    _assert_quoted(expected, "gemma")


def _summary() -> dict[str, tuple[int, int, str, str]]:
    """docs/validation.md's generated summary (test_docs_table_is_current holds it to the
    rows): metric -> (rows within, rows, median abs. error, misses within the noise)."""
    text = (ROOT / "docs" / "validation.md").read_text()
    table = text.split("### Summary\n", 1)[1].strip().split("\n\n", 1)[0]
    out = {}
    for line in table.splitlines()[2:]:
        metric, _target, within, median, _p90, noise = line.strip("|").split(" | ")
        n, total = (int(x) for x in within.split(" / "))
        out[metric.strip()] = (n, total, median, noise.strip())
    return out


def test_readme_and_the_glance_quote_the_summary(rows: list[Row]) -> None:
    """README.md's validation table and docs/validation.md's "At a glance" repeat the
    generated summary's counts by hand; they must be today's."""
    summary = _summary()
    readme = (ROOT / "README.md").read_text()
    glance = (ROOT / "docs" / "validation.md").read_text().split("## At a glance", 1)[1][:4000]
    total = summary["throughput"][1]
    h200, h100 = (sum(1 for r in rows if r.profile.startswith(g)) for g in ("h200/", "h100/"))
    stale = []
    if f"{total} experiment rows, {h200} on an H200 and {h100} on an H100" not in readme:
        stale.append(f"README.md: not '{total} experiment rows, {h200} on an H200 and {h100} "
                     "on an H100'")
    if f"{h200} on an H200" not in glance or f"{h100} on an H100" not in " ".join(glance.split()):
        stale.append(f"docs/validation.md At a glance: not '{h200} on an H200' and "
                     f"'{h100} on an H100'")
    for metric, (n, count, median, noise) in summary.items():
        name = "output throughput" if metric == "throughput" else metric
        line = next((ln for ln in readme.splitlines() if ln.startswith(f"| {name} |")), "")
        want = f"{n} / {count}" + (f" (median error {median.replace('%', ' %')})"
                                    if metric == "throughput" else "")
        if want not in line:
            stale.append(f"README.md {metric}: {want!r} not in {line!r}")
        if noise != "–" and f"{noise} of {count - n}" not in line:
            stale.append(f"README.md {metric}: '{noise} of {count - n}' not in {line!r}")
    if f"**{total} rows**" not in glance:
        stale.append(f"docs/validation.md At a glance: not '**{total} rows**'")
    for metric, words in (("throughput", "Throughput is within 5 % on {}"),
                          ("ITL p50", "ITL p50 on {}"), ("E2E p99", "E2E p99 within 10 % on {}"),
                          ("TTFT p50", "TTFT p50 within 5 % on {}"),
                          ("ITL p99", "ITL p99 within 10 % on {}")):
        want = words.format(summary[metric][0])
        if " ".join(want.split()) not in " ".join(glance.split()):
            stale.append(f"docs/validation.md At a glance: not {want!r}")
    assert not stale, "\n".join(stale)
