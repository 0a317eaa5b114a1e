"""A validation suite: engine configurations, and the experiments each one serves.

One experiment is a traffic mix of one pool and one replica, run for `duration_s`: the GPU
runner replays it against real vLLM, `capplan simulate` predicts it, and the two are
compared. The request shapes the runner sends are drawn here, by the simulator's own
generators and random streams (capplan/sim/run.py: arrivals [seed, 1, w], closed-loop users
[seed, 3, w]), so both sides see the very same requests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from capplan._input import InputModel
from capplan._yaml import load_model, read_mapping
from capplan.calibrate.jobs import QUANT_CONFIGS
from capplan.errors import ConfigError
from capplan.hardware import GPUS, Precision
from capplan.mix import SimulationSettings, TrafficMix
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.profiles import VLLM_VERSION
from capplan.sim.results import SimResult
from capplan.sim.workload import ArrivalStream, ClosedLoopSampler, RequestBatch
from capplan.traffic import ClosedLoop, GammaArrival, PoissonArrival, Workload

_FROZEN = ConfigDict(frozen=True, extra="forbid")
RUNNER = Path(__file__).with_name("runner.py")
HARNESS_SEND_S = 0.4e-3
"""The validation runner's client (runner.py: one asyncio loop, AsyncLLM.generate per
request) sends one request at a time: closed-loop users whose requests end together send
their next ones 0.41 ms apart at the median for 512-token prompts (0.49 ms at 2,048, 0.53 ms
at 4,096; p10-p90 0.24-0.94 ms), each stamped when it leaves. Measured over the suite's
closed-loop runs before 2026-11-30's eleventh session, which chose this value; with that
session's runs, 0.41 / 0.49 / 0.54 ms (`scripts/validation_analysis.py waves`)."""
HARNESS_PICTURE_TOKEN_S = 30.1e-6
"""The validation runner's own time making a picture's request inside its send stamp, per
image token, for experiments with `pixels: per_request` (every one before the twenty-third
session): it draws the picture's noise pixels (runner.py Pictures; 1.9 M float32 values a
280-token Gemma 4 picture) before AsyncLLM has the request. Measured by the runner's
`prep_s` on gemma-4-31b-fp8-vision6, image-c1-rand: 8.43 ms at the median (7.11-13.38 ms
p10-p90) a 280-token picture, and its request reached the engine core 15.0 ms after its
stamp (6.9 ms with the pixels drawn before the clock). On the four hosts traced before, 15.5,
15.8, 19.0 and 20.9 ms: their runners drew the pixels slower, by up to ~6 ms, than this
constant says (`python scripts/validation_analysis.py tocore`)."""
HARNESS_JITTER_S = 0.14e-3
"""The mean of the output path's delay (simulation.output_jitter_s) the validation runner
sees: at concurrency 1, where every step is alike, the client's inter-token gaps spread
+-0.23 ms about their median at p10-p90 and -0.56 / +0.53 ms at p1 / p99, and a long gap is
followed by a short one (lag-1 autocorrelation -0.50): the steps keep their pace, and each
one's outputs reach the client a little late, independently. Two exponential delays of mean
0.14 ms differ by that much (0.135-0.140 ms from the p90, p95 and p99). Measured on the traced
Llama-3.1-8B BF16 engine's two concurrency-1 runs (llama-3.1-8b-bf16-prefix-trace,
prefix90-on-c1 and -off-c1), 2026-11-30, twelfth session; every other row is out of sample."""
CORE_SPREAD = False
"""Whether the suite's predictions draw each step's core time about its median
(simulation.core_spread). Off, as in sizing: tried in the sixteenth session, it brought rows
within target on the tails (TTFT p99 +1 to +12, ITL p99 +2 to +7 over three noise streams)
and moved the production plan's vision pool from 6 GPUs to 5 at a 0.3 % margin, on a spread
of graph-less steps no Gemma 4 trace has measured (scripts/validation_analysis.py spread)."""
CLOSED_ROWS = 4096  # closed-loop request shapes sent to the runner (cycled if exceeded)


