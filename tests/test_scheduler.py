"""EngineCore against vLLM 0.26.0's V1 scheduler, one test per rule.

Each test drives `EngineCore.schedule()` / `update_from_output()` on hand-built requests.
Without async scheduling one "step" is schedule, run, update; the async tests run a Replica
in simpy, as vllm/v1/engine/core.py step_with_batch_queue does.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Generator
from typing import Any

import pytest
import simpy

from capplan.mix import TrafficMix
from capplan.profile import Profile
from capplan.sim.core import CoreConfig, EngineCore
from capplan.sim.metrics import WorkloadRecorder
from capplan.sim.replica import Replica, Window, idle_wake_s
from capplan.sim.request import PREEMPTED, SimRequest, StepPlan
from capplan.sim.run import simulate
from capplan.steptime import StepTimer
from helpers import constant_profile

BS = 16
W = idle_wake_s(16)  # the idle core's wake for these tests' 16-token prompts


def engine(num_blocks: int = 256, *, acceptance: float = 0.0, **cfg: Any) -> EngineCore:
    cfg.setdefault("async_scheduling", False)
    cfg.setdefault("block_size", BS)
    return EngineCore(CoreConfig(num_blocks=num_blocks, **cfg), random.Random(0), [acceptance])


def req(rid: int, prompt: int, max_tokens: int = 1, **kw: Any) -> SimRequest:
    kw.setdefault("arrival_s", float(rid))
    return SimRequest(rid, 0, kw.pop("arrival_s"), prompt, max_tokens, **kw)


def sched(plan: StepPlan) -> dict[int, int]:
    """rid -> tokens scheduled, in plan order."""
    return {r.rid: n for r, n in zip(plan.reqs, plan.tokens, strict=True)}


def step(core: EngineCore) -> tuple[StepPlan, dict[int, tuple[int, bool]]]:
    """One synchronous engine step: schedule, execute, update. Returns rid -> (new, done)."""
    plan = core.schedule()
    out = core.update_from_output(plan)
    return plan, {r.rid: (n, d) for r, n, d in out}


def shared(rid: int, prompt: int, blocks: int, **kw: Any) -> SimRequest:
    """A request whose first `blocks` blocks are a prefix shared by every `shared` request."""
    return req(rid, prompt, prefix_base=-1, prefix_blocks=blocks, **kw)


# --- ordering, budget, caps ------------------------------------------------------------------


def test_running_requests_are_scheduled_before_waiting_ones() -> None:
    """scheduler.py schedule: RUNNING requests take the token budget first, in order; WAITING
    ones get what is left."""
    core = engine(max_num_scheduled_tokens=64)
    a = req(0, 40, 10)
    core.add_request(a)
    step(core)
    core.add_request(req(1, 100, 10))
    plan, _ = step(core)
    assert list(sched(plan).items()) == [(0, 1), (1, 63)]


def test_token_budget_caps_every_step() -> None:
    """scheduler.py: token_budget = max_num_scheduled_tokens; each request gets
    min(remaining, budget) and the step total never exceeds it."""
    core = engine(max_num_scheduled_tokens=120)
    for i in range(3):
        core.add_request(req(i, 50, 5))
    plan, _ = step(core)
    assert sched(plan) == {0: 50, 1: 50, 2: 20}
    assert plan.total_tokens == 120
    plan, _ = step(core)
    assert sched(plan) == {0: 1, 1: 1, 2: 30}  # the chunked prompt continues after decodes


def test_max_num_seqs_caps_running_requests() -> None:
    """scheduler.py: no WAITING request is admitted once len(running) == max_num_seqs."""
    core = engine(max_num_seqs=2)
    for i in range(3):
        core.add_request(req(i, 16, 3))
    plan, _ = step(core)
    assert set(sched(plan)) == {0, 1}
    assert core.num_waiting == 1
    for _ in range(2):
        plan, _ = step(core)
        assert set(sched(plan)) == {0, 1}
        assert len(core.running) <= 2
    plan, _ = step(core)  # 0 and 1 finished with their third token
    assert set(sched(plan)) == {2}


def test_long_prompt_is_chunked_across_steps() -> None:
    """Chunked prefill (always on in V1): a prompt longer than the budget is computed in
    budget-sized chunks; only the chunk that completes it samples a token
    (scheduler.py _update_after_schedule: is_prefill_chunk)."""
    core = engine(max_num_scheduled_tokens=100)
    a = req(0, 250, 2)
    core.add_request(a)
    chunks, emitted = [], []
    for _ in range(3):
        plan, out = step(core)
        chunks.append(sched(plan)[0])
        emitted.append(out.get(0, (0, False))[0])
    assert chunks == [100, 100, 50]
    assert emitted == [0, 0, 1]
    assert a.computed == 250 and a.out == 1


def test_last_admitted_prompt_takes_the_leftover_budget() -> None:
    """Chunked prefill: the last waiting request admitted gets a partial chunk of whatever
    budget is left, and continues as a RUNNING request next step."""
    core = engine(max_num_scheduled_tokens=100)
    core.add_request(req(0, 80, 4))
    core.add_request(req(1, 80, 4))
    plan, _ = step(core)
    assert sched(plan) == {0: 80, 1: 20}
    plan, _ = step(core)
    assert sched(plan) == {0: 1, 1: 60}


# --- KV admission, prefix caching, eviction --------------------------------------------------


def test_admission_requires_the_full_sequence_to_fit() -> None:
    """kv_cache_manager.py allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl,
    default True in vllm/config/scheduler.py): a waiting request is admitted only if its
    whole prompt fits in free blocks, not just its first chunk."""
    core = engine(num_blocks=10, max_num_scheduled_tokens=128)
    a = req(0, 90, 50)  # 6 blocks
    b = req(1, 100, 1)  # 7 blocks; its 38-token first chunk would need only 3
    core.add_request(a)
    core.add_request(b)
    plan, _ = step(core)
    assert sched(plan) == {0: 90}
    assert core.kv.num_free == 4
    assert core.num_waiting == 1


def test_full_sequence_gate_admits_once_blocks_free_up() -> None:
    """The admission gate is a wait, not a rejection: b runs as soon as a's blocks return."""
    core = engine(num_blocks=10, max_num_scheduled_tokens=128)
    core.add_request(req(0, 90, 2))
    core.add_request(req(1, 100, 1))
    step(core)
    _, out = step(core)
    assert out[0] == (1, True)
    plan, _ = step(core)
    assert sched(plan) == {1: 100}


