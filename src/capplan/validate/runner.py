"""GPU side of `capplan validate`: replay experiments against vLLM's AsyncLLM, as a client.

Runs as a plain script on the GPU host (vllm + numpy + stdlib, nothing from capplan):

    python3 runner.py --job job.json --out DIR

The job (written by `capplan validate emit`) names one engine configuration and a list of
experiments. The engine is vLLM's AsyncLLM, the engine behind `vllm serve`, with its engine
core in a child process (vLLM's default); every request is streamed (`RequestOutputKind.DELTA`)
and timed on the client side the way `vllm bench serve` times it
(vllm/benchmarks/lib/endpoint_request_func.py): the send, every streamed chunk, the end.

Load follows the simulator's rules (capplan/sim/run.py), so a prediction replays the same
experiment: closed-loop users send their next request when the last one ends, until
`duration_s`; open-loop requests arrive at the job's times and keep arriving after
`duration_s` until every request sent before it has finished (later ones are aborted and not
measured). Request shapes come from the job, so the simulator sees the very same requests.
Prompts are random token ids; a request of prefix group g starts with that group's shared
token ids. Prefix caching "off" is a unique `cache_salt` per request.

Writes DIR/<experiment>.jsonl (one line per measured request), DIR/<experiment>.metrics-{0,1}.txt
(the engine's Prometheus exposition before and after, as `/metrics` serves it),
DIR/<experiment>.steps.jsonl with job option `trace_steps` (every engine step as the serving
engine reports it), DIR/coretrace/core-<pid>.jsonl with job option `trace_core` (coretrace.py:
where each process's time goes) and DIR/engine.json (engine settings, KV capacity, versions,
errors; each experiment's start `t0_perf` on the clock the traces use, `gc_pauses`: the
runner process's garbage collections of 5 ms or more during it, and `gc_frozen`: how many
objects the collector skips, frozen before it as `vllm serve` freezes its own).
"""

import argparse
import asyncio
import gc
import json
import os
import runpy
import subprocess
import sys
import time

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not bundled

EXIT_NO_VLLM = 3
EXIT_ENGINE = 4
T_START = time.perf_counter()
IMPORT_S = 70.0
"""Seconds this process takes before its engine's start begins (torch and vLLM imported on a
cold host): 44, 57 and 68 s on the fifty-ninth session's three H100 hosts (each lane log's
`===` line against its engine log's first). A start's need counts them, since the deadline
runs from the process's start (T_START): without them a Qwen3-32B FP8 job given 2 s more
than its estimate started its engine and had no time left for its one experiment
(2026-12-07). A start that recorded its own (`ready_s`) needs no such allowance."""


def write_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


class Prompts:
    """Token ids for requests: a shared head per (workload, prefix group), a random tail."""

    def __init__(self, vocab, seed):
        import numpy as np

        self.np = np
        self.vocab = vocab
        self.rng = np.random.default_rng([seed, 7])
        self.seed = seed
        self.heads = {}

    def head(self, workload, group, length):
        key = (workload, group)
        ids = self.heads.get(key)
        if ids is None or len(ids) < length:
            rng = self.np.random.default_rng([self.seed, 11, workload, group])
            ids = rng.integers(1000, self.vocab - 1000, max(length, 1)).tolist()
            self.heads[key] = ids
        return ids[:length]

    def make(self, workload, input_tokens, group, prefix_tokens):
        shared = self.head(workload, group, prefix_tokens) if group >= 0 and prefix_tokens else []
        tail = self.rng.integers(1000, self.vocab - 1000, input_tokens - len(shared)).tolist()
        return shared + tail


