"""Sizing: the fewest GPUs per pool that hold every workload's SLOs (`capplan size`).

The names below are imported on first use (PEP 562), so that `capplan.solve.jobs` can be
imported, and the worker processes started, before the simulator is.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capplan.solve.options import size_mix
    from capplan.solve.plan import Plan, PoolPlan
    from capplan.solve.search import PoolSizing, SearchSettings, size_pool

__all__ = ["Plan", "PoolPlan", "PoolSizing", "SearchSettings", "size_mix", "size_pool"]

_WHERE = {
    "size_mix": "capplan.solve.options",
    "Plan": "capplan.solve.plan",
    "PoolPlan": "capplan.solve.plan",
    "PoolSizing": "capplan.solve.search",
    "SearchSettings": "capplan.solve.search",
    "size_pool": "capplan.solve.search",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