def test_prefix_hit_never_covers_the_last_prompt_token() -> None:
    """kv_cache_manager.py get_computed_blocks: max_cache_hit_length = num_tokens - 1, so a
    prompt that is entirely cached recomputes its whole last block (hits are whole blocks)."""
    core = engine()
    core.add_request(shared(0, 64, 4))
    step(core)
    b = shared(1, 64, 4)
    core.add_request(b)
    plan, _ = step(core)
    assert sched(plan) == {1: 16}
    assert b.cached_tokens == 48
    c = shared(2, 65, 4)  # one token past the shared blocks: all four may hit
    core.add_request(c)
    plan, _ = step(core)
    assert sched(plan) == {2: 1}
    assert c.cached_tokens == 64


def test_only_full_blocks_are_cached() -> None:
    """kv_cache_manager.py allocate_slots / cache_blocks: only blocks whose tokens are all
    computed (num_tokens // block_size) get a hash; a half-computed block cannot be hit."""
    core = engine(max_num_scheduled_tokens=24)
    core.add_request(shared(0, 40, 2, max_tokens=2))
    step(core)  # 24 tokens computed: block 0 full, block 1 half
    assert core.kv.longest_hit([-1, -2]) == (1, 0)
    step(core)
    assert core.kv.longest_hit([-1, -2]) == (2, 0)


def test_hit_rate_counts_only_cached_blocks_of_the_shared_prefix() -> None:
    """Prefix hits stop where the shared prefix stops: unique blocks never hit another
    request (chained hashes differ from the first differing block on)."""
    core = engine()
    core.add_request(shared(0, 100, 3))
    step(core)
    b = shared(1, 100, 3)
    core.add_request(b)
    step(core)
    assert b.cached_tokens == 48


def test_freed_prefix_evicts_tail_first() -> None:
    """kv_cache_manager.py free: blocks are freed in reverse order, so eviction takes a freed
    prompt's tail before its head and a later request still hits the head."""
    core = engine(num_blocks=5)
    core.add_request(shared(0, 48, 3))  # caches shared blocks 0, 1, 2, then frees them
    step(core)
    core.add_request(req(1, 48, 1))  # 3 blocks: 2 unhashed + evicts one cached block
    step(core)
    b = shared(2, 64, 3)
    core.add_request(b)
    step(core)
    assert b.cached_tokens == 32  # blocks 0 and 1 survived; block 2 (tail) was evicted