class Pictures:
    """Image requests without an image processor: what Gemma 4's processor would hand the
    engine for a picture of `tokens` image tokens (gemma4_mm.py Gemma4ImagePixelInputs: per
    picture tokens x k^2 patches of patch^2 x 3 values, with their grid positions; the
    calibration runner's encoder scan builds the same), its placeholder tokens put in the
    prompt after its first token, and a hash of its own so that no picture hits the
    encoder cache. The prompt goes to the engine as vLLM's processed multimodal input
    (vllm/inputs/engine.py mm_input), as the renderer would send it; the weights are dummy,
    so the pixels are noise of the right shape.

    Drawing that noise takes the client's loop ~10 ms a 280-token picture, inside the
    request's send stamp. An experiment with `pixels: pooled` draws POOL batches of each shape
    before its clock starts and hands them out in turn, each under a fresh hash: what the
    engine is sent is the same, and the send stamp then holds only vLLM's own work on the
    input (AsyncLLM.add_request, its serialization to the engine core)."""

    POOL = 8

    def __init__(self, hf, seed):
        vc = hf["vision_config"]
        self.k, self.patch = vc["pooling_kernel_size"], vc["patch_size"]
        self.token_id = hf["image_token_id"]
        self.seed, self.n = seed, 0
        self.pooled = {}  # (images, tokens) -> [pixel batches], next index

    def _pixels(self, images, tokens):
        import torch

        rows, cols = (self.k * d for d in token_grid(tokens))
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        grid = torch.stack([xs.flatten(), ys.flatten()], -1)
        return {"pixel_values": torch.rand(images, rows * cols, self.patch * self.patch * 3),
                "pixel_position_ids": grid.expand(images, -1, -1).contiguous()}

    def pool(self, exp):
        """Draw the pixels of every picture shape `exp` sends before its clock starts
        (`pixels: pooled`), else forget any drawn for an earlier experiment."""
        self.pooled = {}
        if exp.get("pixels") != "pooled":
            return
        for w in exp["workloads"]:
            if w.get("image"):
                shape = (w["image"]["images"], w["image"]["tokens"])
                if shape not in self.pooled:
                    self.pooled[shape] = [[self._pixels(*shape) for _ in range(self.POOL)], 0]

    def place(self, ids, images, tokens):
        """`ids` with each picture's placeholder tokens after the first token and one text
        token after each picture (the prompt's length unchanged: its image tokens are
        counted in it), and the pictures' offsets."""
        if images * (tokens + 1) > len(ids):
            raise ValueError(f"a prompt of {len(ids)} tokens cannot hold {images} pictures "
                             f"of {tokens} tokens")
        ids, offsets, pos = list(ids), [], 1
        for _ in range(images):
            ids[pos:pos + tokens] = [self.token_id] * tokens
            offsets.append(pos)
            pos += tokens + 1
        return ids, offsets

    def batch(self, images, tokens):
        """The pixels of one request's pictures: the pool's next, else drawn now."""
        pooled = self.pooled.get((images, tokens))
        if pooled is None:
            return self._pixels(images, tokens)
        batches, i = pooled
        pooled[1] = i + 1
        return batches[i % len(batches)]

    def prompt(self, ids, images, tokens, cache_salt=None):
        from vllm.inputs.engine import mm_input
        from vllm.multimodal.inputs import (
            MultiModalFieldConfig,
            MultiModalKwargsItems,
            PlaceholderRange,
        )

        ids, offsets = self.place(ids, images, tokens)
        places = [PlaceholderRange(offset=o, length=tokens) for o in offsets]
        batch = self.batch(images, tokens)
        config = {k: MultiModalFieldConfig.batched("image") for k in batch}
        hashes = [f"capplan-{self.seed}-{self.n + i}" for i in range(1, images + 1)]
        self.n += images
        return mm_input(ids, MultiModalKwargsItems.from_hf_inputs(batch, config),
                        {"image": hashes}, {"image": places}, cache_salt=cache_salt)


def token_grid(tokens):
    """The most nearly square rows x cols grid of exactly `tokens` image tokens (as the
    calibration runner's)."""
    import math

    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return rows, tokens // rows


def percentile(xs, q):
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


