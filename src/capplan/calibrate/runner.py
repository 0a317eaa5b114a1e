"""GPU side of `capplan calibrate`: the only module that imports vllm.

Runs as a plain script on the GPU host (vllm + numpy + stdlib, nothing from capplan):

    python3 runner.py --model DIR --plan plan.json --out samples.jsonl [engine flags]

It starts one real vLLM engine on random (dummy) weights, records its KV capacity, then
drives it through the plan's points one at a time with `LLMEngine.add_request` + `step()`,
and appends one JSON line per engine step. A point is complete once its `point_done` line
is written; a re-run with the same `--out` skips complete points (resume after a crash).

What is timed (async scheduling on, in-process engine core): the wrapped
`Scheduler.schedule` stamps `t_sched0`/`t_sched1` around scheduling a batch, the wrapped
`Scheduler.update_from_output` stamps `t_done` when that batch's output has come back from
the GPU. A step's time is `t_done[i] - max(t_done[i-1], t_sched0[i])`: the gap between
consecutive completions while batches are queued back to back, or from scheduling when
the GPU sat idle before the step (computed on the CPU side, see fit.py).

The same two moments are also stamped on the GPU, free of the CPU's jitter (a completion
stamp can land a step late when the engine's thread is busy): a CUDA event on vLLM's
compute stream as the wrapped executor's `execute_model` starts launching a step
(`gpu_t0`, reached when the stream starts the step's work) and one after its
`sample_tokens` has launched the sampler and any drafter (`gpu_t1`), both in seconds from
an event recorded as the point starts. `t_sched1 - t_sched0` is the CPU's scheduling time,
`gpu_t1 - gpu_t0` the GPU's.

The engine core's own time a step is stamped too: `cpu_launch_s`, the CPU's time in the
executor's `execute_model` and `sample_tokens` (they prepare the inputs and launch the
kernels, and return: vllm/v1/executor/uniproc_executor.py), and `cpu_update_s`, its time in
`update_from_output`. Scheduling, launch and update are what the serving engine core's loop
spends on a step (vllm/v1/engine/core.py step_with_batch_queue; capplan.validate.corelaunch
measures the same in serving), and the simulator charges it (profile `core_graph_s`,
`core_piecewise_s`). `gc_launch_s` is the part of `cpu_launch_s` that Python's garbage
collector ran (`gc.callbacks`; vLLM freezes the heap it starts with, vllm/utils/gc_utils.py
freeze_gc_heap, so these are the collections of what the steps themselves make): whether
the launches' slow steps are its passes (docs/calibration.md, "The launches' slow steps, and
the garbage collector").

A point that runs far past its estimate (`--hang-s`, or 10x its estimate if longer) is a
hung engine: vLLM 0.26.0 has waited forever on its output copy in one batch shape on the
H200 (256 decodes plus a 256-token chunk: two engines hung in it, none finished it). A
watchdog thread then writes a `point_hung` line and ends the process; the re-run resumes
past that point.

Exit codes: 0 done (or time budget reached), 3 no vllm / no GPU, 4 out of memory or the
engine failed to start, 5 a point hung (run it again to go on); the reason is the last line
on stderr and in the meta file.
"""

import argparse
import functools
import gc
import json
import math
import os
import runpy
import subprocess
import sys
import threading
import time
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not bundled

EXIT_NO_VLLM = 3
EXIT_ENGINE = 4
EXIT_HUNG = 5


def fail(code, message, meta=None, meta_path=None):
    if meta is not None and meta_path:
        meta["error"] = message
        write_json(meta_path, meta)
    print(f"capplan-runner: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def write_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="folder holding config.json")
    ap.add_argument("--plan", help="plan JSON from capplan.calibrate.sweep; omit for --kv-only")
    ap.add_argument("--out", required=True, help="samples JSONL (appended; resumable)")
    ap.add_argument("--meta", required=True, help="engine/provenance JSON written here")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--spec-method", default=None)
    ap.add_argument("--spec-model", default=None)
    ap.add_argument("--spec-k", type=int, default=0)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--limit-images", type=int, default=None,
                    help="multimodal models: images per prompt (0 = text-only pool)")
    ap.add_argument("--time-budget-s", type=float, default=120.0,
                    help="stop starting new points after this long measuring")
    ap.add_argument("--hf-overrides", type=json.loads, default=None,
                    help="JSON for LLM(hf_overrides=...): what the model spec says vLLM needs")
    ap.add_argument("--kv-only", action="store_true", help="start, record KV capacity, exit")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="enable vLLM's prefix caching (for `cached` points)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gpu-clock", action="store_true",
                    help="time steps by CPU stamps only (no CUDA events)")
    ap.add_argument("--trace-points", default="",
                    help="comma-separated plan point ids to run once more after the plan, "
                    "under torch's profiler; written under <out>.traces/, not to --out")
    ap.add_argument("--trace-chrome", action="store_true",
                    help="with --trace-points, also each point's Chrome trace (tens of MB: "
                    "more than a device call brings back)")
    ap.add_argument("--trace-core", action="store_true",
                    help="time vLLM's engine-core and model-runner calls in every step "
                    "(validate/coretrace.py) into <out>.traces/coretrace/core-<pid>.jsonl")
    ap.add_argument("--hang-s", type=float, default=90.0,
                    help="a point running this long (or 10x its estimate) has hung the engine")
    return ap.parse_args(argv)


