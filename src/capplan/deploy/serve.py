"""The `vllm serve` argv for one pool, spelt as vLLM 0.26.0 spells its flags.

Every flag below is checked against `tests/data/vllm-0.26.0-serve-flags.json`, an inventory
extracted from the 0.26.0 wheel's source by `scripts/extract_vllm_flags.py`:
`vllm/engine/arg_utils.py` (EngineArgs.add_cli_args) and
`vllm/entrypoints/openai/cli_args.py` (make_arg_parser, FrontendArgs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from capplan.errors import ConfigError
from capplan.hardware import Precision
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import EngineConfig, Pool, refuse_open
from capplan.profiles import DEFAULT_DRAFT
from capplan.solve.plan import PoolPlan

VLLM_VERSION = "0.26.0"
DEFAULT_BLOCK_SIZE = 16
"""What capplan models; vLLM 0.26.0 leaves block_size to the attention backend
(`vllm/config/cache.py`: block_size default None), FlashAttention's being 16."""


@dataclass(frozen=True)
class PoolDeploy:
    """What deployment needs of a pool: the engine settings and the replica count."""

    pool: str
    model: str
    gpu: str
    tp: int
    precision: Precision
    engine: EngineConfig
    replicas: int
    router: str = "least_outstanding"
    """How the plan spread requests over the replicas (sim/router.py): the balancer in front
    of them must do the same."""

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp

    @classmethod
    def from_pool(cls, pool: Pool, replicas: int) -> PoolDeploy:
        """A pool of a traffic mix, deployed at `replicas` (no plan needed)."""
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        refuse_open(pool)
        assert pool.precision != "auto"
        return cls(pool.name, pool.model, pool.gpu, pool.tp, Precision(pool.precision),
                   pool.engine, replicas, pool.router)

    @classmethod
    def from_pool_plan(cls, plan: PoolPlan, mix_pool: Pool | None = None) -> PoolDeploy:
        """A planned pool; engine settings the plan lacks come from the mix's pool."""
        base = mix_pool.engine.model_dump(mode="json") if mix_pool else {}
        known = set(EngineConfig.model_fields)
        unknown = sorted(set(plan.engine) - known)
        if unknown:
            raise ConfigError(
                f"pool {plan.pool!r}: engine settings capplan deploy cannot translate: "
                f"{', '.join(unknown)}", field="engine",
            )
        try:
            engine = EngineConfig.model_validate({**base, **plan.engine})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"pool {plan.pool!r}: {err['msg']}", field=f"engine.{where}") from e
        if engine.auto:  # a plan always holds the chosen values; a hand-made one may not
            setting = sorted(engine.auto)[0]
            raise ConfigError(
                f"pool {plan.pool!r}: the plan leaves {setting} auto; size the mix again "
                "(`capplan size --out plan.json`) so the plan holds the chosen value",
                field=f"engine.{setting}",
            )
        try:
            precision = Precision(plan.precision)
        except ValueError as e:
            raise ConfigError(
                f"pool {plan.pool!r}: unknown precision {plan.precision!r}; known: "
                f"{', '.join(p.value for p in Precision)}", field="precision",
            ) from e
        return cls(plan.pool, plan.model, plan.gpu, plan.tp, precision, engine, plan.replicas,
                   plan.router)


def routing_note(d: PoolDeploy) -> str:
    """What must spread requests over the pool's replicas for the plan to hold."""
    how = {"least_outstanding": "each request to the replica with the fewest unfinished ones "
                                "(a least-request balancer, as Envoy's LEAST_REQUEST)",
           "round_robin": "requests to the replicas in turn",
           "prefix_affinity": "requests that share a prompt prefix to the same replica, the "
                              "rest to the one with the fewest unfinished"}[d.router]
    return (f"routing: the plan sized {d.replicas} replicas with {how}; a Kubernetes Service "
            "alone balances connections, not requests, so put that balancer in front of the "
            "replicas (where it differs, size the mix with its pools[].router; docs/deploy.md)")


def as_deploy(pool: PoolDeploy | PoolPlan | Pool) -> PoolDeploy:
    """Any pool-like input as a PoolDeploy (a bare Pool gets one replica)."""
    if isinstance(pool, PoolDeploy):
        return pool
    if isinstance(pool, PoolPlan):
        return PoolDeploy.from_pool_plan(pool)
    return PoolDeploy.from_pool(pool, 1)


def _json(value: Any) -> str:
    """JSON as vLLM's docs write it (`{"image": 0}`); the parser only needs valid JSON."""
    return json.dumps(value)


def served_model(d: PoolDeploy, spec: ModelSpec) -> str:
    """The checkpoint to serve: 4-bit formats need a pre-quantised one, left as a placeholder."""
    if d.precision in (Precision.NVFP4, Precision.AWQ):
        return f"<{d.precision.value} checkpoint of {spec.hf_id}>"
    return spec.hf_id


def _draft_model(spec: ModelSpec) -> str:
    draft = load_model_spec(DEFAULT_DRAFT)
    if draft.vocab_size == spec.vocab_size:
        return draft.hf_id
    return f"<draft model for {spec.hf_id}>"


