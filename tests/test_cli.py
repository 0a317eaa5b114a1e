"""CLI layer: bad input ends in one line on stderr and the error's exit code; good input prints
a table or one deterministic JSON document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import polars as pl
import pytest
import yaml
from click.testing import CliRunner, Result

from capplan.cli import CapplanGroup, main
from capplan.errors import ConfigError

MIX = {
    "schema_version": 1,
    "name": "cli-test",
    "pools": [
        {"name": "chat", "model": "llama-3.1-8b", "engine": {"max_model_len": 8192}},
        {"name": "other", "model": "llama-3.2-1b", "engine": {"max_model_len": 8192}},
    ],
    "workloads": [
        {
            "name": "chat",
            "pool": "chat",
            "arrival": {"kind": "poisson", "rate_rps": 2},
            "input_tokens": {"kind": "constant", "value": 256},
            "output_tokens": {"kind": "constant", "value": 32},
            "slo": {"ttft_p99_s": 0.5, "itl_p99_s": 0.05},
        },
        {
            "name": "bg",
            "pool": "other",
            "arrival": {"kind": "poisson", "rate_rps": 1},
            "input_tokens": {"kind": "constant", "value": 128},
            "output_tokens": {"kind": "constant", "value": 16},
        },
    ],
    "simulation": {"duration_s": 30},
}


def write_mix(tmp_path: Path, mix: dict | None = None, name: str = "mix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(mix or MIX, sort_keys=False))
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def sim(path: Path, *extra: str, pool: str = "chat") -> Result:
    return run("simulate", "--traffic", str(path), "--pool", pool, "--replicas", "1",
               "--duration-s", "20", "--seed", "3", *extra)


def assert_one_line_error(res: Result, code: int, *fragments: str) -> str:
    """The error contract: exit code, exactly one `error:` line on stderr, no traceback."""
    assert res.exit_code == code, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in res.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_unknown_yaml_key_names_key_and_file(tmp_path: Path) -> None:
    """A typo in a YAML key is a ConfigError (exit 2) naming the key and the file."""
    bad = json.loads(json.dumps(MIX))
    bad["workloads"][0]["rate_rsp"] = 3
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, "rate_rsp", str(path), "unknown key")


def test_misspelt_key_is_named_before_the_key_it_hides(tmp_path: Path) -> None:
    """A misspelt key makes the intended one look missing too; the error names the typo and
    suggests the key it resembles, rather than reporting the missing one."""
    bad = json.loads(json.dumps(MIX))
    arrival = bad["workloads"][0]["arrival"]
    arrival["rate_rsp"] = arrival.pop("rate_rps")
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, "unknown key 'rate_rsp'",
                          "did you mean 'rate_rps'?", str(path))


def test_negative_rate_is_rejected(tmp_path: Path) -> None:
    """A negative arrival rate is a ConfigError naming the field."""
    bad = json.loads(json.dumps(MIX))
    bad["workloads"][0]["arrival"]["rate_rps"] = -1
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, "rate_rps", str(path))


@pytest.mark.parametrize(("bounds", "fragment"), [
    ({"max": 0}, "output_tokens.lognormal.max"),
    ({"min": 500, "max": 100}, "max (100) must be >= min (500)"),
])
def test_clipped_length_bounds_are_checked(tmp_path: Path, bounds: dict[str, int],
                                           fragment: str) -> None:
    """A normal or lognormal length's [min, max] must hold a token: a max below 1 or below
    the min is a ConfigError, not a workload whose every request asks for nothing."""
    bad = json.loads(json.dumps(MIX))
    bad["workloads"][0]["output_tokens"] = {"kind": "lognormal", "mean": 200, "sigma": 0.7,
                                            **bounds}
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, fragment, str(path))


@pytest.mark.parametrize("command", ["size", "sweep"])
def test_sizing_bad_input_is_one_line_from_a_real_process(tmp_path: Path, command: str) -> None:
    """`size` and `sweep` start worker processes; bad input is refused before they start, so
    no half-started worker prints a traceback of its own as the process exits (only a real
    process shows that: CliRunner does not capture the workers' stderr)."""
    import subprocess
    import sys

    bad = json.loads(json.dumps(MIX))
    bad["pools"][0]["engine"]["max_num_seqs"] = -3
    path = write_mix(tmp_path, bad)
    res = subprocess.run([sys.executable, "-m", "capplan.cli", command, "--traffic", str(path),
                          "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == ConfigError.exit_code
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "max_num_seqs" in lines[0] and str(path) in lines[0]


def test_a_quick_sizing_ends_without_a_workers_traceback() -> None:
    """A sizing done before its worker processes have all started waits for them at exit
    (solve/jobs.py: _close_all): a worker left starting as the process ends would print a
    traceback of its own after the plan."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "capplan.cli", "size", "--traffic",
                          str(Path(__file__).resolve().parents[1] / "examples" / "chat-only.yaml"),
                          "--quick", "--workers", "2"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "plan for" in res.stdout


def test_missing_pool_lists_the_pools(tmp_path: Path) -> None:
    """--pool naming no pool of the mix fails with the list of pools."""
    path = write_mix(tmp_path)
    line = assert_one_line_error(sim(path, pool="nope"), ConfigError.exit_code, "'nope'")
    assert "chat" in line and "other" in line


def test_unreadable_file(tmp_path: Path) -> None:
    """A traffic file that cannot be read fails with its path, not a traceback."""
    missing = tmp_path / "absent.yaml"
    assert_one_line_error(sim(missing), ConfigError.exit_code, str(missing), "cannot read")


def test_not_yaml(tmp_path: Path) -> None:
    """A file that is not YAML fails with one line naming it."""
    path = tmp_path / "broken.yaml"
    path.write_text("pools: [unclosed\n")
    assert_one_line_error(sim(path), ConfigError.exit_code, str(path))


def test_a_key_given_twice_is_refused_not_dropped(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys silently, so a second `workloads:` would drop
    the first's workloads; capplan refuses the file, naming the key and both lines. A merge
    (`<<: *anchor`) may still be overridden, as YAML allows."""
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(MIX, sort_keys=False) + "workloads: []\n")
    line = assert_one_line_error(sim(path), ConfigError.exit_code, str(path),
                                 "'workloads' given twice")
    assert "keep one" in line
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {value: 1, kind: constant}\nover: {<<: *b, value: 2}\n")
    from capplan._yaml import read_mapping
    assert read_mapping(merged)["over"] == {"value": 2, "kind": "constant"}
    twice_json = tmp_path / "twice.json"
    twice_json.write_text('{"pools": [], "pools": []}')
    assert_one_line_error(sim(twice_json), ConfigError.exit_code, str(twice_json),
                          "'pools' given twice")


def test_lengths_over_max_model_len(tmp_path: Path) -> None:
    """A request longer than the pool's max_model_len is refused before simulating."""
    bad = json.loads(json.dumps(MIX))
    bad["workloads"][0]["input_tokens"] = {"kind": "constant", "value": 9000}
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, "max_model_len", str(path))


def test_max_model_len_past_the_models_context(tmp_path: Path) -> None:
    """vLLM 0.26.0 refuses a max_model_len above the model's context length
    (vllm/config/model.py); so does capplan, naming the field and the most it may be."""
    bad = json.loads(json.dumps(MIX))
    bad["pools"][0]["engine"]["max_model_len"] = 200_000
    path = write_mix(tmp_path, bad)
    line = assert_one_line_error(sim(path), ConfigError.exit_code, str(path),
                                 "pools.0.engine.max_model_len", "131072")
    assert "refuses" in line


def test_replicas_must_be_positive(tmp_path: Path) -> None:
    """--replicas 0 is a usage error (click's exit code 2), not a crash."""
    path = write_mix(tmp_path)
    res = run("simulate", "--traffic", str(path), "--pool", "chat", "--replicas", "0")
    assert res.exit_code == 2
    assert "Traceback" not in res.output


def test_json_parses_and_is_deterministic(tmp_path: Path) -> None:
    """--format json prints one JSON document, byte-identical for the same seed."""
    path = write_mix(tmp_path)
    a, b = sim(path, "--format", "json"), sim(path, "--format", "json")
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout
    doc = json.loads(a.stdout)
    assert doc["pool"]["pool"] == "chat" and doc["pool"]["seed"] == 3
    (w,) = doc["workloads"]
    for key in ("name", "requests", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                "e2e_p99_s", "output_tokens_per_s", "prefix_hit_rate"):
        assert key in w, key
    assert w["name"] == "chat" and w["requests"] > 0
    assert set(w["slo_met"]) == {"ttft_p99_s", "itl_p99_s"}
    assert all(isinstance(v, bool) for v in w["slo_met"].values())


def test_json_changes_with_seed(tmp_path: Path) -> None:
    """The seed is the only source of randomness: another seed, another document."""
    path = write_mix(tmp_path)
    a = sim(path, "--format", "json")
    b = run("simulate", "--traffic", str(path), "--pool", "chat", "--replicas", "1",
            "--duration-s", "20", "--seed", "4", "--format", "json")
    assert a.exit_code == b.exit_code == 0
    assert a.stdout != b.stdout


def test_table_names_profile_source(tmp_path: Path) -> None:
    """The table says which profile ran: the measured one where calibration/ has it, and,
    loudly, the analytic estimate where it does not (an FP8 KV cache was measured with BF16
    weights only)."""
    res = sim(write_mix(tmp_path))
    assert res.exit_code == 0, res.output
    assert "h200/llama-3.1-8b/bf16: measured" in res.stdout
    assert "chat" in res.stdout and "ttft_p99_s" in res.stdout
    mix = yaml.safe_load(write_mix(tmp_path).read_text())
    mix["pools"][0].setdefault("engine", {})["kv_cache_dtype"] = "fp8"
    res = sim(write_mix(tmp_path, mix, "kvfp8.yaml"))
    assert res.exit_code == 0, res.output
    assert "h200/llama-3.1-8b/bf16-kvfp8: measured" in res.stdout
    mix["pools"][0]["precision"] = "fp8"
    res = sim(write_mix(tmp_path, mix, "fp8-kvfp8.yaml"))
    assert res.exit_code == 0, res.output
    assert "h200/llama-3.1-8b/fp8-kvfp8" in res.stdout and "ANALYTIC" in res.stdout


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_requests_out(tmp_path: Path, suffix: str) -> None:
    """--requests-out writes one row per measured request."""
    path = write_mix(tmp_path)
    out = tmp_path / f"req{suffix}"
    res = sim(path, "--format", "json", "--requests-out", str(out))
    assert res.exit_code == 0, res.output
    frame = pl.read_csv(out) if suffix == ".csv" else pl.read_parquet(out)
    assert frame.height == json.loads(res.stdout)["workloads"][0]["completed"]


def test_requests_out_unknown_suffix(tmp_path: Path) -> None:
    """An unsupported --requests-out suffix is a ConfigError, not a silent default."""
    path = write_mix(tmp_path)
    assert_one_line_error(
        sim(path, "--requests-out", str(tmp_path / "r.xlsx")), ConfigError.exit_code, ".xlsx"
    )


def test_missing_lazy_command_fails_only_when_used() -> None:
    """A subcommand whose module is missing fails with one line when invoked, and does not
    break the group's help."""

    @click.group(cls=CapplanGroup, lazy={"ghost": "capplan._no_such_module:ghost"})
    def grp() -> None:
        pass

    runner = CliRunner()
    help_res = runner.invoke(grp, ["--help"])
    assert help_res.exit_code == 0 and "ghost" in help_res.output
    res = runner.invoke(grp, ["ghost", "--anything"])
    assert_one_line_error(res, 1, "capplan._no_such_module")


def test_models_lists_every_spec() -> None:
    """`capplan models` lists each shipped model spec with its KV bytes per token."""
    res = run("models")
    assert res.exit_code == 0, res.output
    for name in ("llama-3.1-8b", "llama-3.3-70b", "qwen3-32b", "gemma-4-31b"):
        assert name in res.stdout
    assert "131,072" in res.stdout  # llama-3.1-8b: 32 layers x 8 KV heads x 128 x 2 x 2 B


def test_profiles_runs() -> None:
    """`capplan profiles` always answers, and names the analytic fallback."""
    res = run("profiles")
    assert res.exit_code == 0, res.output
    assert "ANALYTIC" in res.stdout


def test_profiles_show_the_measured_shared_prefix_saving() -> None:
    """Each profile says whether it carries a measured shared-prefix saving, and how much
    (Llama-3.1-8B BF16's prefix-cache engine measured 37 % of its decode_ctx_s)."""
    res = run("profiles")
    assert res.exit_code == 0, res.output
    assert "shared-prefix saving" in res.stdout
    lines = [ln for ln in res.stdout.splitlines() if "llama-3.1-8b" in ln and "│ bf16 " in ln]
    assert "37%" in next(ln for ln in lines if "│ h200 " in ln)
    # the H100's profile ran no prefix-cache engine: no saving, and it says so
    assert "│ -  " in next(ln for ln in lines if "│ h100 " in ln)


def test_profiles_show_which_graph_sizes_were_timed() -> None:
    """Each profile says how many CUDA-graph sizes its graph scan timed: all 35 up to 256 for
    the scanned Llama-3.1-8B BF16, none for its draft-model profile."""
    res = run("profiles")
    assert res.exit_code == 0, res.output
    cells = {ln.split("│")[4].strip(): ln.split("│")[-2].strip()
             for ln in res.stdout.splitlines() if "│ llama-3.1-8b " in ln}
    assert cells["bf16"] == "35" and cells["bf16-draft_model4"] == "-"


def test_version() -> None:
    """--version prints the package version."""
    res = run("--version")
    assert res.exit_code == 0 and "capplan" in res.stdout


def test_profiles_show_a_pictures_encoder_pass() -> None:
    """Gemma 4's profiles show what a step that encodes one picture of the default size
    costs beyond its text, the measured pass and the median step around it (the cell before
    graph sizes); a model without a vision encoder shows -."""
    from capplan.calibrate.store import CALIBRATION_DIR
    from capplan.profile import Profile
    from capplan.steptime import StepTimer

    res = run("profiles")
    assert res.exit_code == 0, res.output
    cells = {(ln.split("│")[3].strip(), ln.split("│")[4].strip()): ln.split("│")[-3].strip()
             for ln in res.stdout.splitlines() if ln.startswith("│ h200")}
    prof = Profile.load(CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "gemma-4-31b" / "fp8"
                        / "profile.json")
    t = StepTimer(prof, max_num_seqs=256, max_num_batched_tokens=8192)
    around = prof.step.encoder_step_s
    assert around > 0
    assert cells[("gemma-4-31b", "fp8")] == f"{(t.encoder_pass_s(280, 1) + around) * 1e3:.1f} ms"
    assert cells[("llama-3.1-8b", "bf16")] == "-"


def test_a_value_a_union_refuses_names_the_field_and_every_choice(tmp_path: Path) -> None:
    """A precision outside Precision | 'auto' names the YAML field as written (no pydantic
    union tags) and every value it takes, on one line."""
    bad = json.loads(json.dumps(MIX))
    bad["pools"][0]["precision"] = "fp4x"
    path = write_mix(tmp_path, bad)
    line = assert_one_line_error(sim(path), ConfigError.exit_code, str(path),
                                 "pools.0.precision: Input should be ")
    assert all(v in line for v in ("'bf16'", "'fp8'", "'nvfp4'", "'awq'", "'auto'"))


@pytest.mark.parametrize(("field", "value", "fragments"), [
    ("gpu", "h900", ("pools.0.gpu: unknown gpu 'h900'; known: ",)),
    ("tp", 3, ("tp: pool 'chat': tp 3 does not divide llama-3.1-8b's 32 attention heads",
               "set tp to 1, 2, 4, 8")),
])
def test_a_pool_vllm_cannot_start_names_file_field_and_fix(
        tmp_path: Path, field: str, value: object, fragments: tuple[str, ...]) -> None:
    """An unknown GPU, or a tensor-parallel size that does not divide the model's attention
    heads (vLLM refuses to start: vllm/config/model.py), is one line naming the file and the
    field, with what to write instead."""
    bad = json.loads(json.dumps(MIX))
    bad["pools"][0][field] = value
    path = write_mix(tmp_path, bad)
    assert_one_line_error(sim(path), ConfigError.exit_code, str(path), *fragments)


def test_profiles_show_the_held_out_error_on_designed_steps() -> None:
    """Beside each profile's held-out error, the same held-out steps less the sweep points'
    drains (provenance `designed_shipped_*`), one line a profile."""
    import json

    from capplan.calibrate.store import CALIBRATION_DIR

    res = run("profiles")
    assert res.exit_code == 0, res.output
    rows = [ln.split("│") for ln in res.stdout.splitlines() if ln.startswith("│ h200")]
    assert rows and all(len(r) == len(rows[0]) for r in rows)
    cells = {(r[3].strip(), r[4].strip()): r[8].strip() for r in rows}
    fit = json.loads((CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "qwen3-32b" / "bf16"
                      / "provenance.json").read_text())["fit"]
    assert cells[("qwen3-32b", "bf16")] == (f"{fit['designed_shipped_median_ape']:.1%} / "
                                            f"{fit['designed_shipped_p95_ape']:.1%}")
    assert "designed steps:" in res.stdout


# -- bad input found by the thirty-sixth session's audit: each a clear line, never a traceback,
# and outputs refused before the work rather than after it


def _mutated(tmp_path: Path, change: Any) -> Path:
    bad = json.loads(json.dumps(MIX))
    change(bad)
    return write_mix(tmp_path, bad)


@pytest.mark.parametrize(("change", "fragments"), [
    (lambda m: m["workloads"][0]["arrival"].update(rate_rps=float("inf")),
     ("workloads.0.arrival.poisson.rate_rps", "finite")),
    (lambda m: m["workloads"][0]["slo"].update(ttft_p100_s=1.0),
     ("ttft_p100_s", "between 0 and 100")),
    (lambda m: m["pools"][0].update(tp=16), ("pools.0.tp", "less than or equal to 8")),
    (lambda m: m["workloads"][0].update(image={"images_per_request": 1, "tokens_per_image": 64}),
     ("workloads.0.image", "no vision encoder")),
    (lambda m: m["workloads"][1].update(pool="chat"), ("pools.1", "'other' serves no workload")),
    (lambda m: m["workloads"][0].update(
        input_tokens={"kind": "lognormal", "mean": 600, "sigma": 0.5, "max": 10}),
     ("input_tokens.lognormal", "mean (600) must lie within")),
    (lambda m: m["pools"][0].update(profile="no-such-profile"),
     ("profile", "no profile at", "capplan profiles")),
])  # fmt: skip
def test_bad_values_are_one_line_naming_the_file(tmp_path: Path, change: Any,
                                                 fragments: tuple[str, ...]) -> None:
    """Values the schema used to let through (an infinite rate, a percentile of 100, TP past
    one node, a picture for a text model, a pool nothing uses, a mean outside its clip, a
    pinned profile that is not there) are each one line naming the traffic file."""
    path = _mutated(tmp_path, change)
    assert_one_line_error(sim(path), ConfigError.exit_code, str(path), *fragments)


@pytest.mark.parametrize(("args", "fragments"), [
    (("size", "--out", "plan.txt"), ("plan.txt", "--out", "use .json or .csv")),
    (("size", "--out", "nodir/plan.json"), ("--out", "folder nodir does not exist")),
    (("size", "--out", "ok.json", "--report", "nodir/r.html"), ("--report", "nodir")),
    (("size", "--out", "/proc/plan.json"), ("--out", "cannot write in folder /proc")),
    (("sweep", "--out", "curve.json"), ("--out", "use .csv")),
    (("sweep", "--out", "curve.csv", "--plot", "nodir/p.png"), ("--plot", "nodir")),
    (("sweep", "--growth", "1,inf"), ("--growth", "finite")),
])  # fmt: skip
def test_outputs_are_checked_before_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               args: tuple[str, ...],
                                               fragments: tuple[str, ...]) -> None:
    """A plan's or curve's output path that cannot be written, or a growth that is not a
    finite number, is refused before any sizing, and no other output is left behind."""
    monkeypatch.chdir(tmp_path)
    path = write_mix(tmp_path)
    res = run(args[0], "--traffic", str(path), "--quick", *args[1:])
    assert_one_line_error(res, ConfigError.exit_code, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mix.yaml"]


def test_growth_must_be_finite(tmp_path: Path) -> None:
    """click's float ranges let inf and nan through; --growth refuses them."""
    path = write_mix(tmp_path)
    for value in ("inf", "nan"):
        res = run("size", "--traffic", str(path), "--growth", value)
        assert res.exit_code == 2 and "not a finite number above 0" in res.output


def test_simulate_refuses_an_endless_load_and_a_bad_requests_out(tmp_path: Path) -> None:
    """A rate that would take hours to simulate, and a --requests-out in no folder, are each
    refused at once."""
    path = _mutated(tmp_path, lambda m: m["workloads"][0]["arrival"].update(rate_rps=1e9))
    assert_one_line_error(sim(path), ConfigError.exit_code, "workloads.0.arrival",
                          "to simulate", "--duration-s")
    good = write_mix(tmp_path, name="good.yaml")
    assert_one_line_error(sim(good, "--requests-out", str(tmp_path / "nodir" / "r.csv")),
                          ConfigError.exit_code, "--requests-out", "does not exist")


def test_a_workload_with_no_request_in_the_window_is_bad_input(tmp_path: Path) -> None:
    """A rate too low for the run's window gave `simulate` a row of "unfinished" percentiles
    and `size` an infeasible pool, blamed on a prefill far inside the limit; now both say no
    request arrived in the window and what to raise."""
    path = _mutated(tmp_path, lambda m: m["workloads"][0]["arrival"].update(rate_rps=1e-4))
    for res in (sim(path), run("size", "--traffic", str(path), "--quick")):
        line = assert_one_line_error(res, ConfigError.exit_code, "workloads.0.arrival",
                                     "no request of workload chat arrived in the measured window",
                                     "requests/s expects", "simulation.duration_s")
        assert "infeasible" not in line and "unfinished" not in line


def test_simulate_without_slos_does_not_call_them_met(tmp_path: Path) -> None:
    """A mix whose workloads set no SLO printed `(no SLO)` on every row, then "all SLOs met"."""
    path = _mutated(tmp_path, lambda m: [w.pop("slo", None) for w in m["workloads"]])
    res = sim(path)
    assert res.exit_code == 0, res.output
    assert "all SLOs met" not in res.output and "no SLOs to check" in res.output