def test_head_of_line_blocking_when_kv_is_short() -> None:
    """scheduler.py: when the head of the waiting queue cannot get its blocks the loop
    breaks; a smaller request behind it is not admitted (FCFS is strict)."""
    core = engine(num_blocks=10)
    core.add_request(req(0, 96, 100))  # 6 blocks, 7 once it decodes
    step(core)
    core.add_request(req(1, 80, 1))  # needs 5 blocks, 3 free after a's next block
    core.add_request(req(2, 16, 1))  # needs 1 block: would fit
    plan, _ = step(core)
    assert sched(plan) == {0: 1}
    assert core.num_waiting == 2


# --- preemption --------------------------------------------------------------------------------


def _two_decoders(
    policy: str, prio: tuple[int, int] = (0, 0)
) -> tuple[EngineCore, list[SimRequest]]:
    """Two one-block prompts in a 4-block pool: they run out of KV at 32 tokens each (each
    alone fits: max_model_len is the KV capacity, as vLLM requires)."""
    core = engine(num_blocks=4, policy=policy, max_model_len=64)
    a = req(0, 16, 20, priority=prio[0])
    b = req(1, 16, 40, priority=prio[1])
    core.add_request(a)
    step(core)
    core.add_request(b)
    return core, [a, b]


def test_fcfs_preempts_the_newest_running_request() -> None:
    """scheduler.py schedule: when allocate_slots fails, FCFS preempts self.running.pop()
    (the last admitted); _preempt_request frees its blocks, resets num_computed_tokens and
    prepends it to the waiting queue. No waiting request is admitted in that step."""
    core, (a, b) = _two_decoders("fcfs")
    for _ in range(40):
        plan, _ = step(core)
        if plan.preempted:
            break
    assert plan.preempted == 1
    assert b.status == PREEMPTED and b.computed == 0 and b.blocks == 0
    assert b.preemptions == 1 and core.preemptions == 1
    assert a.status != PREEMPTED
    assert set(sched(plan)) == {0}  # nothing admitted from the waiting queue this step


def test_preempted_request_goes_to_the_front_of_the_waiting_queue() -> None:
    """FCFSRequestQueue.prepend_request (request_queue.py): the victim is resumed before
    requests that were already waiting when it was preempted."""
    core, (a, _b) = _two_decoders("fcfs")
    step(core)  # admits b
    step(core)  # b takes the last free block
    assert core.kv.num_free == 0
    c = req(2, 16, 1)
    core.add_request(c)  # waits: no free block
    preempted = False
    for _ in range(40):
        plan, _ = step(core)
        preempted |= plan.preempted > 0
        if preempted and set(sched(plan)) - {0}:
            break
    assert preempted and a.out == a.max_tokens
    assert list(sched(plan)) == [1, 2]  # b re-admitted first, then c


def test_priority_preempts_the_lowest_priority_request() -> None:
    """scheduler.py schedule (PRIORITY): the victim is max(running, key=(priority,
    arrival_time)), here the older low-priority request, not the newest one; when the
    victim is the request being scheduled, the running loop stops."""
    core, (a, b) = _two_decoders("priority", prio=(1, 0))
    for _ in range(40):
        plan, _ = step(core)
        if plan.preempted:
            break
    assert plan.preempted == 1
    assert a.status == PREEMPTED and b.status != PREEMPTED



def test_priority_victim_requeues_by_priority() -> None:
    """request_queue.py PriorityRequestQueue.prepend_request == add_request: a preempted
    request has no front to go to; it waits in (priority, arrival) order, behind a later
    higher-priority request and ahead of a later request of its own priority."""
    core, (a, _b) = _two_decoders("priority", prio=(1, 0))
    for _ in range(40):
        plan, _ = step(core)
        if plan.preempted:
            break
    assert a.status == PREEMPTED
    core.add_request(req(2, 16, 1, priority=0, arrival_s=5.0))
    core.add_request(req(3, 16, 1, priority=1, arrival_s=6.0))
    first_seen: list[int] = []
    for _ in range(80):
        plan, _ = step(core)
        first_seen += [rid for rid in sched(plan) if rid != 1 and rid not in first_seen]
    assert first_seen == [2, 0, 3]

