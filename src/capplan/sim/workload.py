"""Requests from a workload spec: arrival times, prompt and output lengths, prompt structure.

Open-loop arrivals become one `RequestBatch` up front (`generate`); closed-loop users draw
their next request when the last one ends (`ClosedLoopSampler`). Randomness is always the
caller's `rng`, drawn in a fixed order, so the same seed gives the same arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capplan.errors import ConfigError
from capplan.replay import NO_PREFIX, ReplayTrace, read_trace
from capplan.traffic import (
    ClosedLoop,
    DailyArrival,
    GammaArrival,
    PoissonArrival,
    ReplayArrival,
    Workload,
)

__all__ = [
    "NO_PREFIX",
    "TARGET_HIT_RATE",
    "ArrivalStream",
    "ClosedLoopSampler",
    "RequestBatch",
    "generate",
    "offered_rate_rps",
    "offered_tokens_per_s",
]

TARGET_HIT_RATE = -2
"""`prefix_group` of a request whose `prefix_tokens` are treated as cached (target_hit_rate)."""



@dataclass(frozen=True, slots=True)
class RequestBatch:
    """Requests of one workload, sorted by arrival; every array has one entry per request.

    `input_tokens` counts the whole prompt, image tokens included. `prefix_tokens` is the
    prompt head shared with the rest of `prefix_group` (always < input_tokens); with
    `prefix_group == TARGET_HIT_RATE` it is the part treated as already cached.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_tokens: np.ndarray
    image_tokens: np.ndarray
    workload: int

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in (
            "input_tokens",
            "output_tokens",
            "prefix_group",
            "prefix_tokens",
            "image_tokens",
        ):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, arrival_s {n}")

    def __len__(self) -> int:
        return len(self.arrival_s)


# --- lengths and prompt structure -------------------------------------------------------


def _zipf_p(groups: int, s: float) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, groups + 1, dtype=np.float64) ** s
    return w / float(w.sum())


def _structure(
    workload: Workload, input_tokens: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Prefix group and shared tokens for prompts of `input_tokens` (images included).

    vLLM always recomputes a prompt's last token (vllm/v1/core/kv_cache_manager.py:
    get_computed_blocks caps hits at prompt length - 1), so prefix_tokens <= input - 1.
    """
    n = len(input_tokens)
    group = np.full(n, NO_PREFIX, dtype=np.int64)
    prefix = np.zeros(n, dtype=np.int64)
    spec = workload.prefix
    if spec is None:
        return group, prefix
    if spec.target_hit_rate is not None:
        prefix = np.floor(spec.target_hit_rate * input_tokens).astype(np.int64)
        prefix = np.minimum(prefix, input_tokens - 1)
        group[:] = TARGET_HIT_RATE
        return group, prefix
    if spec.shared_tokens is not None:
        # A prompt shorter than the prefix shares the prefix's head: chained block hashes
        # still match, so it still hits on what it has.
        prefix = np.minimum(spec.shared_tokens, input_tokens - 1).astype(np.int64)
    else:
        assert spec.shared_fraction is not None
        prefix = np.floor(spec.shared_fraction * input_tokens).astype(np.int64)
        prefix = np.minimum(prefix, input_tokens - 1)
    if spec.groups == 1:
        group[:] = 0
    else:
        group = rng.choice(spec.groups, size=n, p=_zipf_p(spec.groups, spec.zipf_s))
        group = group.astype(np.int64)
    group[prefix == 0] = NO_PREFIX
    return group, prefix


def _image_tokens(workload: Workload) -> int:
    img = workload.image
    return img.images_per_request * img.tokens_per_image if img else 0


def _draw(
    workload: Workload, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n synthetic requests: (input, output, prefix_group, prefix_tokens, image_tokens)."""
    assert workload.input_tokens is not None and workload.output_tokens is not None
    text = np.asarray(workload.input_tokens.sample(rng, n), dtype=np.int64)
    output = np.asarray(workload.output_tokens.sample(rng, n), dtype=np.int64)
    image = np.full(n, _image_tokens(workload), dtype=np.int64)
    input_tokens = text + image
    group, prefix = _structure(workload, input_tokens, rng)
    return input_tokens, output, group, prefix, image


# --- arrivals -----------------------------------------------------------------------------


