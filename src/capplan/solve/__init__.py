"""Sizing: the fewest GPUs per pool that hold every workload's SLOs (`capplan size`)."""

from capplan.solve.options import size_mix
from capplan.solve.plan import Plan, PoolPlan
from capplan.solve.search import PoolSizing, SearchSettings, size_pool

__all__ = ["Plan", "PoolPlan", "PoolSizing", "SearchSettings", "size_mix", "size_pool"]
