"""The calibration sweep: which batch compositions to drive the engine through, in order.

Points come coarse-first (a run cut short by its time budget still spans the space) and
each carries an analytic cost estimate, so a plan fits a per-engine time budget. Kinds:

- `decode`: `batch` prompts of `context` tokens, then `steps` decode steps (its prefill
  steps are recorded too: multi-sequence prefill samples come for free);
- `prefill`: one prompt cut into `chunks` chunks of exactly `chunk` tokens (the runner
  sets the scheduler's token budget to `chunk`), so chunk i attends over i x chunk tokens;
- `mixed`: `batch` running decodes at `context`, plus a prompt whose chunks of `chunk`
  tokens share each step with them (token budget = batch x (1 + k) + chunk);
- `cached` (an engine with prefix caching on, `cache_points`): a `prefix`-token prompt
  prefilled once, then `repeats` requests of that prefix plus `tail` fresh tokens, one at a
  time from an idle engine: the step a prefix-cache hit makes.
- `shared` (the same engine): a decode batch whose requests all begin with one `prefix`-token
  prompt, which vLLM keeps once in its prefix cache, so every request's attention reads the
  same KV blocks; timed beside a `decode` point of the same batch and context without one.
- `decmix-bBcC-…` (a mixlen-scan engine, `mixlen_points`): a `decode` point whose `groups`
  list [B, C] pairs, B requests at context C each, decoding together (`even`): a decode
  batch of unequal lengths, beside its twin of one length.
- `graphs-bB-cC` (a graph-scan engine, `graph_points`): a `decode` point with `even` set, whose
  requests all decode their `steps` steps together (a request whose prompt is done early
  decodes longer), at every CUDA-graph size a decode-only batch can take: the decode-only
  step's time at each size, which the linear terms do not follow (steptime.py:
  `graph_offset_s`).

An encoder scan (`encoder_points`, a multimodal model's engine with images allowed) times its
vision encoder apart from the steps: `encoder-iN-tT`, N pictures of T image tokens each
through `embed_multimodal`, `warm_passes` untimed then `repeats` timed (runner.py:
`Driver.encoder`); the step that schedules a picture's first chunk runs this before its
decoder forward (steptime.py: `encoder_token_s`). The same engine then times such steps whole
(`picture_points`): `picture-pP-iN[-bB]`, prompts of P tokens with N pictures of the default
size (N = 0: the text-only twin), one at a time, alone or beside B running decodes.

A drain scan (`drain_points`) times what a decode point's end costs: the same point twice,
its requests finishing sixteen a step (a drain, as every sweep's decode points end) and all
in one step (`even`), each run first as any point, and the first pair then again under
torch's profiler (runner.py `--trace-points`): in a drain the engine core's launch of a
step waits for the GPU (docs/calibration.md, "A point's drain"), and the trace names the
call.

A core scan (`core_points`) times what the engine core's CPU spends on a step, apart from
what the GPU does: decode-only steps (one full CUDA graph) across batch sizes, and steps
with a prefill chunk within the largest CUDA graph (piecewise graphs, attention launched
layer by layer) from an idle engine, back to back, and beside running decodes
(runner.py: `cpu_launch_s`, `cpu_update_s`; profile `core_graph_s`, `core_piecewise_s`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from capplan.hardware import GPUS, Precision
from capplan.modelspec import ModelSpec
from capplan.steptime import cudagraph_capture_sizes

Point = dict[str, Any]

DECODE_STEPS = 24
PREFILL_CONTEXT_MAX = 16384
# Decode batches of 8, 1 and 16 before anything is timed: Triton compiles a kernel once per
# specialisation of its integer arguments (== 1, divisible by 16, other), and vLLM's
# speculative-decoding kernels take the batch size (its jit_monitor.py logs "Triton kernel
# JIT compilation during inference: eagle_prepare_next_token_padded_kernel" and three more
# on a drafter's first steps); measured, a draft-model sweep warmed at batch 8 alone took
# 1.1 s for its first batch-1 step, which the batch-1 warm-up now takes instead (its next run:
# 18 ms). One step of 31 requests still took 985 ms after these warm-ups (not yet found).
_WARMUP: list[Point] = [
    {"id": "warmup-decode", "kind": "decode", "batch": 8, "context": 256, "steps": 8,
     "warmup": True},
    {"id": "warmup-decode-b1", "kind": "decode", "batch": 1, "context": 256, "steps": 4,
     "warmup": True},
    {"id": "warmup-decode-b16", "kind": "decode", "batch": 16, "context": 256, "steps": 4,
     "warmup": True},
    {"id": "warmup-prefill", "kind": "prefill", "chunk": 4096, "chunks": 2, "warmup": True},
]


def _decode(b: int, ctx: int) -> Point:
    return {"id": f"decode-b{b}-c{ctx}", "kind": "decode", "batch": b, "context": ctx,
            "steps": DECODE_STEPS, "kv_tokens": b * (ctx + DECODE_STEPS + 1)}


def _prefill(chunk: int, ctx_max: int = PREFILL_CONTEXT_MAX) -> Point:
    chunks = ctx_max // chunk + 1
    return {"id": f"prefill-p{chunk}-x{chunks}", "kind": "prefill", "chunk": chunk,
            "chunks": chunks, "kv_tokens": chunk * chunks}


def _mixed(b: int, ctx: int, chunk: int, chunks: int) -> Point:
    return {"id": f"mixed-b{b}-c{ctx}-p{chunk}-x{chunks}", "kind": "mixed", "batch": b,
            "context": ctx, "chunk": chunk, "chunks": chunks,
            "kv_tokens": b * (ctx + 64) + chunk * chunks}


def _cached(prefix: int, tail: int, repeats: int) -> Point:
    return {"id": f"cached-c{prefix}-t{tail}-x{repeats}", "kind": "cached", "prefix": prefix,
            "tail": tail, "repeats": repeats, "kv_tokens": prefix + tail * repeats}


def _shared(b: int, ctx: int, prefix: int) -> Point:
    return {"id": f"shared-b{b}-c{ctx}-s{prefix}", "kind": "shared", "batch": b,
            "context": ctx, "prefix": prefix, "steps": DECODE_STEPS,
            "kv_tokens": prefix + b * (ctx - prefix + DECODE_STEPS + 1)}


def _graphs(b: int, ctx: int) -> Point:
    return {"id": f"graphs-b{b}-c{ctx}", "kind": "decode", "batch": b, "context": ctx,
            "steps": DECODE_STEPS, "even": True, "kv_tokens": b * (ctx + 2 * DECODE_STEPS)}


GRAPH_SCAN_CONTEXT = 128
"""Context of the scan over every graph size: short, so that its prefills stay cheap."""
GRAPH_SCAN_LONG = (2048, (16, 32, 64, 128))
"""A few sizes again at this context: whether a size's offset depends on the context."""


