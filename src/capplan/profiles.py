"""Finding the profile a pool runs on: the measured one when calibration has it, else analytic.

Measured profiles live at `calibration/<gpu>/vllm-<version>/<model>/<key>/profile.json`, the key
in `Profile.key` style (`bf16`, `fp8-kvfp8`, `bf16-mtp4`, ...). A profile matches a pool only if
every field that changes step times agrees: GPU, vLLM version, model, precision, KV cache dtype,
speculative method and k, and tensor-parallel size. The folder name is a convenience; the
fields inside the file decide.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from capplan.analytic import analytic_profile
from capplan.errors import ConfigError
from capplan.hardware import GPUS, Precision
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import Pool, SpeculativeConfig, refuse_open
from capplan.profile import Profile

VLLM_VERSION = "0.26.0"
DEFAULT_DRAFT = "llama-3.2-1b"
"""The draft model capplan ships, for Llama 3.x targets (same tokenizer)."""
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"


def list_profiles(calibration_dir: Path = CALIBRATION_DIR) -> list[Profile]:
    """Every measured profile under `calibration_dir`, in path order; none if it is missing."""
    root = Path(calibration_dir)
    if not root.is_dir():
        return []
    return [Profile.load(p) for p in sorted(root.rglob("profile.json"))]


def measured_speculative(
    pool: Pool, precision: Precision | str, *, calibration_dir: Path = CALIBRATION_DIR
) -> list[SpeculativeConfig]:
    """The speculative configurations (method, k) measured for the pool's GPU, model, TP and
    KV cache dtype at `precision`, by method then k; acceptance is left at its default."""
    found = set()
    for p in list_profiles(calibration_dir):
        if (p.spec_k and p.spec_method and p.source == "measured" and p.gpu == pool.gpu
                and p.vllm_version == VLLM_VERSION and p.model == pool.model
                and p.precision == getattr(precision, "value", precision) and p.tp == pool.tp
                and p.kv_cache_dtype == pool.engine.kv_cache_dtype):
            found.add((p.spec_method, p.spec_k))
    out = []
    for method, k in sorted(found):
        try:
            out.append(SpeculativeConfig.model_validate(
                {"method": method, "num_speculative_tokens": k}))
        except ValidationError:
            continue  # a method capplan cannot simulate: not a candidate
    return out


def _wanted(pool: Pool) -> tuple[Precision, str, str | None, int]:
    """(precision, kv dtype, spec method, spec k) the pool asks for."""
    if pool.precision == "auto":
        raise ConfigError(
            f"pool {pool.name!r} has precision 'auto'; pick one (bf16, fp8, nvfp4, awq) "
            "before resolving its profile"
        )
    sc = pool.engine.speculative
    method = sc.method if sc else None
    k = sc.num_speculative_tokens if sc else 0
    return Precision(pool.precision), pool.engine.kv_cache_dtype, method, k


def _matches(
    p: Profile,
    pool: Pool,
    spec: ModelSpec,
    precision: Precision,
    kv_dtype: str,
    method: str | None,
    k: int,
) -> bool:
    return (
        p.source == "measured"
        and p.gpu == pool.gpu
        and p.vllm_version == VLLM_VERSION
        and p.model == spec.name
        and p.precision == precision.value
        and p.kv_cache_dtype == kv_dtype
        and p.spec_k == k
        and (k == 0 or p.spec_method == method)
        and p.tp == pool.tp
    )


def resolve_profile(
    pool: Pool,
    spec: ModelSpec,
    *,
    calibration_dir: Path = CALIBRATION_DIR,
    draft: ModelSpec | None = None,
    source: str | None = None,
) -> Profile:
    """The measured profile matching the pool, else the analytic one; `.source` says which.

    `pool.profile`, when set, names a profile folder (relative to `calibration_dir` or absolute)
    that is used as is; `source` is the traffic file an error about it names. A draft_model
    pool needs `draft` for the analytic fallback. A pool with an engine setting left `auto` is
    refused (the solver resolves it first).
    """
    if pool.engine.auto:
        refuse_open(pool)
    if spec.name != pool.model:
        raise ConfigError(
            f"pool {pool.name!r} serves {pool.model!r} but the spec given is {spec.name!r}"
        )
    if pool.profile is not None:
        folder = Path(pool.profile)
        if not folder.is_absolute():
            folder = Path(calibration_dir) / folder
        if not (folder / "profile.json").is_file() and not folder.is_file():
            raise ConfigError(
                f"pool {pool.name!r}: no profile at {folder}; give a folder holding "
                f"profile.json (relative to {calibration_dir}: `capplan profiles` lists them) "
                "or leave profile out", file=source, field="profile")
        return Profile.load(folder)
    precision, kv_dtype, method, k = _wanted(pool)
    model_dir = Path(calibration_dir) / pool.gpu / f"vllm-{VLLM_VERSION}" / spec.name
    if model_dir.is_dir():
        for path in sorted(model_dir.rglob("profile.json")):
            p = Profile.load(path)
            if _matches(p, pool, spec, precision, kv_dtype, method, k):
                return _with_encoder(p, pool, spec, draft)
    return _analytic(pool, spec, precision, kv_dtype, method, k, draft)


def _with_encoder(p: Profile, pool: Pool, spec: ModelSpec, draft: ModelSpec | None) -> Profile:
    """A measured profile of a multimodal model gets what its calibration did not measure
    from the analytic model, and says so: the vision encoder's cost where no encoder scan
    timed it (`capplan calibrate --encoder-scan`), the image-encoder KV reservation where no
    engine with images allowed measured it; every other term stays measured."""
    if not spec.vision_encoder_params:
        return p
    a = _analytic(pool, spec, Precision(p.precision), p.kv_cache_dtype, p.spec_method,
                  p.spec_k, draft)
    supplied: list[str] = []
    terms: list[str] = []
    step, kv = p.step, p.kv
    if step.encoder_token_s == 0:
        step = step.model_copy(update={"encoder_token_s": a.step.encoder_token_s})
        supplied.append("vision encoder cost")
        terms.append("vision encoder")
    if kv.image_reservation_tokens == 0 and a.kv.image_reservation_tokens > 0:
        # the analytic reservation is in its own tokens; keep its share of the capacity
        share = a.kv.image_reservation_tokens / max(1, a.kv.tokens(0.90))
        update: dict[str, float] = {"image_reservation_tokens": round(share * kv.tokens(0.90))}
        if kv.pooled:  # and of the pool's blocks
            update["image_reservation_blocks"] = round(share * kv.blocks(0.90))
        kv = kv.model_copy(update=update)
        supplied.append("image-encoder KV reservation")
        terms.append("image KV reservation")
    if not terms:
        return p
    note = "; ".join(x for x in (p.provenance.note, f"{' and '.join(supplied)} from the "
                                 "analytic model (not measured)") if x)
    return p.model_copy(update={
        "step": step, "kv": kv,
        "provenance": p.provenance.model_copy(update={"note": note,
                                                      "analytic_terms": (
                                                          *p.provenance.analytic_terms,
                                                          *terms)}),
    })


def _analytic(pool: Pool, spec: ModelSpec, precision: Precision, kv_dtype: str,
              method: str | None, k: int, draft: ModelSpec | None) -> Profile:
    if method == "draft_model" and draft is None:
        draft = load_model_spec(DEFAULT_DRAFT)
        if draft.vocab_size != spec.vocab_size:
            raise ConfigError(
                f"pool {pool.name!r}: the default draft {DEFAULT_DRAFT!r} does not share "
                f"{spec.name}'s vocabulary; pass draft= a spec that does"
            )
    return analytic_profile(
        spec,
        GPUS[pool.gpu],
        precision,
        tp=pool.tp,
        kv_cache_dtype=kv_dtype,
        spec_method=method,
        spec_k=k,
        engine=pool.engine,
        draft=draft,
    )
