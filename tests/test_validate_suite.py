"""`capplan validate` on the CPU: suites, jobs for the GPU runner, storing and comparing.

The property everything rests on: the requests the runner sends are the requests the
simulator predicts, drawn by the same generators from the same seed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from click.testing import CliRunner

from capplan.cli import main
from capplan.errors import CalibrationError, ConfigError
from capplan.sim.run import simulate
from capplan.validate.compare import experiment_key
from capplan.validate.store import load_run, stored_runs
from capplan.validate.suite import (
    HARNESS_SEND_S,
    EngineRun,
    emit_job,
    experiment_job,
    load_suite,
)

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "validation" / "h200.yaml"


@pytest.fixture(scope="module")
def suite():
    return load_suite(SUITE)


def _exp(run: EngineRun, name: str):
    return next(e for e in run.experiments if e.name == name)


def test_open_loop_job_sends_exactly_the_simulated_arrivals(suite) -> None:
    run = suite.engine("llama-3.1-8b-bf16")
    exp = _exp(run, "chatlog-p12")
    job = experiment_job(run, exp, exp.name)
    w = job["workloads"][0]
    arrivals = np.array(w["arrival_s"])
    measured = arrivals < exp.duration_s
    res = simulate(run.mix(exp), "validate", 1)
    sim = res.requests().sort("arrival_s")
    assert len(sim) == measured.sum()
    # the runner's one client sends a request at a time, HARNESS_SEND_S apart at least
    sent = arrivals.copy()
    for i in range(1, len(sent)):
        sent[i] = max(sent[i], sent[i - 1] + HARNESS_SEND_S)
    assert (sent > arrivals).any()
    assert sim["arrival_s"].to_numpy() == pytest.approx(sent[measured], abs=1e-6)
    assert sim["input_tokens"].to_list() == list(np.array(w["input_tokens"])[measured])
    assert sim["output_tokens"].to_list() == list(np.array(w["output_tokens"])[measured])


def test_closed_loop_job_rows_are_the_simulated_draws(suite) -> None:
    run = suite.engine("llama-3.1-8b-bf16")
    exp = _exp(run, "chat-c16")
    w = experiment_job(run, exp, "x")["workloads"][0]
    assert w["kind"] == "closed" and w["concurrency"] == 16
    res = simulate(run.mix(exp), "validate", 1)
    n = len(res.requests())
    assert n > 16
    # constant shapes here; the draws' order is what the sampler's rng gives both sides
    assert set(w["input_tokens"][:n]) == {512} and set(w["output_tokens"][:n]) == {128}


def test_prefix_caching_off_is_salted_and_predicted_without_cache(suite) -> None:
    run = suite.engine("llama-3.1-8b-bf16")
    exp = _exp(run, "prefix90-off-c16")
    assert experiment_job(run, exp, "x")["prefix_caching"] is False
    assert run.mix(exp).pools[0].engine.enable_prefix_caching is False


def test_engine_kwargs_pin_what_the_simulator_reads(suite, tmp_path) -> None:
    job = emit_job(suite.engine("llama-3.1-8b-bf16-draft4"), Path("models"), tmp_path)
    eng = job["engine"]
    for key in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                "enable_prefix_caching", "scheduling_policy", "async_scheduling",
                "max_model_len", "kv_cache_dtype"):
        assert key in eng
    assert eng["load_format"] == "dummy" and eng["skip_tokenizer_init"] is True
    assert eng["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 4,
                                         "model": "models/llama-3.2-1b"}
    assert [e["name"] for e in job["experiments"] if e.get("warmup")] == ["warmup-c1", "warmup"]
    assert job["experiments"][0]["workloads"][0]["concurrency"] == 1


def test_synthetic_acceptance_asks_vllm_for_the_simulators_draws(suite, tmp_path) -> None:
    """vLLM's synthetic rejection sampler takes the unconditional rate of the first i drafts
    all accepted; alpha ** i gives alpha at every position, the simulator's geometric draw.
    The prediction before the run uses it; after, the acceptance vLLM reported."""
    run = suite.engine("llama-3.1-8b-bf16-draft4").model_copy(
        update={"synthetic_acceptance": 0.7})
    sc = emit_job(run, Path("models"), tmp_path)["engine"]["speculative_config"]
    assert sc["rejection_sample_method"] == "synthetic"
    assert sc["synthetic_acceptance_rates"] == pytest.approx([0.7, 0.49, 0.343, 0.2401])
    exp = run.experiments[0]
    assert {w.spec_acceptance for w in run.mix(exp).workloads} == {0.7}
    assert {w.spec_acceptance for w in run.mix(exp, 0.05).workloads} == {0.05}
    plain = suite.engine("llama-3.1-8b-bf16-draft4")
    # without it the engine serves dummy weights, whose drafts are not accepted: predicted
    # at none before the run, not at the workload's published default
    assert {w.spec_acceptance for w in plain.mix(exp).workloads} == {0.0}
    assert "rejection_sample_method" not in emit_job(
        plain, Path("models"), tmp_path)["engine"]["speculative_config"]
    # the same engine and experiment at another acceptance is another experiment, not a
    # repeat whose spread is the measurement's noise
    assert experiment_key(run, exp) != experiment_key(plain, exp)


def test_synthetic_acceptance_without_speculation_is_refused(suite) -> None:
    data = suite.engine("llama-3.1-8b-bf16").model_dump()
    with pytest.raises(ValueError, match="synthetic_acceptance needs speculative decoding"):
        EngineRun.model_validate({**data, "synthetic_acceptance": 0.7})


def test_quantized_engines_get_a_config_with_quantization(suite, tmp_path) -> None:
    run = suite.engine("qwen3-32b-bf16").model_copy(deep=True)
    pool = run.pool.model_copy(update={"precision": "awq"})
    awq = run.model_copy(update={"pool": pool})
    job = emit_job(awq, Path("models"), tmp_path)
    cfg = json.loads((Path(job["engine"]["model"]) / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"


def test_suite_errors_name_the_field(tmp_path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text(SUITE.read_text().replace("duration_s: 20", "durations_s: 20", 1))
    with pytest.raises(ConfigError) as e:
        load_suite(bad)
    assert "durations_s" in str(e.value) and str(bad) in str(e.value)


def test_stored_runs_round_trip_to_the_suite(suite) -> None:
    """Every stored run is its GPU's suite's engine (validation/<gpu>.yaml), with its runs."""
    suites = {"h200": suite, "h100": load_suite(ROOT / "validation" / "h100.yaml")}
    for folder in stored_runs():
        run, reqs, measured = load_run(folder)
        assert run == suites[folder.parts[-5]].engine(run.name)
        assert set(reqs["run"].unique()) <= {r for e in run.experiments for r in e.runs()}
        assert measured["engine"]["kv_tokens"] > 0


@pytest.mark.parametrize(("old", "new", "fragments"), [
    ("gpu: h100\n", "gpu: a100\n", ("gpu: unknown gpu 'a100'",)),
    ("vllm: 0.26.0", "vllm: 0.11.0", ("capplan models vLLM 0.26.0",)),
    ("gpu: h100\n", "gpu: h200\n", ("engines.0.pool.gpu", "one suite measures one GPU")),
    ("model: llama-3.1-8b", "model: llama-9b", ("engines.0.pool.model", "unknown model")),
])  # fmt: skip
def test_suite_header_and_engines_are_checked(tmp_path, old, new, fragments) -> None:
    """A suite measures one GPU on vLLM 0.26.0, with models capplan knows: anything else is
    an error naming the suite and the field, before a job is emitted or a row predicted."""
    text = (ROOT / "validation" / "h100.yaml").read_text()
    assert old in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as e:
        load_suite(bad)
    assert str(bad) in str(e.value) and all(f in str(e.value) for f in fragments), str(e.value)


def test_suite_engine_names_are_unique_and_emit_checks_its_folder(tmp_path) -> None:
    """Two engine runs of one name would write one job file over the other; an --out that is
    a file, or an --engine the suite lacks, is one line and makes no folder."""
    suite = yaml.safe_load(SUITE.read_text())
    suite["engines"].append(suite["engines"][0])
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump(suite))
    with pytest.raises(ConfigError, match="names two engine runs"):
        load_suite(bad)
    cli = CliRunner()
    (tmp_path / "afile").write_text("x")
    out = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path / "afile")])
    assert out.exit_code == 2 and "--out names the folder" in out.output
    out = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path / "jobs"),
                            "--engine", "nosuch"])
    assert out.exit_code == 2 and not (tmp_path / "jobs").exists()
    out = cli.invoke(main, ["validate", "compare", "--format", "csv", "--out",
                            str(tmp_path / "nodir" / "c.csv")])
    assert out.exit_code == 2 and "does not exist" in out.output  # before any prediction


def test_cli_emit_and_compare(tmp_path) -> None:
    cli = CliRunner()
    out = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path),
                            "--engine", "llama-3.1-8b-bf16-seqs8"])
    assert out.exit_code == 0, out.output
    job = json.loads((tmp_path / "llama-3.1-8b-bf16-seqs8.json").read_text())
    assert [e["name"] for e in job["experiments"]] == ["warmup-c1", "warmup", "chat-c4",
                                                        "chat-c16", "chat-c32"]
    assert job["experiments"][1]["workloads"][0]["concurrency"] == 32  # the peak it will see
    # the model's longest stored engine start, for gpu_validate.sh to leave time for
    starts = [s["engine_start_s"] for f in stored_runs()
              if f.parts[-3] == "llama-3.1-8b" and f.parts[-5] == "h200"
              for s in json.loads((f / "provenance.json").read_text())["starts"]
              if s.get("engine_start_s")]
    assert job["expected_start_s"] == max(starts) > 0
    # an engine with no prediction recorded is named, with the command that records one
    assert ("llama-3.1-8b-bf16-seqs8: no prediction recorded before its run; record one now: "
            "capplan validate predict") in out.output
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "llama-3.1-8b-bf16-seqs8.json").write_text("{}")
    again = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path),
                              "--engine", "llama-3.1-8b-bf16-seqs8", "--queued",
                              str(tmp_path / "q")])
    assert again.exit_code == 0 and "no prediction recorded" not in again.output
    # compare on a copy holding one stored run only (fast)
    root = tmp_path / "cal"
    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16-seqs8")
    dst = root / "h200/vllm-0.26.0/llama-3.1-8b/validation" / src.name
    shutil.copytree(src, dst)
    out = cli.invoke(main, ["validate", "compare", "--root", str(root), "--format", "csv"])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].startswith("engine,") and len(lines) == 4
    assert not out.output.endswith("\n\n"), "no blank line: a CSV reader takes it for a row"


def test_cli_ingest_of_a_folder_without_runs_is_one_line(tmp_path) -> None:
    out = CliRunner().invoke(main, ["validate", "ingest", str(SUITE), str(tmp_path),
                                    "--root", str(tmp_path / "cal")])
    assert out.exit_code != 0
    assert "no runner output" in out.output and len(out.output.strip().splitlines()) == 1


def test_cli_measure_without_vllm_is_one_line() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    out = CliRunner().invoke(main, ["validate", "measure", str(SUITE), "--engine",
                                    "llama-3.1-8b-bf16-seqs8"])
    assert out.exit_code == 4
    assert "vLLM is not installed here" in out.output
    assert len(out.output.strip().splitlines()) == 1


def _raw_from_stored(stored: Path, raw: Path, runs: list[str], *, finished: bool = True) -> None:
    """A runner output folder rebuilt from stored measurements (real rows, real engine
    facts), holding only `runs`; `finished=False` leaves them as a start cut off mid-run."""
    _, reqs, measured = load_run(stored)
    prov = json.loads((stored / "provenance.json").read_text())
    raw.mkdir(parents=True)
    exps = {}
    for name in runs:
        rows = reqs.filter(pl.col("run") == name)
        index = {w: i for i, w in enumerate(rows["workload"].unique(maintain_order=True))}
        with open(raw / f"{name}.jsonl", "w") as f:
            for r in rows.iter_rows(named=True):
                f.write(json.dumps({**r, "workload": index[r["workload"]]}) + "\n")
        info = {k: v for k, v in measured["runs"][name].items() if k != "engine_start"}
        exps[name] = info if finished else {}
    meta = {"job": stored.name, "argv": ["runner.py"], "started_unix": 1.8e9,
            "finished_unix": 1.8e9 + 60,
            "versions": {k: prov[k] for k in ("gpu_name", "driver", "cuda", "torch", "vllm")},
            "engine_kwargs": prov["engine_kwargs"], "engine": measured["engine"],
            "experiments": exps}
    (raw / "engine.json").write_text(json.dumps(meta))


def test_measure_runs_stores_and_compares(suite, tmp_path, monkeypatch) -> None:
    """`capplan validate measure` on a GPU host: the runner (here, a stand-in writing what a
    stored run measured) runs each engine, its output is stored, and the stored runs are
    compared, in one command that exits 0 (its closing compare had lost an argument)."""
    import importlib.util
    import subprocess

    name = "llama-3.1-8b-bf16-seqs8"
    src = next(p for p in stored_runs() if p.name == name)
    runs = [n for e in suite.engine(name).experiments for n in e.runs()]

    def runner(cmd: list[str]) -> int:
        _raw_from_stored(src, Path(cmd[cmd.index("--out") + 1]), runs)
        return 0

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n == "vllm" else real(n, *a))
    monkeypatch.setattr(subprocess, "call", runner)
    root = tmp_path / "cal"
    res = CliRunner().invoke(main, ["validate", "measure", str(SUITE), "--engine", name,
                                    "--root", str(root)])
    assert res.exit_code == 0, res.output
    (stored,) = stored_runs(root)
    assert load_run(stored)[2]["runs"].keys() == set(runs) and "chat-c32" in res.output


def test_ingest_adds_new_runs_to_what_is_stored(suite, tmp_path) -> None:
    """`emit --missing` measures only runs not yet stored; ingest keeps the stored ones and
    takes a run from the first start that finished it (not one cut off mid-run)."""
    from capplan.validate.store import ingest

    run = suite.engine("llama-3.1-8b-bf16-seqs8")
    src = next(p for p in stored_runs() if p.name == run.name)
    root = tmp_path / "cal"
    dest = root / "h200/vllm-0.26.0/llama-3.1-8b/validation" / run.name
    # stored: chat-c4 and chat-c16 only (what an earlier session measured)
    ingest([_make(tmp_path / "old", src, ["chat-c4", "chat-c16"])], run, root)
    from capplan.validate.report import unmeasured_lines

    assert unmeasured_lines([dest]) == [f"- {run.name}: chat-c32"]  # the page names the gap
    cli = CliRunner()
    out = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path / "jobs"),
                            "--engine", run.name, "--missing", "--root", str(root)])
    assert out.exit_code == 0, out.output
    job = json.loads((tmp_path / "jobs" / f"{run.name}.json").read_text())
    assert [e["name"] for e in job["experiments"] if not e.get("warmup")] == ["chat-c32"]

    cut = tmp_path / "new" / "a" / run.name  # a start cut off during chat-c32 ...
    _raw_from_stored(src, cut, ["chat-c32"], finished=False)
    again = tmp_path / "new" / "b" / run.name  # ... and the start that finished it
    _raw_from_stored(src, again, ["chat-c32"])
    ingest([cut, again], run, root)
    _, reqs, measured = load_run(dest)
    _, truth, _ = load_run(src)
    assert list(measured["runs"]) == ["chat-c4", "chat-c16", "chat-c32"]
    starts = json.loads((dest / "provenance.json").read_text())["starts"]
    assert len(starts) == 3 and measured["runs"]["chat-c32"]["engine_start"] == 2
    assert measured["runs"]["chat-c4"]["engine_start"] == 0
    for name in ("chat-c4", "chat-c16", "chat-c32"):
        got = reqs.filter(pl.col("run") == name).drop("run", "experiment")
        want = truth.filter(pl.col("run") == name).drop("run", "experiment")
        assert got.equals(want), name
    out = cli.invoke(main, ["validate", "emit", str(SUITE), "--out", str(tmp_path / "jobs2"),
                            "--engine", run.name, "--missing", "--root", str(root)])
    assert out.exit_code == 0 and "every run already stored" in out.output
    assert unmeasured_lines([dest]) == ["- none"]


def _make(raw: Path, src: Path, runs: list[str]) -> Path:
    _raw_from_stored(src, raw / src.name, runs)
    return raw / src.name


def test_gemma_engines_run_text_only_with_their_overrides(tmp_path) -> None:
    """The Gemma 4 engines (h200.yaml's, the second with its MTP drafter) start
    text-only, as their profiles were calibrated, and pass the config fixes the model spec
    says vLLM 0.26.0 needs; the MTP engine names the drafter's folder as the speculative model."""
    root = Path(__file__).resolve().parents[1] / "validation"
    grid = load_suite(root / "h200.yaml").engine("gemma-4-31b-fp8")
    mtp = load_suite(root / "h200.yaml").engine("gemma-4-31b-fp8-mtp4")
    for run in (grid, mtp):
        eng = emit_job(run, Path("models"), tmp_path)["engine"]
        assert eng["limit_mm_per_prompt"] == {"image": 0}
        assert eng["quantization"] == "fp8"
        assert eng["hf_overrides"] == {"text_config": {"global_head_dim": 512,
                                                       "num_global_key_value_heads": 4}}
    assert emit_job(mtp, Path("models"), tmp_path)["engine"]["speculative_config"] == {
        "method": "mtp", "num_speculative_tokens": 4, "model": "models/gemma-4-31b-assistant"}


def test_vllm_patches_are_plain_python() -> None:
    """The GPU runners read src/capplan/vllm_patches.py by path: it may import only vllm
    (inside its functions) and the standard library."""
    import runpy

    path = Path(__file__).resolve().parents[1] / "src" / "capplan" / "vllm_patches.py"
    text = path.read_text()
    imports = {ln.split()[1].split(".")[0] for ln in text.splitlines()
               if ln.strip().startswith(("import ", "from "))}
    assert imports <= {"vllm", *sys.stdlib_module_names}
    runpy.run_path(str(path))["apply_all"]()  # without vllm: a no-op, not an error


def test_config_overrides_apply_as_vllm_applies_a_dict() -> None:
    """The drafter gets the target's hf_overrides through this callable: a nested dict
    updates the sub-config of that name; a config without it (vLLM's placeholder, used to
    learn the model type) is left alone; a flat key is set."""
    import runpy
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[1] / "src" / "capplan" / "vllm_patches.py"
    overrides = runpy.run_path(str(path))["ConfigOverrides"](
        {"text_config": {"global_head_dim": 512, "num_global_key_value_heads": 4}, "x": 1})
    cfg = SimpleNamespace(text_config=SimpleNamespace(head_dim=256))
    out = overrides(cfg)
    assert out is cfg and cfg.x == 1
    assert vars(cfg.text_config) == {"head_dim": 256, "global_head_dim": 512,
                                     "num_global_key_value_heads": 4}
    bare = overrides(SimpleNamespace(model_type="dummy_gemma4_assistant"))
    assert not hasattr(bare, "text_config") and bare.model_type == "dummy_gemma4_assistant"



def test_the_next_sessions_suites_load() -> None:
    """validation/h200-next.yaml and h100-next.yaml, the engines queued for the next GPU
    sessions, are valid suites of their GPU (the CI gate requires only the engines of
    h200.yaml to be stored), whose every pool runs on that GPU."""
    from pathlib import Path

    from capplan.validate.suite import load_suite

    for gpu in ("h200", "h100"):
        suite = load_suite(Path(__file__).resolve().parents[1] / "validation" / f"{gpu}-next.yaml")
        assert suite.engines and suite.gpu == gpu
        assert {e.pool.gpu for e in suite.engines} == {gpu}


def test_stored_chunk_times_round_trip_to_the_microsecond(tmp_path) -> None:
    """requests.parquet keeps streamed-chunk times as microsecond deltas (store.write_requests);
    read back they are the seconds after the send the runner recorded, to the microsecond,
    empty streams included, and a folder in the older float layout reads the same."""
    import numpy as np
    import polars as pl

    from capplan.validate.store import read_requests, write_requests

    chunks = [[0.094369, 0.109508, 0.124916, 17.503211], [], [1e-6]]
    reqs = pl.DataFrame({"run": ["a", "b", "c"], "chunk_t": chunks},
                        schema_overrides={"chunk_t": pl.List(pl.Float64)})
    write_requests(reqs, tmp_path / "requests.parquet")
    assert "chunk_us" in pl.read_parquet(tmp_path / "requests.parquet").columns
    back = read_requests(tmp_path)
    assert back.columns == reqs.columns and back.schema == reqs.schema
    for got, want in zip(back["chunk_t"].to_list(), chunks, strict=True):
        assert np.allclose(got, want, rtol=0, atol=5e-7) and len(got) == len(want)
    reqs.with_columns(pl.col("chunk_t").cast(pl.List(pl.Float32))).write_parquet(
        tmp_path / "requests.parquet")
    old = read_requests(tmp_path)
    assert old.schema == reqs.schema


def _one_engine_suite(folder: Path) -> Path:
    """A suite of one engine, `t`, with one closed-loop chat experiment, `c1`."""
    path = folder / "suite.yaml"
    path.write_text(
        "schema_version: 1\ngpu: h200\nvllm: 0.26.0\nengines:\n"
        "  - name: t\n"
        "    pool: {name: v, model: llama-3.1-8b, precision: bf16, engine: {max_model_len: 8192}}\n"
        "    experiments:\n"
        "      - {name: c1, duration_s: 5, workloads: [{pool: validate, name: chat, "
        "input_tokens: {kind: constant, value: 512}, output_tokens: {kind: constant, value: 32}, "
        "arrival: {kind: closed, concurrency: 1}}]}\n")
    return path


def test_predict_prints_what_compare_will_hold_the_engine_to(tmp_path) -> None:
    """`capplan validate predict SUITE` gives, per engine, run and workload, the figures the
    simulator predicts for an experiment not yet measured: compare.predict's, as a table or
    CSV, and on stderr what each engine's prediction rests on (the profile and its KV tokens,
    to check against the engine's log); an unknown engine is one line."""
    import polars as pl
    from click.testing import CliRunner

    from capplan.cli import main
    from capplan.validate.compare import predict, predict_pool

    path = _one_engine_suite(tmp_path)
    res = CliRunner().invoke(main, ["validate", "predict", str(path), "--format", "csv"])
    assert res.exit_code == 0, res.output
    (row,) = pl.read_csv(res.stdout.encode()).iter_rows(named=True)
    want, pool = predict_pool(load_suite(path).engine("t"), "c1", None)
    assert res.stderr == (f"t: profile {pool.profile} ({pool.profile_source}), "
                          f"{pool.kv_tokens_per_replica:,} KV tokens at "
                          "gpu_memory_utilization 0.92\n")
    assert want == predict(load_suite(path).engine("t"), "c1", None)
    want = want["chat"]
    assert (row["engine"], row["run"], row["workload"]) == ("t", "c1", "chat")
    assert row["ttft_p50_s"] == pytest.approx(want["ttft_p50_s"])
    assert row["itl_p99_s"] == pytest.approx(want["itl_p99_s"])
    table = CliRunner().invoke(main, ["validate", "predict", str(path)])
    assert table.exit_code == 0 and "TTFT p99" in table.output and "ttft_p99_s" not in table.output
    bad = CliRunner().invoke(main, ["validate", "predict", str(path), "--engine", "nope"])
    assert bad.exit_code != 0 and len(bad.output.strip().splitlines()) == 1


def test_predictions_are_recorded_once_and_before_the_measurement(suite, tmp_path) -> None:
    """`predict --record DIR` writes each engine's predictions with the date and commit;
    recording it again, or recording an engine already measured, is one line and writes
    nothing; and the docs' generated block holds a measured engine to what was recorded."""
    from capplan.validate import queued
    from capplan.validate.compare import compare_run
    from capplan.validate.report import queued_lines

    path = _one_engine_suite(tmp_path)
    rec = tmp_path / "queued"
    args = ["validate", "predict", str(path), "--record", str(rec), "--root", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    (got,) = queued.load(rec).values()
    assert got["engine"] == "t" and got["recorded"] and "git_commit" in got
    assert got["predictions"]["c1"]["chat"]["ttft_p50_s"] > 0
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "recorded once" in again.output
    assert len(again.output.strip().splitlines()) == 1
    measured = CliRunner().invoke(main, ["validate", "predict", str(SUITE), "--engine",
                                         "llama-3.1-8b-bf16", "--record", str(rec)])
    assert measured.exit_code != 0 and "measured already" in measured.output
    assert not (rec / "llama-3.1-8b-bf16.json").exists()
    # a stored engine held to a recording: exactly on the prediction, then 10 % over it
    (folder,) = [f for f in stored_runs() if f.name == "llama-3.1-8b-bf16-draft4"]
    rows = compare_run(folder)
    on = {"t": {}, "llama-3.1-8b-bf16-draft4": {"predictions": {
        r.experiment: {r.workload: dict(r.measured)} for r in rows},
        "recorded": "2026-12-01T00:00:00+00:00", "git_commit": None}}
    lines = queued_lines(rows, on)
    assert lines[0].startswith(f"{len(rows)} rows of 1 engines")
    assert f"| throughput | ±5% | {len(rows)} / {len(rows)} | 0.0% |" in lines
    over = {"llama-3.1-8b-bf16-draft4": {"predictions": {
        r.experiment: {r.workload: {m: v * 1.1 for m, v in r.measured.items()}}
        for r in rows}, "recorded": "2026-12-02T00:00:00+00:00", "git_commit": "abc1234"}}
    lines = queued_lines(rows, over)
    assert f"| throughput | ±5% | 0 / {len(rows)} | 10.0% |" in lines
    assert "- llama-3.1-8b-bf16-draft4: recorded 2026-12-02T00:00:00+00:00 at abc1234" in lines
    # row by row: the recorded figure 10 % over, and today's prediction after the arrow
    # where it has moved from the recording
    (c1,) = [x for x in lines if x.startswith("| llama-3.1-8b-bf16-draft4 | chat-c1 | chat |")]
    assert "(+10%) ✗ →" in c1
    same = {"llama-3.1-8b-bf16-draft4": {"predictions": {
        r.experiment: {r.workload: dict(r.predicted)} for r in rows},
        "recorded": "2026-12-02T00:00:00+00:00", "git_commit": None}}
    assert all("→" not in x for x in queued_lines(rows, same) if x.startswith("| llama"))
    assert queued_lines(rows, {})[0].startswith("- none yet")


def test_ingest_stores_a_traced_engines_core_trace_where_asked(tmp_path) -> None:
    """`ingest --core-traces DIR` packs the runner's core trace (trace_core) beside the
    stored run, as corelaunch.py reads it; an engine without one stores none."""
    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16-seqs8")
    raw = _make(tmp_path / "raw", src, ["chat-c4"])
    args = ["validate", "ingest", str(SUITE), str(tmp_path / "raw"), "--engine", src.name,
            "--root", str(tmp_path / "cal"), "--core-traces", str(tmp_path / "traces")]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "core trace" not in out.output and not (tmp_path / "traces").exists()
    (raw / "coretrace").mkdir()
    (raw / "coretrace" / "core-9.jsonl").write_text(
        '["execute_model", "MainThread", 5.0, 5.01]\n')
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    from capplan.validate.corelaunch import read_trace

    trace = read_trace(tmp_path / "traces" / f"{src.name}.parquet")
    meta = json.loads((tmp_path / "traces" / f"{src.name}.json").read_text())
    assert trace.rows() == [(9, "execute_model", "MainThread", 0, 10_000)]
    assert "dt_us" in pl.read_parquet(tmp_path / "traces" / f"{src.name}.parquet").columns
    assert meta["engine"] == src.name and meta["clock_base_s"] == 5.0


def test_ingest_stores_the_trace_of_the_start_that_measured(tmp_path) -> None:
    """An engine started, stopped for want of time after its warm-ups alone, and started
    again (scripts/gpu_validate.sh's start2/): the core trace stored is the second start's,
    whose clock the measured experiments share, not the first's (twenty-first session)."""
    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16-seqs8")
    first = tmp_path / "raw" / src.name
    _raw_from_stored(src, first, [])
    (first / "warmup.jsonl").write_text("")
    second = _make(tmp_path / "raw" / "start2", src, ["chat-c4"])
    traces = _ingest_traced(tmp_path, src, [(first, 5.0), (second, 7.0)])
    meta = json.loads((traces / f"{src.name}.json").read_text())
    assert meta["clock_base_s"] == 7.0


def _ingest_traced(tmp_path: Path, src: Path, starts: list[tuple[Path, float]]) -> Path:
    """Give each start's raw folder a one-span core trace at its clock base, ingest them
    all with --core-traces, and return the traces' folder."""
    for folder, t0 in starts:
        (folder / "coretrace").mkdir()
        (folder / "coretrace" / "core-9.jsonl").write_text(
            f'["execute_model", "MainThread", {t0}, {t0 + 0.01}]\n')
    out = CliRunner().invoke(main, [
        "validate", "ingest", str(SUITE), str(tmp_path / "raw"), "--engine", src.name,
        "--root", str(tmp_path / "cal"), "--core-traces", str(tmp_path / "traces")])
    assert out.exit_code == 0, out.output
    return tmp_path / "traces"


def test_ingest_keeps_the_trace_of_every_start_that_measured(tmp_path) -> None:
    """An engine whose experiments were measured over two starts (two hosts: the
    twenty-fifth session's gemma-4-31b-fp8-routed3) keeps each start's trace, the second as
    `<engine>.start2`: a trace's clock is its own start's, so one file cannot hold both."""
    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16-seqs8")
    first = _make(tmp_path / "raw" / "start1", src, ["chat-c4"])
    second = _make(tmp_path / "raw" / "start2", src, ["chat-c16"])
    traces = _ingest_traced(tmp_path, src, [(first, 5.0), (second, 7.0)])
    bases = [json.loads((traces / f"{stem}.json").read_text())["clock_base_s"]
             for stem in (src.name, f"{src.name}.start2")]
    assert bases == [5.0, 7.0]


def test_ingest_passes_over_a_start_that_never_started(tmp_path) -> None:
    """A first start cut by its call's deadline inside the engine's compile leaves an
    engine.json with only the error (twenty-third session); ingest takes the start that
    measured and lists the failed one in the provenance. Alone, it is an error."""
    from capplan.validate.store import ingest

    src = next(p for p in stored_runs() if p.name == "llama-3.1-8b-bf16-seqs8")
    run = load_suite(SUITE).engine(src.name)
    failed = tmp_path / "raw" / src.name
    failed.mkdir(parents=True)
    (failed / "engine.json").write_text(json.dumps(
        {"job": src.name, "started_unix": 1.8e9, "error": "engine failed to start: cut"}))
    with pytest.raises(CalibrationError, match="never started: engine failed to start: cut"):
        ingest([failed], run, tmp_path / "cal")
    second = _make(tmp_path / "raw" / "start2", src, ["chat-c4"])
    dest = ingest([failed, second], run, tmp_path / "cal")
    prov = json.loads((dest / "provenance.json").read_text())
    assert len(prov["starts"]) == 1
    assert prov["failed_starts"] == [{"date": "2027-01-15T08:00:00+00:00",
                                      "error": "engine failed to start: cut"}]
    assert list(json.loads((dest / "measured.json").read_text())["runs"]) == ["chat-c4"]


def _routed(run: EngineRun, policy: str, replicas: int = 10, replica: int = 0):
    from capplan.validate.suite import Routed

    exp = next(e for e in run.experiments if e.routed is not None)
    routed = Routed(replicas=replicas, replica=replica, policy=policy)
    return exp.model_copy(update={"name": f"{policy}-{replica}", "routed": routed})


def test_a_routed_share_is_the_requests_the_router_sent_to_that_replica(suite) -> None:
    """Round robin hands out the pool's stream in turn: replica 1 of 3 gets its 2nd, 5th, ...
    request, and the runner is sent exactly those rows, in order."""
    run = suite.engine("gemma-4-31b-fp8-routed")
    exp = _routed(run, "round_robin", replicas=3, replica=1)
    share = run.share(exp)
    assert share is not None
    whole = experiment_job(run, exp.model_copy(update={"routed": None}), "whole")
    mine = experiment_job(run, exp, "mine")
    every = np.array(whole["workloads"][0]["arrival_s"])
    got = np.array(mine["workloads"][0]["arrival_s"])
    assert len(got) == len(share[0].arrival_s) > 50
    assert got == pytest.approx(every[1::3][: len(got)], abs=1e-6)
    assert mine["workloads"][0]["input_tokens"] == whole["workloads"][0]["input_tokens"][1::3][
        : len(got)]


def test_least_outstanding_shares_split_the_pool_and_differ_from_a_tenth(suite) -> None:
    """Every request the router handed out went to one replica: the shares of all ten are
    disjoint and together are the stream's head; the first replica, which ties favour,
    takes more than a tenth; and its prediction serves exactly its own requests."""
    run = suite.engine("gemma-4-31b-fp8-routed")
    shares = [run.share(_routed(run, "least_outstanding", replica=k))[0].arrival_s
              for k in range(10)]
    joined = np.sort(np.concatenate(shares))
    assert len(np.unique(joined)) == len(joined)
    stream = np.array(experiment_job(
        run, _routed(run, "least_outstanding").model_copy(update={"routed": None}),
        "whole")["workloads"][0]["arrival_s"])
    assert joined == pytest.approx(stream[: len(joined)], abs=1e-6)
    assert len(shares[0]) > len(joined) / 10
    exp = _routed(run, "least_outstanding")
    res = run.simulate(exp)
    sent = np.sort(res.requests()["arrival_s"].to_numpy())
    measured = shares[0][shares[0] < exp.duration_s]
    assert len(sent) == len(measured)
    assert np.all(sent >= measured - 1e-9)  # the client stamps a send no earlier than due


def test_a_routed_share_is_open_loop_and_names_a_replica_of_the_pool() -> None:
    from pydantic import ValidationError

    from capplan.validate.suite import Experiment, Routed

    with pytest.raises(ValidationError, match=r"replica 10 is not one of 0\.\.9"):
        Routed(replicas=10, replica=10)
    closed = {"pool": "validate", "name": "c", "input_tokens": {"kind": "constant", "value": 8},
              "output_tokens": {"kind": "constant", "value": 8},
              "arrival": {"kind": "closed", "concurrency": 2}}
    with pytest.raises(ValidationError, match="routed share replays open-loop arrivals only"):
        Experiment(name="x", duration_s=10, workloads=[closed], routed={"replicas": 2})


def test_a_routed_share_with_no_request_is_refused_in_one_line(suite) -> None:
    run = suite.engine("gemma-4-31b-fp8-routed")
    exp = _routed(run, "round_robin", replicas=256, replica=255)
    exp = exp.model_copy(update={"duration_s": 5.0})
    with pytest.raises(ConfigError, match="sends replica 255 of 256 no request in 5 s"):
        run.share(exp)
