"""What a simulation measures, defined as `vllm bench serve` defines it.

vllm/benchmarks/serve.py (calculate_metrics) and vllm/benchmarks/lib/endpoint_request_func.py:
TTFT = first streamed chunk - request sent; ITL = gap between consecutive streamed chunks
(one chunk per engine step, however many tokens it carries); TPOT = (E2E - TTFT) /
(output tokens - 1); E2E = last chunk - request sent.

Percentiles come from fine log-spaced histograms (0.1 % bins: within 0.1 % of the numpy
interpolation vllm bench reports), so memory stays flat however long the simulation; one
row per request is kept too unless the caller opts out (sizing does).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

# ITL histogram: log bins from 10 us to 1000 s, 0.1 % wide.
_LO = 1e-5
_BINS_PER_E = 1000.0
_NBINS = int(math.log(1e3 / _LO) * _BINS_PER_E) + 2
_LOG_LO = math.log(_LO)


class GapHistogram:
    """Streaming histogram of positive durations with 0.1 % relative resolution."""

    __slots__ = ("_buf", "_rep", "_rep_n", "_steps", "counts", "n")

    def __init__(self) -> None:
        self.counts = np.zeros(_NBINS, dtype=np.int64)
        self._buf = array("d")  # single observations
        self._rep = array("d")  # observations seen `_rep_n[i]` times each
        self._rep_n = array("d")
        self._steps: tuple[StepGaps, int] | None = None  # more repeated ones, kept there
        self.n = 0

    def add(self, x: float) -> None:
        self._buf.append(x)
        if len(self._buf) >= 65536:
            self._flush()

    def add_many(self, xs: list[float]) -> None:
        """Single observations, in bulk (the histogram keeps no order)."""
        self._buf.extend(xs)
        if len(self._buf) >= 65536:
            self._flush()

    def add_repeated(self, x: float, count: int) -> None:
        """`count` observations of x (one step's gap, seen by `count` requests)."""
        self._rep.append(x)
        self._rep_n.append(count)
        if len(self._rep) >= 65536:
            self._flush()

    def _flush(self) -> None:
        if self._steps is not None:
            steps, workload = self._steps
            steps.hand_over(workload)
        if self._buf:
            x = np.frombuffer(self._buf, dtype=np.float64)
            self.counts += np.bincount(_bins(x), minlength=_NBINS)
            self.n += len(x)
            self._buf = array("d")
        if self._rep:
            x = np.frombuffer(self._rep, dtype=np.float64)
            w = np.frombuffer(self._rep_n, dtype=np.float64)
            self.counts += np.rint(np.bincount(_bins(x), weights=w, minlength=_NBINS)).astype(
                np.int64
            )
            self.n += int(w.sum())
            self._rep = array("d")
            self._rep_n = array("d")

    def count(self) -> int:
        """Observations so far, buffered ones included."""
        self._flush()
        return self.n

    def merge(self, other: GapHistogram) -> None:
        self._flush()
        other._flush()
        self.counts += other.counts
        self.n += other.n

    def percentile(self, q: float, missing: int = 0) -> float:
        """The q-th percentile (0-100), at the geometric centre of its bin; NaN if empty.
        `missing` observations count as infinitely long (requests that never finished):
        inf when the rank falls among them."""
        self._flush()
        total = self.n + missing
        if total == 0:
            return float("nan")
        rank = q / 100 * (total - 1)
        if rank > self.n - 1:
            return math.inf
        i = int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))
        return math.exp(_LOG_LO + (i + 0.5) / _BINS_PER_E)

    def share_above(self, x: float, missing: int = 0) -> float:
        """The share of observations longer than x (to the histogram's resolution; its bin
        counts as longer where its geometric centre is); `missing` ones count as longer.
        NaN if empty."""
        self._flush()
        total = self.n + missing
        if total == 0:
            return float("nan")
        first = max(math.floor((math.log(x) - _LOG_LO) * _BINS_PER_E + 0.5), 0)  # centre > x
        return (float(self.counts[first:].sum()) + missing) / total

    def mean(self) -> float:
        self._flush()
        if self.n == 0:
            return float("nan")
        centres = np.exp(_LOG_LO + (np.arange(_NBINS) + 0.5) / _BINS_PER_E)
        return float(np.dot(self.counts, centres) / self.n)


_FLUSH_AT = 65536
"""A GapHistogram's buffers flush when either holds this many entries."""


