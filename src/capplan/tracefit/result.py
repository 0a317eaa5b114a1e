"""What a fit returns: the traffic mix and, per workload, what was fitted and how."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from capplan._yaml import validation_message
from capplan.errors import ConfigError
from capplan.mix import TrafficMix, check_lengths
from capplan.modelspec import load_model_spec
from capplan.pool import Pool
from capplan.traffic import Slo, Workload

__all__ = ["SloLike", "TraceFit", "WorkloadFit", "build_mix"]

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
    spec = load_model_spec(model)
    slo_obj = slo if isinstance(slo, Slo) else Slo.model_validate(dict(slo or {}))
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
