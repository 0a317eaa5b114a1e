"""What a fit returns: the traffic mix and, per workload, what was fitted and how."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from capplan._yaml import validation_message
from capplan.errors import ConfigError
from capplan.mix import TrafficMix, check_lengths
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import Pool
from capplan.traffic import Slo, Workload

__all__ = ["SLO_FORM", "SloLike", "TraceFit", "WorkloadFit", "build_mix", "check_options"]

SloLike = Slo | Mapping[str, float] | None


@dataclass(frozen=True)
class WorkloadFit:
    """One fitted workload's headline numbers and one note per fitted field."""

    name: str
    requests: int
    rate_rps: float | None  # None: closed loop
    cv: float | None
    mean_input_tokens: float
    mean_output_tokens: float
    hit_rate: float | None  # infinite-cache (traces) or measured (metrics) prefix hit rate
    notes: tuple[str, ...]


@dataclass(frozen=True)
class TraceFit:
    """A fitted traffic mix with the provenance `to_yaml` writes into its header."""

    mix: TrafficMix
    source: str
    format: str
    workloads: tuple[WorkloadFit, ...]
    notes: tuple[str, ...] = ()


SLO_FORM = (
    "<ttft|itl|tpot|e2e>_p<percentile>_s=<seconds>, percentile in (0, 100) and seconds > 0, "
    "e.g. ttft_p99_s=0.5"
)


def check_options(pool: str, model: str, slo: SloLike) -> tuple[ModelSpec, Slo]:
    """The pool name, model and SLOs a fit is asked for, checked before the trace is read:
    a bad one is a ConfigError naming its option (--pool, --model, --slo)."""
    try:
        Pool(name=pool, model=model)
    except ValidationError as e:
        field, msg = validation_message(e)
        if field == "model":
            raise ConfigError(msg, field="--model") from e
        raise ConfigError(f"{pool!r} is not a pool name ({msg}); use only letters, digits, "
                          "'_', '.' and '-'", field="--pool") from e
    try:
        spec = load_model_spec(model)
    except ConfigError as e:
        raise ConfigError(str(e), field="--model") from e
    if isinstance(slo, Slo):
        return spec, slo
    items = dict(slo or {})
    for key, value in items.items():
        try:
            Slo.model_validate({key: value})
        except ValidationError as e:
            _, why = validation_message(e)
            raise ConfigError(f"{key}={value}: {why.split('; write')[0]}; write {SLO_FORM}",
                              field="--slo") from e
    return spec, Slo.model_validate(items)


def build_mix(
    name: str,
    description: str,
    workloads: Sequence[Mapping[str, object]],
    *,
    pool: str,
    model: str,
    slo: SloLike,
    source: str,
) -> TrafficMix:
    """A one-pool mix of `workloads` (dicts of Workload fields without pool and slo)."""
    spec, slo_obj = check_options(pool, model, slo)
    try:
        pool_obj = Pool(name=pool, model=model)
        mix = TrafficMix(
            schema_version=1,
            name=name,
            description=description,
            pools=[pool_obj],
            workloads=[Workload(pool=pool, slo=slo_obj, **dict(w)) for w in workloads],
        )
    except ValidationError as e:
        field, msg = validation_message(e)
        raise ConfigError(f"fitted traffic is invalid ({field}: {msg})", file=source) from e
    check_lengths(mix.with_source(source, mix.base_dir), {model: spec})
    return mix