def test_priority_victim_already_scheduled_gives_its_budget_back() -> None:
    """scheduler.py schedule (PRIORITY): a victim already scheduled this step is taken out of
    the step (its tokens return to the budget) before it is preempted."""
    core = engine(num_blocks=4, policy="priority", max_model_len=64)
    low = req(0, 8, 50, priority=1)
    high = req(1, 16, 40, priority=0)
    core.add_request(low)
    step(core)
    core.add_request(high)
    for _ in range(40):
        plan, _ = step(core)
        if plan.preempted:
            break
    assert low.status == PREEMPTED and low.computed == 0
    assert sched(plan) == {1: 1}
    assert plan.total_tokens == 1


def test_fcfs_would_preempt_the_newest_in_the_same_setup() -> None:
    """Control for the priority test: same arrivals under FCFS preempt the newest (b)."""
    core, (a, b) = _two_decoders("fcfs", prio=(1, 0))
    for _ in range(40):
        plan, _ = step(core)
        if plan.preempted:
            break
    assert b.status == PREEMPTED and a.status != PREEMPTED


def test_priority_queue_orders_waiting_by_priority_then_arrival() -> None:
    """request_queue.py PriorityRequestQueue: a heap on Request.__lt__ = (priority,
    arrival_time, request_id); lower priority values run first."""
    core = engine(max_num_seqs=1, policy="priority")
    spec = [(0, 2, 5.0), (1, 0, 9.0), (2, 0, 3.0), (3, 1, 0.0), (4, 0, 3.0)]
    for rid, prio, t in spec:
        core.add_request(req(rid, 16, 1, priority=prio, arrival_s=t))
    order = []
    for _ in spec:
        plan, _ = step(core)
        order += list(sched(plan))
    assert order == [2, 4, 1, 3, 0]


def test_fcfs_queue_ignores_priority() -> None:
    """request_queue.py FCFSRequestQueue: a deque in arrival order; priority is ignored."""
    core = engine(max_num_seqs=1)
    for rid, prio in enumerate([2, 0, 1]):
        core.add_request(req(rid, 16, 1, priority=prio))
    order = []
    for _ in range(3):
        plan, _ = step(core)
        order += list(sched(plan))
    assert order == [0, 1, 2]


# --- speculative decoding ---------------------------------------------------------------------


def test_spec_decode_step_schedules_one_plus_k_tokens() -> None:
    """scheduler.py: num_new_tokens = num_tokens_with_spec - num_computed_tokens, so a decode
    step with k drafts schedules 1 + k tokens, and they count against the token budget."""
    k = 3
    core = engine(spec_k=k, max_num_scheduled_tokens=6)
    a = req(0, 6, 10)
    core.add_request(a)
    step(core)
    core.add_request(req(1, 10, 10))
    plan, _ = step(core)
    assert sched(plan) == {0: 1 + k, 1: 2}
    assert plan.spec == [k, 0]
    assert plan.total_tokens == 6



def test_async_spec_decode_schedules_one_plus_k_against_placeholders() -> None:
    """async_scheduler.py _update_after_schedule: a decode step leaves 1 + k output
    placeholders and k placeholder drafts, so the step scheduled while it runs already asks
    for 1 + k tokens, k of them drafts."""
    k = 2
    core = engine(spec_k=k, async_scheduling=True)
    core.add_request(req(0, 16, 10))
    p1 = core.schedule()
    p2 = core.schedule()
    assert sched(p1) == {0: 16} and sched(p2) == {0: 1 + k}
    assert p2.spec == [k]

def test_spec_decode_drafts_are_cut_by_the_budget() -> None:
    """scheduler.py: when the budget is below 1 + k, only the drafts that fit are scheduled
    (spec_token_ids[:num_scheduled_spec_tokens])."""
    core = engine(spec_k=4, max_num_scheduled_tokens=3)
    core.add_request(req(0, 3, 10))
    step(core)
    plan, _ = step(core)
    assert sched(plan) == {0: 3}
    assert plan.spec == [2]


def test_spec_decode_reserves_kv_lookahead() -> None:
    """scheduler.py: draft_model/EAGLE/MTP set num_lookahead_tokens = k, and allocate_slots
    reserves blocks for computed + new + lookahead tokens; ngram reserves none."""
    with_la = engine(spec_k=4)
    with_la.add_request(req(0, 16, 10))
    with_la.schedule()
    assert with_la.kv.num_used == 2  # ceil((16 + 4) / 16)
    no_la = engine(spec_k=4, spec_lookahead=False)
    no_la.add_request(req(0, 16, 10))
    no_la.schedule()
    assert no_la.kv.num_used == 1


