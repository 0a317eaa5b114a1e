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


def _ordered(frame: pl.LazyFrame, in_order: bool) -> pl.LazyFrame:
    """Requests numbered in arrival order (file order breaks ties); a log already in
    arrival order (the usual case) is not sorted."""
    if in_order:
        return frame.with_row_index("order")
    return frame.with_row_index("row").sort("t_s", "row").drop("row").with_row_index("order")


def _zipf_slope(counts: np.ndarray) -> float:
    """Least-squares slope of log(popularity) on log(rank); 0 for fewer than 3 groups."""
    if len(counts) < 3:
        return 0.0
    c = np.sort(counts)[::-1].astype(float)
    x = np.log(np.arange(1, len(c) + 1))
    slope = float(np.polyfit(x, np.log(c), 1)[0])
    return round(max(0.0, -slope), 3)


def _per_request_hash_ids(
    frame: pl.LazyFrame, block_tokens: int, in_order: bool
) -> pl.LazyFrame:
    """Per request: workload, input_tokens, leading shared tokens, first block id."""
    req = _ordered(frame.select("workload", "t_s", "input_tokens", "hash_ids"), in_order)
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
    heads = req.select(
        "workload",
        "order",
        "input_tokens",
        pl.col("hash_ids").list.len().alias("blocks"),
        pl.col("hash_ids").list.first().cast(pl.String).alias("root"),
    )
    return heads.join(leading, on="order", how="left").select(
        "workload",
        "input_tokens",
        "root",
        pl.min_horizontal(
            pl.col("new_at").fill_null(pl.col("blocks")).cast(pl.Int64) * block_tokens,
            pl.col("input_tokens") - 1,
        ).alias("shared_tokens"),
    )


def _per_request_prefix_hash(frame: pl.LazyFrame, in_order: bool) -> pl.LazyFrame:
    columns = ("workload", "t_s", "input_tokens", "prefix_hash", "prefix_tokens")
    req = _ordered(frame.select(columns), in_order)
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
    )


def fit_prefix(
    frame: pl.LazyFrame, *, hash_ids: bool, block_tokens: int, in_order: bool = False
) -> dict[str, PrefixFit]:
    """Prefix structure of every workload from `hash_ids` or `prefix_hash`/`prefix_tokens`;
    `in_order`: each workload's rows are already in arrival order in `frame`."""
    per = (
        _per_request_hash_ids(frame, block_tokens, in_order)
        if hash_ids
        else _per_request_prefix_hash(frame, in_order)
    )
    reuse = pl.col("shared_tokens") > 0
    totals, roots = pl.collect_all(
        [
            per.group_by("workload").agg(
                pl.col("input_tokens").sum().alias("total"),
                pl.col("shared_tokens").sum().alias("shared"),
                pl.len().alias("requests"),
                reuse.sum().alias("sharing"),
            ),
            # requests per first block (or prefix hash), for the groups that recur
            per.group_by("workload", "root")
            .agg(pl.len().alias("n"), reuse.any().alias("reused"))
            .filter(pl.col("reused"))
            .select("workload", "n"),
        ],
        engine="streaming",
    )
    source = f"hash_ids ({block_tokens}-token blocks)" if hash_ids else "prefix_hash"
    out: dict[str, PrefixFit] = {}
    for row in totals.sort("workload").iter_rows(named=True):
        w = str(row["workload"])
        hit = float(row["shared"]) / row["total"] if row["total"] else 0.0
        sharing = row["sharing"] / row["requests"]
        popularity = roots.filter(pl.col("workload") == w).get_column("n").to_numpy()
        groups = len(popularity)
        zipf_s = _zipf_slope(popularity)
        spec = None
        if hit > 0 and groups > 0:
            fraction = min(1.0, max(0.001, round(hit, 3)))
            spec = PrefixSpec(shared_fraction=fraction, groups=groups, zipf_s=zipf_s)
        how = (
            f"from {source}: infinite-cache hit rate {hit:.1%}; "
            f"{sharing:.0%} of requests reuse a prefix; "
            f"{groups} recurring first blocks, popularity zipf_s {zipf_s:g}"
        )
        out[w] = PrefixFit(spec, hit, sharing, groups, zipf_s, how)
    return out