class Routed(InputModel):
    """One replica's share of a pool's traffic, as the pool's router hands it out.

    The experiment's workloads are the whole pool's (`replicas` x one replica's load); the
    simulator serves them with `replicas` replicas behind the router (capplan/sim/router.py)
    and the experiment is the requests it routed to `replica`: the runner replays exactly
    those on its one engine, and the prediction serves the same requests on one replica. A
    plan's share under least-outstanding routing is not a Poisson stream at 1/N of the rate:
    the router sends a request to a replica with the fewest unfinished ones, so fewer arrive
    while a replica is busy; this is the experiment that measures a replica under it."""

    model_config = _FROZEN
    replicas: int = Field(ge=2, le=256)
    replica: int = Field(default=0, ge=0, description="which replica's share (0: the first)")
    policy: Literal["least_outstanding", "round_robin", "prefix_affinity"] = "least_outstanding"

    @model_validator(mode="after")
    def _within(self) -> Routed:
        if self.replica >= self.replicas:
            raise ValueError(f"replica {self.replica} is not one of 0..{self.replicas - 1}")
        return self


class Experiment(InputModel):
    """One measured run: the workloads of one replica for `duration_s`."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    workloads: list[Workload] = Field(min_length=1)
    duration_s: float = Field(gt=0, le=600)
    prefix_caching: bool = Field(
        default=True, description="off: a unique cache_salt per request (no prefix hits)"
    )
    seed: int = 0
    repeat: int = Field(default=1, ge=1, le=10, description="runs of the same experiment")
    tags: list[str] = Field(default_factory=list, description="groups rows in the report")
    pixels: Literal["per_request", "pooled"] = Field(
        default="per_request",
        description="a picture's noise pixels: drawn for each request inside its send stamp "
                    "(every run to the twenty-third session), or drawn before the clock starts "
                    "and reused under a fresh hash (runner.py Pictures)")
    routed: Routed | None = Field(
        default=None, description="the workloads are a whole pool's, and the experiment one "
                                  "replica's share of them as its router hands them out")

    @model_validator(mode="after")
    def _replayable(self) -> Experiment:
        for w in self.workloads:
            if not isinstance(w.arrival, ClosedLoop | PoissonArrival | GammaArrival):
                raise ValueError(f"workload {w.name!r}: validation replays closed, poisson or "
                                 "gamma arrivals only")
            if self.routed is not None and isinstance(w.arrival, ClosedLoop):
                raise ValueError(f"workload {w.name!r}: a routed share replays open-loop "
                                 "arrivals only (poisson or gamma)")
            if w.prefix is not None and w.prefix.target_hit_rate is not None:
                raise ValueError(f"workload {w.name!r}: target_hit_rate is a simulator "
                                 "shortcut; describe shared_tokens and groups instead")
        return self

    def runs(self) -> list[str]:
        """Run names: the experiment's, or name-r1, name-r2, ... when repeated."""
        if self.repeat == 1:
            return [self.name]
        return [f"{self.name}-r{i + 1}" for i in range(self.repeat)]