def versions():
    out = {"python": sys.version.split()[0]}
    try:
        import torch
        import vllm

        out.update(vllm=vllm.__version__, torch=torch.__version__, cuda=torch.version.cuda)
        if torch.cuda.is_available():
            out["gpu_name"] = torch.cuda.get_device_name(0)
            out["gpu_total_bytes"] = torch.cuda.mem_get_info()[1]
    except Exception as e:
        out["version_error"] = repr(e)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False)
        out["nvidia_smi"] = smi.stdout.strip()
        out["driver"] = smi.stdout.split(",")[1].strip() if "," in smi.stdout else None
    except (OSError, subprocess.SubprocessError) as e:
        out["nvidia_smi"] = repr(e)
    return out


def _point_lines(path):
    """`point_done` / `point_hung` records of an earlier run of the same output file."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if rec.get("kind") in ("point_done", "point_hung"):
                yield rec


def load_done(path):
    """Point ids already complete, or declared hung, in an earlier run (both are skipped)."""
    return {rec["point"] for rec in _point_lines(path)}


def load_hung(path):
    """Point ids an earlier run of the same output file declared hung."""
    return [rec["point"] for rec in _point_lines(path) if rec["kind"] == "point_hung"]


class Watchdog:
    """Ends the process when the current point runs past its limit (see module docstring):
    the engine is stuck inside a CUDA synchronize, which no exception can interrupt."""

    def __init__(self, out, meta, meta_path, hang_s):
        self.out, self.meta, self.meta_path, self.hang_s = out, meta, meta_path, hang_s
        self.point, self.deadline = None, None
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def start(self, point):
        with self.lock:
            limit = max(self.hang_s, 10 * point.get("est_s", 0))
            self.point, self.deadline = point["id"], time.perf_counter() + limit

    def stop(self):
        with self.lock:
            self.point = self.deadline = None

    def _watch(self):
        while True:
            time.sleep(1.0)
            with self.lock:
                if self.deadline is None or time.perf_counter() < self.deadline:
                    continue
                pid = self.point
                self.out.write(json.dumps({"kind": "point_hung", "point": pid,
                                           "limit_s": self.hang_s}) + "\n")
                self.out.flush()
                self.meta.setdefault("points_hung", []).append(pid)
                try:  # SystemExit would end this thread only: report, then leave at once
                    fail(EXIT_HUNG, f"point {pid} hung: no engine step came back within its "
                         "limit; run again to resume after it", self.meta, self.meta_path)
                finally:
                    os._exit(EXIT_HUNG)


class GpuClock:
    """CUDA events on the current stream (vLLM's compute stream: the in-process engine
    launches every step from this thread), read back as seconds from a reference event
    recorded at `restart`. One reference per point keeps the float32 milliseconds that
    CUDA returns exact to a microsecond."""

    def __init__(self, torch):
        self.torch = torch
        self.ref = None

    def restart(self):
        self.ref = self.event()

    def event(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, ev):
        return self.ref.elapsed_time(ev) / 1e3


class GcClock:
    """Seconds Python's garbage collector has run in this process since it was made, from
    `gc.callbacks` (the in-process engine launches every step from this thread)."""

    def __init__(self):
        self.total = 0.0
        self._t0 = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.total += time.perf_counter() - self._t0
            self._t0 = None


class Recorder:
    """Wraps the scheduler and the executor: one record per non-empty engine step."""

    def __init__(self, sched, executor=None, clock=None, alloc_counts=False):
        self.sched = sched
        # --trace-core: torch's caching-allocator counters after each step's launch (a
        # cudaFree, which the allocator makes when it must give cached memory back, waits
        # for the whole device)
        self.alloc_counts, self.alloc = alloc_counts, {}
        self.point = None
        self.step_no = 0
        self.records = []
        self.pending = {}
        self._schedule = sched.schedule
        self._update = sched.update_from_output
        sched.schedule = self.schedule
        sched.update_from_output = self.update_from_output
        self.clock, self.gpu, self.launched = clock, {}, None
        self.launch_s = {}  # id(so) -> the CPU's seconds in execute_model + sample_tokens
        self.gc, self.gc_s = GcClock(), {}  # id(so) -> the collector's seconds in them
        if clock is not None and executor is not None:
            self._execute, self._sample = executor.execute_model, executor.sample_tokens
            executor.execute_model, executor.sample_tokens = self.execute_model, self.sample_tokens

    def schedule(self, *a, **k):
        t0 = time.perf_counter()
        so = self._schedule(*a, **k)
        t1 = time.perf_counter()
        if so.total_num_scheduled_tokens:
            self.pending[id(so)] = (t0, t1, self.describe(so))
        return so

    def execute_model(self, so, *a, **k):
        t0, g0 = time.perf_counter(), self.gc.total
        ev = self.clock.event() if so.total_num_scheduled_tokens else None
        out = self._execute(so, *a, **k)
        if ev is not None:
            self.gpu[id(so)] = [ev, None]
            self.launched = id(so)
            self.launch_s[id(so)] = time.perf_counter() - t0
            self.gc_s[id(so)] = self.gc.total - g0
        return out

    def sample_tokens(self, *a, **k):
        t0, g0 = time.perf_counter(), self.gc.total
        out = self._sample(*a, **k)
        if self.launched in self.gpu:
            self.gpu[self.launched][1] = self.clock.event()
            self.launch_s[self.launched] += time.perf_counter() - t0
            self.gc_s[self.launched] += self.gc.total - g0
            if self.alloc_counts:
                import torch
                st = torch.cuda.memory_stats()
                self.alloc[self.launched] = [st.get(k, 0) for k in (
                    "num_alloc_retries", "num_device_alloc", "num_device_free",
                    "num_sync_all_streams")]
        self.launched = None
        return out

    def restart_clock(self):
        if self.clock is not None:
            self.clock.restart()

    def resolve_gpu(self):
        """Turn the point's events into seconds, once its steps have all run."""
        events = [r.pop("_gpu", None) for r in self.records]
        if self.clock is None:
            return
        try:
            self.clock.torch.cuda.synchronize()
            stamps = [None if e is None or e[1] is None else
                      (round(self.clock.seconds(e[0]), 7), round(self.clock.seconds(e[1]), 7))
                      for e in events]
        except RuntimeError as e:  # the CPU stamps still stand
            print(f"GPU clock unreadable at point {self.point}: {e}", file=sys.stderr, flush=True)
            return
        for r, st in zip(self.records, stamps, strict=True):
            if st is not None:
                r["gpu_t0"], r["gpu_t1"] = st

    def describe(self, so):
        """Batch composition, read right after scheduling (num_computed_tokens already
        advanced by this step's tokens, so prior context = computed - scheduled)."""
        chunks, decode_ctx, decode_seqs, spec_tokens, drafting = [], 0, 0, 0, 0
        max_ctx = 0
        for rid, n in so.num_scheduled_tokens.items():
            req = self.sched.requests.get(rid)
            n_spec = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            if req is None:
                continue
            ctx = req.num_computed_tokens - n
            max_ctx = max(max_ctx, ctx + n)
            if ctx >= req.num_prompt_tokens:
                decode_seqs += 1
                decode_ctx += ctx
                spec_tokens += n_spec
                drafting += 1 if n_spec else 0
            else:
                chunks.append([n, ctx])
        encoded = 0  # image tokens whose encoder runs in this step
        for rid, inputs in (getattr(so, "scheduled_encoder_inputs", None) or {}).items():
            req = self.sched.requests.get(rid)
            if req is not None:
                encoded += sum(req.mm_features[i].mm_position.length for i in inputs)
        return {
            "tokens": so.total_num_scheduled_tokens,
            "seqs": len(so.num_scheduled_tokens),
            "decode_seqs": decode_seqs,
            "decode_ctx": decode_ctx,
            "spec_tokens": spec_tokens,
            "drafting_seqs": drafting,
            "prefill_seqs": len(chunks),
            "prefill_tokens": sum(c for c, _ in chunks),
            "chunks": chunks,
            "max_ctx": max_ctx,
            **({"encoder_tokens": encoded} if encoded else {}),
        }

    def update_from_output(self, so, *a, **k):
        t = time.perf_counter()
        item = self.pending.pop(id(so), None)
        evs = self.gpu.pop(id(so), None)
        launch = self.launch_s.pop(id(so), None)
        gc_s = self.gc_s.pop(id(so), None)
        rec = None
        if item is not None and self.point is not None:
            t0, t1, desc = item
            rec = dict(kind="step", point=self.point, step=self.step_no,
                       t_sched0=t0, t_sched1=t1, t_done=t, **desc)
            if evs is not None:
                rec["_gpu"] = evs
            if launch is not None:
                rec["cpu_launch_s"] = round(launch, 7)
                rec["gc_launch_s"] = round(gc_s or 0.0, 7)
            if id(so) in self.alloc:  # cumulative: retries, cudaMallocs, cudaFrees, syncs
                rec["alloc_counts"] = self.alloc.pop(id(so))
            self.records.append(rec)
            self.step_no += 1
        out = self._update(so, *a, **k)
        if rec is not None:
            rec["cpu_update_s"] = round(time.perf_counter() - t, 7)
        return out


