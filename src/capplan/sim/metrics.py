"""What a simulation measures, defined as `vllm bench serve` defines it.

vllm/benchmarks/serve.py (calculate_metrics) and vllm/benchmarks/lib/endpoint_request_func.py:
TTFT = first streamed chunk - request sent; ITL = gap between consecutive streamed chunks
(one chunk per engine step, however many tokens it carries); TPOT = (E2E - TTFT) /
(output tokens - 1); E2E = last chunk - request sent. Percentiles use numpy's default
(linear) interpolation, as vllm bench does.

Per-request figures are kept in compact arrays; per-token gaps (ITL) go into a fine
log-spaced histogram, so memory grows with requests, never with tokens.
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

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), at the geometric centre of its bin; NaN if empty."""
        self._flush()
        if self.n == 0:
            return float("nan")
        rank = q / 100 * (self.n - 1)
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
    """Measured requests of one workload, and token counts in the measurement window."""

    __slots__ = ("cols", "input_tokens_in_window", "itl", "output_tokens_in_window")

    def __init__(self) -> None:
        self.cols = {f: array("d") for f in REQUEST_FIELDS}
        self.itl = GapHistogram()
        self.output_tokens_in_window = 0
        self.input_tokens_in_window = 0

    def add_request(self, *values: float) -> None:
        for col, v in zip(self.cols.values(), values, strict=True):
            col.append(v)

    def column(self, name: str) -> np.ndarray:
        return np.frombuffer(self.cols[name], dtype=np.float64) if self.cols[name] else np.zeros(0)

    @property
    def completed(self) -> int:
        return len(self.cols["arrival_s"])


def pct(x: np.ndarray, q: float) -> float:
    """numpy's linear-interpolation percentile (vllm bench's convention); NaN when empty,
    inf when the rank reaches requests that never finished (stored as inf)."""
    if not len(x):
        return float("nan")
    hi = math.ceil(q / 100 * (len(x) - 1))
    if np.partition(x, hi)[hi] == math.inf:
        return math.inf
    return float(np.percentile(x, q))
