"""The GPU runner's client-side load rules, exercised on the CPU.

The engine here is a stand-in with fixed timings (no vLLM behaviour is imitated): it lets
the tests check what the runner itself decides, i.e. who is measured, when closed-loop users
stop, when open-loop arrivals stop, and what each request record holds. Real measurements
come only from vLLM on a GPU (docs/validation.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from capplan.validate import runner


class FixedTimingEngine:
    """Streams `max_tokens` one-token chunks: the first after `ttft`, then every `tpot`."""

    def __init__(self, ttft: float = 0.01, tpot: float = 0.002) -> None:
        self.ttft, self.tpot = ttft, tpot
        self.aborted: list[str] = []
        self.prompts: list[dict] = []

    async def generate(self, prompt, max_tokens, rid, priority=0):
        self.prompts.append(prompt)
        await asyncio.sleep(self.ttft)
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(self.tpot)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7])], num_cached_tokens=0)

    async def abort(self, rid):
        self.aborted.append(rid)


def closed(concurrency: int, n_out: int = 5) -> dict:
    rows = 64
    return {"index": 0, "kind": "closed", "concurrency": concurrency, "priority": 0,
            "input_tokens": [32] * rows, "output_tokens": [n_out] * rows,
            "prefix_group": [0] * rows, "prefix_tokens": [16] * rows}


def run(exp: dict, tmp_path, engine=None):
    engine = engine or FixedTimingEngine()
    prompts = runner.Prompts(vocab=5000, seed=0)
    x = runner.Experiment(engine, exp, prompts, str(tmp_path / "x.jsonl"), lambda n: n)
    wall, summary = asyncio.run(x.run())
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    return engine, wall, summary, rows


def test_closed_loop_users_stop_sending_at_the_duration(tmp_path):
    exp = {"name": "c", "duration_s": 0.2, "workloads": [closed(2)]}
    _, wall, summary, rows = run(exp, tmp_path)
    assert rows and all(r["send_s"] < 0.2 for r in rows)
    assert max(r["send_s"] for r in rows) > 0.1  # users kept going until near the end
    assert all(r["output_tokens"] == 5 and len(r["chunk_t"]) == 5 for r in rows)
    assert all(r["ttft_s"] >= 0.01 and r["e2e_s"] >= r["ttft_s"] for r in rows)
    assert summary["requests"] == len(rows)
    assert wall < 0.2 + 0.1  # the last requests finish soon after


def test_a_request_built_past_the_duration_is_not_sent(tmp_path):
    """The send stamp decides: a closed-loop user whose next prompt takes until after
    duration_s to build sends nothing, rather than a measured request past the end."""
    import time

    class SlowPrompts(runner.Prompts):
        def make(self, *a):
            time.sleep(0.04)
            return super().make(*a)

    engine = FixedTimingEngine()
    x = runner.Experiment(engine, {"name": "c", "duration_s": 0.1, "workloads": [closed(1)]},
                          SlowPrompts(vocab=5000, seed=0), str(tmp_path / "x.jsonl"),
                          lambda n: n)
    asyncio.run(x.run())
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert rows and all(r["send_s"] < 0.1 for r in rows)
    assert len(engine.prompts) == len(rows)  # nothing sent unrecorded


def test_open_loop_measures_arrivals_before_the_duration_and_aborts_the_rest(tmp_path):
    arrivals = [0.01 * i for i in range(1, 200)]
    n = len(arrivals)
    wl = {"index": 0, "kind": "open", "priority": 0, "arrival_s": arrivals,
          "input_tokens": [8] * n, "output_tokens": [40] * n,
          "prefix_group": [-1] * n, "prefix_tokens": [0] * n}
    exp = {"name": "o", "duration_s": 0.3, "workloads": [wl]}
    engine, wall, _, rows = run(exp, tmp_path)
    assert len(rows) == sum(a < 0.3 for a in arrivals)
    assert wall < 1.0  # stops once the measured requests are done, not at the last arrival
    assert len(engine.prompts) > len(rows)  # traffic kept flowing while they finished
    assert engine.aborted  # and what was still running then was aborted


def test_prompts_share_their_group_head_and_nothing_else():
    p = runner.Prompts(vocab=5000, seed=3)
    a, b = p.make(0, 100, 2, 64), p.make(0, 100, 2, 64)
    c = p.make(0, 100, 3, 64)
    assert len(a) == len(b) == 100
    assert a[:64] == b[:64] and a[64:] != b[64:]
    assert a[:64] != c[:64]
    assert p.make(1, 50, -1, 0) != p.make(1, 50, -1, 0)


def test_caching_off_salts_every_request(tmp_path):
    exp = {"name": "s", "duration_s": 0.05, "prefix_caching": False, "workloads": [closed(2)]}
    engine, *_ = run(exp, tmp_path)
    salts = [pr["cache_salt"] for pr in engine.prompts]
    assert len(set(salts)) == len(salts)


@pytest.mark.parametrize("q", [50, 99])
def test_summary_percentiles_follow_numpy(q):
    recs = [{"ttft_s": 0.01 * i, "e2e_s": 0.1 * i, "send_s": 0.0, "output_tokens": 3,
             "chunk_t": [0.0, 0.01, 0.03]} for i in range(1, 11)]
    s = runner.summary(recs, 1.0)
    import numpy as np

    assert s[f"ttft_p{q}_ms"] == pytest.approx(1e3 * np.percentile([r["ttft_s"] for r in recs], q),
                                               abs=0.01)


def test_step_trace_rows_are_timed_from_the_experiment_start():
    trace = runner.StepTrace()
    trace.rows = [(10.5, 7, 1, 512, 30, 30, 9.1, 31, 0, 0.02)]
    rows = trace.take(10.0)
    assert rows == [{"t": 0.5, "step": 7, "prefill_reqs": 1, "prefill_tokens": 512,
                     "decode_reqs": 30, "decode_tokens": 30, "wait_ms": 9.1, "running": 31,
                     "waiting": 0, "kv_usage": 0.02}]
    assert trace.take(0.0) == []  # taken once


def test_a_resumed_start_skips_only_runs_an_earlier_start_finished(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "engine.json").write_text(json.dumps({"experiments": {
        "warmup": {"wall_s": 3.0}, "chat-c1": {"wall_s": 20.1}, "chat-c4": {},
        "chat-c16": {"skipped": "time budget"}}}))
    assert runner.finished_runs([str(tmp_path / "a"), str(tmp_path / "missing")]) == {
        "warmup", "chat-c1"}
    assert runner.finished_runs([]) == set()


class FakePictures:
    """Records what the runner asks of runner.Pictures (which needs torch and vLLM)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.pooled_for: list[str] = []

    def pool(self, exp):
        self.pooled_for.append(exp["name"])

    def prompt(self, ids, images, tokens, cache_salt=None):
        self.calls.append((len(ids), images, tokens, cache_salt))
        return {"prompt_token_ids": ids, "pictures": images}


