"""Where a serving engine core's time goes: wall-clock spans of its scheduler, model runner
and I/O threads, and the GPU's span of each step (job option `trace_core`).

Plain Python with no capplan imports: the validation runner reads this file by path
(`runpy.run_path`) and calls `plugin(folder)` before it starts the engine. The runner has
initialised CUDA by then, so vLLM 0.26.0 spawns the engine core (vllm/utils/system_utils.py:
_maybe_force_spawn) and the child inherits no wrapped method. It loads vLLM's general
plugins instead (vllm/plugins/__init__.py, called from EngineCore.__init__ before the core
binds its step function), so `plugin` makes this file one: a module and its entry point in
a folder on the path, which wraps the methods in every process. Each process writes its own
`folder/core-<pid>.jsonl`.

One line per span: `[name, thread, t0, t1]`, times in `time.perf_counter()` seconds, the
clock the runner stamps requests with (CLOCK_MONOTONIC, shared by every process on the
host). A model-runner call also gives a `gpu:<name>` span: CUDA events recorded on the
engine's stream (vllm/v1/worker/gpu/model_runner.py: main_stream is the current stream)
just before and after the call, placed on the same clock through one synchronised event.
The GPU span starts when the stream reaches the call's first kernel and ends when its last
launched kernel finishes, so the gap from a step's CPU start to its GPU start is the GPU
still busy with earlier work, and a GPU span longer than its kernels is launch-bound.
Python's garbage collector gives a `gc<generation>` span on the thread it stopped
(`gc.callbacks`): vLLM freezes the heap it starts with (vllm/utils/gc_utils.py
freeze_gc_heap, from EngineCore.__init__), and what the collections of the objects each
step makes cost the core is what these spans measure.

Lines are written by a background thread whenever the core has been quiet for 0.5 s (between
experiments), so writing never delays a step, and what is left as the process exits (vLLM's
engine core, a multiprocessing child, leaves through SystemExit on SIGTERM,
vllm/v1/engine/core.py `run_engine_core`): a run whose last experiment kept the core busy
until its shutdown lost its tail before (llama-3.1-8b-bf16-draft4-core16k, twenty-eighth
session).
"""

import functools
import gc
import importlib
import json
import multiprocessing.util
import os
import threading
import time

# (module, class, method): what each span times (vLLM 0.26.0; the V2 model runner is the
# default there, vllm/v1/worker/gpu/model_runner.py; a target this vLLM lacks is skipped)
TARGETS = [
    ("vllm.v1.engine.core", "EngineCore", "add_request"),
    ("vllm.v1.engine.core", "EngineCore", "preprocess_add_request"),
    ("vllm.v1.engine.core", "EngineCore", "step_with_batch_queue"),
    ("vllm.v1.engine.core", "EngineCoreProc", "_process_input_queue"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "add_request"),
    ("vllm.v1.executor.uniproc_executor", "AsyncOutputFuture", "result"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "execute_model"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "sample_tokens"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "add_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "update_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "prepare_inputs"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "prepare_attn"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "sample"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "postprocess_sampled"),
    # inside execute_model (model_runner.py), for the steps whose launch waits for the GPU
    # (docs/calibration.md, "A point's drain"); a fourth field names a span whose method
    # name another target has
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "finish_requests"),
    ("vllm.v1.worker.gpu.block_table", "BlockTables", "apply_staged_writes"),
    ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", "dispatch"),
    ("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager", "run_fullgraph"),
    ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", "run_pw_graph"),
    ("vllm.v1.worker.gpu.model_states.default", "DefaultModelState", "prepare_inputs",
     "state.prepare_inputs"),
    ("vllm.v1.worker.gpu.model_states.default", "DefaultModelState", "prepare_attn",
     "state.prepare_attn"),
    ("vllm.v1.worker.gpu.async_utils", "AsyncOutput", "__init__", "AsyncOutput"),
    # inside GPUModelRunner.sample, which a drain's launches wait in (thirty-third session)
    ("vllm.model_executor.models.llama", "LlamaForCausalLM", "compute_logits"),
    ("vllm.v1.worker.gpu.sample.sampler", "Sampler", "__call__", "Sampler"),
    ("vllm.v1.worker.gpu.sample.sampler", "Sampler", "sample", "Sampler.sample"),
    # the V1 model runner, which vLLM 0.26.0 still picks for a draft model's speculation
    # (vllm/config/vllm.py: _get_v2_model_runner_unsupported_features), and its drafter
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_prepare_inputs"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_bookkeeping_sync"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "propose"),
    ("vllm.v1.serial_utils", "MsgpackEncoder", "encode_into"),
    ("vllm.v1.serial_utils", "MsgpackDecoder", "decode"),
]
GPU_TIMED = {"execute_model", "sample_tokens", "propose"}


