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
results equal the request-by-request path (tests/test_cohort.py holds them equal).

A member's counters hold its values as of two step indices: `s0`, the first schedule and
`u0`, the first output update it has not yet been advanced by. After `sc` implicit
schedules and `uc` implicit updates, computed += sc, out += uc, placeholders += sc - uc.
A member that turns explicit while steps it was implicit in are still in flight (async
scheduling keeps one) is "trailing": those steps' outputs still advance it, one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capplan.sim.core import SimRequest

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
        "trailing",
        "upd_done",
    )

    def __init__(self, workloads: int, block_size: int) -> None:
        self.members: dict[int, SimRequest] = {}
        self.bs = block_size
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

    def join(self, r: SimRequest, s0: int, lookahead: int, max_len: int) -> bool:
        """Make r implicit from step s0 on (its counters are as of step s0's schedule).
        False when r is too close to its end to be worth it."""
        leave = min(r.prompt + r.max_tokens, max_len) - LEAVE_MARGIN - r.computed
        if leave <= 0:
            return False
        bs = self.bs
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
        ev = s0 + leave
        r.event = ev
        bucket = self.events.get(ev)
        if bucket is None:
            self.events[ev] = [r]
        else:
            bucket.append(r)
        return True

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
            r.s0 = done + 1
        uc = self.upd_done - r.u0 + 1
        if uc > 0:
            r.out += uc
            r.placeholders -= uc
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
