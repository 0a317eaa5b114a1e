"""Shared-prefix structure from block hash ids (Mooncake `hash_ids`), a prefix hash, or the
replay columns `prefix_group` + `prefix_tokens`.

A request's leading blocks that some earlier request of its workload also had are what an
infinite prefix cache would hit; vLLM still recomputes the prompt's last token
(vllm/v1/core/kv_cache_manager.py: get_computed_blocks caps hits at prompt length - 1).
From hash ids or a prefix hash the estimate handed to the simulator is
`prefix: {shared_fraction, groups, zipf_s}`: `shared_fraction` is the token-weighted
infinite-cache hit rate, `groups` the number of distinct first blocks that recur, `zipf_s`
the slope of their popularity on log-log axes.

`prefix_group` + `prefix_tokens` state the structure itself, as a replay file does
(capplan/sim/workload.py): each request's group and the leading tokens it shares with it.
Then `groups` and `zipf_s` come from the groups that recur, and the shared part is
`shared_tokens` when every group has one head length (each prompt shares the head, or all
of itself but its last token when shorter), chosen so the simulator's prompts share as
many tokens in all as the trace's; otherwise (heads that grow or vary within a group, as in
multi-turn chats) it is `shared_fraction`, the shared tokens' share of all prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from capplan.errors import ConfigError
from capplan.sim.workload import NO_PREFIX, TARGET_HIT_RATE
from capplan.tracefit.scan import PrefixSource
from capplan.traffic import PrefixSpec

__all__ = ["PrefixFit", "fit_prefix"]

FIXED_HEADS = 0.9
"""Share of sharing requests that must sit on their group's head for `shared_tokens`."""


@dataclass(frozen=True)
class PrefixFit:
    """What an infinite cache would hit, and the PrefixSpec that approximates it."""

    spec: PrefixSpec | None
    hit_rate: float  # infinite-cache token hit rate, last prompt token always recomputed
    sharing_requests: float  # fraction of requests that reuse at least one block
    shared_share: float  # shared prompt tokens / prompt tokens (hash paths: the hit rate)
    groups: int
    zipf_s: float
    how: str

    def below(self, longest: int) -> tuple[PrefixSpec | None, str | None]:
        """The spec for prompts of at most `longest` tokens: a `shared_tokens` spec whose head
        is not below the longest fitted prompt (the schema refuses it) becomes the same
        share of prompt tokens as `shared_fraction`; with the note saying so."""
        spec = self.spec
        if spec is None or spec.shared_tokens is None or spec.shared_tokens < longest:
            return spec, None
        fraction = min(1.0, max(0.001, round(self.shared_share, 3)))
        return (
            PrefixSpec(shared_fraction=fraction, groups=spec.groups, zipf_s=spec.zipf_s),
            f"shared_tokens {spec.shared_tokens} is not below the longest fitted prompt "
            f"({longest}): shared_fraction {fraction:g} instead",
        )


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
    frame: pl.LazyFrame,
    *,
    source: PrefixSource,
    block_tokens: int,
    in_order: bool = False,
    file: str | None = None,
) -> dict[str, PrefixFit]:
    """Prefix structure of every workload from `hash_ids`, `prefix_hash`/`prefix_tokens` or
    `prefix_group`/`prefix_tokens`; `in_order`: each workload's rows are already in arrival
    order in `frame`; `file` names the trace in errors."""
    if source == "prefix_group":
        return _fit_groups(frame, in_order, file)
    hash_ids = source == "hash_ids"
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
    origin = f"hash_ids ({block_tokens}-token blocks)" if hash_ids else "prefix_hash"
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
            f"from {origin}: infinite-cache hit rate {hit:.1%}; "
            f"{sharing:.0%} of requests reuse a prefix; "
            f"{groups} recurring first blocks, popularity zipf_s {zipf_s:g}"
        )
        out[w] = PrefixFit(spec, hit, sharing, hit, groups, zipf_s, how)
    return out


def _per_request_prefix_group(frame: pl.LazyFrame, in_order: bool) -> pl.LazyFrame:
    """Per request: tokens shared with its group (0 for a group of one or none), the group's
    longest such head, and what an infinite cache would hit: the longest head an earlier
    request of the group held (chained block hashes: the shorter head is a prefix of it).
    A TARGET_HIT_RATE row's tokens count as cached, as the simulator takes them."""
    req = _ordered(
        frame.select("workload", "t_s", "input_tokens", "prefix_group", "prefix_tokens"),
        in_order,
    )
    group, by = pl.col("prefix_group"), ("workload", "prefix_group")
    recurring = (group >= 0) & (pl.len().over(*by) > 1)
    capped = pl.min_horizontal("prefix_tokens", pl.col("input_tokens") - 1).clip(lower_bound=0)
    shared = pl.when(recurring | (group == TARGET_HIT_RATE)).then(capped).otherwise(0)
    req = req.with_columns(shared.alias("shared"))
    earlier = pl.col("shared").cum_max().shift(1).over(*by).fill_null(0)
    return req.select(
        "workload",
        "input_tokens",
        "prefix_group",
        "prefix_tokens",
        "shared",
        pl.col("shared").max().over(*by).alias("head"),
        pl.when(group == TARGET_HIT_RATE)
        .then(pl.col("shared"))
        .otherwise(pl.min_horizontal("shared", earlier))
        .alias("hit"),
    )