class _Trace:
    def __init__(self, folder):
        self.folder = folder
        self.pid = None
        self.lines = []
        self.pending = []  # (name, start event, end event) not yet resolved
        self.base = None  # (event, perf_counter when it completed)
        self.last = 0.0
        self.lock = threading.Lock()

    def _ensure(self):
        """First use in a process: a fresh buffer and writer (a forked child inherits the
        parent's lists but not its threads)."""
        if self.pid == os.getpid():
            return
        self.pid, self.lines, self.pending, self.base = os.getpid(), [], [], None
        self.lines.append(["process", threading.current_thread().name, time.perf_counter(),
                           time.perf_counter()])
        threading.Thread(target=self._writer, name="coretrace", daemon=True).start()
        # at exit: a multiprocessing child leaves through its _bootstrap, which runs these
        # finalizers and not atexit's (a forked one ends in os._exit); the parent at atexit
        multiprocessing.util.Finalize(self, self._flush, exitpriority=0)

    def span(self, name, t0, t1):
        self.lines.append([name, threading.current_thread().name[:12], t0, t1])
        self.last = t1

    def gpu_events(self, torch):
        if self.base is None:
            torch.cuda.synchronize()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self.base = (ev, time.perf_counter())
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, everything=False):
        base, t_base = self.base
        keep = []
        for name, e0, e1 in self.pending:
            if everything or e1.query():
                e1.synchronize()
                self.lines.append([f"gpu:{name}", "gpu", t_base + base.elapsed_time(e0) / 1e3,
                                   t_base + base.elapsed_time(e1) / 1e3])
            else:
                keep.append((name, e0, e1))
        self.pending = keep

    def _flush(self):
        with self.lock:
            out, self.lines = self.lines, []
            if out:
                with open(os.path.join(self.folder, f"core-{os.getpid()}.jsonl"), "a") as f:
                    f.writelines(json.dumps(x) + "\n" for x in out)

    def _writer(self):
        while True:
            time.sleep(0.5)
            if self.lines and time.perf_counter() - self.last > 0.5:
                self._flush()


def _wrap(trace, fn, name):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        trace._ensure()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            trace.span(name, t0, time.perf_counter())
    return timed


def _wrap_gpu(trace, fn, name):
    import torch

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        # warm-up and CUDA-graph capture run the model too (model_runner.py: _dummy_run);
        # an event query or synchronize inside a capture would break it
        if kwargs.get("dummy_run") or torch.cuda.is_current_stream_capturing():
            return fn(*args, **kwargs)
        trace._ensure()
        if trace.pending:
            trace.resolve()
        e0 = trace.gpu_events(torch)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.perf_counter()
            trace.pending.append((name, e0, trace.gpu_events(torch)))
            trace.span(name, t0, t1)
    return timed


def _gc_spans(trace):
    """A `gc.callbacks` entry that writes each collection as a span `gc<generation>` on the
    thread it stopped, once this process has traced a call (the engine's start-up
    collections, before its first step, are left out). Not the writer's own collections, and
    a collection does not count as the core's activity: the writer waits for the core to be
    quiet, and collections in other threads would keep it waiting."""
    began = {}

    def callback(phase, info):
        thread = threading.current_thread().name
        if thread == "coretrace":
            return
        if phase == "start":
            began[threading.get_ident()] = time.perf_counter()
            return
        t0 = began.pop(threading.get_ident(), None)
        if t0 is not None and trace.pid == os.getpid():
            trace.lines.append([f"gc{info.get('generation', '')}", thread[:12], t0,
                                time.perf_counter()])
    callback._coretrace = True
    return callback


def install(folder):
    """Wrap the TARGETS that exist in this vLLM and are not wrapped yet, and time the garbage
    collector's passes (`_gc_spans`) once a process; returns the wrapped names."""
    os.makedirs(folder, exist_ok=True)
    trace = _Trace(folder)
    wrapped = []
    if not any(getattr(cb, "_coretrace", False) for cb in gc.callbacks):
        gc.callbacks.append(_gc_spans(trace))
        wrapped.append("gc.callbacks")
    for mod, cls, meth, *span in TARGETS:
        try:
            owner = getattr(importlib.import_module(mod), cls)
            fn = getattr(owner, meth)
        except (ImportError, AttributeError):
            continue
        if getattr(fn, "_coretrace", False):
            continue
        timed = (_wrap_gpu if meth in GPU_TIMED else _wrap)(trace, fn, span[0] if span else meth)
        timed._coretrace = True
        setattr(owner, meth, timed)
        wrapped.append(f"{cls}.{meth}")
    return wrapped


PLUGIN = """import os, runpy


def register():
    runpy.run_path(os.environ["CAPPLAN_CORE_TRACE_PY"])["install"](os.environ["CAPPLAN_CORE_TRACE"])
"""


def plugin(folder):
    """Trace every process vLLM starts from here on: this file as a `vllm.general_plugins`
    entry point (a module and its dist-info in `folder/site`, put on sys.path, which a
    spawned child inherits, and on PYTHONPATH), then `install` in this process."""
    import sys

    site = os.path.join(folder, "site")
    info = os.path.join(site, "capplan_coretrace-0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(site, "capplan_coretrace.py"), "w") as f:
        f.write(PLUGIN)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: capplan-coretrace\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ncoretrace = capplan_coretrace:register\n")
    os.environ["CAPPLAN_CORE_TRACE"] = folder
    os.environ["CAPPLAN_CORE_TRACE_PY"] = os.path.abspath(__file__)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (site, os.environ.get("PYTHONPATH")) if x)
    sys.path.insert(0, site)
    importlib.invalidate_caches()
    return install(folder)
