"""The decode cohort: thinking in steps, not tokens.

Most running requests in a busy engine are in steady decode: every step schedules one token
for each, and nothing about them changes but their counters. The cohort holds such requests
*lazily*: it advances them all by one token per step through step counters instead of
touching each one, and turns a request back into an explicit one (`leave`) only when it
nears its last token, or when the scheduler must walk the whole running list in order (a
full token budget, a KV shortage, preemption).

New KV blocks need no visit either. A member asks for a block each time its computed tokens
(plus speculative lookahead) fill the last block it holds: every `block_size` steps, at a
fixed phase of the step index. The cohort counts members per phase, so the blocks all its
members take in a step are one lookup; a member's own block count catches up when it is
materialized, and the blocks it filled are cached then (they are unique to it, so no other
request could have hit them earlier).

This is an evaluation strategy, not a model: the engine takes the cohort's shortcut only in
steps where vLLM's ordered walk over the running list would give every request what it asks
for (budget and free blocks suffice for all), so the walk's order cannot matter, and the
results equal the request-by-request path (tests/test_cohort.py holds them equal). One
exception: through one client's event loop (sim/client.py), the client reads a step's
cohort tokens after its explicit ones, where the walk reads them in scheduling order; a
read can move by a send, and the ITL percentiles by a few histogram bins (every request's
row stays the same).

A hybrid model's member (sliding-window groups, sim/core.py) also takes a block in every
sliding group each `sw_block_size` steps and frees one that left its window each
`sw_block_size` steps, each at a phase of its own (with async scheduling and a window that
is a multiple of the block, the same phase: the pool's count does not move). Both are
counted per phase like the full-attention blocks. A member joins only when that pattern
holds until it leaves: its window's tail is settled (no chunk in flight), the blocks it
will free are its own content (no shared prefix in its window, never preempted with
caching on: those carry hashes and are freed in order, by the explicit path), and it frees
blocks at all; otherwise it leaves at the step where the pattern would change.

A member's counters hold its values as of two step indices: `s0`, the first schedule and
`u0`, the first output update it has not yet been advanced by. After `sc` implicit
schedules and `uc` implicit updates, computed += sc, out += uc, placeholders += sc - uc.
A member that turns explicit while steps it was implicit in are still in flight (async
scheduling keeps one) is "trailing": those steps' outputs still advance it, one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capplan.sim.request import SimRequest

LEAVE_MARGIN = 2  # tokens before the last at which a member turns explicit again


class DecodeCohort:
    """Requests advanced implicitly, one decode token per step."""

    __slots__ = (
        "_counts",
        "all_w",
        "bs",
        "ctx",
        "events",
        "last_update_s",
        "meas_w",
        "members",
        "phase",
        "sched_done",
        "sw",
        "sw_alloc",
        "sw_both",
        "sw_free",
        "trailing",
        "upd_done",
    )

    def __init__(
        self, workloads: int, block_size: int, sw: tuple[int, int, int, int] | None = None
    ) -> None:
        self.members: dict[int, SimRequest] = {}
        self.bs = block_size
        # sliding-window groups: (groups, block size, window, tokens in flight at a steady
        # decoder's schedule), and members allocating / freeing / doing both per phase
        self.sw = sw
        sbs = sw[1] if sw else 0
        self.sw_alloc = [0] * sbs
        self.sw_free = [0] * sbs
        self.sw_both = [0] * sbs
        self.ctx = 0  # sum of members' computed tokens at the next schedule
        self.all_w = [0] * workloads  # members per workload
        self.meas_w = [0] * workloads  # measured members per workload
        self._counts: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self.phase = [0] * block_size  # members taking a new block at steps = i mod bs
        self.events: dict[int, list[SimRequest]] = {}  # step index -> members to leave
        self.sched_done = 0  # index of the last schedule
        self.upd_done = 0  # index of the last plan whose output was processed
        self.last_update_s = 0.0
        self.trailing: list[SimRequest] = []

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(all_w, meas_w) as tuples, made again only after a member joined or left."""
        if self._counts is None:
            self._counts = (tuple(self.all_w), tuple(self.meas_w))
        return self._counts

    def crossings(self, step: int) -> int:
        """Blocks the members take at this schedule."""
        return self.phase[step % self.bs]

    def sw_step(self, step: int) -> tuple[int, int, int]:
        """A hybrid model's schedule: blocks the members take in every group, sliding blocks
        they free, and the sum over members of what each takes beyond what it frees first
        (each frees before it allocates: kv_cache_manager.py allocate_slots)."""
        assert self.sw is not None
        groups, sbs = self.sw[0], self.sw[1]
        full = self.phase[step % self.bs]
        q = step % sbs
        alloc = self.sw_alloc[q]
        return (full + groups * alloc, groups * self.sw_free[q],
                full + groups * (alloc - self.sw_both[q]))

    def join(self, r: SimRequest, s0: int, lookahead: int, max_len: int) -> bool:
        """Make r implicit from step s0 on (its counters are as of step s0's schedule).
        False when r is too close to its end to be worth it."""
        leave = min(r.prompt + r.max_tokens, max_len) - LEAVE_MARGIN - r.computed
        if leave <= 0:
            return False
        bs = self.bs
        if self.sw is not None:
            sw_leave = self._sw_join(r, s0, lookahead)
            if sw_leave is not None:
                if sw_leave <= s0:
                    return False
                leave = min(leave, sw_leave - s0)
        r.lazy = True
        r.s0 = r.u0 = s0
        self.members[r.rid] = r
        self.ctx += r.computed
        self.all_w[r.wl] += 1
        if r.measured:
            self.meas_w[r.wl] += 1
        self._counts = None
        # allocate_slots asks for a block when computed + 1 + lookahead passes the blocks held
        first = s0 + (r.blocks + r.pinned_blocks) * bs - lookahead - r.computed
        r.phase = first % bs
        self.phase[r.phase] += 1
        if self.sw is not None:
            self.sw_alloc[r.sw_phase] += 1
            if r.sw_fphase >= 0:
                self.sw_free[r.sw_fphase] += 1
                if r.sw_fphase == r.sw_phase:
                    self.sw_both[r.sw_phase] += 1
        ev = s0 + leave
        r.event = ev
        bucket = self.events.get(ev)
        if bucket is None:
            self.events[ev] = [r]
        else:
            bucket.append(r)
        return True

    def _sw_join(self, r: SimRequest, s0: int, lookahead: int) -> int | None:
        """Set a hybrid member's sliding phases; the step at which it must leave (its
        pattern changes then), or None."""
        assert self.sw is not None
        _groups, sbs, window, in_flight = self.sw
        c0 = r.computed
        # allocate_slots asks for a sliding block when computed + 1 passes the entries held
        r.sw_phase = (s0 + r.sw_hi * sbs - lookahead - c0) % sbs
        # remove_skipped_blocks frees block j when computed - in flight - window + 1 reaches
        # (j + 1) x block: the first one it releases (pinned blocks are not its own)
        pin = r.pinned_blocks * (self.bs // sbs)
        lo = r.sw_lo if r.sw_lo > pin else pin
        first = s0 + (lo + 1) * sbs + window - 1 + in_flight - c0
        r.sw_fphase = -1
        if first < s0:
            return s0  # a tail still to free at once: not steady yet
        keyed = r.sw_keys is not None and bool(r.sw_keys[0])
        if first < s0 + sbs and not keyed:
            # blocks below the pinned ones are not its own: their null entries may still
            # be settled at s0 (a chunk was in flight), which frees nothing; from here on
            # each free is one of its own, the first at `first`
            r.sw_lo = lo
            r.sw_fphase = first % sbs
            return None
        return first

    def materialize(self, r: SimRequest) -> None:
        """Bring r's counters and blocks up to date with the steps done so far."""
        done = self.sched_done
        sc = done - r.s0 + 1
        if sc > 0:
            r.computed += sc
            r.placeholders += sc
            # block crossings at steps in [s0, done] with step = phase (mod bs)
            bs, p = self.bs, r.phase
            r.blocks += (done - p) // bs - (r.s0 - 1 - p) // bs
            if self.sw is not None:
                r.inflight += sc
                sbs, p = self.sw[1], r.sw_phase
                r.sw_hi += (done - p) // sbs - (r.s0 - 1 - p) // sbs
                p = r.sw_fphase
                if p >= 0:
                    r.sw_lo += (done - p) // sbs - (r.s0 - 1 - p) // sbs
                    r.sw_free_at = (r.sw_lo + 1) * sbs + self.sw[2] - 1
            r.s0 = done + 1
        uc = self.upd_done - r.u0 + 1
        if uc > 0:
            r.out += uc
            r.placeholders -= uc
            if self.sw is not None:
                r.inflight -= uc
            r.last_token_s = self.last_update_s
            r.u0 = self.upd_done + 1

    def leave(self, r: SimRequest) -> None:
        """Make r explicit again, counters up to date; steps in flight trail it."""
        self.materialize(r)
        r.lazy = False
        del self.members[r.rid]
        self.ctx -= r.computed
        self.all_w[r.wl] -= 1
        if r.measured:
            self.meas_w[r.wl] -= 1
        self._counts = None
        self.phase[r.phase] -= 1
        if self.sw is not None:
            self.sw_alloc[r.sw_phase] -= 1
            if r.sw_fphase >= 0:
                self.sw_free[r.sw_fphase] -= 1
                if r.sw_fphase == r.sw_phase:
                    self.sw_both[r.sw_phase] -= 1
        r.trail_from = r.u0
        r.trail_until = self.sched_done
        if r.trail_from <= r.trail_until:
            self.trailing.append(r)

    def advance_trailing(self, step: int, now: float) -> list[SimRequest]:
        """Apply the output of implicit step `step` to members that have since left;
        returns those it advanced."""
        keep, advanced = [], []
        for r in self.trailing:
            if r.trail_from <= step <= r.trail_until:
                r.out += 1
                r.placeholders -= 1
                if self.sw is not None:
                    r.inflight -= 1
                r.last_token_s = now
                r.trail_from = step + 1
                advanced.append(r)
            if r.trail_from <= r.trail_until:
                keep.append(r)
        self.trailing = keep
        return advanced

    def dissolve(self) -> list[SimRequest]:
        """Make every member explicit (before a step that needs the ordered walk)."""
        left = list(self.members.values())
        for r in left:
            self.leave(r)
        self.events.clear()
        self.ctx = 0
        return left

    def due(self, step: int) -> list[SimRequest]:
        """Members that near their end at this schedule (still members; the caller lets
        them leave)."""
        bucket = self.events.pop(step, None)
        if not bucket:
            return []
        return [r for r in bucket if r.lazy and r.event == step]