def _open_loop_arrivals(
    rate_rps: float, cv: float | None, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times in [0, duration_s): cumulative exponential (cv None) or gamma gaps.

    Gaps are never clipped: clipping (as vidur does at 3x the mean) understates bursts.
    """

    def gaps(k: int) -> np.ndarray:
        if cv is None:
            return rng.exponential(1.0 / rate_rps, k)
        shape = 1.0 / cv**2
        return rng.gamma(shape, 1.0 / (rate_rps * shape), k)

    expected = rate_rps * duration_s
    chunk = int(expected + 6.0 * math.sqrt(expected) * max(cv or 1.0, 1.0)) + 16
    parts: list[np.ndarray] = []
    t = 0.0
    while t < duration_s:
        times = t + np.cumsum(gaps(chunk))
        parts.append(times)
        t = float(times[-1])
    arrival = np.concatenate(parts) if parts else np.empty(0)
    return arrival[arrival < duration_s]


def generate(
    workload: Workload,
    index: int,
    duration_s: float,
    rng: np.random.Generator,
    *,
    base_dir: Path | None = None,
) -> RequestBatch:
    """All requests of an open-loop workload arriving in [0, duration_s).

    Closed-loop workloads have no arrival schedule; draw them with `ClosedLoopSampler`.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    arr = workload.arrival
    if isinstance(arr, ClosedLoop):
        raise ValueError(
            f"workload {workload.name!r} is closed loop; use ClosedLoopSampler, not generate"
        )
    if isinstance(arr, ReplayArrival):
        return _replay(workload, index, duration_s, rng, base_dir)
    if isinstance(arr, PoissonArrival):
        arrival = _open_loop_arrivals(arr.rate_rps, None, duration_s, rng)
    elif isinstance(arr, GammaArrival):
        arrival = _open_loop_arrivals(arr.rate_rps, arr.cv, duration_s, rng)
    elif isinstance(arr, DailyArrival):
        # Simulation runs at the peak hour; the daily profile only feeds cost figures.
        arrival = _open_loop_arrivals(arr.peak_rate_rps, arr.cv, duration_s, rng)
    else:  # pragma: no cover - the Arrival union is closed
        raise TypeError(f"unknown arrival {type(arr).__name__}")
    input_tokens, output, group, prefix, image = _draw(workload, len(arrival), rng)
    return RequestBatch(arrival, input_tokens, output, group, prefix, image, index)


class ArrivalStream:
    """Open-loop requests of one workload, a chunk at a time, so memory stays flat however
    long the simulation: the renewal process continues from the last arrival, so chunks
    join exactly (Poisson and gamma alike). Replay files are read whole (`generate`), and
    so is a `batch` given instead of the workload's arrivals (a validation experiment's
    routed share, capplan/validate/suite.py). Rates scale by `rate_scale` (arrival times
    divided by it)."""

    def __init__(
        self,
        workload: Workload,
        index: int,
        horizon_s: float,
        rng: np.random.Generator,
        *,
        rate_scale: float = 1.0,
        base_dir: Path | None = None,
        chunk: int = 2048,
        batch: RequestBatch | None = None,
    ) -> None:
        arr = workload.arrival
        if isinstance(arr, ClosedLoop):
            raise ValueError(f"workload {workload.name!r} is closed loop; use ClosedLoopSampler")
        self.workload, self.index, self.rng = workload, index, rng
        self.horizon_s, self.rate_scale, self._chunk = horizon_s, rate_scale, chunk
        self._replay: RequestBatch | None = None
        self._rate, self._cv = 0.0, None
        if batch is not None or isinstance(arr, ReplayArrival):
            b = batch if batch is not None else generate(
                workload, index, horizon_s * rate_scale, rng, base_dir=base_dir)
            self._replay = RequestBatch(b.arrival_s / rate_scale, b.input_tokens,
                                        b.output_tokens, b.prefix_group, b.prefix_tokens,
                                        b.image_tokens, index)
        elif isinstance(arr, PoissonArrival):
            self._rate = arr.rate_rps * rate_scale
        elif isinstance(arr, GammaArrival):
            self._rate, self._cv = arr.rate_rps * rate_scale, arr.cv
        elif isinstance(arr, DailyArrival):  # the peak hour, as `generate`
            self._rate, self._cv = arr.peak_rate_rps * rate_scale, arr.cv
        self._t = 0.0
        self._done = False

    def next_batch(self) -> RequestBatch | None:
        """The next requests in arrival order; None once past the horizon."""
        if self._done:
            return None
        if self._replay is not None:
            self._done = True
            return self._replay
        rng, rate, cv, n = self.rng, self._rate, self._cv, self._chunk
        if cv is None:
            gaps = rng.exponential(1.0 / rate, n)
        else:
            shape = 1.0 / cv**2
            gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
        arrival = self._t + np.cumsum(gaps)
        self._t = float(arrival[-1])
        if self._t >= self.horizon_s:
            self._done = True
            arrival = arrival[arrival < self.horizon_s]
        cols = _draw(self.workload, len(arrival), rng)
        return RequestBatch(arrival, *cols, self.index)


class ClosedLoopSampler:
    """One request at a time for a closed-loop workload (called when a user's request ends).

    Requests are drawn from the workload's distributions in chunks, for speed; the draws
    depend only on the rng passed in and the order of calls.
    """

    def __init__(self, workload: Workload, index: int, *, chunk: int = 4096) -> None:
        if not isinstance(workload.arrival, ClosedLoop):
            raise ValueError(f"workload {workload.name!r} is not closed loop")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.workload = workload
        self.index = index
        self.concurrency: int = workload.arrival.concurrency
        self.think_time_s: float = workload.arrival.think_time_s
        self._chunk = chunk
        self._rows: list[tuple[int, int, int, int, int]] = []
        self._pos = 0

    def next(self, rng: np.random.Generator) -> tuple[int, int, int, int, int]:
        """(input_tokens, output_tokens, prefix_group, prefix_tokens, image_tokens)."""
        if self._pos == len(self._rows):
            cols = _draw(self.workload, self._chunk, rng)
            self._rows = list(zip(*(c.tolist() for c in cols), strict=True))
            self._pos = 0
        row = self._rows[self._pos]
        self._pos += 1
        return row


# --- replay -------------------------------------------------------------------------------




def _period_s(trace: ReplayTrace) -> float:
    """Trace span in trace time: last - first arrival plus one mean gap, so that a looped
    trace keeps its rate and rows/span is the offered rate."""
    n = len(trace.arrival_s)
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    if n < 2 or span <= 0:
        raise ConfigError(
            "a replay trace needs at least two distinct arrival times to define a rate",
            file=trace.file,
            field="arrival_s",
        )
    return span * n / (n - 1)


def _replay(
    workload: Workload,
    index: int,
    duration_s: float,
    rng: np.random.Generator,
    base_dir: Path | None,
) -> RequestBatch:
    arr = workload.arrival
    assert isinstance(arr, ReplayArrival)
    trace = read_trace(workload, base_dir)
    arrival = trace.arrival_s / arr.time_scale
    reps = 1
    if arr.loop:
        period = _period_s(trace) / arr.time_scale
        reps = max(1, math.ceil((duration_s - float(arrival[0])) / period))
        arrival = (arrival[None, :] + period * np.arange(reps)[:, None]).ravel()
    keep = arrival < duration_s

    def tile(x: np.ndarray) -> np.ndarray:
        return np.tile(x, reps)[keep]

    input_tokens = tile(trace.input_tokens)
    # Recorded prompt lengths are what vLLM reports, image placeholder tokens included.
    image = np.full(len(input_tokens), _image_tokens(workload), dtype=np.int64)
    if (image >= input_tokens).any():
        raise ConfigError(
            f"workload {workload.name!r} has {image[0]} image tokens per request but some "
            "recorded prompts are not longer; input_tokens must include image tokens",
            file=trace.file,
            field="input_tokens",
        )
    if trace.has_prefix or workload.prefix is None:
        group, prefix = tile(trace.prefix_group), tile(trace.prefix_tokens)
    else:  # no recorded structure: the workload's prefix spec supplies it
        group, prefix = _structure(workload, input_tokens, rng)
    return RequestBatch(
        arrival[keep], input_tokens, tile(trace.output_tokens), group, prefix, image, index
    )


# --- analytic companions -------------------------------------------------------------------


def offered_rate_rps(workload: Workload, *, base_dir: Path | None = None) -> float | None:
    """Mean request rate offered by an open-loop workload (peak hour for daily); None for
    closed loop, whose rate depends on the latency it meets."""
    arr = workload.arrival
    if isinstance(arr, ClosedLoop):
        return None
    if isinstance(arr, PoissonArrival | GammaArrival):
        return arr.rate_rps
    if isinstance(arr, DailyArrival):
        return arr.peak_rate_rps
    return _trace_rate_rps(read_trace(workload, base_dir), arr.time_scale)


def _trace_rate_rps(trace: ReplayTrace, time_scale: float) -> float:
    return len(trace.arrival_s) / _period_s(trace) * time_scale


def offered_tokens_per_s(
    workload: Workload, *, base_dir: Path | None = None
) -> tuple[float, float] | None:
    """(input, output) tokens/s offered: rate x mean lengths (images included); None for
    closed loop."""
    arr = workload.arrival
    if isinstance(arr, ReplayArrival):
        trace = read_trace(workload, base_dir)
        rate = _trace_rate_rps(trace, arr.time_scale)
        return rate * float(trace.input_tokens.mean()), rate * float(trace.output_tokens.mean())
    open_rate = offered_rate_rps(workload)
    if open_rate is None:
        return None
    return open_rate * workload.mean_input_tokens, open_rate * workload.mean_output_tokens