def test_rejected_drafts_roll_back_and_accepted_ones_burst() -> None:
    """scheduler.py update_from_output: num_computed_tokens -= rejected drafts; a step emits
    1 + accepted tokens at once (tokens arrive in bursts after verification)."""
    k = 3
    none = engine(spec_k=k, acceptance=0.0)
    a = req(0, 16, 50)
    none.add_request(a)
    step(none)
    _, out = step(none)
    assert out[0] == (1, False)
    assert a.computed == 17  # 16 + (1 + 3) scheduled - 3 rejected
    every = engine(spec_k=k, acceptance=0.999999)
    b = req(0, 16, 50)
    every.add_request(b)
    step(every)
    _, out = step(every)
    assert out[0] == (1 + k, False)
    assert b.computed == 16 + 1 + k


def test_spec_decode_stops_exactly_at_max_tokens() -> None:
    """check_stop (vllm/v1/core/sched/utils.py): accepted tokens past max_tokens are dropped;
    the request finishes with exactly max_tokens outputs."""
    core = engine(spec_k=4, acceptance=0.999999)
    a = req(0, 16, 7)
    core.add_request(a)
    total = 0
    for _ in range(10):
        _, out = step(core)
        total += out.get(0, (0, False))[0]
        if out.get(0, (0, False))[1]:
            break
    assert total == a.out == 7


# --- async scheduling --------------------------------------------------------------------------


def run_replica(
    arrivals: list[tuple[float, SimRequest]], *, async_scheduling: bool, step_s: float = 1.0,
    profile: Profile | None = None,
) -> list[SimRequest]:
    """Run one replica over timed arrivals; return requests in finishing order."""
    env = simpy.Environment()
    core = engine(async_scheduling=async_scheduling)
    timer = StepTimer(profile or constant_profile(step_s), max_num_seqs=1024,
                      max_num_batched_tokens=8192)
    done: list[SimRequest] = []
    rep = Replica(env, 0, core, timer, Window(0.0, 1e9, [WorkloadRecorder()]),
                  lambda r, _rep, _seen: done.append(r))

    def feed() -> Generator[simpy.Event, Any, None]:
        for t, r in arrivals:
            yield env.timeout(t - env.now)
            rep.add_request(r)

    env.process(feed())
    env.run(until=1000)
    return done


def test_async_first_token_at_end_of_admitting_step() -> None:
    """engine/core.py step_with_batch_queue: a request admitted in step n's schedule streams
    its first token when step n ends, and one token per step after (no extra step). The idle
    core schedules W (idle_wake_s: the input thread's time on the request, then the core's
    wake) after the request reaches it."""
    a = req(0, 16, 5, arrival_s=0.0)
    (done,) = run_replica([(0.0, a)], async_scheduling=True)
    assert done is a
    assert a.first_token_s == pytest.approx(1.0 + W)
    assert a.last_token_s == pytest.approx(5.0 + W)


def test_async_arrival_during_a_step_joins_two_steps_later() -> None:
    """engine/core.py step_with_batch_queue: with two steps in flight, step n+1 is already
    scheduled while n runs, so a request arriving during step n joins step n+2."""
    a = req(0, 16, 20, arrival_s=0.0)
    b = req(1, 16, 3, arrival_s=2.5)  # arrives while step 3 ([2, 3] + W) runs
    run_replica([(0.0, a), (2.5, b)], async_scheduling=True)
    assert b.first_token_s == pytest.approx(5.0 + W)  # joins step 5 ([4, 5] + W)


def test_sync_arrival_during_a_step_joins_the_next_one() -> None:
    """engine/core.py EngineCore.step (async off): schedule, run, update one step at a time,
    so a request arriving during step n joins step n+1."""
    a = req(0, 16, 20, arrival_s=0.0)
    b = req(1, 16, 3, arrival_s=2.5)
    run_replica([(0.0, a), (2.5, b)], async_scheduling=False)
    assert b.first_token_s == pytest.approx(4.0 + W)


def test_idle_core_takes_what_arrives_before_it_wakes() -> None:
    """engine/core.py run_busy_loop: the idle core drains its input queue W after the first
    request reaches it; a request that arrives later waits for the next schedule (with
    async scheduling, when step 1 ends: step 2 went with step 1, so it joins step 3)."""
    a, b, c = (req(i, 16, 3, arrival_s=t) for i, t in enumerate((0.0, W / 2, 1.5 * W)))
    run_replica([(r.arrival_s, r) for r in (a, b, c)], async_scheduling=True)
    assert a.first_token_s == b.first_token_s == pytest.approx(1.0 + W)
    assert c.first_token_s == pytest.approx(3.0 + W)