class Experiment:
    """One experiment's load, replayed against a live engine."""

    def __init__(self, engine, exp, prompts, out_path, sampling_params, pictures=None):
        self.engine = engine
        self.pictures = pictures  # Pictures, where a workload sends images
        self.sampling_params = sampling_params  # max_tokens -> streamed, ignore-EOS params
        self.exp = exp
        self.prompts = prompts
        self.out_path = out_path
        self.duration = float(exp["duration_s"])
        self.salted = not exp.get("prefix_caching", True)
        self.records = []
        self.measured_pending = 0
        self.sent_open = []
        self.t0 = 0.0
        self.all_measured_done = asyncio.Event()
        self.open_done_sending = False
        self.tasks = set()
        self.errors = []
        self.n = 0

    def now(self):
        return time.perf_counter() - self.t0

    async def request(self, wl, inp, out, group, ptoks, priority, measured, send_by=None):
        """Send one request and record it; with `send_by`, only if it can be sent before
        then (the send stamp decides, not a clock read before the prompt was built).
        Returns whether it was sent."""
        ids = self.prompts.make(wl, inp, group, ptoks)
        sp = self.sampling_params(out)
        t_send = self.now()
        if send_by is not None and t_send >= send_by:
            return False
        self.n += 1
        rid = f"{self.exp['name']}-{self.n}"
        image = self.exp["workloads"][wl].get("image")
        if image:  # a processed multimodal input (Pictures)
            prompt = self.pictures.prompt(ids, image["images"], image["tokens"],
                                          rid if self.salted else None)
        else:
            prompt = {"prompt_token_ids": ids}  # vllm.inputs.TokensPrompt is this TypedDict
            if self.salted:
                prompt["cache_salt"] = rid
        prep = self.now() - t_send  # the harness's own time inside the send stamp
        chunks, cached, n_out = [], None, 0
        kw = {"priority": priority} if priority else {}
        error = None
        try:
            async for o in self.engine.generate(prompt, sp, rid, **kw):
                t = self.now()
                k = len(o.outputs[0].token_ids)
                if cached is None and o.num_cached_tokens is not None:
                    cached = o.num_cached_tokens
                if k:
                    chunks.append((t, k))
                    n_out += k
        except asyncio.CancelledError:
            await self.engine.abort(rid)
            raise
        except Exception as e:  # counted, not lost: a silent failure would hang the run
            error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            self.errors.append(error)
        if measured:
            self.records.append({
                "workload": wl, "send_s": round(t_send, 6), "input_tokens": inp,
                "output_tokens": n_out, "max_tokens": out, "cached_tokens": cached or 0,
                "prefix_group": group, "prefix_tokens": ptoks, "priority": priority,
                "prep_s": round(prep, 6),
                "ttft_s": round(chunks[0][0] - t_send, 6) if chunks else None,
                "e2e_s": round(chunks[-1][0] - t_send, 6) if chunks else None,
                "chunk_t": [round(t - t_send, 6) for t, _ in chunks],
                "chunk_k": [k for _, k in chunks],
                **({"error": error} if error else {}),
            })
            self.measured_pending -= 1
            if self.measured_pending == 0 and self.open_done_sending:
                self.all_measured_done.set()
        return True

    def spawn(self, coro):
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def user(self, wl, spec, rows, cursor):
        """One closed-loop user: next request when the last ends, until duration_s, or until
        a request has failed: a dead engine fails each at once, and its users would send tens
        of thousands (an H100 out of memory, forty-third session); the run fails on them."""
        while self.now() < self.duration and not self.errors:
            i = cursor[0]
            cursor[0] += 1
            inp, out, group, ptoks = rows[i % len(rows)]
            self.measured_pending += 1
            if not await self.request(wl, inp, out, group, ptoks, spec.get("priority", 0),
                                      True, send_by=self.duration):
                self.measured_pending -= 1
                return

    async def open_loop(self, arrivals):
        """Open-loop arrivals in time order; after duration_s they keep coming (unmeasured)
        until every measured request has finished."""
        for at, wl, inp, out, group, ptoks, prio in arrivals:
            if at >= self.duration and not self.open_done_sending:
                self.open_done_sending = True
                if self.measured_pending == 0:
                    self.all_measured_done.set()
            if self.all_measured_done.is_set():
                return
            delay = at - self.now()
            if delay > 0 and self.open_done_sending:
                try:
                    await asyncio.wait_for(self.all_measured_done.wait(), delay)
                    return
                except TimeoutError:
                    pass
            elif delay > 0:
                await asyncio.sleep(delay)
            measured = at < self.duration
            if measured:
                self.measured_pending += 1
            self.spawn(self.request(wl, inp, out, group, ptoks, prio, measured))
        self.open_done_sending = True
        if self.measured_pending == 0:
            self.all_measured_done.set()

    async def run(self):
        exp = self.exp
        arrivals, users = [], []
        for w in exp["workloads"]:
            wl = w["index"]
            if w["kind"] == "closed":
                rows = list(zip(w["input_tokens"], w["output_tokens"], w["prefix_group"],
                                w["prefix_tokens"], strict=True))
                users.append((wl, w, rows))
            else:
                n = len(w["arrival_s"])
                arrivals += list(zip(w["arrival_s"], [wl] * n, w["input_tokens"],
                                     w["output_tokens"], w["prefix_group"], w["prefix_tokens"],
                                     [w.get("priority", 0)] * n, strict=True))
        arrivals.sort(key=lambda a: a[0])
        if self.pictures is not None:
            self.pictures.pool(exp)
        self.t0 = time.perf_counter()
        closed = []
        for wl, w, rows in users:
            cursor = [0]
            closed += [self.spawn(self.user(wl, w, rows, cursor)) for _ in range(w["concurrency"])]
        if arrivals:
            await self.open_loop(arrivals)
            await self.all_measured_done.wait()
        if closed:
            await asyncio.gather(*closed)
        wall = self.now()
        for t in list(self.tasks):  # unmeasured open-loop requests still running
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with open(self.out_path, "w") as f:
            for r in self.records:
                f.write(json.dumps(r) + "\n")
        return wall, summary(self.records, self.duration)


