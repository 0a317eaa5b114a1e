"""The GPU driver's bookkeeping, run against a fake engine (no vllm, no GPU)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from capplan.calibrate import jobs
from capplan.calibrate.sweep import (
    _cached,
    _decode_mix,
    _graphs,
    _shared,
    cache_points,
    design_points,
)

RUNNER = Path(jobs.__file__).with_name("runner.py")


def _load_runner() -> Any:
    spec = importlib.util.spec_from_file_location("capplan_runner_under_test", RUNNER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeRequest:
    def __init__(self, rid: str, prompt: int, max_tokens: int, computed: int = 0,
                 pictures: tuple[tuple[int, int], ...] = ()) -> None:
        self.request_id, self.num_prompt_tokens = rid, prompt
        self.num_computed_tokens, self.max_tokens, self.out = computed, max_tokens, 0
        self.mm_features = [NS(mm_position=NS(offset=o, length=n)) for o, n in pictures]


class FakeScheduler:
    """Running first, then waiting; a prompt is chunked by the token budget."""

    def __init__(self, budget: int) -> None:
        self.max_num_scheduled_tokens = budget
        self.requests: dict[str, FakeRequest] = {}
        self.running: list[FakeRequest] = []
        self.waiting: list[FakeRequest] = []

    def schedule(self) -> NS:
        budget, sched, encode = self.max_num_scheduled_tokens, {}, {}
        while self.waiting and budget:
            self.running.append(self.waiting.pop(0))
        for r in self.running:
            left = r.num_prompt_tokens - r.num_computed_tokens
            n = min(budget, left) if left > 0 else min(budget, 1)
            if n:
                sched[r.request_id] = n
                # a picture is encoded in the step whose chunk reaches it
                done = r.num_computed_tokens
                here = [i for i, f in enumerate(r.mm_features)
                        if done <= f.mm_position.offset < done + n]
                if here:
                    encode[r.request_id] = here
                r.num_computed_tokens += n
                budget -= n
        return NS(total_num_scheduled_tokens=sum(sched.values()), num_scheduled_tokens=sched,
                  scheduled_spec_decode_tokens={}, scheduled_encoder_inputs=encode)

    def update_from_output(self, so: NS, _out: object) -> None:
        for rid in so.num_scheduled_tokens:
            r = self.requests[rid]
            if r.num_computed_tokens >= r.num_prompt_tokens:
                r.out += 1
            if r.out >= r.max_tokens:
                self.finish([rid])

    def finish(self, ids: list[str]) -> None:
        for rid in ids:
            r = self.requests.pop(rid, None)
            if r in self.running:
                self.running.remove(r)


class FakeExecutor:
    def execute_model(self, so: NS) -> None:
        return None

    def collective_rpc(self, fn: Any) -> list[Any]:
        """The worker holds a model whose encoder returns one embedding per picture."""
        def encode(**batch: Any) -> list[NS]:
            n = batch["pixel_values"].shape[0]
            return [NS(shape=(280, 5376))] * n

        runner = NS(model=NS(embed_multimodal=encode),
                    _get_mm_dummy_batch=lambda modality, n: {
                        "pixel_values": NS(shape=(n, 2520, 768))})
        return [fn(NS(model_runner=runner))]

    def sample_tokens(self, grammar: object) -> None:
        return None


class FakeEngine:
    def __init__(self, budget: int, abort_works: bool = True) -> None:
        self.sched = FakeScheduler(budget)
        self.executor = FakeExecutor()
        self.engine_core = NS(engine_core=NS(scheduler=self.sched, model_executor=self.executor))
        self.abort_works = abort_works

    cached: list[list[int]] | None = None  # prompts seen, when prefix caching is on

    def add_request(self, rid: str, prompt: dict[str, list[int]], params: dict[str, int]) -> str:
        internal = f"{rid}-abcd"
        ids = prompt["prompt_token_ids"]
        hit = 0
        if self.cached is not None:  # full 16-token blocks, never the prompt's last token
            for old in self.cached:
                n = next((i for i, (a, b) in enumerate(zip(old, ids, strict=False)) if a != b),
                         min(len(old), len(ids)))
                hit = max(hit, min(n, len(ids) - 1) // 16 * 16)
            self.cached.append(ids)
        places = prompt.get("mm_placeholders", {}).get("image", ())  # type: ignore[attr-defined]
        r = FakeRequest(internal, len(ids), params["max_tokens"], hit,
                        tuple((x.offset, x.length) for x in places))
        self.sched.requests[internal] = r
        self.sched.waiting.append(r)
        return internal

    def step(self) -> None:
        so = self.sched.schedule()
        self.executor.execute_model(so)
        if so.total_num_scheduled_tokens:
            self.executor.sample_tokens(None)
        self.sched.update_from_output(so, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.sched.requests)

    def abort_request(self, ids: list[str], internal: bool = False) -> None:
        if self.abort_works:
            self.sched.finish(ids)


class FakeEvent:
    """A CUDA event whose GPU time is the order in which it was recorded, in milliseconds."""

    recorded = 0

    def __init__(self, enable_timing: bool) -> None:
        self.at: int | None = None

    def record(self) -> None:
        FakeEvent.recorded += 1
        self.at = FakeEvent.recorded

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.at is not None and other.at is not None
        return float(other.at - self.at)


@pytest.fixture()
def runner(monkeypatch: pytest.MonkeyPatch) -> Any:
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **k: k  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.cuda = NS(Event=FakeEvent, synchronize=lambda: None)  # type: ignore[attr-defined]
    torch.inference_mode = contextlib.nullcontext  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return _load_runner()


def _driver(runner: Any, budget: int = 8192, **engine: Any) -> Any:
    args = NS(seed=0, spec_k=0, no_gpu_clock=False)
    return runner.Driver(NS(llm_engine=FakeEngine(budget, **engine)), args, vocab=32000)


def test_each_step_gets_its_own_gpu_stamps(runner: Any) -> None:
    """The events around a step's launches land on that step's record, in order, as seconds
    from the point's own reference event."""
    recs = _driver(runner).point({"id": "d", "kind": "decode", "batch": 2, "context": 16,
                                  "steps": 3})
    t0 = [r["gpu_t0"] for r in recs]
    t1 = [r["gpu_t1"] for r in recs]
    # events are recorded ref, (start, end) per step: 1 ms apart on the fake clock
    assert t0 == [(2 * i + 1) / 1e3 for i in range(len(recs))]
    assert t1 == [(2 * i + 2) / 1e3 for i in range(len(recs))]
    assert all("_gpu" not in r for r in recs), "no event object is left to serialise"
    json.dumps(recs)


