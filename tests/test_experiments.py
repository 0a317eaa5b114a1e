"""The experiments the docs report and the tree does not carry (scripts/experiments/) each
apply to the commit their README names, so that anyone can run one again."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "scripts" / "experiments"


def _listed() -> dict[str, str]:
    text = (EXPERIMENTS / "README.md").read_text()
    return dict(re.findall(r"^\| `([\w.-]+\.patch)` \| ([0-9a-f]{7,40}) \|$", text, re.M))


def test_every_patch_is_listed() -> None:
    assert set(_listed()) == {p.name for p in EXPERIMENTS.glob("*.patch")}


@pytest.mark.parametrize("name", sorted(_listed()))
def test_the_patch_applies_at_its_commit(name: str) -> None:
    commit = _listed()[name]
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode:
        pytest.skip(f"{commit} is not in this checkout's history (a shallow clone)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        subprocess.run([*git, "read-tree", commit], env=env, check=True)
        done = subprocess.run([*git, "apply", "--cached", "--check", str(EXPERIMENTS / name)],
                              env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{name} does not apply at {commit}: {done.stderr.strip()}"