class EngineRun(InputModel):
    """One engine configuration (one engine start) and the experiments it serves."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    pool: Pool
    draft_model: str | None = Field(default=None, description="models/<name> of the drafter")
    synthetic_acceptance: float | None = Field(
        default=None, ge=0, lt=1,
        description="vLLM's synthetic rejection sampler accepts each draft token with this "
        "probability, until one is rejected (`rejection_sample_method: synthetic`, "
        "vllm/config/speculative.py), as real weights accept some; dummy weights accept "
        "almost none. The prediction before the run uses it; `compare`, as for any "
        "speculative run, the acceptance vLLM's counters report",
    )
    trace_steps: bool = Field(
        default=False, description="also record every engine step's composition (diagnosis)"
    )
    trace_core: bool = Field(
        default=False,
        description="also record where the engine core's time goes (validate/coretrace.py)",
    )
    experiments: list[Experiment] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> EngineRun:
        names = [r for e in self.experiments for r in e.runs()]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"experiment names repeat: {', '.join(sorted(dup))}")
        spec = self.pool.engine.speculative
        if spec is not None and spec.method == "draft_model" and not self.draft_model:
            raise ValueError("speculative method draft_model needs draft_model: <model name>")
        if self.synthetic_acceptance is not None and spec is None:
            raise ValueError("synthetic_acceptance needs speculative decoding in the pool's "
                             "engine (engine.speculative)")
        if self.pool.precision == "auto" or self.pool.open_settings:
            raise ValueError("settings left auto are for sizing; name the value to validate")
        return self

    def mix(self, exp: Experiment, acceptance: float | None = None) -> TrafficMix:
        """The experiment as a traffic mix the simulator predicts, every workload's drafts
        accepted at `acceptance` where given (what vLLM reported), else at the synthetic
        sampler's, else at none: the runner serves dummy weights, whose drafts the standard
        sampler (almost) never accepts."""
        engine = self.pool.engine
        if acceptance is None:
            acceptance = self.synthetic_acceptance
        if acceptance is None and engine.speculative is not None:
            acceptance = 0.0
        if not exp.prefix_caching:
            engine = engine.model_copy(update={"enable_prefix_caching": False})
        pool = self.pool.model_copy(update={"engine": engine, "name": "validate"})
        upd: dict[str, Any] = {"pool": "validate"}
        if acceptance is not None:
            upd["spec_acceptance"] = acceptance
        return TrafficMix(
            schema_version=1,
            name=f"{self.name}/{exp.name}",
            pools=[pool],
            workloads=[w.model_copy(update=upd) for w in exp.workloads],
            simulation=SimulationSettings(duration_s=exp.duration_s, warmup_s=0.0,
                                          seed=exp.seed, client_send_s=HARNESS_SEND_S,
                                          client_picture_token_s=(
                                              HARNESS_PICTURE_TOKEN_S
                                              if exp.pixels == "per_request" else 0.0),
                                          output_jitter_s=HARNESS_JITTER_S,
                                          core_spread=CORE_SPREAD),
        )

    def share(self, exp: Experiment) -> dict[int, RequestBatch] | None:
        """A routed experiment's requests, by workload index: those its pool's router sent
        to `exp.routed.replica` when `exp.routed.replicas` replicas served the workloads
        (None for an experiment that is not routed)."""
        if exp.routed is None:
            return None
        from capplan.sim.run import simulate

        mix = self.mix(exp)
        pool = mix.pools[0].model_copy(update={"router": exp.routed.policy})
        whole = mix.model_copy(update={"pools": [pool]})
        log: list[tuple[int, int, int]] = []
        simulate(whole, "validate", exp.routed.replicas, keep_requests=False, route_log=log)
        horizon = mix.simulation.duration_s + mix.simulation.drain_s
        out = {}
        for i, w in enumerate(mix.workloads):
            rids = sorted(rid for wl, rid, _ in log if wl == i)  # the stream's order
            mine = {rid for wl, rid, rep in log if wl == i and rep == exp.routed.replica}
            keep = np.array([n for n, rid in enumerate(rids) if rid in mine], dtype=np.int64)
            b = _open_batch(w, i, exp.seed, horizon)
            out[i] = RequestBatch(b.arrival_s[keep], b.input_tokens[keep],
                                  b.output_tokens[keep], b.prefix_group[keep],
                                  b.prefix_tokens[keep], b.image_tokens[keep], i)
        if not any(np.any(b.arrival_s < exp.duration_s) for b in out.values()):
            raise ConfigError(
                f"experiment {exp.name!r}: the router sends replica {exp.routed.replica} of "
                f"{exp.routed.replicas} no request in {exp.duration_s:g} s; route fewer "
                "replicas or run longer", field="routed")
        return out

    def simulate(self, exp: Experiment, acceptance: float | None = None) -> SimResult:
        """The prediction of one experiment: one replica serving its requests."""
        from capplan.sim.run import simulate

        return simulate(self.mix(exp, acceptance), "validate", 1, keep_requests=True,
                        arrivals=self.share(exp))


class Suite(InputModel):
    """The validation grid: engines (one start each) and their experiments."""

    model_config = _FROZEN
    schema_version: Literal[1]
    gpu: str = "h200"
    vllm: str = "0.26.0"
    shapes: list[dict[str, Any]] = Field(
        default_factory=list, description="YAML anchors for experiments to merge (<<: *name)"
    )
    engines: list[EngineRun] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Suite:
        """One GPU and one vLLM for the whole suite, the ones the simulator models, and one
        engine run per name (a job file and a stored run are named after it)."""
        if self.gpu not in GPUS:
            raise ValueError(f"gpu: unknown gpu {self.gpu!r}; known: {', '.join(sorted(GPUS))}")
        if self.vllm != VLLM_VERSION:
            raise ValueError(f"vllm: capplan models vLLM {VLLM_VERSION}, not {self.vllm}; "
                             f"set vllm: {VLLM_VERSION}")
        names = [e.name for e in self.engines]
        for i, e in enumerate(self.engines):
            if names.count(e.name) > 1:
                raise ValueError(f"engines.{i}.name: {e.name!r} names two engine runs; "
                                 "give each its own name")
            try:
                load_model_spec(e.pool.model)
            except ConfigError as err:
                raise ValueError(f"engines.{i}.pool.model: {err}") from None
            if e.pool.gpu != self.gpu:
                raise ValueError(f"engines.{i}.pool.gpu: {e.pool.gpu!r} in a suite for "
                                 f"{self.gpu!r}; one suite measures one GPU")
        return self

    def engine(self, name: str) -> EngineRun:
        for e in self.engines:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.engines)
        raise ConfigError(f"no engine {name!r} in the suite (known: {known})", field="engines")


def load_suite(path: str | Path) -> Suite:
    p = Path(path)
    return load_model(Suite, read_mapping(p), file=str(p))


# --- jobs for the GPU runner ----------------------------------------------------------------


def engine_kwargs(run: EngineRun, models_root: Path, work: Path) -> dict[str, Any]:
    """vLLM AsyncEngineArgs for the run, every setting the simulator reads pinned."""
    pool, eng = run.pool, run.pool.engine
    spec = load_model_spec(pool.model)
    model_dir = models_root / spec.name
    prec = Precision(pool.precision)
    if prec in QUANT_CONFIGS:  # 4-bit on dummy weights: a quantization_config (calibrate/jobs)
        model_dir = work / "models" / f"{spec.name}-{prec.value}"
        model_dir.mkdir(parents=True, exist_ok=True)
        cfg = json.loads(spec.config_path.read_text())
        cfg["quantization_config"] = QUANT_CONFIGS[prec]
        (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    kw: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "seed": 0,
        "max_model_len": eng.max_model_len or spec.max_position_embeddings,
        "max_num_seqs": eng.max_num_seqs,
        "max_num_batched_tokens": eng.max_num_batched_tokens,
        "gpu_memory_utilization": eng.gpu_memory_utilization,
        "enable_prefix_caching": eng.enable_prefix_caching,
        "scheduling_policy": eng.scheduling_policy,
        "async_scheduling": eng.async_scheduling,
        "kv_cache_dtype": eng.kv_cache_dtype,
        "tensor_parallel_size": pool.tp,
    }
    if prec is Precision.FP8:
        kw["quantization"] = "fp8"
    if spec.vllm_hf_overrides:
        kw["hf_overrides"] = spec.vllm_hf_overrides
    if eng.limit_mm_per_prompt is not None:
        kw["limit_mm_per_prompt"] = dict(eng.limit_mm_per_prompt)
    if eng.long_prefill_token_threshold:
        kw["long_prefill_token_threshold"] = eng.long_prefill_token_threshold
    if eng.speculative is not None:
        sc: dict[str, Any] = {"method": eng.speculative.method,
                              "num_speculative_tokens": eng.speculative.num_speculative_tokens}
        if run.draft_model:
            sc["model"] = str(models_root / load_model_spec(run.draft_model).name)
        elif eng.speculative.method == "mtp" and spec.mtp_drafter is not None:
            sc["model"] = str(models_root / spec.mtp_drafter.config)
        if eng.speculative.method == "ngram":
            sc.update(prompt_lookup_min=2, prompt_lookup_max=4)
        if run.synthetic_acceptance is not None:
            # the unconditional rate of the first i drafts all accepted: alpha ** i, which
            # vLLM turns back into alpha at every position (rejection_sampler.py
            # unconditional_to_conditional_rates); the simulator draws the same
            # (sim/core.py: leading successes of a geometric draw)
            a = run.synthetic_acceptance
            sc.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=[
                round(a ** (i + 1), 6) for i in range(eng.speculative.num_speculative_tokens)])
        kw["speculative_config"] = sc
    return kw


def _closed_rows(w: Workload, index: int, seed: int) -> dict[str, list[int]]:
    rng = np.random.default_rng([seed, 3, index])
    sampler = ClosedLoopSampler(w, index, chunk=CLOSED_ROWS)
    rows = [sampler.next(rng) for _ in range(CLOSED_ROWS)]
    cols = list(zip(*rows, strict=True))
    return {"input_tokens": list(cols[0]), "output_tokens": list(cols[1]),
            "prefix_group": list(cols[2]), "prefix_tokens": list(cols[3])}


def _open_batch(w: Workload, index: int, seed: int, horizon: float) -> RequestBatch:
    """Every open-loop request of the workload up to `horizon`, as the simulator draws them."""
    stream = ArrivalStream(w, index, horizon, np.random.default_rng([seed, 1, index]))
    batches = []
    while (b := stream.next_batch()) is not None:
        batches.append(b)
    def col(f: str) -> np.ndarray:
        return np.concatenate([getattr(b, f) for b in batches]) if batches else np.empty(0, int)

    return RequestBatch(col("arrival_s"), col("input_tokens"), col("output_tokens"),
                        col("prefix_group"), col("prefix_tokens"), col("image_tokens"), index)


def _open_rows(b: RequestBatch) -> dict[str, list[Any]]:
    return {"arrival_s": [round(x, 6) for x in b.arrival_s.tolist()],
            "input_tokens": b.input_tokens.tolist(), "output_tokens": b.output_tokens.tolist(),
            "prefix_group": b.prefix_group.tolist(), "prefix_tokens": b.prefix_tokens.tolist()}


def experiment_job(run: EngineRun, exp: Experiment, name: str) -> dict[str, Any]:
    """The runner's view of one experiment run: every request shape, drawn as the simulator
    draws them for the same mix and seed."""
    mix = run.mix(exp)
    limit = mix.simulation.duration_s + mix.simulation.drain_s  # the simulator's horizon
    share = run.share(exp)
    workloads = []
    for i, w in enumerate(mix.workloads):
        d: dict[str, Any] = {"index": i, "name": w.name, "priority": w.priority}
        if isinstance(w.arrival, ClosedLoop):
            if w.arrival.think_time_s:
                raise ConfigError(f"workload {w.name!r}: think time is not replayed",
                                  field="arrival.think_time_s")
            d.update(kind="closed", concurrency=w.arrival.concurrency,
                     **_closed_rows(w, i, exp.seed))
        else:
            batch = share[i] if share is not None else _open_batch(w, i, exp.seed, limit)
            d.update(kind="open", **_open_rows(batch))
        if w.image is not None:  # the runner builds the pictures itself (runner.py Pictures)
            d["image"] = {"images": w.image.images_per_request,
                          "tokens": w.image.tokens_per_image}
        workloads.append(d)
    return {"name": name, "duration_s": exp.duration_s, "prefix_caching": exp.prefix_caching,
            **({"pixels": exp.pixels} if exp.pixels != "per_request" else {}),
            "workloads": workloads}


def warmup_jobs(run: EngineRun) -> list[dict[str, Any]]:
    """Requests of every shape the engine will serve, alone and then at the largest
    concurrency it will see (up to 64), before anything is measured: the first batch of a
    new size pays one-off costs (measured: a drafter's first batch-1 step took 2 s)."""
    first = run.experiments[0]
    shapes: dict[str, Workload] = {}
    peak = 4
    for e in run.experiments:
        for w in e.workloads:
            shapes.setdefault(w.name, w)
            if isinstance(w.arrival, ClosedLoop):
                peak = max(peak, w.arrival.concurrency)
    jobs = []
    for name, users, seconds in (("warmup-c1", 1, 2.0), ("warmup", min(peak, 64), 3.0)):
        ws = [w.model_copy(update={"arrival": ClosedLoop(concurrency=users),
                                   "name": f"warmup{i}", "priority": 0})
              for i, w in enumerate(list(shapes.values())[:4])]
        exp = first.model_copy(update={"name": name, "workloads": ws, "duration_s": seconds,
                                       "prefix_caching": False, "repeat": 1,
                                       "routed": None})
        job = experiment_job(run, exp, name)
        job["warmup"] = True
        jobs.append(job)
    return jobs


def emit_job(run: EngineRun, models_root: Path, work: Path, *, seed: int = 0,
             skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The runner's job for one engine start: warm-ups, then every experiment run not in
    `skip` (runs already measured and stored)."""
    exps = warmup_jobs(run)
    for e in run.experiments:
        for name in e.runs():
            if name not in skip:
                exps.append(experiment_job(run, e, name))
    return {"name": run.name, "seed": seed, "engine": engine_kwargs(run, models_root, work),
            "trace_steps": run.trace_steps, "trace_core": run.trace_core, "experiments": exps}