def graph_points(max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                 spec_k: int = 0) -> list[Point]:
    """A decode-only batch at every CUDA-graph capture size up to `max_num_seqs`
    (profile.cudagraph_capture_sizes), then a few at a long context. Under speculative
    decoding a decode-only step of B requests runs B x (1 + k) tokens (each request's token
    and its k drafts), and vLLM captures its graphs at multiples of 1 + k: the scan takes
    B = size / (1 + k) for each of those sizes, and for the long context the batches nearest
    the same token counts as without."""
    q = 1 + spec_k
    batches = sorted({s // q for s in cudagraph_capture_sizes(max_num_seqs,
                                                              max_num_batched_tokens, spec_k)
                      if s // q <= max_num_seqs})
    ctx, long_sizes = GRAPH_SCAN_LONG
    long_batches = sorted({min(batches, key=lambda b: abs(b * q - t)) for t in long_sizes})
    return ([_graphs(b, GRAPH_SCAN_CONTEXT) for b in batches]
            + [_graphs(b, ctx) for b in long_batches])


MIXLEN_PAIRS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((16, 3600), (32, 600)),
    ((2, 8192), (30, 256)),
    ((8, 8192), (56, 512)),
    ((64, 4096), (64, 512)),
)
"""Decode batches of unequal lengths (B requests at context C, twice), each timed beside a
batch of as many requests at one context that reads as much KV (mixlen_points)."""


