"""The HTML report: self-contained, complete, deterministic, and rendered by a real browser."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from capplan.mix import load_mix
from capplan.report import render_report
from capplan.report.cli import report
from capplan.report.runs import QUICK_DURATION_S, QUICK_LOAD_SCALES, LoadPoint, PoolRuns
from capplan.solve.options import size_mix
from capplan.solve.plan import Advice, Candidate, Fidelity, Plan

MIX = """\
schema_version: 1
name: report-small
pools:
  - name: frontdoor
    model: llama-3.1-8b
    precision: bf16
    max_replicas: 8
    engine: {max_model_len: 4096}
workloads:
  - name: chatty
    pool: frontdoor
    arrival: {kind: poisson, rate_rps: 8}
    input_tokens: {kind: lognormal, mean: 500, sigma: 0.5, max: 2048}
    output_tokens: {kind: lognormal, mean: 100, sigma: 0.5, max: 400}
    prefix: {shared_tokens: 128, groups: 4}
    slo: {ttft_p99_s: 0.4, itl_p99_s: 0.03}
  - name: longdocs
    pool: frontdoor
    arrival: {kind: poisson, rate_rps: 1}
    input_tokens: {kind: uniform, low: 1000, high: 3000}
    output_tokens: {kind: constant, value: 120}
    slo: {e2e_p90_s: 10}
