"""A traffic file: pools, the workloads they serve, and how long to simulate.

`load_mix(path)` reads and checks one YAML file; every error names the file, the field
and the fix, and cross-references (a workload's pool, a pool's model, lengths against
max_model_len) are checked here, before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import numpy as np
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from capplan._input import InputModel
from capplan._yaml import load_model, read_mapping
from capplan.errors import ConfigError
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import Pool, PoolHost, refuse_open
from capplan.replay import read_trace
from capplan.traffic import ReplayArrival, Workload

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

CLIENT_LATENCY_S = 1e-3
"""One-way latency between a streaming client and the engine core, each way: a request
travels AsyncLLM's input path (vllm/v1/engine/async_llm.py add_request, then a ZMQ hop to
the engine-core process, vllm/v1/engine/core_client.py) before the core's busy loop sees it
(vllm/v1/engine/core.py run_busy_loop drains its input queue only between steps), and every
output travels back the same way. It decides which step a request can join: under async
scheduling the core schedules step n+2 as soon as it has processed step n's output, so a
closed-loop user's next request, sent when the last token reaches the client, joins step
n+3, not n+2. The value is an estimate from docs/validation.md: at concurrency 1 the
measured TTFT of Llama-3.1-8B exceeds the profile's prefill step by about 2 ms in all."""


class SimulationSettings(InputModel):
    """Horizon and steady-state window: requests arriving in [warmup_s, duration_s) are
    measured; traffic keeps flowing after duration_s until they finish (or drain_s ends)."""

    model_config = _FROZEN
    duration_s: float = Field(default=300.0, gt=0)
    warmup_s: float | None = Field(default=None, ge=0, description="default: 10 % of duration")
    drain_s: float = Field(default=120.0, gt=0)
    seed: int = Field(default=0, ge=0)
    client_latency_s: float = Field(
        default=CLIENT_LATENCY_S, ge=0, le=1,
        description="one-way latency between client and engine core, each way (1 ms: "
        "AsyncLLM in the client's host; add your network and HTTP time)",
    )
    client_send_s: float = Field(
        default=0.0, ge=0, le=0.1,
        description="seconds one client spends sending a request: requests it sends at the "
        "same moment leave one after another, this far apart, and it reads no token "
        "meanwhile (sim/client.py; 0: every user is its own client; a single asyncio load "
        "generator such as vllm bench serve: about 0.4 ms)",
    )
    client_picture_token_s: float = Field(
        default=0.0, ge=0, le=1e-3,
        description="seconds a client spends making a request's picture, per image token, "
        "before it hands the request to vLLM and after the request's send stamp; it reads "
        "no token meanwhile where it is one loop (client_send_s > 0). 0 for a client that "
        "sends pictures it already holds (the validation runner drawing noise pixels per "
        "request: about 30 us, validate/suite.py HARNESS_PICTURE_TOKEN_S)",
    )

    output_jitter_s: float = Field(
        default=0.0, ge=0, le=0.01,
        description="mean delay, drawn per step from an exponential distribution, of a "
        "step's outputs on their way to the client (sim/client.py; the validation runner "
        "measured about 0.14 ms: ITL p99 about 0.5 ms above p50 at concurrency 1)",
    )

    core_spread: bool = Field(
        default=False,
        description="draw each step's engine-core time about its median with the spread the "
        "profile's serving core trace measured (core_graph_sigma, core_piecewise_sigma, and "
        "eager_sigma about eager_floor_s where the profile has no core_eager_s; sim/replica.py "
        "LaunchSpread); false (the default: the median every such step). A step past the "
        "largest CUDA graph whose core time the profile measured under load (core_eager_s) is "
        "drawn either way",
    )

    @model_validator(mode="after")
    def _window(self) -> SimulationSettings:
        if self.warmup_s is not None and self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s}) must be below duration_s")
        return self

    @property
    def warmup(self) -> float:
        return self.duration_s * 0.1 if self.warmup_s is None else self.warmup_s