MIXLEN_MIXED: tuple[tuple[int, int], ...] = ((128, 2048), (64, 4096), (32, 8192))
"""Mixed steps' decodes (B requests at context C) of one summed context (mixlen_points)."""


def _decode_mix(groups: tuple[tuple[int, int], ...]) -> Point:
    b = sum(n for n, _ in groups)
    kv = sum(n * (c + 2 * DECODE_STEPS) for n, c in groups)
    return {"id": "decmix-" + "-".join(f"b{n}c{c}" for n, c in groups), "kind": "decode",
            "batch": b, "groups": [list(g) for g in groups], "steps": DECODE_STEPS,
            "even": True, "kv_tokens": kv}


def mixlen_points() -> list[Point]:
    """The mixlen scan: each decode batch of unequal lengths (MIXLEN_PAIRS: the production
    mix's chat beside its RAG and agent requests, 600 against 3,600 tokens) after its twin of
    one length with the same requests and the same context summed, both with `even` set so
    every request decodes the point's steps together; then mixed steps whose decodes read one
    summed context as few long or many short requests (MIXLEN_MIXED). The step model prices
    a decode by its context summed (steptime.py: decode_ctx_s); the points test that on the
    engine itself."""
    out = []
    for groups in MIXLEN_PAIRS:
        b = sum(n for n, _ in groups)
        ctx = sum(n * c for n, c in groups) // b
        out += [{**_decode(b, ctx), "even": True, "kv_tokens": b * (ctx + 2 * DECODE_STEPS)},
                _decode_mix(groups)]
    # then the same in a step with a prefill chunk (piecewise graphs, the decodes' attention
    # launched with the chunk's): 262,144 tokens of decode context as 128 x 2,048, 64 x 4,096
    # and 32 x 8,192 beside a 384-token chunk. Llama-3.1-8B BF16 took 21.0 ms for the first
    # and 26.0 for the second, where the profile prices 22.1 and 22.7 (calibration.md)
    out += [_mixed(b, ctx, 384, 4) for b, ctx in MIXLEN_MIXED]
    return out


DRAIN_POINTS: tuple[tuple[int, int], ...] = ((128, 512), (256, 512))
"""Decode points (batch, context) whose drains stalled the core on every Qwen3-32B engine
(calibration_analysis.py drain)."""


def drain_points() -> list[Point]:
    """The drain scan: each of DRAIN_POINTS as the sweep runs it (its requests admitted 16
    a prefill chunk, so they finish 16 a step) and as `drain-bB-cC` with `even` set (every
    request decodes the point's steps together and all finish in one step). The runner runs
    them all, then the first pair again under its profiler (`drain_traced`)."""
    out = []
    for b, ctx in DRAIN_POINTS:
        out += [_decode(b, ctx), {**_decode(b, ctx), "id": f"drain-b{b}-c{ctx}", "even": True,
                                  "kv_tokens": b * (ctx + 2 * DECODE_STEPS)}]
    return out


def drain_traced() -> list[str]:
    """The drain points run again under the profiler (runner.py `--trace-points`,
    Job.runner_args): the first pair, whose 4 prefill chunks keep the profiled pass short."""
    return [p["id"] for p in drain_points()[:2]]


ENCODER_IMAGES = (1, 2, 4, 8)
"""Pictures per encoder call at the model's default size: whether the cost is per token."""
ENCODER_TOKENS = (70, 140, 560, 1120)
"""Other sizes, one picture each (Gemma 4's 70-1,120 image tokens): the attention over a
picture's patches grows with its square."""


