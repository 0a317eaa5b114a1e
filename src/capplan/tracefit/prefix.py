"""Shared-prefix structure from block hash ids (Mooncake `hash_ids`) or a prefix hash.

A request's leading blocks that some earlier request of its workload also had are what an
infinite prefix cache would hit; vLLM still recomputes the prompt's last token
(vllm/v1/core/kv_cache_manager.py: get_computed_blocks caps hits at prompt length - 1).
The estimate handed to the simulator is `prefix: {shared_fraction, groups, zipf_s}`:
`shared_fraction` is the token-weighted infinite-cache hit rate, `groups` the number of
distinct first blocks that recur, `zipf_s` the slope of their popularity on log-log axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from capplan.traffic import PrefixSpec

__all__ = ["PrefixFit", "fit_prefix"]



@dataclass(frozen=True)
class PrefixFit:
    """What an infinite cache would hit, and the PrefixSpec that approximates it."""

    spec: PrefixSpec | None
    hit_rate: float  # infinite-cache token hit rate, last prompt token always recomputed
    sharing_requests: float  # fraction of requests that reuse at least one block
    groups: int
    zipf_s: float
    how: str


def _ordered(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Requests in arrival order (file order breaks ties), numbered."""
    return frame.with_row_index("row").sort("t_s", "row").with_row_index("order")


def _zipf_slope(counts: np.ndarray) -> float:
    """Least-squares slope of log(popularity) on log(rank); 0 for fewer than 3 groups."""
    if len(counts) < 3:
        return 0.0
    c = np.sort(counts)[::-1].astype(float)
    x = np.log(np.arange(1, len(c) + 1))
    slope = float(np.polyfit(x, np.log(c), 1)[0])
    return round(max(0.0, -slope), 3)


def _per_request_hash_ids(frame: pl.LazyFrame, block_tokens: int) -> pl.DataFrame:
    """Per request: workload, input_tokens, leading shared tokens, first block id."""
    req = _ordered(frame.select("workload", "t_s", "input_tokens", "hash_ids"))
    blocks = (
        req.select("workload", "order", "hash_ids")
        .with_columns(pl.int_ranges(pl.col("hash_ids").list.len()).alias("pos"))
        .explode("hash_ids", "pos")
        .drop_nulls("hash_ids")
    )
    first = blocks.group_by("workload", "hash_ids").agg(pl.col("order").min().alias("first"))
    leading = (
        blocks.join(first, on=["workload", "hash_ids"])
        .filter(pl.col("first") == pl.col("order"))  # blocks this request is first to hold
        .group_by("order")
        .agg(pl.col("pos").min().alias("new_at"))
    )
    return (
        req.join(leading, on="order", how="left")
        .select(
            "workload",
            "input_tokens",
            pl.col("new_at")
            .fill_null(pl.col("hash_ids").list.len())
            .cast(pl.Int64)
            .alias("shared_blocks"),
            pl.col("hash_ids").list.first().cast(pl.String).alias("root"),
        )
        .with_columns(
            pl.min_horizontal(
                pl.col("shared_blocks") * block_tokens, pl.col("input_tokens") - 1
            ).alias("shared_tokens")
        )
        .collect(engine="streaming")
    )


def _per_request_prefix_hash(frame: pl.LazyFrame) -> pl.DataFrame:
    req = _ordered(frame.select("workload", "t_s", "input_tokens", "prefix_hash", "prefix_tokens"))
    first = req.group_by("workload", "prefix_hash").agg(pl.col("order").min().alias("first"))
    return (
        req.join(first, on=["workload", "prefix_hash"], how="left", nulls_equal=False)
        .select(
            "workload",
            "input_tokens",
            pl.col("prefix_hash").alias("root"),
            pl.when(pl.col("order") > pl.col("first"))
            .then(pl.min_horizontal(pl.col("prefix_tokens"), pl.col("input_tokens") - 1))
            .otherwise(0)
            .clip(lower_bound=0)
            .alias("shared_tokens"),
        )
        .collect(engine="streaming")
    )


def fit_prefix(
    frame: pl.LazyFrame, *, hash_ids: bool, block_tokens: int
) -> dict[str, PrefixFit]:
    """Prefix structure of every workload from `hash_ids` or `prefix_hash`/`prefix_tokens`."""
    per = (
        _per_request_hash_ids(frame, block_tokens)
        if hash_ids
        else _per_request_prefix_hash(frame)
    )
    out: dict[str, PrefixFit] = {}
    for (w,), rows in per.group_by("workload", maintain_order=True):
        total = int(rows.get_column("input_tokens").sum())
        shared = rows.get_column("shared_tokens")
        hit = float(shared.sum()) / total if total else 0.0
        sharing = rows.filter(pl.col("shared_tokens") > 0)
        recurring = rows.filter(pl.col("root").is_in(sharing.get_column("root").implode()))
        popularity = recurring.group_by("root").len().get_column("len").to_numpy()
        groups = len(popularity)
        zipf_s = _zipf_slope(popularity)
        spec = None
        if hit > 0 and groups > 0:
            fraction = min(1.0, max(0.001, round(hit, 3)))
            spec = PrefixSpec(shared_fraction=fraction, groups=groups, zipf_s=zipf_s)
        source = f"hash_ids ({block_tokens}-token blocks)" if hash_ids else "prefix_hash"
        how = (
            f"from {source}: infinite-cache hit rate {hit:.1%}; "
            f"{sharing.height / rows.height:.0%} of requests reuse a prefix; "
            f"{groups} recurring first blocks, popularity zipf_s {zipf_s:g}"
        )
        out[str(w)] = PrefixFit(spec, hit, sharing.height / rows.height, groups, zipf_s, how)
    return out
