"""A run's SLO miss, known before the run ends.

A TTFT or E2E target `p` at percentile q over the M measured requests of a workload is
missed when at most q/100 x (M - 1) of them come out below the limit (`summarise` counts an
unfinished request as infinitely late; metrics.py puts each value in a 0.1 % bin and reads
the bin's centre). So once more than M minus that many are surely over it, no later event
can save the target: each such request has either finished (or shown its first token) over
the limit, or is still waiting past it. Sizing uses this to stop a run whose verdict is
settled (probes that fail, the one-fewer check); a run that would pass is never stopped, as
its miss is never certain.

M must be known in advance: open-loop arrivals are counted up front (their random stream is
replayed); closed-loop workloads, whose count depends on the run, are judged only after the
last request was sent. ITL and TPOT targets (per token, with unfinished tokens scaled in)
are never judged early.
"""

from __future__ import annotations

import math

from capplan.sim.metrics import _BINS_PER_E, _LOG_LO, _NBINS
from capplan.sim.request import FINISHED, SimRequest
from capplan.traffic import Workload

CHECK_EVERY_S = 1.0
"""Simulated seconds between two looks at the measured requests."""

_EDGE_GUARD = 1e-9
"""Relative margin above a bin's lower edge: a value past it is binned there whatever the
rounding of the histogram's logarithm (the margin only makes the check later, never wrong)."""


def over_limit_s(limit_s: float) -> float:
    """The smallest latency surely binned above `limit_s`: the lower edge of the first bin
    whose centre exceeds the limit (inf when no bin does)."""
    first = math.floor((math.log(limit_s) - _LOG_LO) * _BINS_PER_E - 0.5)
    first = max(first, 0)
    while first < _NBINS and math.exp(_LOG_LO + (first + 0.5) / _BINS_PER_E) <= limit_s:
        first += 1
    if first >= _NBINS - 1:
        return math.inf  # the last bin also holds every clipped value: never decide on it
    return math.exp(_LOG_LO + first / _BINS_PER_E) * (1 + _EDGE_GUARD)


class _Target:
    """One TTFT or E2E target of one workload, and the measured requests not yet settled."""

    __slots__ = ("e2e", "key", "open", "over", "over_s", "q", "wl")

    def __init__(self, wl: int, key: str, e2e: bool, q: float, limit_s: float) -> None:
        self.wl, self.key, self.e2e, self.q = wl, key, e2e, q
        self.over_s = over_limit_s(limit_s)
        self.open: list[SimRequest] = []  # value not known yet
        self.over = 0  # requests whose value is known and over the limit


class MissWatch:
    """Watches the measured requests of a run for a certain SLO miss."""

    def __init__(
        self, workloads: list[Workload], expected: list[int | None], latency_s: float
    ) -> None:
        """`expected[i]`: measured requests workload i will have created by the end (None:
        not known in advance)."""
        self.expected = expected
        self.latency = latency_s
        self.targets: list[list[_Target]] = [
            [
                _Target(i, t.key, t.metric == "e2e", t.percentile, t.limit_s)
                for t in w.slo.targets if t.metric in ("ttft", "e2e")
            ]
            for i, w in enumerate(workloads)
        ]
        self.names = [w.name for w in workloads]

    def add(self, r: SimRequest) -> None:
        """A measured request was created."""
        for t in self.targets[r.wl]:
            if t.over_s < math.inf:
                t.open.append(r)

    def certain_miss(self, now: float, created: list[int], arrivals_done: bool) -> str | None:
        """'<workload> <target>' of a target already missed for sure at time `now`, else None."""
        for i, targets in enumerate(self.targets):
            total = self.expected[i]
            if total is None:
                if not arrivals_done:
                    continue
                total = created[i]
            for t in targets:
                # summarise's rank: the target is missed when no more than `rank` requests
                # come out under the limit
                rank = t.q / 100 * (total - 1)
                if total and total - self._over(t, now) <= rank:
                    return f"{self.names[i]} {t.key}"
        return None

    def _over(self, t: _Target, now: float) -> int:
        """Requests of t's workload surely over its limit: settled over it, or unsettled and
        already waiting past it."""
        cut = now + self.latency - t.over_s  # arrived at or before: over the limit already
        lat, over_s, e2e = self.latency, t.over_s, t.e2e
        still: list[SimRequest] = []
        waiting = 0
        for r in t.open:
            if e2e:
                if r.status == FINISHED:
                    t.over += r.last_token_s + lat - r.arrival_s >= over_s
                    continue
            elif r.first_token_s >= 0:
                t.over += r.first_token_s + lat - r.arrival_s >= over_s
                continue
            still.append(r)
            if r.arrival_s <= cut:
                waiting += 1
        t.open = still
        return t.over + waiting


__all__ = ["CHECK_EVERY_S", "MissWatch", "over_limit_s"]