def _encoder(images: int, tokens: int, built: bool) -> Point:
    p: Point = {"id": f"encoder-i{images}-t{tokens}", "kind": "encoder", "images": images,
                "image_tokens": tokens, "warm_passes": 3, "repeats": 12, "kv_tokens": 0}
    if built:  # vLLM's own dummy picture has the default size only
        p["built"] = True
    return p


def encoder_points(spec: ModelSpec) -> list[Point]:
    """The encoder scan: 1-8 pictures of the default size (vLLM's dummy picture), then one
    picture at each other size (tensors of the processor's shape)."""
    t = spec.image_tokens_per_image
    return ([_encoder(n, t, False) for n in ENCODER_IMAGES]
            + [_encoder(1, x, True) for x in ENCODER_TOKENS if x != t])


PICTURE_PROMPTS = ((580, 0, 0), (580, 16, 512), (400, 8, 512))
"""(prompt tokens, running decodes, their context) of the picture points: a picture's
request alone, as at concurrency 1, and beside decodes, past the largest CUDA graph (580 and
596 tokens) and within it (408: piecewise graphs)."""


PICTURE_REPEATS = 30
"""Steps a picture point times: such steps run at one of two speeds, in spells of several
steps (docs/calibration.md, "A picture's step"), so ten (the first run's) can sit in one."""


def picture_points(spec: ModelSpec) -> list[Point]:
    """Steps that encode a picture, each beside its text-only twin: a prompt of the default
    picture's tokens among its own, `repeats` times one at a time (runner.py `Driver.point`,
    kind `picture`), after warm-ups that compile the decoder's attention with the image
    tokens' bidirectional mask (FlashAttention 4 builds it on first use). The encoder
    points time `embed_multimodal` alone; these, what the engine's step costs around it
    (steptime.py: `encoder_step_s`)."""
    t = spec.image_tokens_per_image
    out: list[Point] = []
    for prompt, batch, context in PICTURE_PROMPTS:
        out.append({"id": f"warmup-picture-p{prompt}-b{batch}", "kind": "picture",
                    "warmup": True, "prompt": prompt, "images": 1, "image_tokens": t,
                    "batch": batch, "context": context, "repeats": 2, "kv_tokens": 0})
        for images in (1, 0):
            pid = f"picture-p{prompt}-i{images}" + (f"-b{batch}" if batch else "")
            out.append({"id": pid, "kind": "picture", "prompt": prompt, "images": images,
                        "image_tokens": t, "batch": batch, "context": context,
                        "repeats": PICTURE_REPEATS, "kv_tokens": batch * context + prompt})
    return out


def core_points(max_num_seqs: int = 256) -> list[Point]:
    """The core scan: steps whose launch can bind (sweep docstring). Decode-only batches of
    1-256 requests; a lone prompt of 51-410 tokens on an idle engine, fresh and behind a
    cached 1,843-token prefix (the serving rows' cache hits); prompts cut in chunks of 128-512
    tokens; and chunks of 128-256 tokens beside 16-128 running decodes."""
    return ([_decode(b, 512) for b in (1, 4, 16, 64, 256) if b <= max_num_seqs]
            + [_cached(0, 51, 8), _cached(0, 205, 8), _cached(0, 410, 8),
               _cached(1843, 205, 8)]
            + [_prefill(128, 2048), _prefill(256, 2048), _prefill(512, 4096)]
            + [_mixed(b, 512, chunk, 4) for b, chunk in ((16, 256), (64, 128), (128, 256))
               if b <= max_num_seqs])


