"""Regenerate the small trace fixtures of tests/test_tracefit.py (fixed seeds, deterministic).

    pip install prometheus_client==0.26.0   # only for the /metrics scrapes
    python tests/data/traces/make_traces.py

- mooncake.jsonl: a Mooncake-format trace (timestamp in ms, input_length, output_length,
  hash_ids of 512-token blocks): 600 requests at ~5 req/s; 75 % start with one of 4 system
  prompts of 4 blocks (Zipf-popular), the rest share nothing.
- vllm_bench.json: a `vllm bench serve --save-result --save-detailed` result (Poisson at
  4 req/s, one failed request); vllm_bench_closed.json: `--max-concurrency 16` with the
  default infinite rate, saved without --save-detailed. Keys follow vLLM 0.26.0's
  vllm/benchmarks/serve.py.
- metrics_a.prom, metrics_b.prom: two scrapes, 60 s apart, of a 2-engine (data-parallel)
  vLLM 0.26.0 server, written by prometheus_client from metrics declared exactly as
  vllm/v1/metrics/loggers.py declares them (names, labels, 1-2-5 buckets to max_model_len
  131072). Synthetic, not a real H200 scrape: that fixture is still to be captured.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
BLOCK = 512


def mooncake(rng: np.random.Generator) -> None:
    n = 600
    t_ms = np.cumsum(rng.exponential(1000 / 5, n)).astype(np.int64)
    popularity = 1.0 / np.arange(1, 5) ** 1.0
    popularity /= popularity.sum()
    next_id = 1000
    lines = []
    for i in range(n):
        blocks: list[int] = []
        if rng.random() < 0.75:
            g = int(rng.choice(4, p=popularity))
            blocks = [g * 4 + k for k in range(4)]  # a 2048-token system prompt
        own = int(rng.integers(1, 5))
        blocks += list(range(next_id, next_id + own))
        next_id += own
        length = len(blocks) * BLOCK - int(rng.integers(0, BLOCK))
        out = int(max(1, round(rng.lognormal(np.log(180), 0.6))))
        rec = {
            "timestamp": int(t_ms[i]),
            "input_length": length,
            "output_length": out,
            "hash_ids": blocks,
        }
        lines.append(json.dumps(rec))
    (HERE / "mooncake.jsonl").write_text("\n".join(lines) + "\n")


def bench(rng: np.random.Generator) -> None:
    n = 200
    inp = rng.integers(900, 1100, n).tolist()
    out = rng.integers(100, 300, n).tolist()
    errors = [""] * n
    out[17] = 0
    errors[17] = "Traceback: server disconnected"
    ttfts = rng.uniform(0.02, 0.2, n).round(4).tolist()
    detailed = {
        "date": "20261129-120000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": n,
        "request_rate": 4.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 50.3,
        "completed": n - 1,
        "failed": 1,
        "total_input_tokens": int(sum(inp) - inp[17]),
        "total_output_tokens": int(sum(out)),
        "request_throughput": (n - 1) / 50.3,
        "request_goodput": None,
        "output_throughput": sum(out) / 50.3,
        "total_token_throughput": (sum(inp) + sum(out)) / 50.3,
        "input_lens": inp,
        "output_lens": out,
        "ttfts": ttfts,
        "itls": [[0.011, 0.012] for _ in range(n)],
        "start_times": np.cumsum(rng.exponential(0.25, n)).round(4).tolist(),
        "generated_texts": ["" for _ in range(n)],
        "errors": errors,
        "max_output_tokens_per_s": 1400.0,
        "max_concurrent_requests": 9,
        "rtfx": 0.0,
        "mean_ttft_ms": 110.0,
        "median_ttft_ms": 108.0,
        "std_ttft_ms": 50.0,
        "p99_ttft_ms": 198.0,
        "mean_itl_ms": 11.5,
        "median_itl_ms": 11.5,
        "std_itl_ms": 0.5,
        "p99_itl_ms": 12.0,
    }
    (HERE / "vllm_bench.json").write_text(json.dumps(detailed))
    closed = {
        k: v
        for k, v in detailed.items()
        if k
        not in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts",
                "errors")
    }
    closed.update(request_rate="inf", max_concurrency=16, completed=n, failed=0,
                  total_input_tokens=n * 1000, total_output_tokens=n * 200)
    (HERE / "vllm_bench_closed.json").write_text(json.dumps(closed))


def metrics(rng: np.random.Generator) -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    def build_1_2_5_buckets(max_value: int) -> list[int]:  # vllm/v1/metrics/loggers.py
        buckets, exponent = [], 0
        while True:
            for m in (1, 2, 5):
                value = m * 10**exponent
                if value > max_value:
                    return buckets
                buckets.append(value)
            exponent += 1

    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    model = "meta-llama/Llama-3.1-8B-Instruct"
    engines = ["0", "1"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution "
                    "batches.", labels, registry=reg, multiprocess_mode="mostrecent")
    queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number "
                      "of queried tokens.", labels, registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of "
                   "cached tokens.", labels, registry=reg)
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      [*labels, "finished_reason"], registry=reg)
    prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                       labels, buckets=build_1_2_5_buckets(131072), registry=reg)
    gen = Histogram("vllm:request_generation_tokens", "Number of generation tokens "
                    "processed.", labels, buckets=build_1_2_5_buckets(131072), registry=reg)

    def serve(n: int) -> None:
        for _ in range(n):
            e = engines[int(rng.integers(0, 2))]
            p = int(max(1, round(rng.lognormal(np.log(1500) - 0.18, 0.6))))
            g = int(max(1, round(rng.lognormal(np.log(250) - 0.125, 0.5))))
            prompt.labels(model, e).observe(p)
            gen.labels(model, e).observe(g)
            queries.labels(model, e).inc(p)
            hits.labels(model, e).inc(int(p * 0.4) // 16 * 16)
            reason = "length" if rng.random() < 0.1 else "stop"
            success.labels(model, e, reason).inc()
        for e in engines:
            running.labels(model, e).set(int(rng.integers(5, 30)))

    serve(1000)
    (HERE / "metrics_a.prom").write_bytes(generate_latest(reg))
    serve(600)  # 600 finish in the 60 s between the scrapes, 9 fewer run: 9.85 req/s arrive
    (HERE / "metrics_b.prom").write_bytes(generate_latest(reg))


if __name__ == "__main__":
    mooncake(np.random.default_rng(6))
    bench(np.random.default_rng(7))
    metrics(np.random.default_rng(8))
