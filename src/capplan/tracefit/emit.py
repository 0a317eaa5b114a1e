"""A fitted mix as traffic YAML, with a header comment saying what was fitted from what."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from capplan.mix import TrafficMix
from capplan.tracefit.result import TraceFit
from capplan.traffic import Workload

__all__ = ["to_yaml"]

_WIDTH = 96


def _workload(w: Workload) -> dict[str, Any]:
    d: dict[str, Any] = {"name": w.name, "pool": w.pool}
    d["arrival"] = w.arrival.model_dump(mode="json", by_alias=True)
    for key in ("input_tokens", "output_tokens", "prefix"):
        value = getattr(w, key)
        if value is not None:
            extra = {"exclude_defaults": True} if key == "prefix" else {}
            d[key] = value.model_dump(mode="json", by_alias=True, exclude_none=True, **extra)
    if w.slo.targets:
        d["slo"] = {t.key: t.limit_s for t in w.slo.targets}
    return d


def _document(mix: TrafficMix) -> dict[str, Any]:
    pools = [
        {"name": p.name, "model": p.model, "gpu": p.gpu, "precision": str(p.precision)}
        for p in mix.pools
    ]
    return {
        "schema_version": mix.schema_version,
        "name": mix.name,
        "description": mix.description,
        "pools": pools,
        "workloads": [_workload(w) for w in mix.workloads],
        "simulation": mix.simulation.model_dump(mode="json", exclude_none=True),
    }


def _comment(text: str, indent: str = "") -> list[str]:
    lines = textwrap.wrap(text, _WIDTH - 2 - len(indent), subsequent_indent="  ")
    return [f"# {indent}{line}".rstrip() for line in lines]


def _header(fit: TraceFit) -> list[str]:
    lines = [f"# Fitted by `capplan traffic from-trace` from {fit.source} (format {fit.format})."]
    for note in fit.notes:
        lines += _comment(note)
    for w in fit.workloads:
        lines.append(f"# workload {w.name}: {w.requests:,} requests")
        for note in w.notes:
            lines += _comment(note, "  ")
    lines.append("# Review before sizing: add SLOs and check the pool (model, GPU, precision).")
    return lines


def to_yaml(fit: TraceFit | TrafficMix) -> str:
    """Traffic YAML that `load_mix` reads back; a `TraceFit` adds its provenance header."""
    mix = fit.mix if isinstance(fit, TraceFit) else fit
    body: str = yaml.safe_dump(
        _document(mix), sort_keys=False, default_flow_style=None, width=_WIDTH
    )
    header = _header(fit) if isinstance(fit, TraceFit) else [f"# {mix.description}"]
    return "\n".join(header) + "\n" + body