def cache_points() -> list[Point]:
    """The shared-prefix serving rows' steps (validation.md: a 90 % shared prefix of 512-,
    2,048- and 4,096-token prompts, whose TTFT at concurrency 1 the simulator puts 14-49 %
    low), and the same tails without a hit (prefix 0): what the hit itself costs, apart from
    a small prefill started on an idle engine."""
    return [_cached(1843, 205, 8), _cached(0, 205, 8), _cached(461, 51, 8), _cached(0, 51, 8),
            _cached(3686, 410, 6), _cached(0, 2048, 4),
            # decode over a shared 90 % prefix against the same batch without one (the
            # shared-prefix rows' ITL at concurrency 16 and 64, 6-34 % high in validation.md)
            _shared(16, 2048, 1843), _decode(16, 2048), _shared(64, 2048, 1843),
            _decode(64, 2048), _shared(128, 1024, 922), _decode(128, 1024),
            _shared(32, 4096, 3686), _decode(32, 4096)]


def design_points(max_num_batched_tokens: int = 8192, spec_k: int = 0) -> list[Point]:
    """Every point of the full sweep, coarse pass first, then the fill-in pass."""
    coarse = [
        _decode(1, 512), _decode(64, 512), _decode(256, 512),
        _prefill(8192), _prefill(2048), _prefill(512), _prefill(128),
        _decode(8, 2048), _decode(1, 8192), _decode(16, 8192),
        _mixed(64, 1024, 2048, 3), _mixed(16, 512, 512, 4), _mixed(128, 512, 4096, 2),
        # steps just past the largest CUDA graph (512 tokens), which the CPU's launches can
        # bound (steptime.py: eager_floor_s; the serving engine's traced steps of 513-1,100
        # tokens cost 8-9 ms more than additive terms, validation.md)
        _mixed(64, 512, 640, 3), _mixed(32, 2048, 896, 3),
    ]
    fill = [
        _decode(2, 512), _decode(4, 512), _decode(8, 512), _decode(16, 512),
        _decode(32, 512), _decode(128, 512),
        _prefill(4096), _prefill(1024), _prefill(256),
        _decode(1, 2048), _decode(32, 2048), _decode(128, 2048), _decode(4, 8192),
        # 224, not 256, decodes beside the chunk: no engine ever finished 256 decodes plus a
        # 256-token chunk (a 512-token budget). Llama BF16 and Llama with FP8 KV hung in it
        # (calibration/_raw/logs-s4, device-call-s3-1.log), Gemma FP8 was 30 s into it when
        # its call ended. The 224-decode point has not run yet.
        _mixed(32, 2048, 1024, 4), _mixed(224, 512, 256, 4), _mixed(8, 8192, 4096, 2),
        _decode(64, 2048), _decode(256, 2048), _decode(32, 8192),
        _mixed(4, 512, 8192 - 4 * (1 + spec_k), 2),
        # the step chat traffic makes most past the largest graph: a 512-token prompt beside
        # a few running decodes; few such steps were in the sweeps the floors were fitted on
        # (calibration.md, "A floor under graph-less steps")
        _mixed(4, 512, 512, 8), _mixed(32, 512, 512, 6), _prefill(768),
        # a chunk within the largest CUDA graph beside many long-context decodes: every heavy
        # step of a pool with a 512-token budget (the production example's interactive pool,
        # whose engine decodes 3-7 % slower than predicted in such stretches: validation.md,
        # "The production plan's decision"); no sweep point had more than 16 decodes at a
        # context over 1,024 in a piecewise step
        _mixed(128, 2048, 256, 4), _mixed(64, 4096, 384, 4),
        # prompts whose chunks are not multiples of 256 tokens, as a serving engine's prompt
        # steps nearly never are: on FP8 a lone 2,112-token prompt ran 173 ms where 2,048
        # ran 129-132, and the sweep's other prompt steps are all such multiples
        # (docs/calibration.md, "The seventh run")
        _prefill(1000, 3000), _prefill(2100, 4200), _prefill(3000, 6000),
    ]
    out = []
    for p in coarse + fill:
        if p["kind"] == "mixed":
            p["chunk"] = min(p["chunk"], max_num_batched_tokens - p["batch"] * (1 + spec_k))
        out.append(p)
    return out