class StepGaps:
    """The decode cohort's ITL gaps and tokens, for every workload at once (replica.py,
    `Replica._emit_cohort`): a step appends its gap `dt`, the measured members of each workload
    that saw it (`counts`, one entry per workload) and, in the measurement window, the
    tokens each workload's members received (`tokens`). That is two or three appends a step
    instead of a histogram call per workload.

    The gaps are each workload's ITL histogram's `add_repeated` observations, held here
    instead of in its buffer and with the same effect, also on when the histogram flushes
    (its `n` counts flushed observations only): they count as the histogram's buffered
    entries, it takes them whenever it flushes, and
    it flushes once they number _FLUSH_AT (steps that a workload's measured members saw), as
    add_repeated would. Every FOLD_EVERY steps (or sooner, so that no histogram's count can
    pass _FLUSH_AT unseen) the steps are binned into per-workload pending counts, so memory
    stays flat."""

    __slots__ = ("_pend", "_pend_n", "_pend_rep", "_taken", "check_at", "counts", "dt",
                 "hists", "recorders", "tokens", "width")

    FOLD_EVERY = 4096

    def __init__(self, recorders: list[WorkloadRecorder]) -> None:
        self.recorders = recorders
        self.width = len(recorders)
        self.hists = [rec.itl for rec in recorders]
        for w, hist in enumerate(self.hists):
            hist._steps = (self, w)
        self.dt = array("d")
        self.counts = array("q")
        self.tokens = array("q")
        self._taken = [0] * self.width  # buffered steps already in each workload's pending
        self._pend: list[np.ndarray | None] = [None] * self.width  # binned, float64
        self._pend_n = [0] * self.width  # observations pending
        self._pend_rep = [0] * self.width  # steps pending: the histogram's len(_rep)
        self.check_at = self.FOLD_EVERY
        """`fold` when len(dt) reaches this."""

    def _fold_one(self, w: int, counts: np.ndarray, bins: np.ndarray) -> None:
        start = self._taken[w]
        self._taken[w] = len(bins)
        col = counts[start:, w]
        seen = int(np.count_nonzero(col))  # add_repeated ran for these (count != 0)
        if not seen:
            return
        add = np.bincount(bins[start:], weights=col.astype(np.float64), minlength=_NBINS)
        pend = self._pend[w]
        self._pend[w] = add if pend is None else pend + add
        self._pend_n[w] += int(col.sum())
        self._pend_rep[w] += seen

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.dt)
        counts = np.frombuffer(self.counts, dtype=np.int64).reshape(n, self.width)
        return counts, _bins(np.frombuffer(self.dt, dtype=np.float64))

    def fold(self) -> None:
        """Bin the buffered steps into each workload's pending counts; a histogram whose
        pending steps reach _FLUSH_AT flushes (they did at this step: `check_at`)."""
        if self.dt:
            counts, bins = self._arrays()
            for w in range(self.width):
                if self._taken[w] < len(bins):
                    self._fold_one(w, counts, bins)
            self.dt = array("d")
            self.counts = array("q")
            self._taken = [0] * self.width
            for w, hist in enumerate(self.hists):
                if self._pend_rep[w] >= _FLUSH_AT:
                    hist._flush()
        self.fold_tokens()
        # no histogram's pending steps can reach _FLUSH_AT before this many more steps
        self.check_at = min(self.FOLD_EVERY, *(_FLUSH_AT - r for r in self._pend_rep))

    def fold_tokens(self) -> None:
        """Add the buffered window tokens to the recorders."""
        if self.tokens:
            sums = np.frombuffer(self.tokens, dtype=np.int64).reshape(-1, self.width).sum(0)
            for rec, n in zip(self.recorders, sums.tolist(), strict=True):
                rec.output_tokens_in_window += n
            self.tokens = array("q")

    def hand_over(self, w: int) -> None:
        """Workload w's histogram flushes: its pending observations go into its counts."""
        if self._taken[w] < len(self.dt):
            self._fold_one(w, *self._arrays())
        pend = self._pend[w]
        if pend is not None:
            hist = self.hists[w]
            hist.counts += np.rint(pend).astype(np.int64)
            hist.n += self._pend_n[w]
        self._pend[w] = None
        self._pend_n[w] = 0
        self._pend_rep[w] = 0


def _bins(x: np.ndarray) -> np.ndarray:
    idx = ((np.log(np.maximum(x, _LO)) - _LOG_LO) * _BINS_PER_E).astype(np.int64)
    clipped: np.ndarray = np.clip(idx, 0, _NBINS - 1)
    return clipped


REQUEST_FIELDS = (
    "arrival_s",
    "ttft_s",
    "e2e_s",
    "queue_s",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "preemptions",
    "replica",
)


class WorkloadRecorder:
    """Measured requests of one workload: latency histograms (memory flat in duration),
    totals, token counts in the measurement window and, if asked, one row per request."""

    __slots__ = (
        "cached_tokens",
        "cols",
        "completed",
        "e2e",
        "input_tokens",
        "input_tokens_in_window",
        "itl",
        "output_tokens_in_window",
        "preempted",
        "queue",
        "tpot",
        "ttft",
    )

    def __init__(self, *, keep_requests: bool = True) -> None:
        self.cols = {f: array("d") for f in REQUEST_FIELDS} if keep_requests else None
        self.ttft, self.e2e, self.tpot, self.queue, self.itl = (GapHistogram() for _ in range(5))
        self.completed = 0
        self.input_tokens = 0
        self.cached_tokens = 0
        self.preempted = 0
        self.output_tokens_in_window = 0
        self.input_tokens_in_window = 0

    def add_request(
        self,
        arrival_s: float,
        ttft_s: float,
        e2e_s: float,
        queue_s: float,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int,
        preemptions: int,
        replica: int,
    ) -> None:
        self.completed += 1
        self.ttft.add(ttft_s)
        self.e2e.add(e2e_s)
        self.queue.add(queue_s)
        if output_tokens > 1:  # vllm bench: TPOT = (E2E - TTFT) / (output tokens - 1)
            self.tpot.add((e2e_s - ttft_s) / (output_tokens - 1))
        self.input_tokens += input_tokens
        self.cached_tokens += cached_tokens
        if preemptions:
            self.preempted += 1
        if self.cols is not None:
            values = (arrival_s, ttft_s, e2e_s, queue_s, input_tokens, output_tokens,
                      cached_tokens, preemptions, replica)
            for col, v in zip(self.cols.values(), values, strict=True):
                col.append(v)

    def column(self, name: str) -> np.ndarray:
        if self.cols is None or not self.cols[name]:
            return np.zeros(0)
        return np.frombuffer(self.cols[name], dtype=np.float64)