def summary(records, duration):
    ttft = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in records if r["e2e_s"] is not None]
    itl = [b - a for r in records for a, b in zip(r["chunk_t"][:-1], r["chunk_t"][1:], strict=True)]
    out = sum(r["output_tokens"] for r in records)
    end = max((r["send_s"] + r["e2e_s"] for r in records if r["e2e_s"] is not None), default=0)
    start = min((r["send_s"] for r in records), default=0)
    return {
        "requests": len(records),
        "output_tok_s": round(out / max(end - start, 1e-9), 1),
        "ttft_p50_ms": round(1e3 * percentile(ttft, 50), 2),
        "ttft_p99_ms": round(1e3 * percentile(ttft, 99), 2),
        "itl_p50_ms": round(1e3 * percentile(itl, 50), 2),
        "itl_p99_ms": round(1e3 * percentile(itl, 99), 2),
        "e2e_p99_s": round(percentile(e2e, 99), 3),
    }


def host():
    """The host's CPU, which sets how long the engine core takes to launch a step that is
    not one CUDA graph: its model, its clock, and a pure-Python loop's time on it (two
    leases of the same H200 kind differed 1.7x in such steps, docs/validation.md)."""
    out = {"cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        out["cpu_model"] = next((x.split(":", 1)[1].strip() for x in lines
                                 if x.startswith("model name")), None)
        mhz = [float(x.split(":", 1)[1]) for x in lines if x.startswith("cpu MHz")]
        if mhz:
            out["cpu_mhz_mean"] = round(sum(mhz) / len(mhz))
    except (OSError, ValueError) as e:
        out["cpu_error"] = repr(e)
    best = float("inf")
    for _ in range(3):
        t, acc = time.perf_counter(), 0
        for i in range(1_000_000):
            acc += i
        best = min(best, time.perf_counter() - t)
    out["py_loop_1m_ms"] = round(best * 1e3, 2)
    return out


def versions():  # as calibrate/runner.py's: each GPU script stands alone (stdlib + vllm)
    out = {"python": sys.version.split()[0], "host": host()}
    try:
        import torch
        import vllm

        out.update(vllm=vllm.__version__, torch=torch.__version__, cuda=torch.version.cuda)
        if torch.cuda.is_available():
            out["gpu_name"] = torch.cuda.get_device_name(0)
            out["gpu_total_bytes"] = torch.cuda.mem_get_info()[1]
    except Exception as e:  # provenance is best effort; the run itself will fail loudly
        out["version_error"] = repr(e)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False)
        line = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else ""
        out["nvidia_smi"] = line
        out["driver"] = line.split(",")[1].strip() if "," in line else None
    except (OSError, subprocess.SubprocessError) as e:
        out["nvidia_smi"] = repr(e)
    return out


