"""Engine settings measured to run out of GPU memory (capplan/memory.py): the stored
failures are complete, and a pool that reaches one is warned in its plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capplan.errors import CalibrationError
from capplan.memory import FILE, failure_for, measured_failures
from capplan.pool import Pool
from capplan.profiles import CALIBRATION_DIR
from capplan.sim.run import setup_pool
from capplan.solve.options import memory_advice
from capplan.solve.plan import Advice

ROOT = CALIBRATION_DIR.parent


def _pool(**engine: object) -> Pool:
    return Pool.model_validate({"name": "q", "model": "qwen3-32b", "gpu": "h100",
                                "precision": "fp8",
                                "engine": {"max_model_len": 8192, **engine}})


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_every_stored_failure_has_its_logs_and_a_lower_utilisation_that_served(gpu: str) -> None:
    for run in measured_failures(gpu):
        assert run.logs and all((ROOT / log).exists() for log in run.logs), run.engine
        assert "OutOfMemoryError" in run.error
        assert run.served_at and max(run.served_at) < run.gpu_memory_utilization


def test_qwen3_32b_fp8_at_095_on_an_h100_is_warned_with_the_kv_it_gives_up() -> None:
    setup = setup_pool(_pool(gpu_memory_utilization=0.95))
    advice = memory_advice(setup)
    assert advice is not None and advice.kind == "memory"
    assert "ran out of GPU memory" in advice.message and "0.92 was measured" in advice.message
    kv = setup.profile.kv
    assert advice.kv_gain == pytest.approx(kv.tokens(0.92) / kv.tokens(0.95) - 1, abs=1e-6)
    assert advice.kv_gain is not None and advice.kv_gain < 0
    # the plan's JSON carries it as it does any advice
    assert Advice.model_validate_json(advice.model_dump_json()) == advice


def test_settings_short_of_the_failure_or_another_model_are_not_warned() -> None:
    assert memory_advice(setup_pool(_pool(gpu_memory_utilization=0.92))) is None
    # a smaller token budget asks less of the leftover memory than the failure's did
    assert memory_advice(setup_pool(_pool(gpu_memory_utilization=0.95,
                                          max_num_batched_tokens=4096))) is None
    awq = _pool(gpu_memory_utilization=0.95).model_copy(update={"precision": "awq"})
    assert memory_advice(setup_pool(awq)) is None


def test_a_broken_failure_file_names_itself_and_the_field(tmp_path: Path) -> None:
    folder = tmp_path / "h100" / "vllm-0.26.0"
    folder.mkdir(parents=True)
    stored = json.loads((CALIBRATION_DIR / "h100" / "vllm-0.26.0" / FILE).read_text())
    del stored["runs"][0]["gpu_memory_utilization"]
    (folder / FILE).write_text(json.dumps(stored))
    profile = setup_pool(_pool(gpu_memory_utilization=0.95)).profile
    with pytest.raises(CalibrationError, match=r"out-of-memory\.json: runs\.0\."
                                               r"gpu_memory_utilization: Field required"):
        failure_for(_pool(gpu_memory_utilization=0.95), profile, calibration_dir=tmp_path)


def test_emit_warns_before_a_lease_is_spent_on_settings_that_ran_out(tmp_path: Path) -> None:
    """`capplan validate emit` still writes the job, and says on stderr that these settings
    ran vLLM out of GPU memory before, naming the engine and its log."""
    from click.testing import CliRunner

    from capplan.cli import main

    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "schema_version: 1\ngpu: h100\nvllm: 0.26.0\nengines:\n"
        "  - name: q95\n"
        "    pool: {name: v, model: qwen3-32b, gpu: h100, precision: fp8, engine: "
        "{max_model_len: 8192, gpu_memory_utilization: UTIL}}\n"
        "    experiments:\n"
        "      - {name: chat-c4, duration_s: 5, workloads: [{pool: validate, name: chat, "
        "input_tokens: {kind: constant, value: 512}, output_tokens: {kind: constant, value: "
        "128}, arrival: {kind: closed, concurrency: 4}}]}\n")
    text = suite.read_text()
    for util, warned in (("0.95", True), ("0.92", False)):
        suite.write_text(text.replace("UTIL", util))
        r = CliRunner().invoke(main, ["validate", "emit", str(suite), "--out",
                                      str(tmp_path / util)])
        assert r.exit_code == 0, r.output
        assert (tmp_path / util / "q95.json").exists()
        assert ("ran out of GPU memory" in r.output
                and "qwen3-32b-fp8-h100-u95" in r.output) is warned
