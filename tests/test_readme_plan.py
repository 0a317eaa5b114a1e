"""The README's main job, as the README prints it: `capplan size --traffic
examples/production-mix.yaml` with the shipped profiles gives every figure the README's
abridged output shows (a `…` there stands for what it leaves out); and the choices of
`examples/which-gpu.yaml` (the GPU) and `examples/token-budget.yaml` (the token budget) that
README.md and docs/quickstart.md quote. A refit or a simulator
change that moves a plan fails here until the docs say what the code does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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



WORDS = {3: "three", 4: "four", 5: "five", 6: "six"}


def _sized(traffic: Path, out: Path, *flags: str) -> dict[str, Any]:
    """The one pool of `capplan size --traffic traffic` (its plan written to `out`)."""
    result = CliRunner().invoke(main, ["size", "--traffic", str(traffic), "--out", str(out),
                                       *flags])
    assert result.exit_code == 0, result.output
    pool: dict[str, Any] = json.loads(out.read_text())["pools"][0]
    return pool


def _which_gpu(tmp_path: Path, *flags: str) -> dict[str, Any]:
    return _sized(ROOT / "examples/which-gpu.yaml", tmp_path / "plan.json", *flags)


def test_which_gpus_answers_are_the_docs(tmp_path: Path) -> None:
    """README.md and docs/quickstart.md quote `examples/which-gpu.yaml`'s plans, alone and
    with `--host any` (GPUs and monthly cost of the H100s kept and of the H200s beside them,
    and the GPUs on each host's core); they must be what `capplan size` gives today."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    quick = " ".join((ROOT / "docs" / "quickstart.md").read_text().split())
    alone, anyhost = _which_gpu(tmp_path), _which_gpu(tmp_path, "--host", "any")
    assert alone["gpu"] == anyhost["gpu"] == "h100", "the docs say the H100 wins"
    h200 = [next(r for r in p["runners_up"] if r["gpu"] == "h200") for p in (alone, anyhost)]
    cost = [f"${p['cost']['usd_per_month']:,.0f}" for p in (alone, anyhost)]
    h200_cost = [f"${r['usd_per_month']:,.0f}" for r in h200]
    hosts = {m[2]: int(m[1]) for m in re.finditer(r"(\d+) GPUs on the (\w+) host's core",
                                                  anyhost["reasoning"])}
    wants = [
        (readme, f"the H100s need {anyhost['gpus']} where the median host needs "
                 f"{hosts['median']}"),
        (readme, f"at {cost[1]} a month against {h200[1]['gpus']} H200s' {h200_cost[1]}"),
        (quick, f"keeps {anyhost['gpus']} H100s ({cost[1]} a month), which need "
                f"{hosts['median']} on the median host's core but {hosts['fastest']} on the "
                f"fastest's, over {h200[1]['gpus']} H200s ({h200_cost[1]};"),
        (quick, f"here {WORDS[alone['gpus']]} H100s or {WORDS[h200[0]['gpus']]} H200s hold "
                "the SLOs"),
        (quick, f"{cost[0]} a month against {h200_cost[0]}"),
        (quick, f"With `--host any` the H100s need {WORDS[anyhost['gpus']]} (on the fastest "
                f"traced host's core) and still win, {cost[1]} against {h200_cost[1]}"),
    ]
    stale = [want for text, want in wants if want not in text]
    assert not stale, "the docs' which-gpu figures are stale:\n" + "\n".join(stale)


def _token_budget(tmp_path: Path, *flags: str, gpu: str = "h200") -> dict[int, int]:
    """examples/token-budget.yaml's plan on `gpu`: GPUs at each token budget, the chosen one
    first."""
    src = ROOT / "examples/token-budget.yaml"
    text = src.read_text()
    assert "    gpu: h200\n" in text
    mix = tmp_path / f"token-budget-{gpu}.yaml"
    mix.write_text(text.replace("    gpu: h200\n", f"    gpu: {gpu}\n"))
    pool = _sized(mix, tmp_path / "plan.json", *flags)
    return {p["engine"]["max_num_batched_tokens"]: p["gpus"] for p in [pool, *pool["runners_up"]]}


def test_token_budgets_answers_are_the_docs(tmp_path: Path) -> None:
    """README.md and docs/quickstart.md quote `examples/token-budget.yaml`'s plans: on its
    H200s, on H100s and with `--host any`; they must be what `capplan size` gives today."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    quick = " ".join((ROOT / "docs" / "quickstart.md").read_text().split())
    h200, h100 = _token_budget(tmp_path), _token_budget(tmp_path, gpu="h100")
    anyhost = _token_budget(tmp_path, "--host", "any")
    chosen = next(iter(anyhost))
    wants = [
        (readme, f"a 1,024-token budget needs {h200[1024]} H200s and vLLM's 8,192 needs "
                 f"{h200[8192]} (on the H100, {h100[1024]} against {h100[8192]};"),
        (quick, f"on the H100 sizes {h100[1024]} GPUs at 1,024 tokens (2,048 also "
                f"{h100[2048]}, 4,096 and 8,192 {h100[4096]} each)"),
        (quick, f"`--host any` takes a {chosen:,}-token budget on its {anyhost[chosen]} H200s "
                f"where the median host took 1,024: at 1,024 the slowest traced host's core "
                f"needs {anyhost[1024]}"),
    ]
    assert next(iter(h200)) == next(iter(h100)) == 1024, "the docs say 1,024 tokens win"
    assert h100[4096] == h100[8192], "the quickstart gives 4,096 and 8,192 one count"
    stale = [want for text, want in wants if want not in text]
    assert not stale, "the docs' token-budget figures are stale:\n" + "\n".join(stale)