def _shared_tokens_for(values: np.ndarray, counts: np.ndarray, shared: float) -> int:
    """Smallest S with sum(count x min(S, value - 1)) >= shared: the simulator's prompts,
    sharing min(S, length - 1) tokens each, then share as many tokens in all."""
    cap = np.maximum(values.astype(np.int64) - 1, 0)
    lo, hi = 1, max(1, int(cap.max()))
    while lo < hi:
        mid = (lo + hi) // 2
        if float(np.dot(counts, np.minimum(mid, cap))) >= shared:
            hi = mid
        else:
            lo = mid + 1
    return lo


_BAD_ROWS = (  # the replay reader's rules (capplan/sim/workload.py), as (column, test, fix)
    ("prefix_group", pl.col("prefix_group") < TARGET_HIT_RATE,
     f"a group is >= 0 ({NO_PREFIX}: none, {TARGET_HIT_RATE}: treated as cached)"),
    ("prefix_tokens", pl.col("prefix_tokens") < 0, "shared tokens are >= 0"),
    ("prefix_tokens", pl.col("prefix_tokens") > pl.col("input_tokens"),
     "a prompt shares at most its own length; prefix_tokens must be <= input_tokens"),
    ("prefix_group", (pl.col("prefix_tokens") > 0) & (pl.col("prefix_group") == NO_PREFIX),
     "prefix_tokens without a group; give the group (>= 0) or set prefix_tokens to 0"),
)


def _fit_groups(frame: pl.LazyFrame, in_order: bool, file: str | None) -> dict[str, PrefixFit]:
    per = _per_request_prefix_group(frame, in_order)
    c = pl.col
    sharer = c("shared") > 0
    on_head = sharer & (c("shared") == pl.min_horizontal("head", c("input_tokens") - 1))
    totals, groups, lengths = pl.collect_all(
        [
            per.group_by("workload").agg(
                *(test.sum().alias(f"bad{i}") for i, (_, test, _) in enumerate(_BAD_ROWS)),
                c("input_tokens").sum().alias("total"),
                c("shared").sum().alias("shared"),
                c("hit").sum().alias("hit"),
                pl.len().alias("requests"),
                (c("hit") > 0).sum().alias("hitting"),
                sharer.sum().alias("sharers"),
                on_head.sum().alias("on_head"),
                (sharer & (c("prefix_group") == TARGET_HIT_RATE)).sum().alias("pinned"),
            ),
            per.filter(sharer & (c("prefix_group") >= 0))
            .group_by("workload", "prefix_group")
            .agg(pl.len().alias("n"), c("head").first().alias("head")),
            per.group_by("workload", "input_tokens").agg(pl.len().alias("n")),
        ],
        engine="streaming",
    )
    for i, (column, _, fix) in enumerate(_BAD_ROWS):
        bad = int(totals.get_column(f"bad{i}").sum())
        if bad:
            raise ConfigError(f"{bad} row(s) break a rule: {fix}", file=file, field=column)
    out: dict[str, PrefixFit] = {}
    for row in totals.sort("workload").iter_rows(named=True):
        w = str(row["workload"])
        mine = groups.filter(c("workload") == w)
        popularity = mine.get_column("n").to_numpy()
        heads = mine.get_column("head").to_numpy()
        n_groups, zipf_s = len(popularity), _zipf_slope(popularity)
        total, shared = float(row["total"]), float(row["shared"])
        hit = float(row["hit"]) / total if total else 0.0
        how = (
            f"from prefix_group/prefix_tokens: {row['sharers'] / row['requests']:.0%} of "
            f"requests share a head with their group; {n_groups} recurring groups, "
            f"popularity zipf_s {zipf_s:g}"
        )
        spec = None
        if shared > 0 and n_groups == 0:  # only TARGET_HIT_RATE rows: cached, no groups
            spec = PrefixSpec(target_hit_rate=round(shared / total, 3))
            how += f"; {row['pinned']} rows with prefix_group {TARGET_HIT_RATE} -> target_hit_rate"
        elif shared > 0 and row["on_head"] >= FIXED_HEADS * row["sharers"]:
            hist = lengths.filter(c("workload") == w)
            tokens = _shared_tokens_for(
                hist.get_column("input_tokens").to_numpy(), hist.get_column("n").to_numpy(), shared
            )
            spec = PrefixSpec(shared_tokens=tokens, groups=n_groups, zipf_s=zipf_s)
            span = f"{heads.min()}" + (f"-{heads.max()}" if heads.max() > heads.min() else "")
            how += f"; heads of {span} tokens -> shared_tokens {tokens} (as many shared in all)"
        elif shared > 0:
            fraction = min(1.0, max(0.001, round(shared / total, 3)))
            spec = PrefixSpec(shared_fraction=fraction, groups=n_groups, zipf_s=zipf_s)
            how += (
                f"; heads vary within groups -> shared_fraction {fraction:g} (shared tokens / "
                "prompt tokens)"
            )
        if row["pinned"] and n_groups:
            how += f"; {row['pinned']} rows with prefix_group {TARGET_HIT_RATE} counted as shared"
        how += f"; infinite-cache hit rate {hit:.1%}"
        share = shared / total if total else 0.0
        hitting = row["hitting"] / row["requests"]
        out[w] = PrefixFit(spec, hit, hitting, share, n_groups, zipf_s, how)
    return out