@functools.cache
def validate_runner():
    """The validation runner's globals (validate/runner.py, read by path: this script imports
    nothing of capplan): its `host` and `Pictures` are shared with this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    return runpy.run_path(os.path.join(here, "..", "validate", "runner.py"))


def token_grid(tokens):
    """The most nearly square rows x cols grid of exactly `tokens` image tokens."""
    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return rows, tokens // rows


class Driver:
    """Feeds the engine requests of exact shapes and steps it until they finish."""

    def __init__(self, llm, args, vocab, hf=None):
        import numpy as np
        from vllm import SamplingParams

        self.hf = hf  # the model's config.json: what a picture point's pictures look like
        self.pictures = None
        self.np = np
        self.SamplingParams = SamplingParams
        self.engine = llm.llm_engine
        self.core = self.engine.engine_core.engine_core  # in-process EngineCore
        self.sched = self.core.scheduler
        clock = None
        if not args.no_gpu_clock:
            import torch

            clock = GpuClock(torch)
        self.rec = Recorder(self.sched, self.core.model_executor, clock,
                            alloc_counts=getattr(args, "trace_core", False))
        self.rng = np.random.default_rng(args.seed)
        self.vocab = vocab
        self.budget0 = self.sched.max_num_scheduled_tokens
        self.k = args.spec_k
        self.n = 0

    def ids(self, length):
        return self.rng.integers(1000, self.vocab - 1000, length).tolist()

    def add(self, length, max_tokens, ids=None):
        """A request of `length` fresh tokens (or exactly `ids`); returns the engine's
        internal id (the external one plus a random suffix)."""
        from vllm.inputs import TokensPrompt

        self.n += 1
        params = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        prompt = TokensPrompt(prompt_token_ids=self.ids(length) if ids is None else ids)
        return self.engine.add_request(f"r{self.n}", prompt, params)

    def add_picture(self, length, images, tokens):
        """A request of `length` fresh tokens, `images` pictures of `tokens` image tokens
        among them, sent as the serving engine gets it: vLLM's processed multimodal input,
        built as the validation runner builds it (validate/runner.py Pictures, read by path:
        this script imports nothing of capplan)."""
        if not images:
            return self.add(length, 1)
        if self.pictures is None:
            self.pictures = validate_runner()["Pictures"](self.hf, seed=0)
        self.n += 1
        params = self.SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
        prompt = self.pictures.prompt(self.ids(length), images, tokens)
        return self.engine.add_request(f"r{self.n}", prompt, params)

    def run_until(self, done):
        while self.engine.has_unfinished_requests() and not done():
            self.engine.step()

    def drain(self):
        self.run_until(lambda: False)

    def running_decodes(self):
        return sum(1 for r in self.sched.running if r.num_computed_tokens >= r.num_prompt_tokens)

    def encoder(self, p):
        """An encoder point: `images` pictures of `image_tokens` tokens each through the
        model's vision encoder, `repeats` times after `warm_passes` untimed ones; one record
        a pass.

        The engine runs a request's images through `model.embed_multimodal` in the step
        that schedules their first chunk, eagerly, on the compute stream before the
        decoder's forward (vllm/v1/worker/gpu/mm/encoder_runner.py execute_mm_encoder in
        model runner V2, gpu_model_runner.py _execute_mm_encoder in V1; Gemma 4 has no
        encoder CUDA graph). This calls the same method of the same loaded model, in the
        engine's own worker. Its input is the batch V1's memory profiling encodes
        (`_get_mm_dummy_batch`, the processor's dummy picture at the largest size); for
        another size (`built`), or where that cannot be built (it needs the model's
        processor files), a batch of the same form: per picture `image_tokens` x k^2 patches
        of patch^2 x 3 values on a grid, k the pooling kernel (gemma4_mm.py
        Gemma4ImagePixelInputs)."""
        import torch

        n, tokens = p["images"], p["image_tokens"]

        def run(worker):
            runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
            # the model itself, not V1's CUDA-graph wrapper around it (get_model unwraps)
            model = runner.get_model() if hasattr(runner, "get_model") else runner.model
            source, batch = "vllm-dummy", None
            if not p.get("built"):
                try:
                    batch = runner._get_mm_dummy_batch("image", n)
                except Exception as e:  # any failure: build the tensors ourselves
                    source = f"built ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
            if batch is None:
                source = "built" if p.get("built") else source
                vc = model.config.vision_config
                k, patch = vc.pooling_kernel_size, vc.patch_size
                rows, cols = (k * d for d in token_grid(tokens))
                ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
                pos = torch.stack([xs.flatten(), ys.flatten()], -1)
                batch = {"pixel_values": torch.rand(n, rows * cols, patch * patch * 3,
                                                    device=runner.device),
                         "pixel_position_ids": pos.expand(n, -1, -1).contiguous().to(
                             runner.device)}
            shape = list(batch["pixel_values"].shape) if "pixel_values" in batch else None
            out = []
            with torch.inference_mode():
                for i in range(p["warm_passes"] + p["repeats"]):
                    torch.cuda.synchronize()
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    e0.record()
                    emb = model.embed_multimodal(**batch)
                    e1.record()
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    if i >= p["warm_passes"]:
                        out.append({"gpu_s": e0.elapsed_time(e1) / 1e3, "launch_s": t1 - t0,
                                    "wall_s": t2 - t0,
                                    "tokens_out": int(sum(x.shape[0] for x in emb))})
            return source, shape, out

        source, shape, passes = self.core.model_executor.collective_rpc(run)[0]
        return [{"kind": "encoder", "point": p["id"], "rep": i, "images": n,
                 "image_tokens": tokens, "pixel_values_shape": shape, "inputs": source, **r}
                for i, r in enumerate(passes)]

    def point(self, p):
        """Run one plan point; returns the step records it produced."""
        if p["kind"] == "encoder":
            return self.encoder(p)
        self.drain()  # nothing of an earlier point left on the GPU when the clock restarts
        self.rec.point, self.rec.step_no, self.rec.records = p["id"], 0, []
        self.rec.restart_clock()
        kind = p["kind"]
        try:
            if kind == "decode":
                # `groups`: [n, context] pairs, n requests of each context (a batch of
                # unequal lengths); else `batch` requests of `context`
                lengths = [c for n, c in p.get("groups", [(p["batch"], p.get("context"))])
                           for _ in range(n)]
                ends = [sum(lengths[:i + 1]) for i in range(len(lengths))]

                def completes(i):  # the prefill step the i-th prompt (from 0) completes in
                    return math.ceil(ends[i] / self.budget0)

                for i, ctx in enumerate(lengths):
                    # `even`: a request whose prompt completes before the last one's decodes
                    # the steps between, so that all of them decode `steps` steps together
                    extra = completes(len(lengths) - 1) - completes(i) if p.get("even") else 0
                    self.add(ctx, p["steps"] + 1 + extra)
                self.drain()
            elif kind == "prefill":
                # one long prompt, cut into chunks of exactly `chunk` tokens (at most the
                # engine's own budget: with a draft model vLLM keeps max_num_seqs tokens of
                # it for the drafter's extra slots, vllm/config/vllm.py:
                # _set_max_num_scheduled_tokens; a step past it overran the drafter's
                # 8,192-token buffers, a device-side assert in repeat_interleave)
                self.sched.max_num_scheduled_tokens = min(p["chunk"], self.budget0)
                self.add(p["chunk"] * p["chunks"], 1)
                self.drain()
            elif kind == "mixed":
                b, per = p["batch"], 1 + self.k
                # the decodes run out by themselves shortly after the prefill is done, even
                # if the abort below does not reach them (it did not on Llama-3.1-8B, whose
                # mixed point then decoded 10,000 steps)
                steps = b * p["context"] // self.budget0 + p["chunks"] + 24
                ids = [self.add(p["context"], steps * per) for _ in range(b)]
                self.run_until(lambda: self.running_decodes() >= b)
                for _ in range(2):  # settle into steady decode before the prefill arrives
                    self.engine.step()
                self.sched.max_num_scheduled_tokens = min(b * per + p["chunk"], self.budget0)
                pid = self.add(p["chunk"] * p["chunks"], 1)
                self.run_until(lambda: pid not in self.sched.requests)
                self.engine.step()
                self.engine.abort_request(ids, internal=True)
                self.drain()
            elif kind == "picture":
                # `repeats` prompts of `prompt` tokens, each with `images` pictures of
                # `image_tokens` tokens (0: its text-only twin), one at a time, alone or
                # beside `batch` running decodes at `context`: the step that encodes a
                # picture as the engine runs it (the request's multimodal input, the encoder
                # in gpu_model_runner.py _execute_mm_encoder, the decoder over the image
                # tokens), of which the encoder points time only the model's own call
                b = p.get("batch", 0)
                ids = []
                if b:
                    steps = p["repeats"] * (p["prompt"] // self.budget0 + 4) + 24
                    ids = [self.add(p["context"], steps) for _ in range(b)]
                    self.run_until(lambda: self.running_decodes() >= b)
                    for _ in range(2):
                        self.engine.step()
                for _ in range(p["repeats"]):
                    pid = self.add_picture(p["prompt"], p["images"], p["image_tokens"])
                    self.run_until(lambda pid=pid: pid not in self.sched.requests)
                    for _ in range(2):  # decode-only steps between, as in serving
                        self.engine.step()
                if ids:
                    self.engine.abort_request(ids, internal=True)
                self.drain()
            elif kind == "cached":
                # the prefix once, finished: its full blocks stay in vLLM's prefix cache; then
                # each request of prefix + a fresh tail alone, from an idle engine, as a
                # shared-prefix request at concurrency 1 meets it
                shared = self.ids(p["prefix"])
                if shared:
                    self.add(0, 1, ids=shared)
                    self.drain()
                for _ in range(p["repeats"]):
                    self.add(0, 1, ids=shared + self.ids(p["tail"]))
                    self.drain()
            elif kind == "shared":
                # the prefix once, then the batch: each request that prefix plus its own
                # fresh tokens, so their decode steps read the prefix's KV blocks in common
                shared = self.ids(p["prefix"])
                self.add(0, 1, ids=shared)
                self.drain()
                for _ in range(p["batch"]):
                    self.add(0, p["steps"] + 1, ids=shared + self.ids(p["context"] - p["prefix"]))
                self.drain()
            else:
                raise ValueError(f"unknown point kind {kind!r}")
        finally:
            self.sched.max_num_scheduled_tokens = self.budget0
        self.drain()
        self.rec.resolve_gpu()
        return self.rec.records


def kv_info(llm):
    cfg = llm.llm_engine.vllm_config
    cc = cfg.cache_config
    core = llm.llm_engine.engine_core.engine_core
    info = {
        "num_gpu_blocks": cc.num_gpu_blocks,
        "block_size": cc.block_size,
        "kv_tokens": (cc.num_gpu_blocks or 0) * cc.block_size,
        "available_kv_bytes": getattr(core, "available_gpu_memory_for_kv_cache", None),
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "cache_dtype": str(cc.cache_dtype),
    }
    try:
        kcc = core.scheduler.kv_cache_config
        info["kv_cache_groups"] = len(kcc.kv_cache_groups)
        info["kv_num_blocks"] = kcc.num_blocks
        info["kv_tensor_bytes"] = sum(t.size for t in kcc.kv_cache_tensors)
        # vLLM's own capacity in tokens (the "GPU KV cache size" it logs): blocks per request
        # at max_model_len over all KV cache groups, so sliding-window layers count once per
        # window (vllm/v1/core/kv_cache_utils.py: get_kv_cache_capacity)
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
        tokens, concurrency = get_kv_cache_capacity(cfg, kcc)
        info["vllm_kv_tokens"], info["max_concurrency"] = int(tokens), float(concurrency)
    except Exception as e:
        info["kv_cache_config_error"] = repr(e)
    return info


def engine_settings(llm):
    cfg = llm.llm_engine.vllm_config
    sc, cc, comp = cfg.scheduler_config, cfg.cache_config, cfg.compilation_config
    mc = cfg.model_config
    spec = cfg.speculative_config
    return {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "async_scheduling": sc.async_scheduling,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "max_model_len": mc.max_model_len,
        "dtype": str(mc.dtype),
        "quantization": mc.quantization,
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "block_size": cc.block_size,
        "kv_cache_dtype": str(cc.cache_dtype),
        "enable_prefix_caching": cc.enable_prefix_caching,
        "cudagraph_mode": str(comp.cudagraph_mode),
        "cudagraph_capture_sizes": list(comp.cudagraph_capture_sizes or []),
        "compilation_mode": str(comp.mode),
        "spec_method": getattr(spec, "method", None),
        "spec_k": getattr(spec, "num_speculative_tokens", 0) or 0,
        "load_format": "dummy",
    }


TRACE_MIN_MS = 2.0
"""CPU calls at least this long are listed by `trace_summary`."""


def trace_summary(events, min_ms=TRACE_MIN_MS, limit=400):
    """The host's long calls in a profiled point: every CPU event of torch's profiler (an
    aten op, a CUDA runtime call such as cudaStreamSynchronize, a Python function) lasting
    `min_ms` or more, in the order they began, with where it was called from; nested calls
    each appear, so a blocking call shows with the op and the vLLM function around it.
    `events`: the profiler's FunctionEvents (anything with name, time_range.start/.end in
    microseconds, device_type and stack)."""
    out = []
    for e in events:
        if "cuda" in str(getattr(e, "device_type", "")).lower():
            continue  # kernels and copies on the GPU: their time is the GPU's
        start, end = e.time_range.start, e.time_range.end
        if (end - start) / 1e3 < min_ms:
            continue
        out.append({"name": e.name, "start_ms": start / 1e3, "ms": round((end - start) / 1e3, 3),
                    "thread": getattr(e, "thread", None),
                    "stack": list(getattr(e, "stack", None) or [])[:12]})
    out.sort(key=lambda r: r["start_ms"])
    t0 = out[0]["start_ms"] if out else 0.0
    for r in out:
        r["start_ms"] = round(r["start_ms"] - t0, 3)
    return out[:limit]


def trace_point(drv, p, folder, chrome=False):
    """Run plan point `p` once more under torch's profiler (CPU and CUDA activity, Python
    stacks): its step records to `<id>.steps.jsonl`, the host's long calls
    (`trace_summary`) to `<id>.calls.json`, the profiler's table by self CPU time to
    `<id>.table.txt` and, with `chrome`, its Chrome trace, gzipped, to
    `<id>.trace.json.gz`."""
    import gzip
    import shutil

    import torch
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, p["id"])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=True) as prof:
        recs = drv.point(dict(p, id=p["id"] + "~traced"))
        torch.cuda.synchronize()
    with open(base + ".steps.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    write_json(base + ".calls.json", trace_summary(prof.events()))
    with open(base + ".table.txt", "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    if not chrome:
        return len(recs)
    raw = base + ".trace.json"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    return len(recs)


def main(argv=None):
    args = parse_args(argv)
    meta = {"argv": sys.argv, "args": vars(args), "started_unix": time.time(),
            # the settings of the environment that change how a step runs
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("VLLM_", "CUDA_", "TORCH_", "PYTORCH_"))}}
    try:
        import numpy  # noqa: F401
        import torch
        from vllm import LLM
    except ImportError as e:
        fail(EXIT_NO_VLLM, f"vLLM is not installed here ({e.name or e}); "
             "calibration must run on a GPU host with vllm==0.26.0", meta, args.meta)
    if not torch.cuda.is_available():
        fail(EXIT_NO_VLLM, "no CUDA GPU visible; calibration must run on a GPU host",
             meta, args.meta)
    meta["versions"] = versions()
    # the host's CPU (its model, clock, a Python loop's time): the engine core's launches of
    # a step that is not one CUDA graph run at its pace (docs/calibration.md, the nineteenth
    # session); measured as the validation runner measures it
    meta["versions"]["host"] = validate_runner()["host"]()
    with open(os.path.join(args.model, "config.json")) as f:
        hf = json.load(f)
    vocab = hf.get("vocab_size") or hf.get("text_config", {}).get("vocab_size") or 32000

    kw = dict(model=args.model, load_format="dummy", skip_tokenizer_init=True, seed=args.seed,
              quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
              gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=args.prefix_caching, async_scheduling=True)
    if args.spec_method:
        spec = {"method": args.spec_method, "num_speculative_tokens": args.spec_k}
        if args.spec_model:
            spec["model"] = args.spec_model
        if args.spec_method == "ngram":
            spec.update(prompt_lookup_min=2, prompt_lookup_max=4)
        kw["speculative_config"] = spec
    if args.limit_images is not None:
        kw["limit_mm_per_prompt"] = {"image": args.limit_images}
    # vLLM 0.26.0 work-arounds, shared with the validation runner (read by path: this
    # script imports nothing of capplan)
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "vllm_patches.py"))["apply_all"]()
    if args.trace_core:
        # the serving runner's core trace, in this process (the engine core runs in it):
        # which of the model runner's calls a step's launch spends its time in, at the cost
        # of two clock reads a call and two CUDA events a launch (a profiler slows the host
        # so much that the GPU always waits for it, and a call that waits for the GPU never
        # does)
        meta["trace_core"] = runpy.run_path(os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "validate", "coretrace.py"))[
                "install"](os.path.splitext(args.out)[0] + ".traces/coretrace")
    if args.hf_overrides:
        kw["hf_overrides"] = args.hf_overrides
    meta["engine_kwargs"] = {k: v for k, v in kw.items()}
    t0 = time.perf_counter()
    try:
        llm = LLM(**kw)
    except Exception as e:
        # the whole traceback to the log (a bare AssertionError names no place), one line
        # to the meta file and the last line on stderr
        traceback.print_exc(file=sys.stderr)
        text = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        meta["traceback_tail"] = traceback.format_exc().splitlines()[-12:]
        oom = "out of memory" in text.lower() or isinstance(e, torch.cuda.OutOfMemoryError)
        why = "out of memory starting the engine" if oom else "engine failed to start"
        fail(EXIT_ENGINE, f"{why}: {text}", meta, args.meta)
    meta["engine_start_s"] = round(time.perf_counter() - t0, 2)
    meta["kv"] = kv_info(llm)
    meta["engine"] = engine_settings(llm)
    write_json(args.meta, meta)
    print("ENGINE", json.dumps({"start_s": meta["engine_start_s"], **meta["kv"]}), flush=True)
    if args.kv_only or not args.plan:
        return

    with open(args.plan) as f:
        plan = json.load(f)
    done = load_done(args.out)
    drv = Driver(llm, args, vocab, hf)
    cap = meta["kv"]["kv_tokens"]
    # warm-up points run on every start: a resumed engine is as cold as a new one
    todo = [p for p in plan["points"] if p.get("warmup") or p["id"] not in done]
    meta["points_resumed"] = sorted(done)
    meta["points_hung"] = load_hung(args.out)
    t_start = time.perf_counter()
    measured, skipped = 0, []
    with open(args.out, "a") as out:
        dog = Watchdog(out, meta, args.meta, args.hang_s)
        for i, p in enumerate(todo):
            elapsed = time.perf_counter() - t_start
            if elapsed > args.time_budget_s:
                skipped += [q["id"] for q in todo[i:]]
                print(f"TIME budget reached after {elapsed:.0f} s; {len(todo) - i} points left",
                      flush=True)
                break
            if p.get("kv_tokens", 0) > 0.9 * cap:
                skipped.append(p["id"])
                continue
            tp = time.perf_counter()
            dog.start(p)
            try:
                recs = drv.point(p)
            except torch.cuda.OutOfMemoryError as e:
                fail(EXIT_ENGINE, f"out of memory at point {p['id']}: {e}".splitlines()[0],
                     meta, args.meta)
            dog.stop()
            for r in recs:
                out.write(json.dumps(r) + "\n")
            out.write(json.dumps({"kind": "point_done", "point": p["id"], "steps": len(recs),
                                  "point_s": round(time.perf_counter() - tp, 3)}) + "\n")
            out.flush()
            measured += 1
            eta = (time.perf_counter() - t_start) / measured * (len(todo) - i - 1)
            print(f"POINT {i + 1}/{len(todo)} {p['id']} steps={len(recs)} "
                  f"{time.perf_counter() - tp:.1f}s eta={eta:.0f}s", flush=True)
    meta["measure_s"] = round(time.perf_counter() - t_start, 2)
    meta["points_measured"] = measured
    meta["points_skipped"] = skipped
    meta["finished_unix"] = time.time()
    write_json(args.meta, meta)  # the measured points stand whatever a trace does
    traced = [x for x in args.trace_points.split(",") if x]
    if traced:
        folder = os.path.splitext(args.out)[0] + ".traces"
        by_id = {q["id"]: q for q in plan["points"]}
        meta["points_traced"] = {}
        for pid in traced:
            if pid not in by_id:
                print(f"TRACE {pid}: not in the plan", flush=True)
                continue
            tp = time.perf_counter()
            try:
                n = trace_point(drv, by_id[pid], folder, chrome=args.trace_chrome)
            except Exception as e:  # a trace is a diagnosis: the measured points stand
                traceback.print_exc(file=sys.stderr)
                meta["points_traced"][pid] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                continue
            meta["points_traced"][pid] = {"steps": n, "s": round(time.perf_counter() - tp, 2)}
            write_json(args.meta, meta)
            print(f"TRACE {pid} steps={n} {time.perf_counter() - tp:.1f}s", flush=True)
        write_json(args.meta, meta)
    print("DONE", json.dumps({"measured": measured, "skipped": len(skipped)}), flush=True)


if __name__ == "__main__":
    main()