def estimate_point_s(p: Point, spec: ModelSpec, precision: Precision, gpu: str = "h200") -> float:
    """Rough seconds a point takes (roofline with 50 % of peak plus 4 ms a step)."""
    g = GPUS[gpu]
    prefill_tok_s = 0.5 * g.matmul_flops(precision) / spec.flops_per_token()
    decode_step_s = spec.weight_bytes(precision) / g.hbm_bytes_per_s + 0.004
    if p["kind"] == "decode":
        prompt = sum(n * c for n, c in p.get("groups", [(p["batch"], p.get("context", 0))]))
        return float(prompt / prefill_tok_s + (p["steps"] + 1) * decode_step_s)
    if p["kind"] == "prefill":
        return float(p["chunk"] * p["chunks"] / prefill_tok_s + p["chunks"] * 0.004)
    if p["kind"] == "shared":
        return float((p["prefix"] + p["batch"] * (p["context"] - p["prefix"])) / prefill_tok_s
                     + (p["steps"] + 2) * decode_step_s)
    if p["kind"] == "encoder":
        per_pass = (p["images"] * p["image_tokens"] * spec.encoder_flops_per_image_token()
                    / (0.5 * g.bf16_flops) + 0.004)
        return float((p["warm_passes"] + p["repeats"]) * per_pass)
    if p["kind"] == "picture":
        per = ((p["prompt"] / prefill_tok_s + 3 * decode_step_s + 0.05) * p["repeats"]
               + (p["batch"] * p["context"] / prefill_tok_s))
        return float(per)
    if p["kind"] == "cached":
        return float((p["prefix"] + p["tail"] * p["repeats"]) / prefill_tok_s
                     + (p["repeats"] + 1) * (decode_step_s + 0.004))
    steps = p["chunks"] + 4
    return float((p["batch"] * p["context"] + p["chunk"] * p["chunks"]) / prefill_tok_s
                 + steps * (decode_step_s + p["chunk"] / prefill_tok_s))


def make_plan(
    spec: ModelSpec,
    precision: Precision,
    *,
    budget_s: float,
    kv_tokens: int | None = None,
    max_num_batched_tokens: int = 8192,
    spec_k: int = 0,
    cache: bool = False,
    graphs: bool = False,
    core: bool = False,
    mixlen: bool = False,
    encoder: bool = False,
    drain: bool = False,
    max_num_seqs: int = 256,
) -> dict[str, Any]:
    """Points in priority order whose estimated cost fits `budget_s` (warm-up first); with
    `cache`, the prefix-cache points (`cache_points`) instead of the sweep, with `graphs`
    the graph scan (`graph_points`), with `core` the core scan (`core_points`), with
    `mixlen` the unequal-length decode pairs (`mixlen_points`), with `encoder` the encoder
    scan (`encoder_points`, no step timed, so no warm-up steps) and the picture steps
    (`picture_points`, with warm-ups of their own), with `drain` the drain scan
    (`drain_points`)."""
    points: list[Point] = [] if encoder else [dict(p) for p in _WARMUP]
    total = 0.0
    if encoder:
        todo = encoder_points(spec) + picture_points(spec)
    elif cache:
        todo = cache_points()
    elif core:
        todo = core_points(max_num_seqs)
    elif graphs:
        todo = graph_points(max_num_seqs, max_num_batched_tokens, spec_k)
    elif mixlen:
        todo = mixlen_points()
    elif drain:
        todo = drain_points()
    else:
        todo = design_points(max_num_batched_tokens, spec_k)
    for p in todo:
        if kv_tokens is not None and p["kv_tokens"] > 0.9 * kv_tokens:
            continue
        cost = estimate_point_s(p, spec, precision)
        if total + cost > budget_s:
            continue
        p["est_s"] = round(cost, 2)
        total += cost
        points.append(p)
    return {"model": spec.name, "precision": precision.value, "spec_k": spec_k,
            "budget_s": budget_s, "est_total_s": round(total, 1), "points": points}


def write_plan(plan: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(plan, indent=1) + "\n")
    return p
