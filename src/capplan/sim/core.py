"""One vLLM 0.26.0 engine's scheduler, rule by rule, on simulated requests (sim/request.py).

The scheduler follows vllm/v1/core/sched/scheduler.py (Scheduler.schedule,
_update_after_schedule, update_from_output, _preempt_request) and
vllm/v1/core/sched/async_scheduler.py; the waiting queue follows
vllm/v1/core/sched/request_queue.py. Rules for connectors, LoRA, structured output,
encoder-decoder models, Mamba and pipeline parallelism are left out: none of them bears on a
dense decoder served from one replica. A model with sliding-window layers keeps KV-cache
groups of both kinds (sim/window.py).
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass
from itertools import count
from operator import sub

from capplan.sim.cohort import DecodeCohort
from capplan.sim.kvcache import UNIQUE_SHIFT, KVCache
from capplan.sim.request import FINISHED, PREEMPTED, RUNNING, SimRequest, StepPlan
from capplan.sim.window import SlidingWindowGroups
from capplan.steptime import window_pairs

PICTURE_AT = 1
"""Where a request's pictures start in its prompt: after its first token, one text token
between pictures (validate/runner.py Pictures places them so)."""


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """The engine settings the scheduler reads."""

    num_blocks: int
    block_size: int = 16  # tokens per block of the (full-attention) group
    max_num_seqs: int = 1024
    max_num_scheduled_tokens: int = 8192  # max_num_batched_tokens less draft slots
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    async_scheduling: bool = True
    spec_k: int = 0
    spec_lookahead: bool = True  # model-based drafters reserve KV for their drafts
    long_prefill_token_threshold: int = 0
    drop_eagle_block: bool = False  # EAGLE/MTP drafters recompute the last cached block
    decode_cohort: bool = False  # evaluate steady decoders lazily (sim/cohort.py)
    workloads: int = 1
    # sliding-window KV-cache groups beside the full-attention one (kvlayout.py); 0: none
    sw_groups: int = 0
    sw_block_size: int = 16  # tokens per block of a sliding-window group (divides block_size)
    sw_window: int = 0  # tokens a sliding layer attends
    max_in_flight_tokens: int = 0  # VllmConfig.max_in_flight_tokens (admission cap)
    # disable_chunked_mm_input (vllm/platforms/cuda.py forces it for Gemma 4): a chunk that
    # would cover part of a request's pictures ends before them (ModelSpec.images_whole)
    images_whole: bool = False


class EngineCore(SlidingWindowGroups):
    """The scheduler and KV manager of one replica (no clock: the replica drives it)."""

    def __init__(self, cfg: CoreConfig, rng: random.Random, acceptance: list[float]) -> None:
        self.cfg = cfg
        self.acceptance = acceptance  # P(draft accepted), per workload index
        # log P(accepted) per workload; None: drafts are never accepted (and draw nothing)
        self._log_acceptance = [math.log(a) if a > 0 else None for a in acceptance]
        self.kv = KVCache(
            cfg.num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching
        )
        self.rng = rng
        self.running: list[SimRequest] = []
        self.priority = cfg.policy == "priority"
        self._fcfs: deque[SimRequest] = deque()
        self._heap: list[SimRequest] = []
        self.lookahead = cfg.spec_k if cfg.spec_lookahead else 0
        self.preemptions = 0
        self.now = 0.0  # set by the replica before each schedule()
        self.prompt_tokens_queried = 0
        self.prompt_tokens_hit = 0
        self.step_idx = 0
        # running requests per prefix group (prefix_base): [readers, their shared tokens],
        # and S of steptime.py, the tokens later readers read in common, kept as they change
        self._readers: dict[int, list[int]] = {}
        self.shared_ctx = 0.0
        self.sw = cfg.sw_groups  # sliding-window groups (0: one full-attention group)
        if self.sw:
            sbs = cfg.sw_block_size
            if cfg.sw_window < 1 or sbs < 1 or cfg.block_size % sbs:
                raise ValueError("sliding-window groups need a window and a block size that "
                                 f"divides {cfg.block_size}, got {cfg.sw_window}, {sbs}")
            self._sw_k = cfg.block_size // sbs  # sliding blocks per full-attention block
            if cfg.enable_prefix_caching and -(-(cfg.sw_window - 1) // sbs) < self._sw_k:
                # SlidingWindowManager.reachable_block_mask would cache only some blocks
                raise NotImplementedError("a window shorter than a full-attention block: "
                                          "vLLM caches its sliding blocks sparsely")
            # kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request
            in_flight = cfg.max_in_flight_tokens or cfg.max_model_len
            self._sw_cap = -(-min(cfg.sw_window - 1 + in_flight, cfg.max_model_len) // sbs) + 1
            # tokens in flight at a steady decoder's schedule (async: the step before's)
            steady = 1 if cfg.async_scheduling else 0
        self.cohort = (
            DecodeCohort(cfg.workloads, cfg.block_size,
                         (cfg.sw_groups, cfg.sw_block_size, cfg.sw_window, steady)
                         if self.sw else None)
            if cfg.decode_cohort and cfg.spec_k == 0
            else None
        )

    # -- waiting queue: vllm/v1/core/sched/request_queue.py -------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._heap) if self.priority else len(self._fcfs)

    def add_request(self, r: SimRequest) -> None:
        # check_stop (vllm/v1/core/sched/utils.py) stops at max_tokens or max_model_len
        r.stop_out = min(r.max_tokens, self.cfg.max_model_len - r.prompt)
        if self.priority:
            heapq.heappush(self._heap, r)  # PriorityRequestQueue.add_request
        else:
            self._fcfs.append(r)  # FCFSRequestQueue.add_request

    def _prepend(self, r: SimRequest) -> None:
        if self.priority:
            heapq.heappush(self._heap, r)  # PriorityRequestQueue.prepend_request == add
        else:
            self._fcfs.appendleft(r)

    def _peek(self) -> SimRequest:
        return self._heap[0] if self.priority else self._fcfs[0]

    def _pop(self) -> SimRequest:
        return heapq.heappop(self._heap) if self.priority else self._fcfs.popleft()

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._fcfs or self._heap)

    # -- KV: vllm/v1/core/kv_cache_manager.py allocate_slots --------------------------------
    def _cache_blocks(self, r: SimRequest, num_tokens: int) -> None:
        """Cache r's blocks that are full up to `num_tokens` (KVCacheManager.cache_blocks)."""
        full = num_tokens // self.cfg.block_size
        start = r.n_reg
        if full <= start:
            return
        r.n_reg = full
        if self.sw and self.kv.caching:
            self._cache_sw(r, start, full)
        if start >= r.prefix_blocks and not r.preemptions:
            return  # blocks unique to a request never preempted: see the end
        kv = self.kv
        if not kv.caching:
            return
        if start < r.pinned_blocks:
            start = r.pinned_blocks
        hashes = r.hashes
        shared_end = full if full < r.prefix_blocks else r.prefix_blocks
        for i in range(start, shared_end):  # shared prefix: another request may have it
            hashes.append(kv.cache(r.prefix_base - i))
        if shared_end > start:
            start = shared_end
        if start >= full:
            return
        if r.preemptions:  # its own blocks may still be cached from before the preemption
            base = r.rid << UNIQUE_SHIFT
            for i in range(start, full):
                hashes.append(kv.cache(base | i))
        # else: blocks unique to a request never preempted are not cached yet, and no lookup
        # can reach them while it holds them: they stay out of the cache until _free

    def _allocate_running(self, r: SimRequest, n: int) -> bool:
        """allocate_slots for a running request: blocks up to computed + n + lookahead."""
        cfg = self.cfg
        bs = cfg.block_size
        upto = r.computed + n  # (conditionals, not min(): this runs for every block filled)
        end = upto + self.lookahead
        if end > cfg.max_model_len:
            end = cfg.max_model_len
        need = -(-end // bs) - r.blocks - r.pinned_blocks
        if need > 0:
            kv = self.kv
            unhashed = kv.free_unhashed
            if need > unhashed + kv.free_cached:  # kv.num_free
                return False
            if need <= unhashed:  # (KVCache.allocate's common case)
                kv.free_unhashed = unhashed - need
            else:
                kv.allocate(need)
            r.blocks += need
        num_tokens = r.prompt + r.out
        if upto > num_tokens:
            upto = num_tokens
        if upto // bs > r.n_reg:
            self._cache_blocks(r, upto)
        return True

    def _free(self, r: SimRequest) -> None:
        """_free_request_blocks: release every block, tail first."""
        if self.sw:
            self._free_sw(r)
        # entry k of r.hashes is block pinned_blocks + k; only shared-prefix blocks can be
        # held by other requests too. A request never preempted holds its own full blocks
        # [own_from, n_reg) outside r.hashes (_cache_blocks): they are freed as one run
        shared = max(0, r.prefix_blocks - r.pinned_blocks)
        own = range(0)
        own_from = max(r.prefix_blocks, r.pinned_blocks)
        if self.kv.caching and not r.preemptions and r.n_reg > own_from:
            base = r.rid << UNIQUE_SHIFT
            own = range(base | own_from, base | r.n_reg)
        self.kv.free(r.hashes, r.blocks - len(r.hashes) - len(own), shared, own,
                     r.chain, r.prefix_base)
        r.blocks = 0
        r.hashes = []
        r.chain = 0
        r.n_reg = 0

    def _allocate_running_sw(self, r: SimRequest, n: int) -> bool:
        """allocate_slots for a running request of a hybrid model: free the sliding blocks
        out of the window (on the processed-token basis: tokens of steps in flight are not
        settled), then blocks up to computed + n + lookahead in every group."""
        cfg = self.cfg
        bs = cfg.block_size
        sbs = cfg.sw_block_size
        max_len = cfg.max_model_len
        computed = r.computed
        processed = (computed if computed < max_len else max_len) - r.inflight
        if processed >= r.sw_free_at:
            self._sw_skip(r, processed)
        upto = computed + n
        end = upto + self.lookahead
        if end > max_len:
            end = max_len
        need = -(-end // bs) - r.blocks - r.pinned_blocks
        if need < 0:
            need = 0
        sw_need = -(-end // sbs) - r.sw_hi
        total = need + self.sw * sw_need if sw_need > 0 else need
        if total > 0:
            kv = self.kv
            if total > kv.num_free:
                return False
            kv.allocate(total)
            r.blocks += need
            if sw_need > 0:
                r.sw_hi += sw_need
        num_tokens = r.prompt + r.out
        if upto > num_tokens:
            upto = num_tokens
        if upto // bs > r.n_reg:
            self._cache_blocks(r, upto)
        return True

    def _read_shared(self, r: SimRequest, joins: int) -> None:
        """r starts (joins = 1) or stops (-1) running: with prefix caching on, requests of
        one prefix group hold the very same KV blocks for their shared prefix
        (kv_cache_manager.py get_computed_blocks: a hit takes the cached block), and each
        reader after the first reads it in common (steptime.py: shared_ctx_saving).
        A group's S is (readers - 1) x their mean shared tokens."""
        group = self._readers.get(r.prefix_base)
        if group is None:
            group = self._readers[r.prefix_base] = [0, 0]
        n, tokens = group
        before = tokens * (n - 1) / n if n > 1 else 0.0
        n += joins
        tokens += joins * r.prefix_blocks * self.cfg.block_size
        self.shared_ctx += (tokens * (n - 1) / n if n > 1 else 0.0) - before
        if n:
            group[0], group[1] = n, tokens
        else:
            del self._readers[r.prefix_base]

    def _preempt(self, r: SimRequest) -> None:
        """Scheduler._preempt_request: recompute preemption, back to the waiting front."""
        if r.prefix_blocks and self.kv.caching:
            self._read_shared(r, -1)
        self._free(r)
        r.status = PREEMPTED
        r.computed = 0
        r.spec = 0
        r.decoding = False
        r.encoded = False  # encoder_cache_manager.free(request): re-encoded on resume
        r.preemptions += 1
        self.preemptions += 1
        self._prepend(r)

    # -- Scheduler.schedule ----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Scheduler.schedule: running requests first, in order, then waiting ones."""
        self.step_idx += 1
        plan = StepPlan(idx=self.step_idx)
        budget = self.cfg.max_num_scheduled_tokens
        cohort = self.cohort
        if cohort is not None and cohort.members:
            budget, preempted = self._schedule_with_cohort(plan, budget, cohort)
        else:
            budget, preempted = self._schedule_running(plan, self.running, budget)
        # Next, the WAITING requests, unless this step preempted one.
        if not preempted and (self._heap if self.priority else self._fcfs):
            self._schedule_waiting(plan, budget)
        if plan.reqs:  # (a step of cohort members only has nothing to walk)
            self._update_after_schedule(plan)
            if cohort is not None:
                self._join_cohort(plan, cohort)
        if cohort is not None:
            cohort.sched_done = plan.idx
        plan.shared_ctx = self.shared_ctx
        return plan

    def decode_contexts(self, plan: StepPlan) -> list[int]:
        """Each sequence's context in `plan`, a decode-only step just scheduled (they sum to
        plan.decode_ctx), in the running list's order, the cohort's shortcut or not: an
        explicit request's counters have advanced past the step (_update_after_schedule), a
        member's are as of its first implicit schedule, s0. vLLM's batch order is its
        persistent batch's slots (vllm/v1/worker/gpu_input_batch.py: a new request takes
        the first free one), which the running list's order stands in for
        (steptime.StepTimer.tail_factor)."""
        idx = plan.idx
        scheduled = {id(r): n for r, n in zip(plan.reqs, plan.tokens, strict=True)}
        out: list[int] = []
        for r in self.running:
            n = scheduled.get(id(r))
            if n is not None:
                out.append(r.computed - n)
            elif r.lazy and r.s0 <= idx:
                out.append(r.computed + idx - r.s0)
        return out

    def _schedule_with_cohort(
        self, plan: StepPlan, budget: int, cohort: DecodeCohort
    ) -> tuple[int, bool]:
        """The cohort's shortcut when the ordered walk's order cannot matter: every running
        request gets all it asks for, or the members all come before the explicit requests
        in the running list (then they take their tokens first and the explicit ones share
        what is left, in order, as the walk would) and no request would be preempted. Else
        dissolve the cohort and walk the running list in order."""
        idx = plan.idx
        if idx in cohort.events:
            for r in cohort.due(idx):
                self._leave(r)  # near its last token: the explicit path handles the end
        size = len(cohort.members)
        # the explicit requests, in order, and the members ahead of each in the running list;
        # none when the members are all of it (they are running requests: a member leaves the
        # cohort before it can finish, and the cohort dissolves before any preemption). The
        # explicit ones (new prompts, members near their end) are few and mostly near the
        # end of the list: found from the end, stopping at the last of them
        running = self.running
        others: list[SimRequest] = []
        before: list[int] = []
        k = len(running) - size
        if k:
            at: list[int] = []
            i = len(running)
            while k:
                i -= 1
                if not running[i].lazy:
                    at.append(i)
                    k -= 1
            at.reverse()
            others = list(map(running.__getitem__, at))
            before = list(map(sub, at, count()))
        kv = self.kv
        if self.sw:
            # members' new blocks in every group, and the sliding blocks leaving their
            # windows (each member frees before it allocates: it needs the positive part)
            crossings, freed, positive = cohort.sw_step(idx)
            free_blocks = kv.num_free - positive
        else:
            crossings = cohort.phase[idx % cohort.bs]  # cohort.crossings(idx)
            free_blocks = kv.free_unhashed + kv.free_cached - crossings
        if not (
            self._fits(others, before, size, budget, free_blocks)
            if others
            else free_blocks >= 0 and size <= budget  # _fits without explicit requests
        ):
            for r in cohort.dissolve():
                self._register_decoded(r)
            return self._schedule_running(plan, self.running, budget)
        if self.sw and freed:
            # members' out-of-window blocks: their own, cached (kvcache.py free_anon)
            if kv.caching:
                kv.free_anon(freed)
            else:
                kv.free_unhashed += freed
        if crossings:  # members' new blocks; counted on them when met
            if crossings <= kv.free_unhashed:  # (KVCache.allocate's common case)
                kv.free_unhashed -= crossings
            else:
                kv.allocate(crossings)
        plan.total_tokens += size
        plan.decode_ctx += cohort.ctx
        plan.cohort_size = size
        plan.running_scheduled += size
        plan.cohort_all, plan.cohort_meas = cohort.counts  # (tuples of all_w, meas_w)
        cohort.ctx += size
        if not others:
            return budget - size, False
        budget, preempted = self._schedule_running(plan, others, budget, before)
        if preempted:  # _fits guaranteed every allocation; a preemption here is a bug
            raise RuntimeError("decode cohort: preemption in a step that fits")
        return budget - (size - before[-1]), False

    def _leave(self, r: SimRequest) -> None:
        assert self.cohort is not None
        self.cohort.leave(r)
        self._register_decoded(r)

    def _register_decoded(self, r: SimRequest) -> None:
        """Cache the blocks a just-materialized member filled while implicit: exactly what
        the per-request path's updates cached (up to computed - placeholders)."""
        if (r.computed - r.placeholders) // self.cfg.block_size > r.n_reg:
            self._cache_blocks(r, r.computed - r.placeholders)

    def _fits(
        self,
        others: list[SimRequest],
        before: list[int],
        members: int,
        budget: int,
        free_blocks: int,
    ) -> bool:
        """Can the cohort's shortcut stand in for the ordered walk this step? It can when the
        walk would serve every member (one token each, at its place in the running list)
        before the budget runs out, and would allocate without preempting. The explicit
        requests get what the walk gives them: all they ask for, or a chunk cut to the
        budget left at their place (`before[j]` members ahead of others[j])."""
        cfg = self.cfg
        bs, max_len, threshold, la = (
            cfg.block_size, cfg.max_model_len, cfg.long_prefill_token_threshold, self.lookahead
        )
        sw = self.sw
        if free_blocks < 0:
            return False
        used = 0  # tokens the explicit requests take
        for r, ahead in zip(others, before, strict=True):
            avail = budget - ahead - used
            if avail <= 0:  # the walk stops here: members after this point would starve
                return ahead >= members and avail == 0
            computed, ph = r.computed, r.placeholders
            if ph and computed + 2 - ph >= r.prompt + r.max_tokens:
                continue
            n = r.prompt + r.out + r.spec + ph - computed
            if 0 < threshold < n:
                n = threshold
            if n > max_len - computed - 1:
                n = max_len - computed - 1
            if n <= 0:
                continue
            if n > avail:
                n = avail
            used += n
            end = computed + n + la
            if end > max_len:
                end = max_len
            need = -(-end // bs) - r.blocks - r.pinned_blocks
            if sw:
                net = self._sw_net_need(r, end, need)
                if net is None:
                    return False
                need = net
            if need > 0:
                free_blocks -= need
                if free_blocks < 0:
                    return False
        return used + members <= budget

    def _join_cohort(self, plan: StepPlan, cohort: DecodeCohort) -> None:
        """Explicit requests that will take one decode token a step from now on (their
        prompt is done) join the cohort."""
        cfg = self.cfg
        s0 = plan.idx + 1
        sw = self.sw
        for r, emits, n in zip(plan.reqs, plan.emits, plan.tokens, strict=True):
            if emits and not r.lazy and r.status == RUNNING:
                if sw and ((self.kv.caching and r.preemptions)
                           or (cfg.async_scheduling and n != 1)):
                    # hybrid: a preempted request's blocks carry hashes (freed in order);
                    # after a chunk, the next step frees its window's tail at once
                    continue
                cohort.join(r, s0, self.lookahead, cfg.max_model_len)

    def _schedule_running(
        self,
        plan: StepPlan,
        running: list[SimRequest],
        budget: int,
        members_before: list[int] | None = None,
    ) -> tuple[int, bool]:
        """The RUNNING walk of Scheduler.schedule over `running`, in order; preemption
        takes victims from self.running. `members_before[i]`: decode-cohort members that come
        before running[i] in the full list (each takes one token of the budget first).
        Returns (budget left, whether it preempted)."""
        cfg = self.cfg
        max_len = cfg.max_model_len
        threshold = cfg.long_prefill_token_threshold
        bs = cfg.block_size
        la = self.lookahead
        prio = self.priority
        sw = self.sw
        sbs = cfg.sw_block_size
        allocate = self._allocate_running_sw if sw else self._allocate_running
        preempted = False
        reqs = plan.reqs
        add_req, add_tok, add_spec = reqs.append, plan.tokens.append, plan.spec.append
        all_running = self.running
        # the plan's integer sums, added to it at the end (a priority preemption's undo
        # subtracts from the plan meanwhile: the sum comes out the same)
        n_scheduled = total_tokens = decode_ctx = 0

        # First, the RUNNING requests, in order.
        i = 0
        served = 0  # cohort members whose token has been taken from the budget
        while i < len(running) and budget > 0:
            if members_before is not None and members_before[i] > served:
                budget -= members_before[i] - served
                served = members_before[i]
                if budget <= 0:
                    break
            r = running[i]
            computed = r.computed
            ph = r.placeholders
            # async_scheduler: no extra step once the last one reached max_tokens
            if ph and computed + 2 - ph >= r.prompt + r.max_tokens:
                i += 1
                continue
            num_tokens = r.prompt + r.out
            drafts = r.spec
            n = num_tokens + drafts + ph - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > max_len - computed - 1:
                n = max_len - computed - 1
            if n <= 0:
                i += 1
                continue
            if computed + n + la > (r.blocks + r.pinned_blocks) * bs or (
                (computed + n if computed + n < num_tokens else num_tokens) // bs > r.n_reg
            ) or (sw and (computed + n + la > r.sw_hi * sbs
                          or computed - r.inflight >= r.sw_free_at)):
                ok = allocate(r, n)
                while not ok:
                    # Out of KV: preempt the lowest-priority (priority) or newest (fcfs).
                    if prio:
                        victim = max(all_running, key=lambda q: (q.priority, q.arrival_s))
                        all_running.remove(victim)
                        if victim in reqs:  # scheduled in this walk (plan.reqs holds no other)
                            budget += self._unschedule(plan, reqs.index(victim))
                            # only then does vLLM step its index back: an earlier victim that
                            # was not scheduled makes the walk skip the request after r
                            i -= 1
                    else:
                        victim = all_running.pop()
                    self._preempt(victim)
                    preempted = True
                    plan.preempted += 1
                    if victim is r:
                        break
                    ok = allocate(r, n)
                if not ok:
                    break  # r itself was preempted: nothing more fits
            n_scheduled += 1
            add_req(r)
            add_tok(n)
            if drafts:
                drafts = n + computed - num_tokens - ph
                add_spec(drafts if drafts > 0 else 0)
                r.spec = 0  # consumed; new drafts arrive with the output (or as placeholders)
            else:
                add_spec(0)
            total_tokens += n
            if r.decoding:
                decode_ctx += computed
            else:
                plan.running_prefill = True
                plan.prefill_tokens += n
                plan.prefill_attn += n * (computed + n / 2)
                plan.prefill_seqs += 1
                if sw:
                    plan.prefill_attn_w += window_pairs(n, computed, cfg.sw_window)
                if r.image_tokens and not r.encoded and computed + n > PICTURE_AT:
                    plan.encoder_tokens += r.image_tokens
                    plan.encoder_images += r.images
                    r.encoded = True
            budget -= n
            i += 1

        plan.running_scheduled += n_scheduled
        plan.total_tokens += total_tokens
        plan.decode_ctx += decode_ctx
        return budget, preempted

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> None:
        """The WAITING part of Scheduler.schedule: admit in queue order while budget,
        max_num_seqs and KV blocks allow; stop at the first that does not fit."""
        cfg = self.cfg
        running = self.running
        max_len = cfg.max_model_len
        threshold = cfg.long_prefill_token_threshold
        bs = cfg.block_size
        kv = self.kv
        sw = self.sw
        if sw:
            sbs = cfg.sw_block_size
            cap = self._sw_cap
        # a hit on a shared prefix all in use may be held as a chain (KVCache.hold_chain)
        chains = kv.caching and not sw and not cfg.drop_eagle_block
        while self.num_waiting and budget > 0:
            if len(running) >= cfg.max_num_seqs:
                break
            r = self._peek()
            if r.status == FINISHED:  # finished by an in-flight step after preemption
                self._pop()
                continue
            num_tokens = r.num_tokens
            # KVCacheManager.get_computed_blocks: full blocks only, and never the
            # last token (it must be recomputed for logits).
            hit_blocks = evictable = 0
            hit_hashes: list[int] = []
            max_hit = (num_tokens - 1) // bs
            if not r.preemptions and max_hit > r.prefix_blocks:
                # blocks past the shared prefix of a request never scheduled before are
                # unique to it and not cached yet: the chain of hits stops there
                max_hit = max(r.prefix_blocks, r.pinned_blocks)
            chain = 0
            if kv.caching and max_hit > r.pinned_blocks:
                hit_hashes = r.block_hashes(r.pinned_blocks, max_hit)
                # a request never scheduled, asking for blocks [0, max_hit) of its prefix
                chainable = (chains and not r.preemptions and not r.pinned_blocks
                             and max_hit <= r.prefix_blocks)
                if chainable and kv.chains and kv.cover(r.prefix_base) >= max_hit:
                    hit_blocks = chain = max_hit  # all held as chains: in use, longest_hit's
                else:
                    hit_blocks, evictable, in_use = kv.hit(hit_hashes)
                    if chainable and in_use >= hit_blocks:
                        chain = hit_blocks
                del hit_hashes[hit_blocks:]
                if cfg.drop_eagle_block and hit_blocks:
                    # single_type_kv_cache_manager.py find_longest_cache_hit: drop_eagle_block
                    hit_blocks -= 1
                    del hit_hashes[hit_blocks:]
                    hit_hashes = kv.hit_keys(hit_hashes)
                    evictable = sum(map(kv.is_free, hit_hashes))
                else:
                    hit_hashes = kv.hit_keys(hit_hashes)
            if sw:
                hit_blocks, hit_hashes, evictable, sw_hit = self._sw_admission(
                    r, hit_blocks, hit_hashes, evictable)
            computed = (r.pinned_blocks + hit_blocks) * bs
            n = num_tokens - computed
            pad = 0
            if cfg.spec_k and n == 1 and plan.running_scheduled and not plan.running_prefill:
                # pad_spec_decode: a 1-token admission joins a decode-only step as 1 + k
                # tokens, the padding marked as k draft tokens (rolled back on rejection)
                n = 1 + cfg.spec_k
                if n > budget or computed + n > max_len:
                    break
                pad = cfg.spec_k
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            if (cfg.images_whole and r.image_tokens and computed < PICTURE_AT
                    and computed + n < PICTURE_AT + r.image_tokens + r.images - 1):
                # scheduler.py _try_schedule_encoder_inputs, disable_chunked_mm_input: a chunk
                # that would cover part of a picture is rolled back to end before it (the
                # simulator's pictures go together: before the first of them)
                n = PICTURE_AT - computed
            # scheduler_reserve_full_isl (vllm/config/scheduler.py, default True): admit
            # only if the whole sequence fits; then the chunk itself (+ lookahead).
            held = r.pinned_blocks + hit_blocks
            full_need = -(-min(num_tokens, max_len) // bs) - held + evictable
            chunk_need = -(-min(computed + n + self.lookahead, max_len) // bs) - held
            if sw:
                # every sliding group: get_num_blocks_to_allocate with the hit's blocks
                # (null ones included) counted as held; the whole-sequence check capped at
                # max_admission_blocks_per_request (apply_admission_cap)
                local = computed // sbs
                seq_blocks = -(-min(num_tokens, max_len) // sbs)
                sw_full = (seq_blocks if seq_blocks < cap else cap) - local
                sw_chunk = -(-min(computed + n + self.lookahead, max_len) // sbs) - local
                sw_evictable = sw_hit[3]
                full_total = full_need + sw_evictable + (sw * sw_full if sw_full > 0 else 0)
                chunk_total = chunk_need + evictable + sw_evictable + (
                    sw * sw_chunk if sw_chunk > 0 else 0)
                if max(full_total, chunk_total) > kv.num_free:
                    break
            elif max(full_need, chunk_need + evictable) > kv.num_free:
                break
            self._pop()
            if hit_hashes:
                if chain:  # every block in use, under its own hash (hit_keys: the same)
                    kv.hold_chain(r.prefix_base, chain)
                    r.chain = chain
                else:
                    kv.touch(hit_hashes)
                r.hashes = hit_hashes
            if sw:  # every group's hits are touched before any group allocates
                sw_keys = sw_hit[2]
                for keys in sw_keys:
                    if keys:
                        kv.touch(keys)
            if chunk_need > 0:
                kv.allocate(chunk_need)
            r.blocks = hit_blocks + max(chunk_need, 0)
            if sw:
                if sw_chunk > 0:
                    kv.allocate(sw * sw_chunk)
                r.sw_hi = local + (sw_chunk if sw_chunk > 0 else 0)
                r.sw_lo = sw_hit[1]
                r.sw_keys = sw_keys
                r.sw_free_at = (r.sw_lo + 1) * sbs + cfg.sw_window - 1
            r.n_reg = held
            r.computed = computed
            if r.cached_tokens < 0:
                r.cached_tokens = computed
                r.scheduled_s = self.now
                self.prompt_tokens_queried += num_tokens
                self.prompt_tokens_hit += computed
            self._cache_blocks(r, min(computed + n, num_tokens))
            r.status = RUNNING
            running.append(r)
            if r.prefix_blocks and kv.caching:
                self._read_shared(r, 1)
            self._add(plan, r, n)
            if pad:
                plan.spec[-1] = pad
                if plan.padded is None:
                    plan.padded = []
                plan.padded.append(r)
            budget -= n

    def _add(self, plan: StepPlan, r: SimRequest, n: int) -> None:
        """Record r in the plan with its cost features (before counters advance)."""
        spec = n + r.computed - r.num_tokens - r.placeholders if r.spec else 0
        plan.reqs.append(r)
        plan.tokens.append(n)
        plan.spec.append(spec if spec > 0 else 0)
        plan.total_tokens += n
        if r.decoding:
            plan.decode_ctx += r.computed
        else:
            plan.prefill_tokens += n
            plan.prefill_attn += n * (r.computed + n / 2)
            plan.prefill_seqs += 1
            if self.sw:
                plan.prefill_attn_w += window_pairs(n, r.computed, self.cfg.sw_window)
            if r.image_tokens and not r.encoded and r.computed + n > PICTURE_AT:
                # scheduler.py _try_schedule_encoder_inputs: the pictures are encoded with the
                # first chunk that reaches them (they sit near the start of chat prompts,
                # from token PICTURE_AT on)
                plan.encoder_tokens += r.image_tokens
                plan.encoder_images += r.images
                r.encoded = True
        r.spec = 0  # consumed; new drafts arrive with the output (or as placeholders)

    def _unschedule(self, plan: StepPlan, j: int) -> int:
        """Undo the plan's j-th request (priority preemption of a scheduled request)."""
        r = plan.reqs[j]
        n = plan.tokens[j]
        plan.running_scheduled -= 1
        plan.total_tokens -= n
        if r.decoding:
            plan.decode_ctx -= r.computed
        else:
            plan.prefill_tokens -= n
            plan.prefill_attn -= n * (r.computed + n / 2)
            plan.prefill_seqs -= 1
            if self.sw:
                plan.prefill_attn_w -= window_pairs(n, r.computed, self.cfg.sw_window)
        for lst in (plan.reqs, plan.tokens, plan.spec):
            del lst[j]
        return n

    def _update_after_schedule(self, plan: StepPlan) -> None:
        """Scheduler._update_after_schedule (+ AsyncScheduler's placeholders)."""
        k = self.cfg.spec_k
        async_ = self.cfg.async_scheduling
        emit = plan.emits.append
        if self.sw:  # num_in_flight_tokens (scheduler.py _update_after_schedule)
            for r, n in zip(plan.reqs, plan.tokens, strict=True):
                r.inflight += n
        for r, n, spec in zip(plan.reqs, plan.tokens, plan.spec, strict=True):
            computed = r.computed + n
            r.computed = computed
            # is_prefill_chunk: the prompt (or the recompute after preemption) is not done
            if computed < r.prompt + r.out + r.placeholders:
                emit(False)
                continue
            emit(True)
            r.decoding = True
            if async_:
                r.placeholders += 1 + spec
                r.spec = k

    # -- Scheduler.update_from_output ------------------------------------------------------
    def update_from_output(self, plan: StepPlan) -> list[tuple[SimRequest, int, bool]]:
        """Apply a finished step: returns (request, new tokens, finished) for each request
        that received tokens."""
        out: list[tuple[SimRequest, int, bool]] = []
        cohort = self.cohort
        if cohort is not None:
            if cohort.trailing:
                for r in cohort.advance_trailing(plan.idx, self.now):
                    if r.status == RUNNING:
                        self._register_decoded(r)
            cohort.upd_done = plan.idx
            cohort.last_update_s = self.now
        if not plan.reqs:  # cohort members only: the replica streams their tokens
            return out
        if self.sw:  # every scheduled request's tokens settle (scheduler.py update_from_output)
            for r, n in zip(plan.reqs, plan.tokens, strict=True):
                r.inflight -= n
        cfg = self.cfg
        async_ = cfg.async_scheduling
        redraft = cfg.spec_k if not async_ else 0  # sync: drafts come with the output
        bs = cfg.block_size
        log_acceptance, draw, log = self._log_acceptance, self.rng.random, math.log
        padded = plan.padded
        emit = out.append
        finished_any = False
        for r, emits, spec in zip(plan.reqs, plan.emits, plan.spec, strict=True):
            if not emits or r.status == FINISHED:
                continue
            if spec:
                # draft tokens accepted: each in turn with probability alpha, until one is
                # not (the number of leading successes of a geometric draw; inline, as this
                # runs for every drafting request every step)
                log_alpha = log_acceptance[r.wl]
                if log_alpha is None or (padded is not None and r in padded):
                    # rejection_sampler.py: "-1 is used for padded draft token ids that
                    # should be rejected" (pad_spec_decode's [-1] * k)
                    accepted = 0
                else:
                    u = draw()
                    accepted = spec if u <= 0 else int(log(u) / log_alpha)
                    if accepted > spec:
                        accepted = spec
                if accepted < spec:
                    rejected = spec - accepted
                    if r.computed > 0:
                        r.computed -= rejected
                    if r.placeholders > 0:
                        r.placeholders -= rejected
                new = 1 + accepted
            else:
                new = 1
            # check_stop (vllm/v1/core/sched/utils.py): max_tokens, then max_model_len
            # (stop_out: the fewer of the two, as output tokens)
            o = r.out
            left = r.stop_out - o
            if new >= left:
                if left <= 0:
                    continue
                new = left
            o += new
            r.out = o
            if async_:
                ph = r.placeholders - new
                if ph < 0:
                    ph = 0
                r.placeholders = ph
                # AsyncScheduler._update_request_with_output caches the blocks the new tokens
                # filled, also on the update that finishes the request (before it is freed);
                # the synchronous Scheduler caches only when it allocates
                if (r.computed - ph) // bs > r.n_reg and r.status == RUNNING:
                    self._cache_blocks(r, r.computed - ph)
            if new == left:
                r.status = FINISHED
                finished_any = True
                if r.prefix_blocks and self.kv.caching:
                    self._read_shared(r, -1)
                if r.blocks or r.hashes:
                    self._free(r)
                emit((r, new, True))
                continue
            if redraft:
                r.spec = redraft  # the drafter proposes k tokens after each sampled step
            emit((r, new, False))
        if finished_any:
            self.running = [q for q in self.running if q.status != FINISHED]
        return out