def test_graph_less_step_holds_the_core_while_it_launches() -> None:
    """engine/core.py step_with_batch_queue: the core launches a step before it schedules
    the next or hands out the outputs of the one before; a step past the largest CUDA graph
    keeps it eager_floor_s (steptime.py StepTimer.step_times: launch), while the GPU starts
    on the kernels as they come. Steps of 1 s work, a 1,025-token step launching for 3 s:
    b's prefill (step 5, scheduled when step 3 ends at 3 + W) keeps the core until 6 + W, so
    step 4's token and step 5's come out together then, and the run is one second shorter
    than with the eager step's 3 s in a row (a's last token at 22 + W)."""
    base = constant_profile(1.0)
    eager = base.model_copy(update={"step": base.step.model_copy(update={"eager_floor_s": 3.0})})
    a = req(0, 16, 20, arrival_s=0.0)
    b = req(1, 1024, 3, arrival_s=2.5)
    run_replica([(0.0, a), (2.5, b)], async_scheduling=True, profile=eager)
    assert b.first_token_s == pytest.approx(6.0 + W)
    assert a.last_token_s == pytest.approx(21.0 + W)


def test_async_does_not_schedule_past_max_tokens() -> None:
    """async_scheduler.py / scheduler.py: a running request whose in-flight steps already
    reach max_tokens is skipped, so no wasted step follows the last token."""
    core = engine(async_scheduling=True)
    a = req(0, 16, 2)
    core.add_request(a)
    p1 = core.schedule()  # prefill -> token 1
    p2 = core.schedule()  # decode -> token 2, scheduled while p1 runs (placeholder)
    core.update_from_output(p1)
    p3 = core.schedule()  # scheduled while p2 runs: token 2 is already on its way
    assert sched(p1) == {0: 16} and sched(p2) == {0: 1}
    assert not p3.reqs
    core.update_from_output(p2)
    assert a.out == 2 and core.kv.num_used == 0



def _priority_self_preemption(
    async_scheduling: bool, calls: list[tuple[float, int, bool]] | None = None
) -> list[SimRequest]:
    """Low-priority a is admitted first, then b; a is the first to need a new block and is
    itself the priority victim, so that step schedules nothing (scheduler.py breaks out of
    the running loop and admits no waiting request after a preemption). `calls`, if given,
    gets (time, steps in flight, only preempted) for each schedule."""
    env = simpy.Environment()
    core = engine(num_blocks=4, policy="priority", async_scheduling=async_scheduling,
                  max_model_len=64)
    timer = StepTimer(constant_profile(1.0), max_num_seqs=1024, max_num_batched_tokens=8192)
    done: list[SimRequest] = []
    rep = Replica(env, 0, core, timer, Window(0.0, 1e9, [WorkloadRecorder()]),
                  lambda r, _rep, _seen: done.append(r))
    if calls is not None:
        schedule = core.schedule

        def traced() -> StepPlan:
            n = len(rep._inflight)
            plan = schedule()
            calls.append((env.now, n, plan.empty and bool(plan.preempted)))
            return plan

        core.schedule = traced  # type: ignore[method-assign]
    a = req(0, 16, 20, priority=1)
    b = req(1, 16, 40, priority=0)

    def feed() -> Generator[simpy.Event, Any, None]:
        rep.add_request(a)
        yield env.timeout(1.5)
        rep.add_request(b)

    env.process(feed())
    env.run(until=1000)
    return done


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_step_emptied_by_preemption_does_not_idle_the_engine(async_scheduling: bool) -> None:
    """vllm/v1/engine/core.py run_busy_loop: the engine keeps stepping while the scheduler
    has requests, so a step that only preempted is not idleness: both requests finish
    without any further arrival."""
    done = _priority_self_preemption(async_scheduling)
    assert sorted(r.rid for r in done) == [0, 1]


def test_step_that_only_preempted_waits_for_the_step_in_flight() -> None:
    """vllm/v1/engine/core.py step_with_batch_queue: an empty step (here one that only
    preempted) still joins the batch queue, so with async scheduling and a step in flight
    the queue is full and the core waits for that step's output before it schedules again,
    where the busy loop without a step in flight schedules again at once."""
    calls: list[tuple[float, int, bool]] = []
    done = _priority_self_preemption(True, calls)
    after = [(c, calls[i + 1]) for i, c in enumerate(calls[:-1]) if c[2]]
    assert after and all(c[1] == 1 for c, _ in after)  # each with a step in flight
    assert all(nxt[1] == 0 and nxt[0] > c[0] for c, nxt in after)
    assert sorted(r.rid for r in done) == [0, 1]


