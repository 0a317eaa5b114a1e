"""The README's promise: from a CSV of one's own requests to a plan and an HTML report in
three commands (after `pip install`)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from click.testing import CliRunner

from capplan.cli import main

TRACE = Path(__file__).resolve().parents[1] / "examples" / "requests.csv"


def test_trace_to_plan_and_report_in_three_commands(tmp_path: Path) -> None:
    """`capplan traffic from-trace ... --slo ...` then `capplan size ... --report ...` give a
    traffic file with the SLOs, a plan sized against them and a self-contained report."""
    runner = CliRunner()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        fit = runner.invoke(main, ["traffic", "from-trace", str(TRACE), "--slo", "ttft_p99_s=0.5",
                                   "--slo", "itl_p99_s=0.05", "--out", "mix.yaml"])
        assert fit.exit_code == 0, fit.output
        mix = yaml.safe_load(Path("mix.yaml").read_text())
        assert mix["workloads"][0]["slo"] == {"ttft_p99_s": 0.5, "itl_p99_s": 0.05}
        size = runner.invoke(main, ["size", "--traffic", "mix.yaml", "--quick",
                                    "--out", "plan.json", "--report", "report.html"])
        assert size.exit_code == 0, size.output
        assert "ttft_p99_s" in size.output and "itl_p99_s" in size.output
        page = Path("report.html").read_text()
        assert page.startswith("<!DOCTYPE html>") or page.lstrip().lower().startswith("<!doctype")
        assert "default" in page and "requests" in page
        assert "http://" not in page and "https://" not in page
    finally:
        os.chdir(cwd)


def test_bad_slo_flag_is_one_line(tmp_path: Path) -> None:
    """A malformed --slo names the flag and the expected form; nothing is written."""
    out = tmp_path / "mix.yaml"
    res = CliRunner().invoke(main, ["traffic", "from-trace", str(TRACE), "--slo", "ttft_p99_s",
                                    "--out", str(out)])
    assert res.exit_code == 2
    assert "--slo" in res.output and "KEY=SECONDS" in res.output
    assert not out.exists()


def test_size_verbose_explains_each_search_step() -> None:
    """`capplan size --verbose` tells, on stderr, every simulation of the search and what it
    found, so a person can follow why the answer is what it is."""
    mix = Path(__file__).resolve().parents[1] / "examples" / "chat-only.yaml"
    res = CliRunner().invoke(main, ["size", "--traffic", str(mix), "--quick", "--verbose"])
    assert res.exit_code == 0, res.output
    steps = [line for line in res.stderr.splitlines() if "replica(s)" in line]
    assert steps, res.stderr
    assert all("seed" in line and ("meets every SLO" in line or "misses" in line)
               for line in steps)
    assert "plan for" in res.stdout
