"""The docs site builds with warnings as errors, and its generated reference is current."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _gen_reference() -> ModuleType:
    path = ROOT / "scripts/gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_matches_the_models() -> None:
    """docs/reference.md is what scripts/gen_reference.py makes from the pydantic models now,
    so the traffic-file reference never goes stale."""
    expected = _gen_reference().render()
    actual = (ROOT / "docs/reference.md").read_text(encoding="utf-8")
    assert actual == expected, (
        "docs/reference.md is stale: run `python scripts/gen_reference.py` and commit it"
    )


def test_reference_names_every_field() -> None:
    """Every field of every model in the traffic file's schema appears in the reference."""
    from capplan.mix import TrafficMix

    text = (ROOT / "docs/reference.md").read_text(encoding="utf-8")
    schema = TrafficMix.model_json_schema()
    models = [schema, *schema["$defs"].values()]
    for model in models:
        if model.get("title") in ("Slo", "SloTarget"):
            continue  # written as keys (ttft_p99_s: ...), documented by their pattern
        for field in model.get("properties", {}):
            assert f"| `{field}` |" in text, f"{model['title']}.{field} missing from reference"
    assert "<ttft|itl|tpot|e2e>_p<percentile>_s" in text


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: every nav entry and link resolves, no warnings."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install 'mkdocs==1.6.1' (the dev extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"),
         "--config-file", str(ROOT / "mkdocs.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    for page in ("index", "quickstart", "reference", "simulator"):
        path = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert path.is_file(), f"{page} page not built"


def test_validation_indexes_every_lease_in_the_log() -> None:
    """docs/validation.md's "The leases, one by one" links every section of
    docs/validation-log.md, in the log's order, so a lease written up in the log is found
    from the reference page (mkdocs --strict checks each link's anchor, not that none is
    missing)."""
    from markdown.extensions.toc import slugify

    log = (ROOT / "docs/validation-log.md").read_text(encoding="utf-8")
    sections = [line[3:].strip() for line in log.splitlines() if line.startswith("## ")]
    text = (ROOT / "docs/validation.md").read_text(encoding="utf-8")
    index = text.split("### The leases, one by one", 1)[1].split("\n### ", 1)[0]
    listed = [line for line in index.splitlines() if line.startswith("- [")]
    want = [f"- [{s}](validation-log.md#{slugify(s, '-')})" for s in sections]
    assert listed == want, (
        "docs/validation.md's lease index is not the log's sections: list each `## ` heading "
        "of docs/validation-log.md there, in order, as `- [heading](validation-log.md#anchor)`")