def test_each_step_records_the_cores_cpu_time(runner: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu_launch_s is the CPU's time in execute_model plus sample_tokens, cpu_update_s its
    time in update_from_output, each on that step's own record."""
    now = [0.0]
    monkeypatch.setattr(runner.time, "perf_counter", lambda: now[0])
    drv = _driver(runner)

    def advance(f: Any, dt: float) -> Any:
        def g(*a: Any, **k: Any) -> Any:
            now[0] += dt
            return f(*a, **k)
        return g

    # the Recorder wrapped these at start; what they wrap now takes fake time
    drv.rec._execute = advance(drv.rec._execute, 0.002)
    drv.rec._sample = advance(drv.rec._sample, 0.001)
    drv.rec._update = advance(drv.rec._update, 0.0005)
    recs = drv.point({"id": "d", "kind": "decode", "batch": 2, "context": 16, "steps": 3})
    assert recs
    assert all(r["cpu_launch_s"] == 0.003 and r["cpu_update_s"] == 0.0005 for r in recs)


def test_mixed_point_ends_when_the_abort_is_lost(runner: Any) -> None:
    """The decodes of a mixed point stop by themselves soon after the prefill (on
    Llama-3.1-8B the abort did not reach them and the point ran 10,000 decode steps)."""
    drv = _driver(runner, abort_works=False)
    recs = drv.point({"id": "m", "kind": "mixed", "batch": 8, "context": 64, "chunk": 256,
                      "chunks": 3})
    assert len(recs) < 40
    assert not drv.engine.has_unfinished_requests()


def test_prefill_point_cuts_exact_chunks(runner: Any) -> None:
    """A prefill point yields chunks of exactly `chunk` tokens at contexts 0, c, 2c, ..."""
    drv = _driver(runner)
    recs = drv.point({"id": "p", "kind": "prefill", "chunk": 512, "chunks": 4})
    pre = [r for r in recs if r["prefill_seqs"]]
    assert [r["chunks"] for r in pre] == [[[512, 0]], [[512, 512]], [[512, 1024]], [[512, 1536]]]
    assert drv.sched.max_num_scheduled_tokens == 8192, "token budget restored after the point"


def test_decode_point_records_batch_and_context(runner: Any) -> None:
    """Decode steps carry the batch size and the summed prior context."""
    recs = _driver(runner).point({"id": "d", "kind": "decode", "batch": 4, "context": 100,
                                  "steps": 3})
    dec = [r for r in recs if r["decode_seqs"] == 4 and not r["prefill_seqs"]]
    assert len(dec) == 3
    assert dec[0]["decode_ctx"] == 4 * 100 and dec[0]["tokens"] == 4


def test_mixed_point_shares_steps(runner: Any) -> None:
    """Mixed steps hold every running decode plus one chunk of exactly `chunk` tokens."""
    drv = _driver(runner)
    recs = drv.point({"id": "m", "kind": "mixed", "batch": 8, "context": 64, "chunk": 256,
                      "chunks": 3})
    mixed = [r for r in recs if r["prefill_seqs"] == 1 and r["decode_seqs"] == 8]
    assert [r["chunks"][0] for r in mixed] == [[256, 0], [256, 256], [256, 512]]
    assert not drv.engine.has_unfinished_requests()


def test_every_designed_point_runs(runner: Any) -> None:
    """Each point the sweep designs is one the driver knows how to run."""
    drv = _driver(runner)
    for p in [*design_points()[:6], *cache_points()[:2], *cache_points()[-2:]]:
        small = {**p, "context": min(p.get("context", 1), 64), "batch": min(p.get("batch", 1), 4),
                 "chunks": min(p.get("chunks", 1), 2), "prefix": min(p.get("prefix", 0), 32)}
        assert drv.point(small)


def test_sweep_prompts_off_the_multiples_of_256_are_cut_as_designed(runner: Any) -> None:
    """The sweep's prompts come in chunks both on and off the multiples of 256 tokens (on FP8
    the GEMMs run a token of the others up to a third slower: docs/calibration.md, "The
    seventh run"), and the driver cuts such a prompt into chunks of exactly that size."""
    prompts = {p["id"]: p for p in design_points() if p["kind"] == "prefill"}
    assert {p["chunk"] % 256 == 0 for p in prompts.values()} == {True, False}
    recs = _driver(runner).point(prompts["prefill-p2100-x3"])
    assert [r["chunks"][0] for r in recs if r["prefill_seqs"]] == [[2100, 0], [2100, 2100],
                                                                  [2100, 4200]]


def test_graph_scan_point_decodes_its_batch_together(runner: Any) -> None:
    """A graph-scan point's requests decode their steps together: a request whose prompt is
    done before the last one's decodes longer, so the batch finishes as one (a plain decode
    point ramps down instead)."""
    p = {**_graphs(8, 100), "steps": 6}
    full = [r for r in _driver(runner, budget=256).point(p)
            if r["decode_seqs"] == 8 and not r["prefill_seqs"]]
    ramp = [r for r in _driver(runner, budget=256).point({**p, "even": False})
            if r["decode_seqs"] == 8 and not r["prefill_seqs"]]
    assert len(full) >= 6 > len(ramp)


def test_mixlen_point_decodes_unequal_lengths_together(runner: Any) -> None:
    """A mixlen point's groups (2 requests of 300 tokens, 6 of 20) all decode its steps
    together, each step reading their contexts summed (plus what the early ones decoded
    while the last prefilled), and about the longest as max_ctx."""
    p = {**_decode_mix(((2, 300), (6, 20))), "steps": 5}
    recs = _driver(runner, budget=128).point(p)
    full = [r for r in recs if r["decode_seqs"] == 8 and not r["prefill_seqs"]]
    assert len(full) >= 5
    summed = 2 * 300 + 6 * 20
    assert summed <= full[0]["decode_ctx"] < summed + 8 * 128 // 20
    assert 300 < full[0]["max_ctx"] < 310


def test_cached_point_times_the_tail_behind_a_cache_hit(runner: Any) -> None:
    """A `cached` point prefills the prefix once, then each repeat's step holds only its
    fresh tail, over the cached prefix as context (prefix 0: the tail alone)."""
    drv = _driver(runner)
    drv.engine.cached = []
    recs = drv.point(_cached(64, 20, 3))
    assert [(r["tokens"], r["chunks"]) for r in recs] == [(64, [[64, 0]])] + [(20, [[20, 64]])] * 3
    assert [r["chunks"] for r in drv.point(_cached(0, 20, 2))] == [[[20, 0]], [[20, 0]]]


def test_shared_point_decodes_a_batch_over_one_cached_prefix(runner: Any) -> None:
    """A `shared` point prefills the prefix once; each request of the batch then prefills
    only its own tokens over the cached prefix, and the batch decodes together."""
    drv = _driver(runner)
    drv.engine.cached = []
    recs = drv.point(_shared(3, 48, 32))
    assert recs[0]["chunks"] == [[32, 0]]
    assert sorted(c for r in recs[1:] for c in map(tuple, r["chunks"])) == [(16, 32)] * 3
    decode = [r for r in recs if r["decode_seqs"] == 3]
    assert decode and all(r["prefill_seqs"] == 0 for r in decode)
    assert decode[0]["decode_ctx"] == 3 * 48


def test_resume_skips_completed_points(runner: Any, tmp_path: Path) -> None:
    """Points with a `point_done` line are not measured again; a cut line is ignored."""
    out = tmp_path / "s.jsonl"
    out.write_text(json.dumps({"kind": "point_done", "point": "a"}) + "\n{\"kind\": \"st")
    assert runner.load_done(str(out)) == {"a"}


def test_hung_point_ends_the_run_and_a_rerun_resumes_past_it(tmp_path: Path) -> None:
    """A point stuck past its limit (vLLM waiting forever on a CUDA copy) ends the process
    with exit code 5 and a `point_hung` line; the next start counts it as done."""
    import subprocess
    import textwrap

    out, meta = tmp_path / "s.jsonl", tmp_path / "m.json"
    out.write_text(json.dumps({"kind": "point_done", "point": "a", "steps": 1}) + "\n")
    code = textwrap.dedent(f"""
        import importlib.util, time
        spec = importlib.util.spec_from_file_location("r", {str(RUNNER)!r})
        r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
        with open({str(out)!r}, "a") as f:
            dog = r.Watchdog(f, {{}}, {str(meta)!r}, hang_s=1.0)
            dog.start({{"id": "b", "est_s": 0.01}})
            time.sleep(30)  # the stuck engine step
    """)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 5, res.stderr
    assert time.perf_counter() - t0 < 20
    assert "point b hung" in res.stderr
    assert json.loads(meta.read_text())["points_hung"] == ["b"]
    runner = _load_runner()
    assert runner.load_done(str(out)) == {"a", "b"}
    assert runner.load_hung(str(out)) == ["b"]


def test_a_point_that_finishes_in_time_is_not_hung(tmp_path: Path) -> None:
    runner = _load_runner()
    with open(tmp_path / "s.jsonl", "a") as f:
        dog = runner.Watchdog(f, {}, str(tmp_path / "m.json"), hang_s=1.5)
        dog.start({"id": "b", "est_s": 0.01})
        dog.stop()
        time.sleep(2.5)
    assert runner.load_hung(str(tmp_path / "s.jsonl")) == []


def test_encoder_point_records_each_timed_pass(runner: Any) -> None:
    """An encoder point runs its warm passes untimed, then one record a timed pass: the
    pictures, their image tokens in and out, the input's source, GPU and wall time."""
    from capplan.calibrate.sweep import _encoder

    p = _encoder(4, 280, built=False)
    recs = _driver(runner).point(p)
    assert len(recs) == p["repeats"]
    assert [r["rep"] for r in recs] == list(range(p["repeats"]))
    r = recs[0]
    assert (r["kind"], r["point"], r["images"], r["image_tokens"]) == (
        "encoder", "encoder-i4-t280", 4, 280)
    assert (r["inputs"], r["pixel_values_shape"], r["tokens_out"]) == (
        "vllm-dummy", [4, 2520, 768], 4 * 280)
    assert r["gpu_s"] == pytest.approx(1e-3)  # the two events, one apart in FakeEvent's clock
    assert r["wall_s"] >= r["launch_s"] >= 0


def test_encoder_grid_holds_exactly_the_image_tokens(runner: Any) -> None:
    """A built picture's patch grid pools into exactly its image tokens, as near square
    as they allow (Gemma 4's 70-1,120)."""
    assert runner.token_grid(280) == (14, 20)
    assert runner.token_grid(70) == (7, 10)
    assert runner.token_grid(1120) == (32, 35)
    assert runner.token_grid(7) == (1, 7)


class FakePictures:
    """What runner.Driver asks of validate/runner.py Pictures (which needs torch and vLLM):
    the prompt with each picture's placeholders after its first token."""

    def prompt(self, ids: list[int], images: int, tokens: int) -> dict[str, Any]:
        places = [NS(offset=1 + i * (tokens + 1), length=tokens) for i in range(images)]
        return {"prompt_token_ids": ids, "mm_placeholders": {"image": places}}


def test_picture_point_records_the_steps_that_encode(runner: Any) -> None:
    """A picture point sends its prompts one at a time, each with its picture, and marks the
    step that encodes it with the picture's image tokens; its text twin sends none, and
    beside running decodes the encoding step holds them too."""
    drv = _driver(runner)
    drv.pictures = FakePictures()
    point = {"kind": "picture", "prompt": 580, "images": 1, "image_tokens": 280,
             "batch": 0, "context": 0, "repeats": 3}
    recs = drv.point({**point, "id": "picture-p580-i1"})
    enc = [r for r in recs if r.get("encoder_tokens")]
    assert [(r["encoder_tokens"], r["prefill_tokens"], r["decode_seqs"]) for r in enc] == \
        [(280, 580, 0)] * 3
    twin = drv.point({**point, "id": "picture-p580-i0", "images": 0})
    assert [r["prefill_tokens"] for r in twin if r["prefill_seqs"]] == [580] * 3
    assert not any(r.get("encoder_tokens") for r in twin)
    beside = drv.point({**point, "id": "picture-p400-i1-b8", "prompt": 400, "batch": 8,
                        "context": 64})
    enc = [r for r in beside if r.get("encoder_tokens")]
    assert len(enc) == 3 and all(r["decode_seqs"] == 8 for r in enc)
    assert not drv.engine.has_unfinished_requests()


def test_drain_scan_points_finish_sixteen_a_step_and_all_at_once(runner: Any) -> None:
    """Each drain-scan point is the sweep's decode point (its requests finishing a prefill
    chunk's worth a step) beside its `even` twin, whose requests all finish in one step."""
    from capplan.calibrate.sweep import drain_points

    pts = drain_points()
    assert [p["id"] for p in pts[:2]] == ["decode-b128-c512", "drain-b128-c512"]
    for plain, even in zip(pts[::2], pts[1::2], strict=True):
        assert (plain["batch"], plain["context"]) == (even["batch"], even["context"])
        assert even["even"] and not plain.get("even")

    def shrinks(p: dict[str, Any]) -> list[int]:
        small = {**p, "batch": 8, "context": 64, "steps": 4}
        recs = _driver(runner, budget=128).point(small)
        seqs = [r["seqs"] for r in recs if not r["prefill_seqs"]]
        return [a - b for a, b in itertools.pairwise(seqs) if a > b]

    # 128-token chunks of 64-token prompts: admitted two a step, they leave two a step
    assert len(shrinks(pts[0])) >= 2 and max(shrinks(pts[0])) == 2
    # the twin's requests decode to the end together: its batch shrinks on fewer steps
    assert len(shrinks(pts[1])) < len(shrinks(pts[0]))


def test_trace_summary_lists_the_hosts_long_calls_in_order(runner: Any) -> None:
    """trace_summary keeps the CPU events of min_ms or more (not the GPU's), in the order
    they began, from the first one's start, each with the top of its stack."""
    def ev(name: str, start: float, end: float, device: str = "DeviceType.CPU",
           stack: tuple[str, ...] = ()) -> Any:
        return NS(name=name, time_range=NS(start=start, end=end), device_type=device,
                  thread=1, stack=list(stack))

    events = [ev("cudaStreamSynchronize", 5_000, 35_000, stack=("a.py(1): f",) * 20),
              ev("execute_model", 1_000, 36_000),
              ev("aten::add", 2_000, 2_010),                         # too short
              ev("void gemm_kernel", 3_000, 40_000, "DeviceType.CUDA")]  # the GPU's
    out = runner.trace_summary(events)
    assert [(r["name"], r["start_ms"], r["ms"]) for r in out] == [
        ("execute_model", 0.0, 35.0), ("cudaStreamSynchronize", 4.0, 30.0)]
    assert len(out[1]["stack"]) == 12
    json.dumps(out)


def test_a_traced_point_writes_its_steps_calls_table_and_trace(
        runner: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trace_point runs a plan point again under the profiler: its step records (ids marked
    `~traced`), the host's long calls, the profiler's table and, asked, its Chrome trace,
    gzipped."""
    import gzip

    class FakeProfile:
        def __init__(self, **kw: Any) -> None:
            assert kw["with_stack"]

        def __enter__(self) -> FakeProfile:
            return self

        def __exit__(self, *a: Any) -> None:
            return None

        def events(self) -> list[Any]:
            return [NS(name="cudaStreamSynchronize", time_range=NS(start=0, end=25_000),
                       device_type="DeviceType.CPU", thread=1, stack=["x.py(1): f"])]

        def key_averages(self) -> Any:
            return NS(table=lambda **kw: "name  self cpu\n")

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": []}')

    prof = types.ModuleType("torch.profiler")
    prof.profile = FakeProfile  # type: ignore[attr-defined]
    prof.ProfilerActivity = NS(CPU="cpu", CUDA="cuda")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.profiler", prof)
    p = {"id": "decode-b4-c16", "kind": "decode", "batch": 4, "context": 16, "steps": 2}
    runner.trace_point(_driver(runner), p, str(tmp_path / "plain.traces"))
    assert not list((tmp_path / "plain.traces").glob("*.trace.json*")), "no Chrome trace unasked"
    n = runner.trace_point(_driver(runner), p, str(tmp_path / "run.traces"), chrome=True)
    base = tmp_path / "run.traces" / "decode-b4-c16"
    steps = [json.loads(x) for x in Path(f"{base}.steps.jsonl").read_text().splitlines()]
    assert n == len(steps) > 0 and {r["point"] for r in steps} == {"decode-b4-c16~traced"}
    calls = json.loads(Path(f"{base}.calls.json").read_text())
    assert [(c["name"], c["ms"]) for c in calls] == [("cudaStreamSynchronize", 25.0)]
    assert Path(f"{base}.table.txt").read_text().startswith("name")
    with gzip.open(f"{base}.trace.json.gz", "rt") as f:
        assert json.load(f) == {"traceEvents": []}
    assert not Path(f"{base}.trace.json").exists()