# --- spec-decode prefix hits and padding --------------------------------------------------------


def _prefix_mix(method: str | None) -> TrafficMix:
    eng: dict[str, Any] = {"max_model_len": 4096}
    if method:
        eng["speculative"] = {"method": method, "num_speculative_tokens": 2}
    return TrafficMix.model_validate({
        "schema_version": 1,
        "pools": [{"name": "p", "model": "llama-3.1-8b", "engine": eng}],
        "workloads": [{
            "name": "w", "pool": "p", "arrival": {"kind": "closed", "concurrency": 1},
            "input_tokens": {"kind": "constant", "value": 64},
            "output_tokens": {"kind": "constant", "value": 4},
            "prefix": {"shared_tokens": 48},
        }],
        "simulation": {"duration_s": 1.0, "drain_s": 5.0},
    })


def test_draft_model_prefix_hit_keeps_every_full_block() -> None:
    """A draft_model drafter does not use the target's hidden states: its prefix hits are the
    plain full-block hits (3 shared blocks of a 64-token prompt)."""
    res = simulate(_prefix_mix("draft_model"), "p", 1, seed=1)
    assert res.requests()["cached_tokens"].unique().to_list() == [48.0]


def test_mtp_prefix_hit_drops_the_last_matched_block() -> None:
    """single_type_kv_cache_manager.py FullAttentionManager.find_longest_cache_hit
    (drop_eagle_block): EAGLE/MTP drafters need the hidden states before the generation
    point, so vLLM recomputes the last cached block: 3 shared blocks hit as 2 (32 tokens)."""
    res = simulate(_prefix_mix("mtp"), "p", 1, seed=1)
    assert res.requests()["cached_tokens"].unique().to_list() == [32.0]


def _cached_pair(k: int, acceptance: float = 0.0) -> tuple[EngineCore, SimRequest]:
    """A decoding request and a cached 2-block prefix: a 33-token prompt on that prefix has
    exactly one token left to compute when admitted."""
    core = engine(spec_k=k, acceptance=acceptance)
    core.add_request(shared(0, 32, 2))
    step(core)
    core.add_request(req(1, 16, 50))
    step(core)
    return core, shared(3, 33, 2, max_tokens=10)


def test_one_token_admission_is_padded_to_the_spec_size() -> None:
    """scheduler.py schedule (waiting loop): with spec decoding, a waiting request with one
    token left is padded to 1 + k when only decodes were scheduled, so the step keeps a
    uniform decode shape (full CUDA graph)."""
    k = 2
    core, w = _cached_pair(k)
    core.add_request(w)
    plan, _ = step(core)
    assert sched(plan) == {1: 1 + k, 3: 1 + k}


def test_padded_admission_rolls_its_padding_back() -> None:
    """scheduler.py schedule (pad_spec_decode) / update_from_output: the padding is k draft
    tokens ([-1] * k), always rejected, so num_computed_tokens rolls back by k and the
    request is an ordinary decoder after the step."""
    k = 2
    core, w = _cached_pair(k)
    core.add_request(w)
    plan, _ = step(core)
    assert plan.spec[plan.reqs.index(w)] == k
    assert w.computed == w.num_tokens - 1


def test_padding_is_never_accepted() -> None:
    """rejection_sampler.py (rejection_greedy_sample_kernel, rejection_random_sample_kernel):
    "-1 is used for padded draft token ids that should be rejected", whatever the workload's
    acceptance, so the padded request gains exactly one token from its step, while the
    decoder beside it, whose drafts are real, keeps its accepted ones."""
    k = 2
    core, w = _cached_pair(k, acceptance=0.999)
    core.add_request(w)
    plan, out = step(core)
    assert sched(plan) == {1: 1 + k, 3: 1 + k}
    assert out[3] == (1, False)
    assert w.computed == w.num_tokens - 1
    assert out[1][0] == 1 + k  # the real drafts, accepted (p = 0.999 each)


