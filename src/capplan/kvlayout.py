"""How vLLM 0.26.0 lays a model's KV cache out: KV-cache groups sharing one block pool.

vLLM puts the attention layers into KV-cache groups (vllm/v1/core/kv_cache_utils.py:
get_kv_cache_groups). A model whose layers all attend alike gets one group; a model with
full-attention and sliding-window layers of different page sizes gets several:

1. unify_kv_cache_spec_page_size: every layer's page (one block of one layer:
   block_size x KV heads x (K + V head size) x dtype bytes, kv_cache_interface.py
   real_page_size_bytes; full layers at the engine's block size, sliding ones at the
   backend's smallest kernel block, 16) is raised to the largest one by multiplying the
   smaller layers' block size (Gemma 4 31B: a full layer's page at 16 tokens,
   4 x (512 + 512) x 2 B, is half a sliding layer's, 16 x (256 + 256) x 2 B, so full layers
   get 32-token blocks);
2. _get_kv_cache_groups_uniform_page_size: layers of one spec are split into groups of
   `group_size` layers, the fewest layers of any spec (or the most, when that is under 1.5x
   the fewest), padding the last group of a spec (Gemma 4 31B: 10 full and 50 sliding layers,
   groups of 10: one full-attention group and five sliding-window groups);
3. get_kv_cache_config_from_groups: one pool of `num_blocks` blocks, each block `group_size`
   pages (one page of one layer of every group: group_size tensors, each shared by one layer
   of every group), so a block of any group costs the pool the same bytes.

A request then holds blocks in every group from that one pool (kv_cache_coordinator.py:
HybridKVCacheCoordinator): a full-attention group a block per `full_block_size` tokens of
the whole sequence (single_type_kv_cache_manager.py: FullAttentionManager), a sliding-window
group only those of its window (SlidingWindowManager: remove_skipped_blocks frees, on the
processed-token basis, every block whose tokens all precede `num_computed - window + 1`).

vLLM's "GPU KV cache size: N tokens" (get_kv_cache_capacity) is max_concurrency x
max_model_len, max_concurrency = num_blocks / the blocks one request at max_model_len may
hold in all groups (_max_memory_usage_bytes_from_groups, get_max_concurrency_for_kv_cache_config;
a sliding group counts SlidingWindowSpec.max_admission_blocks_per_request: its window plus
the tokens in flight, plus one block). For Gemma 4 31B at max_model_len 32768 and 8192
batched tokens (async scheduling: 16384 in flight) that is 1024 + 5 x 1089 = 6469 blocks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from capplan.modelspec import ModelSpec

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KvLayout(BaseModel):
    """vLLM 0.26.0's KV-cache groups of one model on one GPU, sharing one block pool."""

    model_config = _FROZEN
    block_size: int = Field(gt=0, description="cache_config.block_size the layout is for")
    full_groups: int = Field(ge=0, description="full-attention KV-cache groups")
    full_block_size: int = Field(gt=0, description="tokens per block of a full-attention group")
    sliding_groups: int = Field(default=0, ge=0, description="sliding-window KV-cache groups")
    sliding_block_size: int = Field(default=0, ge=0,
                                    description="tokens per block of a sliding-window group")
    sliding_window: int = Field(default=0, ge=0, description="tokens a sliding layer attends")
    layers_per_group: int = Field(gt=0, description="group_size: layers of one group")
    page_bytes: int = Field(gt=0, description="one block of one layer, after unification")
    full_layers: int = Field(default=0, ge=0)
    sliding_layers: int = Field(default=0, ge=0)

    @property
    def hybrid(self) -> bool:
        """Sliding-window groups beside the full-attention group(s)."""
        return self.sliding_groups > 0

    @property
    def num_groups(self) -> int:
        return self.full_groups + self.sliding_groups

    @property
    def block_bytes(self) -> int:
        """Bytes one block of the pool takes on the GPU (all layers' pages of one group)."""
        return self.page_bytes * self.layers_per_group

    @property
    def scheduler_block_size(self) -> int:
        """kv_cache_utils.py resolve_kv_cache_block_sizes: the LCM of the groups' block sizes
        (cache hits and cached blocks are aligned to it, kv_cache_coordinator.py)."""
        sizes = [self.full_block_size] if self.full_groups else []
        if self.sliding_groups:
            sizes.append(self.sliding_block_size)
        return math.lcm(*sizes)

    def sliding_admission_blocks(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request: the most
        blocks one sliding group of one request holds (its window less one token plus the
        tokens in flight, never more than max_model_len, plus a block for a window that does
        not start on a block boundary)."""
        tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return _cdiv(tokens, self.sliding_block_size) + 1

    def max_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request at max_model_len may hold in all groups together
        (kv_cache_utils.py _max_memory_usage_bytes_from_groups / page size): what vLLM checks
        against the pool at start-up and divides the pool by for its concurrency."""
        full = self.full_groups * _cdiv(max_model_len, self.full_block_size)
        if not self.sliding_groups:
            return full
        return full + self.sliding_groups * self.sliding_admission_blocks(
            max_model_len, max_in_flight_tokens)

    def vllm_kv_tokens(self, num_blocks: int, max_model_len: int,
                       max_in_flight_tokens: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" (kv_cache_utils.py get_kv_cache_capacity):
        int(num_blocks / max_blocks_per_request x max_model_len)."""
        per_req = self.max_blocks_per_request(max_model_len, max_in_flight_tokens)
        return int(num_blocks / per_req * max_model_len)

    def blocks_held(self, tokens: int, processed: int | None = None) -> int:
        """Pool blocks a running request with slots for `tokens` holds once the blocks out of
        its window are freed, `processed` tokens settled (default: all of them; vLLM frees on
        the processed-token basis, kv_cache_manager.py allocate_slots)."""
        full = self.full_groups * _cdiv(tokens, self.full_block_size)
        if not self.sliding_groups:
            return full
        done = tokens if processed is None else processed
        skipped = max(0, done - self.sliding_window + 1) // self.sliding_block_size
        hi = _cdiv(tokens, self.sliding_block_size)
        return full + self.sliding_groups * (hi - min(skipped, hi))


def max_in_flight_tokens(max_num_batched_tokens: int, async_scheduling: bool) -> int:
    """vllm/config/vllm.py VllmConfig.max_in_flight_tokens: max_concurrent_batches (2 with
    async scheduling and no pipeline parallelism, else 1) x max_num_batched_tokens."""
    return (2 if async_scheduling else 1) * max_num_batched_tokens


def _heads_per_gpu(heads: int, tp: int) -> int:
    """KV heads one GPU stores: split by TP, replicated once TP exceeds the head count."""
    return max(1, math.ceil(heads / tp))


SLIDING_KERNEL_BLOCK = 16
"""Tokens per block a sliding-window layer asks for: the attention backend's smallest kernel
block, whatever `--block-size` says (model_executor/layers/attention/attention.py
get_kv_cache_spec, _largest_kernel_block_within; FlashAttention's is a multiple of 16)."""


def derive_layout(spec: ModelSpec, *, block_size: int = 16, kv_dtype_bytes: int = 2,
                  tp: int = 1) -> KvLayout:
    """The KV-cache groups vLLM 0.26.0 builds for `spec` (kv_cache_utils.py get_kv_cache_groups,
    unify_kv_cache_spec_page_size, _get_kv_cache_groups_uniform_page_size; module doc).

    Full-attention layers use the global head shape where the spec has one (Gemma 4: K and V
    both stored at global_head_dim, 4 heads, even where K doubles as V: gemma4.py builds a
    standard Attention, whose FullAttentionSpec has head_size_v = head_size), at the engine's
    `block_size`; sliding layers at SLIDING_KERNEL_BLOCK tokens."""
    sliding = spec.sliding_window_layers if spec.sliding_window else 0
    full = spec.num_layers - sliding
    g_heads = _heads_per_gpu(spec.num_global_kv_heads or spec.num_kv_heads, tp)
    g_dim = spec.global_head_dim or spec.head_dim
    l_heads = _heads_per_gpu(spec.num_kv_heads, tp)
    local_block = SLIDING_KERNEL_BLOCK
    full_page = block_size * g_heads * 2 * g_dim * kv_dtype_bytes
    local_page = local_block * l_heads * 2 * spec.head_dim * kv_dtype_bytes
    if not sliding:  # one group of every layer (kv_cache_utils.py: uniform spec / type)
        return KvLayout(block_size=block_size, full_groups=1, full_block_size=block_size,
                        layers_per_group=full, page_bytes=full_page, full_layers=full)
    if not full:
        raise NotImplementedError(
            f"{spec.name}: every layer slides; vLLM keeps one sliding-window group "
            "(UnitaryKVCacheCoordinator), which the simulator does not model")
    page = max(full_page, local_page)
    for p in (full_page, local_page):
        if page % p:
            raise NotImplementedError(
                f"{spec.name}: page sizes {full_page} and {local_page} B do not divide; "
                "vLLM pads them (unify_kv_cache_spec_page_size), which is not modelled")
    group_size = min(full, sliding)
    if max(full, sliding) < group_size * 1.5:
        group_size = max(full, sliding)
    return KvLayout(
        block_size=block_size,
        full_groups=_cdiv(full, group_size),
        full_block_size=block_size * page // full_page,
        sliding_groups=_cdiv(sliding, group_size),
        sliding_block_size=local_block * page // local_page,
        sliding_window=spec.sliding_window or 0,
        layers_per_group=group_size,
        page_bytes=page,
        full_layers=full,
        sliding_layers=sliding,
    )