def engine_settings(engine):
    cfg = engine.vllm_config
    sc, cc, comp = cfg.scheduler_config, cfg.cache_config, cfg.compilation_config
    spec = cfg.speculative_config
    return {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "async_scheduling": sc.async_scheduling,
        "scheduling_policy": str(sc.policy),
        "max_model_len": cfg.model_config.max_model_len,
        "quantization": cfg.model_config.quantization,
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "block_size": cc.block_size,
        "num_gpu_blocks": cc.num_gpu_blocks,
        "kv_tokens": (cc.num_gpu_blocks or 0) * cc.block_size,
        "kv_cache_dtype": str(cc.cache_dtype),
        "enable_prefix_caching": cc.enable_prefix_caching,
        "cudagraph_mode": str(comp.cudagraph_mode),
        "spec_method": getattr(spec, "method", None),
        "spec_k": getattr(spec, "num_speculative_tokens", 0) or 0,
        "spec_rejection": getattr(spec, "rejection_sample_method", None),
        "spec_synthetic_rates": getattr(spec, "synthetic_acceptance_rates", None),
    }


class StepTrace:
    """Engine steps as the serving engine reports them (job option `trace_steps`): vLLM's
    per-iteration details (`enable_logging_iteration_details`, vllm/v1/engine/core.py
    capture_iteration_details: prefill requests and tokens, decode requests and tokens, the
    core's wait for the step's result) with the time they reached the client process."""

    def __init__(self):
        self.rows = []

    def factory(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        trace = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index=0):
                self.engine_index = engine_index

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
                       engine_idx=0):
                d = getattr(scheduler_stats, "iteration_details", None)
                if d is None or d.is_dummy:
                    return
                trace.rows.append((time.perf_counter(), d.iteration_index, d.num_ctx_requests,
                                   d.num_ctx_tokens, d.num_generation_requests,
                                   d.num_generation_tokens, round(d.elapsed_ms, 3),
                                   scheduler_stats.num_running_reqs,
                                   scheduler_stats.num_waiting_reqs,
                                   round(scheduler_stats.kv_cache_usage, 4)))

            def log_engine_initialized(self):
                pass

        return _Logger

    def take(self, t0):
        """Rows since the last take, timed from t0 (the experiment's start)."""
        rows, self.rows = self.rows, []
        keys = ("t", "step", "prefill_reqs", "prefill_tokens", "decode_reqs", "decode_tokens",
                "wait_ms", "running", "waiting", "kv_usage")
        return [dict(zip(keys, (round(r[0] - t0, 6), *r[1:]), strict=True)) for r in rows]


class GcPauses:
    """The runner process's garbage collections that held it at least `min_s` (gc.callbacks).
    The client and AsyncLLM's output handler share this process, so such a pause delays
    every token it receives meanwhile, as a serving process's own would; twice a 0.5 s gap
    with the engine core stepping on (docs/validation.md, twenty-first session) asked whether
    these were the cause. `take(t0)` returns the pauses since the last take as
    [start from t0 (s), ms, generation]."""

    def __init__(self, min_s=0.005):
        self.min_s, self.started, self.pauses = min_s, None, []

    def __call__(self, phase, info):
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            held = time.perf_counter() - self.started
            if held >= self.min_s:
                self.pauses.append((self.started, held, info.get("generation")))
            self.started = None

    def take(self, t0):
        pauses, self.pauses = self.pauses, []
        return [[round(t - t0, 4), round(held * 1e3, 2), gen] for t, held, gen in pauses]


def scrape():
    import prometheus_client
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return prometheus_client.generate_latest(get_prometheus_registry()).decode()


