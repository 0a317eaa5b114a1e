"""The README's main job, as the README prints it: `capplan size --traffic
examples/production-mix.yaml` with the shipped profiles gives every figure the README's
abridged output shows (a `…` there stands for what it leaves out). A refit or a simulator
change that moves the plan fails here until the README says what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from capplan.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _readme_block() -> list[str]:
    """The lines of the README's first output block (the one that opens with `plan for`)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```\n(plan for .*?)\n```", text, re.S)
    assert m, "README.md: no output block opening with 'plan for'"
    return m.group(1).splitlines()


def _shown(line: str, output: list[str]) -> bool:
    """Whether one output line holds every part of the README's line between its `…`s, in
    order (a line of `…` alone stands for lines left out)."""
    parts = [p.strip() for p in line.split("…") if p.strip()]
    for out in output:
        at = 0
        for part in parts:
            at = out.find(part, at)
            if at < 0:
                break
            at += len(part)
        else:
            return True
    return not parts


def test_the_readmes_plan_is_the_plan_capplan_size_gives() -> None:
    """Every line of the README's output block is in `capplan size`'s output, `…` aside."""
    result = CliRunner().invoke(
        main, ["size", "--traffic", str(ROOT / "examples" / "production-mix.yaml")])
    assert result.exit_code == 0, result.output
    output = result.output.splitlines()
    missing = [line for line in _readme_block() if not _shown(line, output)]
    assert not missing, "README.md's plan differs from capplan size's:\n" + "\n".join(missing)