class TrafficMix(InputModel):
    """The whole input of a plan."""

    model_config = _FROZEN
    schema_version: Literal[1]
    name: str = "mix"
    description: str = ""
    pools: list[Pool] = Field(min_length=1)
    workloads: list[Workload] = Field(min_length=1)
    simulation: SimulationSettings = Field(default_factory=SimulationSettings)
    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<memory>")

    @model_validator(mode="after")
    def _refs(self) -> TrafficMix:
        pools = [p.name for p in self.pools]
        for names, what in ((pools, "pool"), ([w.name for w in self.workloads], "workload")):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"duplicate {what} name {sorted(dup)[0]!r}")
        for i, w in enumerate(self.workloads):
            if w.pool not in pools:
                raise ValueError(
                    f"workloads.{i}.pool: unknown pool {w.pool!r}; pools: {', '.join(pools)}"
                )
            if w.spec_mean_acceptance_length is not None:
                engine = self.pools[pools.index(w.pool)].engine
                if engine.speculative is None or "speculative" in engine.auto:
                    raise ValueError(
                        f"workloads.{i}.spec_mean_acceptance_length: a mean acceptance length "
                        f"holds for one k, and pool {w.pool!r} fixes none; give "
                        "spec_acceptance (per position, for any k) or fix engine.speculative")
                try:
                    w.acceptance(engine.speculative)
                except ValueError as e:
                    raise ValueError(f"workloads.{i}.spec_mean_acceptance_length: {e}") from None
        served = {w.pool for w in self.workloads}
        for k, name in enumerate(pools):
            if name not in served:
                raise ValueError(f"pools.{k}: pool {name!r} serves no workload; remove it or "
                                 "name it in a workload's pool")
        return self

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def source(self) -> str:
        return self._source

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise ConfigError(
            f"unknown pool {name!r}; pools: {', '.join(p.name for p in self.pools)}",
            file=self._source,
            field="pools",
        )

    def fixed_pool(self, name: str) -> Pool:
        """The pool, refused (naming this file and the field) while a setting is `auto`:
        what `capplan simulate` needs; `capplan size` resolves those settings itself."""
        pool = self.pool(name)
        refuse_open(pool, file=self._source, where=f"pools.{self.pools.index(pool)}.")
        return pool

    def workloads_of(self, pool: str) -> list[Workload]:
        return [w for w in self.workloads if w.pool == pool]

    def on_host(self, host: str) -> TrafficMix:
        """This mix with every pool's engine core priced as on `host` (Pool.host: median,
        slowest, fastest, or any, which `size_mix` sizes on each)."""
        known = get_args(PoolHost)
        if host not in known:
            raise ConfigError(f"unknown host {host!r}; give one of {', '.join(known)}",
                              field="host")
        return self.model_copy(update={"pools": [p.model_copy(update={"host": host})
                                                 for p in self.pools]})

    def with_source(self, source: str, base_dir: Path) -> TrafficMix:
        self._source = source
        self._base_dir = base_dir
        return self


def max_model_len(pool: Pool, spec: ModelSpec) -> int:
    """vLLM's default max_model_len is the model's context length."""
    return pool.engine.max_model_len or spec.max_position_embeddings


def check_lengths(mix: TrafficMix, specs: dict[str, ModelSpec]) -> None:
    """No pool's max_model_len may exceed its model's context (vLLM refuses to start:
    vllm/config/model.py, _get_and_verify_max_len, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN), and
    every request must fit max_model_len (vLLM rejects longer prompts outright)."""
    for j, pool in enumerate(mix.pools):
        context = specs[pool.model].max_position_embeddings
        if pool.engine.max_model_len is not None and pool.engine.max_model_len > context:
            raise ConfigError(
                f"{pool.engine.max_model_len} is above {pool.model}'s context length "
                f"{context}, which vLLM 0.26.0 refuses to start with; lower it to {context} "
                "or less, or leave it out",
                file=mix.source, field=f"pools.{j}.engine.max_model_len",
            )
    for i, w in enumerate(mix.workloads):
        pool = mix.pool(w.pool)
        spec = specs[pool.model]
        if w.image is not None and not spec.vision_encoder_params:
            raise ConfigError(
                f"pool {pool.name!r} serves {spec.name}, which has no vision encoder; drop "
                "image or serve a vision model (capplan models lists them)",
                file=mix.source, field=f"workloads.{i}.image")
        limit = max_model_len(pool, spec)
        if isinstance(w.arrival, ReplayArrival):
            _check_replay(w, pool, limit, mix.base_dir)
            continue
        if w.input_tokens is None:
            continue
        assert w.output_tokens is not None
        image = w.image.images_per_request * w.image.tokens_per_image if w.image else 0
        longest = w.input_tokens.max + image + w.output_tokens.max
        if longest > limit:
            raise ConfigError(
                f"longest request ({longest} tokens: input + image + output) exceeds pool "
                f"{pool.name!r} max_model_len {limit}; lower the lengths or raise "
                "engine.max_model_len",
                file=mix.source,
                field=f"workloads.{i}.input_tokens",
            )


def _check_replay(w: Workload, pool: Pool, limit: int, base_dir: Path) -> None:
    """A recorded request must fit the pool too: vLLM 0.26.0 refuses a prompt of
    max_model_len tokens or more (vllm/v1/engine/input_processor.py, _validate_prompt_len),
    and one whose output would run past max_model_len is stopped there
    (vllm/v1/core/sched/utils.py check_stop), so the replay would not be the recorded
    traffic. The error names the file's first such row."""
    trace = read_trace(w, base_dir)
    fix = f"raise engine.max_model_len of pool {pool.name!r} or drop the row"
    prompt, output = trace.input_tokens, trace.output_tokens
    for column, bad in (("input_tokens", prompt >= limit),
                        ("output_tokens", prompt + output > limit)):
        if not bad.any():
            continue
        k = int(np.argmin(np.where(bad, trace.row, np.iinfo(np.int64).max)))
        what = (f"has a {prompt[k]}-token prompt, which vLLM refuses at max_model_len "
                f"{limit} or more" if column == "input_tokens" else
                f"asks for {prompt[k]} + {output[k]} tokens (prompt + output), past "
                f"max_model_len {limit}")
        raise ConfigError(f"row {trace.row[k]} {what}; {fix}", file=trace.file, field=column)


def load_mix(path: str | Path) -> TrafficMix:
    """Read, validate and cross-check a traffic YAML file."""
    p = Path(path)
    mix = load_model(TrafficMix, read_mapping(p), file=str(p)).with_source(str(p), p.parent)
    specs = {}
    for i, pool in enumerate(mix.pools):
        try:
            specs[pool.model] = load_model_spec(pool.model)
        except ConfigError as e:
            raise ConfigError(str(e), file=str(p), field=f"pools.{i}.model") from e
    check_lengths(mix, specs)
    return mix