def test_image_workloads_go_to_the_engine_as_pictures(tmp_path):
    """A workload with `image` (suite.py experiment_job) sends each prompt through
    Pictures, its length the whole prompt's, images counted; a text workload beside it
    sends token ids; a salted experiment salts both."""
    text = closed(1)
    image = {**closed(1), "index": 1, "image": {"images": 1, "tokens": 20}}
    pics = FakePictures()
    engine = FixedTimingEngine()
    exp = {"name": "i", "duration_s": 0.1, "prefix_caching": False,
           "workloads": [text, image]}
    x = runner.Experiment(engine, exp, runner.Prompts(vocab=5000, seed=0),
                          str(tmp_path / "x.jsonl"), lambda n: n, pics)
    asyncio.run(x.run())
    assert pics.calls and all(c[:3] == (32, 1, 20) and c[3] for c in pics.calls)
    with_pictures = [p for p in engine.prompts if "pictures" in p]
    assert len(with_pictures) == len(pics.calls) < len(engine.prompts)
    assert all("cache_salt" in p for p in engine.prompts if "pictures" not in p)
    assert pics.pooled_for == ["i"]  # before the experiment's clock starts
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert rows and all(r["prep_s"] >= 0 for r in rows)  # the runner's own time, recorded


def test_pooled_pixels_are_drawn_before_the_clock_and_handed_out_in_turn() -> None:
    """`pixels: pooled` (suite.py Experiment.pixels): Pictures.pool draws POOL batches of
    each picture shape the experiment sends, and each request takes the next; otherwise
    (the default, every run before the twenty-third session) each request draws its own."""
    pics = runner.Pictures.__new__(runner.Pictures)
    drawn: list[tuple[int, int]] = []
    pics._pixels = lambda images, tokens: drawn.append((images, tokens)) or len(drawn)
    image = {"images": 1, "tokens": 280}
    exp = {"name": "p", "pixels": "pooled",
           "workloads": [{"image": image}, {}, {"image": image}]}
    pics.pool(exp)
    assert drawn == [(1, 280)] * runner.Pictures.POOL  # one pool for the shared shape
    got = [pics.batch(1, 280) for _ in range(runner.Pictures.POOL + 2)]
    assert got == [*range(1, runner.Pictures.POOL + 1), 1, 2] and len(drawn) == runner.Pictures.POOL
    pics.pool({**exp, "pixels": "per_request"})  # the next experiment draws per request
    assert pics.batch(1, 280) == runner.Pictures.POOL + 1


def test_pictures_sit_after_the_first_token_and_keep_the_prompts_length() -> None:
    """Pictures.place: each picture's placeholders after the first token, one text token
    between pictures, the prompt's length unchanged; a prompt too short for its pictures
    is refused."""
    pics = runner.Pictures.__new__(runner.Pictures)
    pics.token_id = 9
    ids, offsets = pics.place(list(range(100, 150)), 2, 20)
    assert len(ids) == 50 and offsets == [1, 22]
    assert ids[1:21] == [9] * 20 and ids[22:42] == [9] * 20 and 9 not in ids[42:] + ids[:1]
    assert ids[21] == 121
    with pytest.raises(ValueError, match="cannot hold 2 pictures"):
        pics.place(list(range(30)), 2, 20)
    assert runner.token_grid(280) == (14, 20) and runner.token_grid(70) == (7, 10)