def _earlier_start(folder):
    """What an earlier start of the same job recorded in its `folder` (engine.json; {} if
    it wrote none or cannot be read)."""
    try:
        with open(os.path.join(folder, "engine.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def finished_runs(folders):
    """Experiment runs an earlier start of the same job finished (its engine.json says so)."""
    done = set()
    for folder in folders or ():
        exps = _earlier_start(folder).get("experiments", {})
        done |= {name for name, info in exps.items() if "wall_s" in info}
    return done


async def amain(args):
    with open(args.job) as f:
        job = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    meta_path = os.path.join(args.out, "engine.json")
    meta = {"job": job["name"], "argv": sys.argv, "started_unix": time.time(),
            "versions": versions(), "engine_kwargs": job["engine"], "experiments": {}}
    try:
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.usage.usage_lib import UsageContext
        from vllm.utils.gc_utils import freeze_gc_heap
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        meta["error"] = f"vLLM is not installed here ({e}); validate runs on a GPU host"
        write_json(meta_path, meta)
        print(f"capplan-runner: {meta['error']}", file=sys.stderr)
        return EXIT_NO_VLLM
    done = finished_runs(args.done)
    if all(e.get("warmup") or e["name"] in done for e in job["experiments"]):
        meta["note"] = "every experiment was measured by an earlier start; engine not started"
        write_json(meta_path, meta)
        print("DONE", job["name"], "nothing left to measure", flush=True)
        return 0
    with open(os.path.join(job["engine"]["model"], "config.json")) as f:
        hf = json.load(f)
    vocab = hf.get("vocab_size") or hf.get("text_config", {}).get("vocab_size") or 32000
    trace, loggers, engine_kw = None, None, dict(job["engine"])
    if job.get("trace_steps"):
        try:
            import logging

            trace = StepTrace()
            loggers = [trace.factory()]
            engine_kw["enable_logging_iteration_details"] = True
            # the default logger would print every iteration; keep it quiet
            logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        except Exception as e:  # tracing is a diagnosis aid: never fail the run for it
            meta["trace_error"] = f"{type(e).__name__}: {e}"[:300]
            trace, loggers = None, None
    # vLLM 0.26.0 work-arounds, shared with the calibration runner (read by path: this
    # script imports nothing of capplan)
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "vllm_patches.py"))["apply_all"]()
    if job.get("trace_core"):  # where the engine core's time goes (coretrace.py)
        try:
            meta["trace_core"] = runpy.run_path(os.path.join(
                os.path.dirname(os.path.abspath(__file__)), "coretrace.py"))["plugin"](
                    os.path.join(args.out, "coretrace"))
        except Exception as e:  # a diagnosis aid: never fail the run for it
            meta["trace_error"] = f"{type(e).__name__}: {e}"[:300]
    t = time.perf_counter()
    try:
        engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(**engine_kw), usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=loggers)
    except Exception as e:
        meta["error"] = f"engine failed to start: {type(e).__name__}: {e}".splitlines()[0][:400]
        write_json(meta_path, meta)
        print(f"capplan-runner: {meta['error']}", file=sys.stderr)
        return EXIT_ENGINE
    meta["engine_start_s"] = round(time.perf_counter() - t, 2)
    meta["ready_s"] = round(time.perf_counter() - T_START, 2)  # the imports and the start
    meta["engine"] = engine_settings(engine)
    write_json(meta_path, meta)
    print("ENGINE", job["name"], json.dumps({"start_s": meta["engine_start_s"],
                                             "kv_tokens": meta["engine"]["kv_tokens"]}), flush=True)
    prompts = Prompts(vocab, job.get("seed", 0))
    pictures = (Pictures(hf, job.get("seed", 0))
                if any(w.get("image") for e in job["experiments"] for w in e["workloads"])
                else None)

    def streamed_params(max_tokens):
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                              output_kind=RequestOutputKind.DELTA)

    deadline = T_START + args.time_budget_s  # counted from the process start
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses)
    rc = 0
    try:
        for exp in job["experiments"]:
            name = exp["name"]
            # warm-ups run on every start: a resumed engine is as cold as a new one (a
            # drafter's first steps JIT-compile vLLM's spec-decode Triton kernels, 2.6 s)
            if name in done and not exp.get("warmup"):
                meta["experiments"][name] = {"skipped": "measured by an earlier start"}
                continue
            need = need_s(exp)
            if time.perf_counter() + need > deadline:
                meta["experiments"][name] = {"skipped": "time budget"}
                print("SKIP", name, flush=True)
                continue
            await engine.reset_prefix_cache()
            before = scrape()
            # what is alive now stays: frozen, the collector's oldest generation skips it, as
            # `vllm serve` does once started (vllm/entrypoints/serve/utils/server_utils.py)
            # and `vllm bench serve` before it sends (vllm/benchmarks/serve.py). Unfrozen, a
            # full collection here held the process 390 ms mid-run (2026-12-01,
            # llama-3.1-8b-fp8-gc chat-p44-r4): every token due meanwhile came late.
            freeze_gc_heap()
            gc_pauses.take(0.0)  # from here on, this experiment's
            x = Experiment(engine, exp, prompts, os.path.join(args.out, f"{name}.jsonl"),
                           streamed_params, pictures)
            limit = exp.get("timeout_s", 4 * exp["duration_s"] + 120)
            try:
                wall, summ = await asyncio.wait_for(x.run(), limit)
                if x.errors:
                    raise RuntimeError(f"{len(x.errors)} requests failed, first: {x.errors[0]}")
            except Exception as e:
                msg = f"{type(e).__name__}: {e}".splitlines()[0][:400]
                meta["experiments"][name] = {"error": msg}
                write_json(meta_path, meta)
                print("FAIL", name, msg, flush=True)
                rc = EXIT_ENGINE
                break  # a dead engine fails every later experiment the same way
            if trace is not None:
                steps = trace.take(x.t0)
                if not exp.get("warmup"):
                    with open(os.path.join(args.out, f"{name}.steps.jsonl"), "w") as f:
                        f.writelines(json.dumps(r) + "\n" for r in steps)
            if not exp.get("warmup"):
                with open(os.path.join(args.out, f"{name}.metrics-0.txt"), "w") as f:
                    f.write(before)
                with open(os.path.join(args.out, f"{name}.metrics-1.txt"), "w") as f:
                    f.write(scrape())
            meta["experiments"][name] = {"wall_s": round(wall, 3), "t0_perf": x.t0, **summ,
                                         "gc_pauses": gc_pauses.take(x.t0),
                                         "gc_frozen": gc.get_freeze_count()}
            write_json(meta_path, meta)
            print("EXP", name, f"{wall:.1f}s", json.dumps(summ), flush=True)
    finally:
        meta["finished_unix"] = time.time()
        write_json(meta_path, meta)
        engine.shutdown()
    return rc


