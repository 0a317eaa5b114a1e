"""FlashAttention 3's decode tiles, and the partly empty wave they can leave.

A decode-only step replays its full CUDA graph, and vLLM 0.26.0 runs its attention through
FlashAttention 3 with the KV of each sequence cut into splits chosen afresh every step from
the real lengths (vllm/v1/attention/backends/flash_attn.py: FlashAttentionMetadataBuilder
passes `num_splits = flash_attn_max_num_splits_for_cuda_graph`, 32 by default in
vllm/config/attention.py, and calls `get_scheduler_metadata` on the step's `seq_lens`). In
FlashAttention's Hopper kernel (vllm-flash-attn, hopper/flash_prepare_scheduler.cu:
prepare_varlen_num_blocks_kernel) a sequence of n blocks of 128 KV tokens takes
`ceil(n / per_sm)` splits (at least 1, at most 32), where `per_sm = ceil(1.1 x kv_heads x
total blocks / SMs)`: the rule aims at about SMs / 1.1 work tiles, one per KV head and
split. The tiles are taken in batch order, a sequence's head by head, by one persistent
thread block per SM (hopper/tile_scheduler.hpp: VarlenDynamicPersistentTileScheduler).
Each sequence's split count is rounded up, so a batch of a few long sequences often makes
133 to 230 tiles for 132 SMs, and the last of them run in a second wave that leaves most
SMs idle.

`tail_factor` prices that: the thread blocks take the tiles in order, each streaming its
tile's blocks at one SM's share of the memory's bandwidth while every SM is busy, and at up
to `rho` times that share once tiles run out (a lone thread block cannot draw the whole
bandwidth); the factor is that makespan over the ideal one (every tile's blocks at the full
bandwidth), at least 1. It is exactly 1 where the tiles fill whole waves or the last wave
holds at least SMs / rho of them, as at the large batches whose decode steps fitted the
context rate (`graph_ctx_s`). Measured on an H100 (Llama-3.1-8B FP8, 8 KV heads), the
sweep's decode steps of 6 sequences ran 10.8 % over the summed-context price, of 17 8.6 %
and of 16 2.1 % (at 8,192 tokens each: 144, 136 and 128 tiles); with `rho` 2.3 they come
within 2.2 %, and a mixlen scan's unequal batches within 2 % (scripts/calibration_analysis.py
tiles, mixlen; docs/calibration.md, "Decode batches of unequal lengths").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

import numpy as np

BLOCK_N = 128  # KV tokens a tile step reads: hopper/tile_size.h, head dim 128, 16-bit KV
MAX_SPLITS = 32  # vllm/config/attention.py: flash_attn_max_num_splits_for_cuda_graph
_F32 = np.float32


def kv_blocks(context: int) -> int:
    """Blocks of BLOCK_N KV tokens a decode of `context` earlier tokens reads (its new
    token's included)."""
    return context // BLOCK_N + 1


def blocks_of(contexts: Iterable[int]) -> tuple[int, ...]:
    """kv_blocks of each decode's context, in order: the key StepTimer.tail_factor takes."""
    return tuple([c // BLOCK_N + 1 for c in contexts])


def splits(blocks: Sequence[int], kv_heads: int, sms: int) -> list[int]:
    """Each sequence's split count (prepare_varlen_num_blocks_kernel; its float32 sum)."""
    total = sum(blocks)
    per_sm = math.ceil(_F32(total) * _F32(1.1) * _F32(kv_heads) / _F32(sms))
    per_sm = per_sm if per_sm > 0 else 1
    out = []
    for n in blocks:
        s = -(-n // per_sm)
        out.append(1 if s < 1 else (MAX_SPLITS if s > MAX_SPLITS else s))
    return out


def tail_factor(blocks: Sequence[int], kv_heads: int, sms: int, rho: float) -> float:
    """The attention kernel's time over the ideal for a decode batch of sequences that read
    `blocks` KV blocks each, in batch order (module docstring), in units of one block at one
    SM's share of the bandwidth: the thread blocks take the tiles in order at rate 1 while
    any is left, then the last ones run at min(rho, SMs / running) each."""
    total = sum(blocks)
    if not total:
        return 1.0
    free = [0.0] * sms  # when each thread block is next free, all running at rate 1
    last = 0.0  # when the last tile taken started
    replace = heapq.heapreplace
    heads = range(kv_heads)
    for n, s in zip(blocks, splits(blocks, kv_heads, sms), strict=True):
        # one split, as most sequences of a large batch take: a quarter faster than the
        # general loop below, in the simulator's hot path
        if s == 1:
            for _ in heads:
                last = replace(free, free[0] + n)
            continue
        per = -(-n // s)
        works = [w if w < per else per for w in range(n, 0, -per)]
        # a sequence's tiles head by head, each head's splits in turn (tile_scheduler.hpp:
        # bidh_actual = bidh / num_splits, split_idx = bidh % num_splits)
        for _ in heads:
            for w in works:
                last = replace(free, free[0] + w)
    # the queue ran dry when the last tile started: what the running ones have left
    free.sort()
    t, done, running = last, 0.0, sms
    for f in free:
        if f <= last:
            running -= 1
            continue
        rate = sms / running
        t += (f - last - done) / (rho if rho < rate else rate)
        done = f - last
        running -= 1
    ideal = kv_heads * total / sms
    return t / ideal if t > ideal else 1.0