def test_gc_pauses_records_the_collections_that_held_the_process() -> None:
    """runner.GcPauses (a gc.callbacks hook) keeps each collection that held the process
    at least its threshold, timed from the experiment's start, and hands each out once."""
    import gc
    import time

    pauses = runner.GcPauses(min_s=0.0)
    gc.callbacks.append(pauses)
    try:
        t0 = time.perf_counter()
        junk = [[i] for i in range(100_000)]
        gc.collect()
        del junk
    finally:
        gc.callbacks.remove(pauses)
    taken = pauses.take(t0)
    assert taken and all(at >= 0 and ms >= 0 for at, ms, _ in taken)
    assert taken[-1][2] == 2  # gc.collect() is a full, generation-2 collection
    assert pauses.take(t0) == []
    quiet = runner.GcPauses(min_s=10.0)
    quiet("start", {"generation": 0})
    quiet("stop", {"generation": 0})
    assert quiet.take(0.0) == []


def test_a_new_start_needs_its_engine_start_warm_ups_and_first_experiment() -> None:
    """runner.start_need_s (scripts/gpu_validate.sh skips a job with less time left): the
    job's expected_start_s after the process's imports, each warm-up's and the first
    measured experiment's need."""
    job = {"expected_start_s": 200.0, "experiments": [
        {"name": "warmup-c1", "warmup": True, "duration_s": 2.0},
        {"name": "warmup", "warmup": True, "duration_s": 3.0},
        {"name": "a", "duration_s": 30.0}, {"name": "b", "duration_s": 90.0}]}
    imports = runner.IMPORT_S
    assert runner.start_need_s(job) == pytest.approx(imports + 200 + 12.6 + 13.9 + 49.0)
    assert runner.start_need_s({**job, "expected_start_s": 0.0}) == pytest.approx(imports + 75.5)


def test_a_resumed_start_needs_its_hosts_own_start_and_first_unfinished_experiment(
        tmp_path: Path) -> None:
    """A job resumed on the host of an earlier start (gpu_validate.sh passes its folders as
    --done) needs that host's own engine start, not the model's longest, and the first
    experiment the earlier starts left unfinished."""
    job = {"expected_start_s": 200.0, "experiments": [
        {"name": "warmup-c1", "warmup": True, "duration_s": 2.0},
        {"name": "warmup", "warmup": True, "duration_s": 3.0},
        {"name": "a", "duration_s": 30.0}, {"name": "b", "duration_s": 90.0}]}
    earlier = tmp_path / "start1"
    earlier.mkdir()
    (earlier / "engine.json").write_text(json.dumps(
        {"engine_start_s": 130.0, "experiments": {"warmup": {"wall_s": 6.0},
                                                  "a": {"wall_s": 40.0}}}))
    imports = runner.IMPORT_S
    assert runner.start_need_s(job, [str(earlier)]) == pytest.approx(
        imports + 130 + 12.6 + 13.9 + 127.0)
    timed = tmp_path / "start3"  # a start that timed its imports as well: its own figure
    timed.mkdir()
    (timed / "engine.json").write_text(json.dumps(
        {"engine_start_s": 130.0, "ready_s": 175.0, "experiments": {"a": {"wall_s": 40.0}}}))
    assert runner.start_need_s(job, [str(timed)]) == pytest.approx(175 + 12.6 + 13.9 + 127.0)
    never = tmp_path / "start2"  # a start cut inside the compile wrote no engine start
    never.mkdir()
    (never / "engine.json").write_text(json.dumps({"error": "cut"}))
    assert runner.start_need_s(job, [str(never)]) == pytest.approx(
        imports + 200 + 12.6 + 13.9 + 49.0)


class DeadEngine(FixedTimingEngine):
    """Fails every request at once, as vLLM's engine does once its core has died."""

    async def generate(self, prompt, max_tokens, rid, priority=0):
        self.prompts.append(prompt)
        raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        yield  # an async generator, as the engine's


def test_closed_loop_users_stop_at_a_failed_request(tmp_path):
    """A dead engine fails each request at once: the users stop at the first failure rather
    than send thousands in the experiment's time, and the run fails naming it."""
    engine = DeadEngine()
    prompts = runner.Prompts(vocab=5000, seed=0)
    exp = {"name": "c", "duration_s": 0.5, "workloads": [closed(4)]}
    x = runner.Experiment(engine, exp, prompts, str(tmp_path / "x.jsonl"), lambda n: n)
    asyncio.run(x.run())
    assert 1 <= len(engine.prompts) <= 4  # one each at most, not one per loop turn
    assert x.errors and "EngineDeadError" in x.errors[0]