def speculative_config(d: PoolDeploy, spec: ModelSpec) -> dict[str, Any] | None:
    """The `--speculative-config` JSON (`vllm/config/speculative.py`: method, model,
    num_speculative_tokens)."""
    sc = d.engine.speculative
    if sc is None:
        return None
    out: dict[str, Any] = {"method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens}
    if sc.method == "draft_model":
        out["model"] = _draft_model(spec)
    elif sc.method == "mtp" and spec.mtp_drafter is not None:
        out["model"] = spec.mtp_drafter.hf_id
    elif sc.method in ("eagle", "eagle3"):
        out["model"] = f"<{sc.method} head for {spec.hf_id}>"
    return out


def serve_command(
    pool: PoolDeploy | PoolPlan | Pool, spec: ModelSpec | None = None
) -> list[str]:
    """`vllm serve <model> ...` for vLLM 0.26.0: capacity-relevant settings explicit, the rest
    left at 0.26.0's defaults; never `--disable-log-requests` (removed in 0.26.0)."""
    d = as_deploy(pool)
    spec = spec or load_model_spec(d.model)
    e = d.engine
    argv = ["vllm", "serve", served_model(d, spec),
            "--tensor-parallel-size", str(d.tp),
            "--max-num-seqs", str(e.max_num_seqs),
            "--max-num-batched-tokens", str(e.max_num_batched_tokens),
            "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}",
            "--max-model-len", str(e.max_model_len or spec.max_position_embeddings)]
    if e.block_size != DEFAULT_BLOCK_SIZE:
        argv += ["--block-size", str(e.block_size)]
    argv.append("--enable-prefix-caching" if e.enable_prefix_caching
                else "--no-enable-prefix-caching")
    if e.scheduling_policy != "fcfs":
        argv += ["--scheduling-policy", e.scheduling_policy]
    sc = speculative_config(d, spec)
    if sc is not None:
        argv += ["--speculative-config", _json(sc)]
    if e.limit_mm_per_prompt is not None:
        argv += ["--limit-mm-per-prompt", _json(e.limit_mm_per_prompt)]
    if e.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", e.kv_cache_dtype]
    if d.precision is Precision.FP8:
        argv += ["--quantization", "fp8"]  # online dynamic W8A8 of the BF16 checkpoint
    if e.long_prefill_token_threshold:
        argv += ["--long-prefill-token-threshold", str(e.long_prefill_token_threshold)]
    if not e.async_scheduling:
        argv.append("--no-async-scheduling")  # on by default in 0.26.0
    elif sc is not None and sc["method"] == "draft_model":
        # ...but off by default with a draft model (vllm/config/vllm.py,
        # VllmConfig.__post_init__: left unset, async scheduling stays on only for
        # EAGLE/MTP, n-gram on the GPU and DSpark drafters), which runs it when asked; the
        # plan simulated the engine with it on
        argv.append("--async-scheduling")
    return argv


def serve_notes(pool: PoolDeploy | PoolPlan | Pool, spec: ModelSpec | None = None) -> list[str]:
    """What a person must check or fill in before running the command, one line each."""
    d = as_deploy(pool)
    spec = spec or load_model_spec(d.model)
    notes = []
    if d.precision is Precision.FP8:
        notes.append(
            f"FP8: online dynamic FP8 of the BF16 checkpoint {spec.hf_id}; to serve a "
            "pre-quantised FP8 checkpoint instead (the seeds use RedHatAI/<model>-FP8-dynamic), "
            "put its id first and drop --quantization fp8"
        )
    elif d.precision is Precision.NVFP4:
        notes.append(
            f"NVFP4: replace <nvfp4 checkpoint of {spec.hf_id}> with the id of a pre-quantised "
            "NVFP4 checkpoint of that model (nvidia/<Model>-NVFP4 naming, as the seeds' "
            "nvidia/Gemma-4-31B-IT-NVFP4); capplan does not invent ids. vLLM reads the format "
            "from the checkpoint's config"
        )
    elif d.precision is Precision.AWQ:
        notes.append(
            f"AWQ: replace <awq checkpoint of {spec.hf_id}> with the id of a pre-quantised "
            "AWQ 4-bit checkpoint of that model (<Model>-AWQ naming); capplan does not invent "
            "ids. vLLM reads the format from the checkpoint's config"
        )
    sc = d.engine.speculative
    if sc is not None and sc.method == "draft_model":
        draft = _draft_model(spec)
        if draft.startswith("<"):
            notes.append(f"speculative draft_model: replace {draft} with a draft model that "
                         f"shares {spec.hf_id}'s tokenizer")
        else:
            notes.append(f"speculative draft_model: {draft} (capplan's {DEFAULT_DRAFT} spec, "
                         "the draft the plan assumed; same tokenizer as the target)")
    elif sc is not None and sc.method in ("eagle", "eagle3"):
        notes.append(f"speculative {sc.method}: replace <{sc.method} head for {spec.hf_id}> "
                     "with the id of an EAGLE head trained for that model")
    elif sc is not None and sc.method == "mtp" and spec.mtp_drafter is not None:
        notes.append(f"speculative mtp: {spec.mtp_drafter.hf_id} is {spec.hf_id}'s drafter")
    elif sc is not None and sc.method == "mtp":
        notes.append("speculative mtp: uses the checkpoint's own MTP layers; where the drafter "
                     'ships separately, add its id as "model" to --speculative-config')
    if d.replicas > 1:
        notes.append(routing_note(d))
    if spec.vision_encoder_params and d.engine.limit_mm_per_prompt is None:
        notes.append(
            f"{spec.hf_id} has a vision encoder; if pool {d.pool!r} serves no images, "
            """--limit-mm-per-prompt '{"image": 0}' frees its memory reservation """
            "(the plan assumed it reserved)"
        )
    return notes
