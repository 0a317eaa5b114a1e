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

    __slots__ = ("_buf", "_rep", "_rep_n", "counts", "n")

    def __init__(self) -> None:
        self.counts = np.zeros(_NBINS, dtype=np.int64)
        self._buf = array("d")  # single observations
        self._rep = array("d")  # observations seen `_rep_n[i]` times each
        self._rep_n = array("d")
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

    def mean(self) -> float:
        self._flush()
        if self.n == 0:
            return float("nan")
        centres = np.exp(_LOG_LO + (np.arange(_NBINS) + 0.5) / _BINS_PER_E)
        return float(np.dot(self.counts, centres) / self.n)


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
