"""The notebooks in notebooks/ execute top to bottom without error, so they never rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed; the notebook test needs "
            "pip install 'nbclient==0.11.0' 'nbformat==5.11.1' 'ipykernel==7.4.0' (the dev extra)"
        )


def test_both_notebooks_exist() -> None:
    """The what-if study and the trace-to-plan walk-through are shipped."""
    assert {p.name for p in NOTEBOOKS} >= {"what-if.ipynb", "trace-to-plan.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path) -> None:
    """Every cell runs without error in a fresh python3 kernel within the time limit."""
    _require("nbclient", "nbformat", "ipykernel")
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name="python3", timeout=120,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
