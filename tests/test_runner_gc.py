"""The calibration runner's record of the garbage collector's time in a step's launch
(calibrate/runner.py GcClock, `gc_launch_s`), on the CPU with stand-ins for vLLM's
scheduler and executor: the record, and the samples column it becomes."""

from __future__ import annotations

import gc
import json
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from capplan.calibrate import store

RUNNER = Path(__file__).resolve().parents[1] / "src" / "capplan" / "calibrate" / "runner.py"


@pytest.fixture
def runner() -> Iterator[dict[str, Any]]:
    """runner.py's globals (a plain script: it imports vllm only where it starts one), and
    the gc.callbacks its clocks add taken away again."""
    before = list(gc.callbacks)
    yield runpy.run_path(str(RUNNER))
    gc.callbacks[:] = before


class Scheduler:
    def __init__(self) -> None:
        self.requests: dict[str, Any] = {}

    def schedule(self) -> SimpleNamespace:
        return SimpleNamespace(total_num_scheduled_tokens=16,
                               num_scheduled_tokens={}, scheduled_spec_decode_tokens={})

    def update_from_output(self, so: Any) -> None:
        return None


class Executor:
    """A launch whose CPU time is a collection of what it made, then a short wait."""

    collect = True

    def execute_model(self, so: Any) -> None:
        if self.collect:
            junk = [[i] for i in range(50_000)]
            gc.collect()
            del junk
        time.sleep(0.002)

    def sample_tokens(self) -> None:
        time.sleep(0.001)


class Clock:
    def event(self) -> object:
        return object()


def test_a_steps_launch_records_the_collectors_share(runner: dict[str, Any],
                                                     tmp_path: Path) -> None:
    clock = runner["GcClock"]()
    t = clock.total
    gc.collect()
    assert clock.total > t  # the collection was timed

    sched, executor = Scheduler(), Executor()
    rec = runner["Recorder"](sched, executor, Clock())
    rec.point = "decode-b1-c512"
    so = sched.schedule()
    executor.execute_model(so)
    executor.sample_tokens()
    sched.update_from_output(so)
    [step] = rec.records
    assert 0 < step["gc_launch_s"] < step["cpu_launch_s"]
    assert step["cpu_launch_s"] - step["gc_launch_s"] >= 0.003  # the waits are not the collector's

    # a launch without a collection records none, as a number
    executor.collect = False
    so = sched.schedule()
    gc.disable()
    try:
        executor.execute_model(so)
        executor.sample_tokens()
    finally:
        gc.enable()
    sched.update_from_output(so)
    assert rec.records[1]["gc_launch_s"] == 0.0

    # the samples keep the column
    path = tmp_path / "run.jsonl"
    lines = [{k: v for k, v in r.items() if k != "_gpu"} for r in rec.records]
    path.write_text("".join(json.dumps(x) + "\n" for x in
                            [*lines, {"kind": "point_done", "point": "decode-b1-c512"}]))
    df = store.read_runner_jsonl(path)
    assert df["gc_launch_s"].to_list() == [r["gc_launch_s"] for r in rec.records]
