"""A request's state inside one simulated engine, and what one engine step computes.

The request counters mirror vLLM's `Request` (vllm/v1/request.py): `computed` is
num_computed_tokens, `out` the output tokens so far, `spec` len(spec_token_ids) and
`placeholders` num_output_placeholders (async scheduling). A step's plan is vLLM's
`SchedulerOutput` (vllm/v1/core/sched/output.py), reduced to what costs time.
"""

from __future__ import annotations

from capplan.sim.kvcache import UNIQUE_SHIFT

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3
NEVER = 1 << 62  # sw_free_at of a request without sliding-window groups


class SimRequest:
    """One request's state inside an engine; field names follow vllm/v1/request.py."""

    # set when its tokens stream (sim/replica.py), never read before: when the client read
    # the first token; how late it read the last one, and that token's engine time
    first_seen_s: float
    lag: float
    lag_at: float

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "chain",
        "computed",
        "decoding",
        "encoded",
        "event",
        "first_seen_s",
        "first_token_s",
        "hashes",
        "image_tokens",
        "images",
        "inflight",
        "lag",
        "lag_at",
        "last_token_s",
        "lazy",
        "max_tokens",
        "measured",
        "n_reg",
        "out",
        "phase",
        "pinned_blocks",
        "placeholders",
        "preemptions",
        "prefix_base",
        "prefix_blocks",
        "priority",
        "prompt",
        "rid",
        "s0",
        "scheduled_s",
        "spec",
        "status",
        "stop_out",
        "sw_fphase",
        "sw_free_at",
        "sw_hi",
        "sw_keys",
        "sw_lo",
        "sw_phase",
        "trail_from",
        "trail_until",
        "u0",
        "user",
        "wl",
    )

    def __init__(
        self,
        rid: int,
        wl: int,
        arrival_s: float,
        prompt: int,
        max_tokens: int,
        *,
        priority: int = 0,
        prefix_base: int = 0,
        prefix_blocks: int = 0,
        pinned_blocks: int = 0,
        measured: bool = True,
        user: int = -1,
        image_tokens: int = 0,
        images: int = 0,
    ) -> None:
        self.rid = rid
        self.wl = wl
        self.arrival_s = arrival_s
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.stop_out = max_tokens  # output tokens at which it stops (EngineCore.add_request)
        self.priority = priority
        self.prefix_base = prefix_base  # hash of shared block 0; block i hashes to base - i
        self.prefix_blocks = prefix_blocks  # leading blocks shared with other requests
        self.pinned_blocks = pinned_blocks  # blocks assumed cached (target hit rate)
        self.measured = measured
        self.user = user
        self.image_tokens = image_tokens
        self.images = images  # pictures the image tokens come from
        self.encoded = False  # vision encoder has run (its output lives in the encoder cache)
        self.status = WAITING
        self.computed = 0
        self.out = 0
        self.spec = 0
        self.placeholders = 0
        self.decoding = False
        self.blocks = 0  # physical blocks held
        self.hashes: list[int] = []  # cached blocks held, in block order
        self.chain = 0  # leading entries of `hashes` held as a chain (KVCache.hold_chain)
        self.n_reg = 0  # leading blocks whose caching is settled (vLLM: num_cached_block)
        self.preemptions = 0
        self.cached_tokens = -1  # prefix-cache hit at first scheduling
        self.first_token_s = -1.0  # engine time of the first token's step end
        self.last_token_s = -1.0
        self.scheduled_s = -1.0
        self.lazy = False  # advanced implicitly by the decode cohort (sim/cohort.py)
        self.s0 = self.u0 = self.event = self.trail_from = self.trail_until = self.phase = 0
        # sliding-window groups (hybrid models only): every group's block-table entries,
        # the leading ones freed out of the window, the processed tokens at which the next
        # one leaves it, and per group the hashes of the cached blocks held (from block
        # max(sw_lo, pinned) on); tokens scheduled but not yet settled (num_in_flight_tokens)
        self.inflight = self.sw_hi = self.sw_lo = 0
        self.sw_free_at = NEVER
        self.sw_keys: list[list[int]] | None = None
        self.sw_phase = self.sw_fphase = -1  # decode cohort: sliding alloc / free phases

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.out

    def block_hash(self, i: int) -> int:
        """Chained hash of block i: shared-prefix blocks are negative, the rest unique."""
        if i < self.prefix_blocks:
            return self.prefix_base - i
        return (self.rid << UNIQUE_SHIFT) | i

    def block_hashes(self, start: int, stop: int) -> list[int]:
        """block_hash(i) for i in [start, stop), built from ranges."""
        shared_end = min(stop, self.prefix_blocks)
        base = self.prefix_base
        hashes = list(range(base - start, base - shared_end, -1)) if start < shared_end else []
        if stop > shared_end:
            unique = self.rid << UNIQUE_SHIFT  # | i == + i: i < 2**UNIQUE_SHIFT
            hashes += range(unique + max(start, shared_end), unique + stop)
        return hashes

    def __lt__(self, other: SimRequest) -> bool:
        # vllm/v1/request.py Request.__lt__: (priority, arrival_time, request_id)
        return (self.priority, self.arrival_s, self.rid) < (
            other.priority,
            other.arrival_s,
            other.rid,
        )


class StepPlan:
    """What one engine step computes: vLLM's SchedulerOutput, reduced to what costs time.
    (A plain class, not a dataclass: one is made every step, and this __init__ is cheaper.)"""

    __slots__ = (
        "cohort_all",
        "cohort_meas",
        "cohort_size",
        "decode_ctx",
        "emits",
        "encoder_images",
        "encoder_tokens",
        "idx",
        "padded",
        "preempted",
        "prefill_attn",
        "prefill_attn_w",
        "prefill_seqs",
        "prefill_tokens",
        "reqs",
        "running_prefill",
        "running_scheduled",
        "shared_ctx",
        "spec",
        "tokens",
        "total_tokens",
    )

    def __init__(self, idx: int = 0) -> None:
        self.reqs: list[SimRequest] = []
        self.tokens: list[int] = []
        self.spec: list[int] = []
        self.emits: list[bool] = []
        self.total_tokens = 0
        self.prefill_tokens = 0
        self.prefill_attn = 0.0
        self.prefill_attn_w = 0.0  # prefill_attn capped at the sliding window (steptime.py)
        self.prefill_seqs = 0
        self.decode_ctx = 0
        self.shared_ctx = 0.0  # context read in common with another running request
        self.preempted = 0
        # requests admitted with their one token padded to 1 + k (pad_spec_decode): their
        # k "drafts" are -1 and never accepted (None: none this step)
        self.padded: list[SimRequest] | None = None
        self.encoder_tokens = 0
        self.encoder_images = 0
        self.running_scheduled = 0  # RUNNING requests scheduled (explicit or in the cohort)
        self.running_prefill = False  # one of them is a prefill chunk (prefill_scheduled)
        self.idx = idx
        self.cohort_size = 0  # decode-cohort members advanced implicitly in this step
        self.cohort_all: tuple[int, ...] = ()  # ... per workload
        self.cohort_meas: tuple[int, ...] = ()  # ... measured ones, per workload

    @property
    def empty(self) -> bool:
        return not self.reqs and not self.cohort_size