def test_padding_ignores_prefills_admitted_from_waiting() -> None:
    """scheduler.py schedule: prefill_scheduled is set in the RUNNING loop only, so a prefill
    admitted from the waiting queue earlier in the same step does not stop the one-token
    admission after it from being padded to 1 + k."""
    k = 2
    core, w = _cached_pair(k)
    core.add_request(req(2, 20, 5))
    core.add_request(w)
    plan, _ = step(core)
    assert sched(plan) == {1: 1 + k, 2: 20, 3: 1 + k}


def test_priority_victim_skipped_earlier_shifts_the_running_walk() -> None:
    """scheduler.py schedule (PRIORITY): req_index steps back only when the victim was
    already scheduled this step. Here low-priority `low` sits first in the running list,
    skipped (async: its in-flight step yields its last token); `h1` needs a block and `low`
    is the victim, so the list shifts under the index and the walk jumps over `h2`."""
    core = engine(num_blocks=4, block_size=4, policy="priority", async_scheduling=True,
                  max_model_len=16)
    low = req(0, 4, 2, priority=1)
    h1 = req(1, 4, 8, priority=0)
    h2 = req(2, 4, 8, priority=0)
    core.add_request(low)
    p1 = core.schedule()
    core.add_request(h1)
    core.add_request(h2)
    core.schedule()  # low decodes its last token; h1, h2 admitted; KV now full
    core.update_from_output(p1)
    p3 = core.schedule()
    assert p3.preempted == 1 and low.status == PREEMPTED
    assert sched(p3) == {1: 1}


def test_duplicate_prefix_block_stays_cached_in_lru_order() -> None:
    """Two requests compute shared block 1 concurrently (long_prefill_token_threshold 20
    keeps both in prefill), so it is cached twice. After both finish, a 4-block request
    evicts from the LRU front: vLLM loses one copy of block 1 but keeps the other, and a
    later request of the same prefix still hits both shared blocks."""
    core = engine(num_blocks=6, long_prefill_token_threshold=20)
    core.add_request(shared(0, 48, 2))
    core.add_request(shared(1, 48, 2))
    for _ in range(3):
        step(core)
    u = req(2, 64, 1)
    core.add_request(u)
    while u.out == 0:
        step(core)
    z = shared(3, 48, 2)
    core.add_request(z)
    step(core)
    assert z.cached_tokens == 32


def test_async_final_update_caches_the_last_full_block() -> None:
    """Async: a 4-token prompt with 5 outputs computes 8 tokens; the final update fills
    block 1 and caches it before the request's blocks are freed, so both blocks stay
    hittable (and evictable in LRU order)."""
    core = engine(block_size=4, async_scheduling=True)
    a = req(0, 4, 5)
    core.add_request(a)
    inflight = deque([core.schedule()])
    while inflight:
        if len(inflight) < 2 and core.has_work:
            plan = core.schedule()
            if not plan.empty:
                inflight.append(plan)
        core.update_from_output(inflight.popleft())
    assert a.out == 5
    assert core.kv.longest_hit([a.block_hash(0), a.block_hash(1)]) == (2, 2)


def test_sync_update_does_not_cache_blocks() -> None:
    """Sync + spec decoding: accepted drafts fill block 0, but it is cached only when the
    next step's allocation runs; a preemption before that frees it unhashed."""
    core = engine(block_size=4, spec_k=4, acceptance=0.999999)
    a = req(0, 2, 20)
    core.add_request(a)
    step(core)  # prefill: 1 token, then 4 drafts proposed
    _, out = step(core)  # 1 + 4 tokens scheduled, all accepted
    assert out[0] == (5, False) and a.computed == 7
    assert core.kv.longest_hit([a.block_hash(0)]) == (0, 0)


def test_a_chunk_that_would_split_a_picture_ends_before_it() -> None:
    """scheduler.py _try_schedule_encoder_inputs under disable_chunked_mm_input (forced for
    Gemma 4): a new request whose picture the step's budget cannot cover whole is scheduled
    up to the picture (its first token) and encoded in the next step, which starts at the
    picture; without the rule (or with room) the picture goes with the first chunk."""
    def run(images_whole: bool, budget: int) -> list[tuple[int, int]]:
        core = engine(max_num_scheduled_tokens=budget, images_whole=images_whole)
        core.add_request(req(0, 600, 2, image_tokens=280, images=1))
        out = []
        for _ in range(2):
            plan, _ = step(core)
            out.append((sched(plan)[0], plan.encoder_tokens))
        return out

    assert run(True, 250) == [(1, 0), (250, 280)]
    assert run(False, 250) == [(250, 280), (250, 0)]
    assert run(True, 512) == [(512, 280), (88, 0)]
