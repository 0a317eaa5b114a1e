"""The fidelity gate: every stored measurement of real vLLM is predicted again, and no row's
error may grow past its bound in validation/bounds.json (which only ever tightens; see
capplan/validate/report.py). The docs table is regenerated from the same rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

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