def need_s(exp):
    """Seconds an experiment needs: sending for its duration, then the last requests' drain."""
    return 1.3 * exp["duration_s"] + 10


def start_need_s(job, done_folders=()):
    """Seconds a new start of `job` needs before it measures anything: the engine's start,
    the warm-ups and the first experiment not yet finished. Less than that, and a start is
    cut inside the compile and measures nothing (2026-12-01: a Gemma 4 start given 233 s).

    The engine's start is the model's longest so far (`capplan validate emit` writes it as
    expected_start_s), unless the job resumes on the host of earlier starts (`done_folders`,
    as --done names them): then it is the longest of those starts, all cold, which bounds a
    restart that finds the host's compile cache warm (2026-12-06: 130 s cold, 42 s again).
    Either way with the process's imports before it: an earlier start's own (`ready_s`), else
    IMPORT_S."""
    x = job["experiments"]
    done = finished_runs(done_folders)
    first = [e for e in x if not e.get("warmup") and e["name"] not in done][:1]
    start = job.get("expected_start_s", 0) + IMPORT_S
    here = [m.get("ready_s") or m["engine_start_s"] + IMPORT_S
            for m in map(_earlier_start, done_folders) if m.get("engine_start_s") is not None]
    if here:
        start = max(here)
    return start + sum(need_s(e) for e in x if e.get("warmup")) + sum(need_s(e) for e in first)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, help="job JSON from `capplan validate emit`")
    ap.add_argument("--out", help="folder for the measurements")
    ap.add_argument("--done", action="append", default=[],
                    help="an earlier start's output folder: skip the runs it finished")
    ap.add_argument("--time-budget-s", type=float, default=600.0,
                    help="seconds from start; skip experiments that would end later")
    ap.add_argument("--start-need", action="store_true",
                    help="print the whole seconds a new start of the job needs (after the --done "
                         "starts, on their host), and exit")
    args = ap.parse_args(argv)
    if args.start_need:
        with open(args.job) as f:
            print(int(start_need_s(json.load(f), args.done)))
        return
    if args.out is None:
        ap.error("--out is required")
    raise SystemExit(asyncio.run(amain(args)))


if __name__ == "__main__":
    main()
