"""The serving engine core's tracer (validate/coretrace.py), on the CPU: what it wraps, what
it writes, and that a spawned child (as vLLM spawns its engine core) loads it as a plugin."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import runpy
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

CORETRACE = Path(__file__).resolve().parents[1] / "src" / "capplan" / "validate" / "coretrace.py"


class Sched:
    def schedule(self, x: int) -> int:
        time.sleep(0.002)
        return x


def _fake_module() -> None:
    mod = types.ModuleType("fake_vllm_core")
    mod.Sched = Sched  # type: ignore[attr-defined]
    sys.modules["fake_vllm_core"] = mod


def _install(folder: Path, module: str, cls: type, method: str) -> list[str]:
    """Put `cls` in a fake module of that name and install the tracer on its `method` alone
    (writing to `folder`); returns what install wrapped."""
    mod = types.ModuleType(module)
    setattr(mod, cls.__name__, cls)
    sys.modules[module] = mod
    ns = runpy.run_path(str(CORETRACE))
    ns["TARGETS"][:] = [(module, cls.__name__, method)]
    wrapped: list[str] = ns["install"](str(folder))
    return wrapped


def _lines(folder: Path) -> list[list[object]]:
    deadline = time.time() + 5
    while time.time() < deadline:  # the writer flushes once the process is quiet for 0.5 s
        files = list(folder.glob("core-*.jsonl"))
        if files:
            return [json.loads(x) for f in files for x in f.read_text().splitlines()]
        time.sleep(0.1)
    return []


@pytest.fixture(autouse=True)
def _no_gc_hook() -> Iterator[None]:
    """Each test installs the tracer's garbage-collector hook afresh and leaves none behind
    (gc.callbacks is the interpreter's, not the traced module's)."""
    def clear() -> None:
        gc.callbacks[:] = [cb for cb in gc.callbacks if not getattr(cb, "_coretrace", False)]
    clear()
    yield
    clear()


def test_wrapped_calls_are_timed_and_written(tmp_path: Path) -> None:
    _fake_module()
    ns = runpy.run_path(str(CORETRACE))
    ns["TARGETS"][:] = [("fake_vllm_core", "Sched", "schedule"), ("not_a_module", "X", "y")]
    assert ns["install"](str(tmp_path)) == ["gc.callbacks", "Sched.schedule"]
    assert ns["install"](str(tmp_path)) == []  # wrapped once, however often installed
    assert Sched().schedule(7) == 7
    spans = [x for x in _lines(tmp_path) if x[0] == "schedule"]
    assert len(spans) == 1
    _, thread, t0, t1 = spans[0]
    assert thread == "MainThread" and 0.002 <= t1 - t0 < 1.0  # type: ignore[operator]


def test_garbage_collections_are_spans_once_a_call_was_traced(tmp_path: Path) -> None:
    class Loop:  # a class of its own: a method wrapped by another test keeps that trace
        def step(self) -> None:
            pass

    assert _install(tmp_path, "fake_vllm_gc", Loop, "step") == ["gc.callbacks", "Loop.step"]
    gc.collect()  # before any traced call: the engine's start-up, left out
    time.sleep(0.7)
    assert not list(tmp_path.glob("core-*.jsonl"))
    Loop().step()
    junk = [[i] for i in range(100_000)]
    gc.collect(1)
    gc.collect()
    del junk
    # another thread collecting all along does not keep the writer from the quiet it waits for
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            gc.collect(0)
            time.sleep(0.01)

    other = threading.Thread(target=churn)
    other.start()
    try:
        lines = _lines(tmp_path)
    finally:
        stop.set()
        other.join()
    collections = [x for x in lines if str(x[0]).startswith("gc")]
    main = [x[0] for x in collections if x[1] == "MainThread"]
    # the list's allocations set off young collections, then the two asked for
    assert "gc0" in main and main[-2:] == ["gc1", "gc2"]
    for _, _thread, t0, t1 in collections:
        assert 0 <= t1 - t0 < 5.0  # type: ignore[operator]


def _child(path: str) -> None:
    """A spawned process, as vLLM's engine core: it loads vLLM's general plugins."""
    from importlib.metadata import entry_points

    _fake_module()
    plugins = entry_points(group="vllm.general_plugins")
    for plugin in plugins:
        if plugin.name == "coretrace":
            plugin.load()()
    Sched().schedule(1)
    time.sleep(1.5)


def test_a_spawned_child_traces_itself_through_the_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CAPPLAN_CORE_TRACE", "CAPPLAN_CORE_TRACE_PY", "PYTHONPATH"):
        monkeypatch.setenv(var, "")  # plugin() sets them; the test restores them
    monkeypatch.setattr(sys, "path", list(sys.path))
    src = CORETRACE.read_text().replace(
        "TARGETS = [", 'TARGETS = [("fake_vllm_core", "Sched", "schedule"),', 1)
    module = tmp_path / "coretrace.py"
    module.write_text(src)
    folder = tmp_path / "trace"
    ns = runpy.run_path(str(module))
    ns["plugin"](str(folder))
    p = mp.get_context("spawn").Process(target=_child, args=(str(folder),))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    pids = {x[0] for x in _lines(folder) if x[0] == "process"}
    spans = [x for x in _lines(folder) if x[0] == "schedule"]
    assert pids and spans, "the child wrote no span"


class Busy:
    def step(self) -> None:
        time.sleep(0.002)


def _busy_to_the_end() -> None:
    """A child that exits right after its last span, before the writer's quiet 0.5 s."""
    Busy().step()


def test_a_child_busy_to_its_exit_keeps_its_last_spans(tmp_path: Path) -> None:
    assert _install(tmp_path, "fake_vllm_busy", Busy, "step") == ["gc.callbacks", "Busy.step"]
    p = mp.get_context("fork").Process(target=_busy_to_the_end)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    spans = [x for x in _lines(tmp_path) if x[0] == "step"]
    assert len(spans) == 1, "the span traced just before exit was lost"