simulation: {duration_s: 20, seed: 3}
"""

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
]
_IMG = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Plan, str]:
    d = tmp_path_factory.mktemp("report")
    mix_path = d / "mix.yaml"
    mix_path.write_text(MIX)
    mix = load_mix(mix_path)
    plan = size_mix(mix, quick=True, advice=False)
    plan_path = d / "plan.json"
    plan_path.write_text(plan.to_json())
    page = render_report(plan, mix, duration_s=QUICK_DURATION_S, scales=QUICK_LOAD_SCALES)
    return mix_path, plan_path, plan, page


def test_no_external_references(small: tuple[Path, Path, Plan, str]) -> None:
    """The page needs no network: every src/href is a data: URL or an in-page anchor, no
    script, no stylesheet link, no url(...) outside data:."""
    page = small[3]
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page, flags=re.I)
    assert refs, "expected the figures' data: URLs"
    assert [r for r in refs if not (r.startswith("data:") or r.startswith("#"))] == []
    assert not re.search(r"https?://", page)
    assert "<script" not in page.lower()
    assert not re.search(r"url\((?!data:)", page)


def test_every_pool_and_workload_named(small: tuple[Path, Path, Plan, str]) -> None:
    """A reader finds every pool and every workload of the plan in the report."""
    _, _, plan, page = small
    names = [p.pool for p in plan.pools] + [w.name for p in plan.pools for w in p.workloads]
    assert set(names) == {"frontdoor", "chatty", "longdocs"}
    for name in names:
        assert name in page, name


def test_figures_present_and_drawn(small: tuple[Path, Path, Plan, str]) -> None:
    """Per pool a latency-CDF and a KV figure, plus the load and growth figures: each a real,
    non-blank PNG."""
    import matplotlib.image as mpimg

    _, _, plan, page = small
    imgs = _IMG.findall(page)
    assert len(imgs) == 2 * len(plan.pools) + 2
    for data in imgs:
        raw = base64.b64decode(data)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        px = mpimg.imread(io.BytesIO(raw), format="png")
        assert px.shape[0] > 200 and px.shape[1] > 400
        assert float(px[..., :3].std()) > 0.05  # lines and text, not a blank canvas
    for section in ("Latency against the SLOs", "where the knee is", "GPUs versus traffic growth",
                    "KV cache and prefix caching", "Configuration chosen"):
        assert section in page


def test_analytic_profile_flagged_loudly(small: tuple[Path, Path, Plan, str]) -> None:
    """A pool sized on an analytic (datasheet) profile is called out at the top of the page
    and in its table row; without a mix the page still renders its tables."""
    plan = small[2]
    pool = plan.pools[0].model_copy(update={"profile_source": "analytic"})
    page = render_report(plan.model_copy(update={"pools": [pool]}), None)
    top = page[: page.index("<h2>Plan</h2>")]
    assert "Analytic profile" in top and pool.pool in top
    assert "ANALYTIC – not measured" in page
    assert "<img" not in page and "no traffic mix given" in page


def test_infeasible_pool_shown_at_the_top(small: tuple[Path, Path, Plan, str]) -> None:
    """A pool no replica count can size is named at the top of the page with its reason, and
    the GPU count says it leaves that pool out."""
    from capplan.solve.plan import InfeasiblePool

    plan = small[2]
    x = InfeasiblePool(pool="late", model="llama-3.1-8b", gpu="h200", precision="bf16",
                       reason="no replica count ≤ 64 meets ttft_p99_s ≤ 0.001 s")
    page = render_report(plan.model_copy(update={"infeasible": [x]}), None)
    top = page[: page.index("<h2>Plan</h2>")]
    assert "Infeasible" in top and "<b>late</b>" in top and "ttft_p99_s ≤ 0.001 s" in top
    assert "1 pool(s) infeasible" in top


def test_fidelity_quoted_for_a_pool_that_has_it(small: tuple[Path, Path, Plan, str]) -> None:
    """The binding metric's validated error and the margins it would leave, in the pool's
    card; a pool without one has no such row."""
    plan = small[2]
    bare = plan.pools[0].model_copy(update={"fidelity": None})
    assert "<td>fidelity</td>" not in render_report(plan.model_copy(update={"pools": [bare]}),
                                                   None)
    f = Fidelity(metric="ttft_p99_s", rows=34, p10=-0.25, p90=0.1, worst_under=-0.43,
                 margin_after_p10=0.487, margin_after_worst=0.328)
    pool = plan.pools[0].model_copy(update={"fidelity": f})
    page = render_report(plan.model_copy(update={"pools": [pool]}), None)
    assert "<td>fidelity</td>" in page
    assert "on 34 validation rows" in page and "worst -43%" in page and "48.7% (p10)" in page
    few = Fidelity(metric="e2e_p99_s", rows=3, p10=-0.30, p90=-0.25, worst_under=-0.30,
                   margin_after_p10=None, margin_after_worst=0.61)
    pool = plan.pools[0].model_copy(update={"fidelity": few})
    page = render_report(plan.model_copy(update={"pools": [pool]}), None)
    assert "on 3 validation rows" in page and "their range" in page
    assert "61.0% (the worst of them)" in page and "(p10)" not in page


def test_runners_up_and_advice_shown(small: tuple[Path, Path, Plan, str]) -> None:
    """The configuration section lists the runners-up with why they lost, and the advice."""
    plan = small[2]
    pool = plan.pools[0].model_copy(update={
        "runners_up": [Candidate(precision="fp8", replicas=3, gpus=3, usd_per_month=7665.0,
                                 profile_source="measured", note="dearer: 3 GPUs vs 2")],
        "advice": [Advice(kind="split", message="longdocs in its own pool saves 1 GPU",
                          gpus_saved=1)],
    })
    page = render_report(plan.model_copy(update={"pools": [pool]}), None)
    config = page[page.index("Configuration chosen"):]
    for text in ("runners-up", "fp8", "dearer: 3 GPUs vs 2", "$7,665",
                 "longdocs in its own pool saves 1 GPU", "GPUs saved: 1"):
        assert text in config, text


def test_knee_is_last_pass_and_first_miss() -> None:
    """The knee brackets the first load whose worst SLO margin is negative."""
    pts = [LoadPoint(s, {"a / ttft_p99_s": m, "b / e2e_p90_s": 0.5}, 0.9, 0.1)
           for s, m in ((0.5, 0.6), (1.0, 0.2), (1.5, -0.3), (2.0, -np.inf))]
    assert PoolRuns("p", load=pts).knee == (1.0, 1.5, "a / ttft_p99_s")
    assert PoolRuns("p", load=pts[:2]).knee == (1.0, None, "")
    assert PoolRuns("p", load=pts[2:]).knee == (None, 1.5, "a / ttft_p99_s")


def test_cli_writes_the_same_page_in_parallel(
    small: tuple[Path, Path, Plan, str], tmp_path: Path
) -> None:
    """`capplan report --quick` with two worker processes writes byte for byte the page the
    library renders serially (same seed, same report)."""
    mix_path, plan_path, _, page = small
    out = tmp_path / "r.html"
    res = CliRunner().invoke(report, [str(plan_path), "--traffic", str(mix_path), "--out",
                                      str(out), "--quick", "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output
    assert out.read_text(encoding="utf-8") == page


def test_cli_bad_plan_is_one_line(tmp_path: Path) -> None:
    """A file that is not a plan is a user error: one red line naming the file, exit code 2."""
    bad = tmp_path / "plan.json"
    bad.write_text('{"pools": 3}')
    res = CliRunner().invoke(report, [str(bad), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "error:" in res.output and str(bad) in res.output
    missing = CliRunner().invoke(report, [str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "cannot read plan" in missing.output


def test_cli_plan_errors_read_like_deploys(tmp_path: Path) -> None:
    """Rule: bad input is one line naming the file, the field and the fix. A plan missing a
    key names it as `capplan deploy` does, with no pydantic dump ([type=...], 'For further
    information')."""
    thin = tmp_path / "thin.json"
    thin.write_text('{"schema_version": 1}')
    res = CliRunner().invoke(report, [str(thin), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {thin}: mix: not a capplan plan: required key is missing"
    yaml_plan = tmp_path / "mix.yaml"
    yaml_plan.write_text(MIX)
    res = CliRunner().invoke(report, [str(yaml_plan), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "write one with `capplan size --out plan.json`" in res.output
    assert "type=" not in res.output and "further information" not in res.output


def test_cli_plan_with_an_unknown_model_is_refused(
    small: tuple[Path, Path, Plan, str], tmp_path: Path
) -> None:
    """A plan whose pool names a model capplan does not know is refused, naming the plan and
    the field, as `capplan deploy` refuses it (the report used to be written regardless)."""
    plan = small[2]
    pools = [p.model_copy(update={"model": "llama-9b"}) for p in plan.pools]
    bad = tmp_path / "plan.json"
    bad.write_text(plan.model_copy(update={"pools": pools}).to_json())
    out = tmp_path / "r.html"
    res = CliRunner().invoke(report, [str(bad), "--out", str(out), "--quick"])
    assert res.exit_code == 2, res.output
    assert f"{bad}: pools.0.model:" in res.output and "unknown model 'llama-9b'" in res.output
    assert not out.exists()


def test_cli_refuses_a_mix_the_plan_was_not_sized_for(
    small: tuple[Path, Path, Plan, str], tmp_path: Path
) -> None:
    """`--traffic` of another mix is refused as `deploy` refuses it: the report dropped the
    plan's pools the mix lacked and wrote a page without figures. Without any mix, the page
    holds tables only, and the command says so and why."""
    other = Path(__file__).parents[1] / "examples/chat-only.yaml"
    out = tmp_path / "r.html"
    res = CliRunner().invoke(report, [str(small[1]), "--traffic", str(other), "--out", str(out),
                                      "--quick"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (f"error: {other}: pool 'frontdoor' of the plan is not in the "
                                  "mix; give the traffic mix the plan was sized for")
    assert not out.exists()
    plan = small[2].model_copy(update={"source": str(tmp_path / "gone.yaml")})
    lone = tmp_path / "plan.json"
    lone.write_text(plan.to_json())
    res = CliRunner().invoke(report, [str(lone), "--out", str(out), "--quick"])
    assert res.exit_code == 0 and out.exists(), res.output
    assert f"the plan's traffic mix {tmp_path / 'gone.yaml'} is not here" in res.stderr
    assert "tables only; give --traffic" in res.stderr


def test_cli_out_must_be_html(small: tuple[Path, Path, Plan, str], tmp_path: Path) -> None:
    """`--out r.json` would hold HTML: refused before any simulation, nothing written."""
    out = tmp_path / "r.json"
    res = CliRunner().invoke(report, [str(small[1]), "--out", str(out), "--quick"])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {out}: --out: unknown suffix '.json'; use .html or .htm"
    assert not out.exists()


def test_sweep_rows_marked_infeasible_are_left_off_the_curve(
    small: tuple[Path, Path, Plan, str],
) -> None:
    """`capplan sweep --out` writes a growth no GPU count serves as a row without GPUs (marked
    infeasible); the report's curve takes the simulated points and leaves that row off."""
    from capplan.report.runs import run_all

    mix_path, _, plan, _ = small
    pool = plan.pools[0]
    sweep = [{"growth": plan.growth, "pool": pool.pool, "gpus": pool.gpus},
             {"growth": plan.growth * 50, "pool": pool.pool, "gpus": None}]
    runs = run_all(plan, load_mix(mix_path), duration_s=QUICK_DURATION_S, scales=(),
                   growths=(), sweep=sweep)
    assert runs[pool.pool].sweep == {1.0: pool.gpus}


def test_registered_under_capplan() -> None:
    """`capplan report` resolves to this command through the CLI's lazy registry."""
    from capplan.cli import LAZY_COMMANDS

    assert LAZY_COMMANDS.get("report") == "capplan.report.cli:report"


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("headless Chromium is required for the report's browser test and is not "
                    "on PATH: install it with `apt-get install -y chromium` (Debian)")
    return exe


def _screenshot(exe: str, page: Path, png: Path, profile: Path, size: str) -> list[str]:
    """Chromium's console lines while it loads `page` and writes a screenshot of it."""
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
           f"--window-size={size}", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    log = done.stdout + done.stderr
    assert png.is_file(), f"no screenshot (exit {done.returncode}):\n{log[-2000:]}"
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def test_headless_chromium_renders_without_errors(
    small: tuple[Path, Path, Plan, str], tmp_path: Path
) -> None:
    """In a real browser the report loads with no console message and its figures paint: the
    screenshot is far from blank and holds many coloured (plot-line) pixels. A page with a
    script error proves the console check can fail."""
    import matplotlib.image as mpimg

    exe = _chromium()
    html = tmp_path / "report.html"
    html.write_text(small[3], encoding="utf-8")
    png = tmp_path / "report.png"
    console = _screenshot(exe, html, png, tmp_path / "profile", "1280,2400")
    assert console == []
    px = mpimg.imread(png)[..., :3]
    assert px.shape[:2] == (2400, 1280)
    assert float(px.std()) > 0.1
    rgb = px.reshape(-1, 3)
    saturation = rgb.max(axis=1) - rgb.min(axis=1)
    assert int((saturation > 0.35).sum()) > 5000  # plot lines, bars and SLO markers

    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>x</p><script>notDefined();</script></body></html>")
    caught = _screenshot(exe, bad, tmp_path / "bad.png", tmp_path / "profile2", "400,300")
    assert any("Uncaught" in line for line in caught)
