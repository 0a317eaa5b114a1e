"""Simulations in worker processes, and pools sized side by side that still report in order.

A search is a chain (each probe depends on the last), so one pool's simulations barely run
in parallel; the pools of a mix are independent, and so are a pool's confirmation seeds.
`size_mix` with more than one worker therefore searches every pool at once, one thread each,
and the threads hand their simulations to one set of worker processes, a search's next step
first: the cores stay busy from the first probe to the last seed.

Workers are forked from a fork server that imported the simulator once: ready in
milliseconds, not the second a spawned interpreter takes to import numpy, polars and
capplan, and never forked from the caller (polars' thread pool does not survive a fork).
A simulation's result depends on its inputs only, so where it runs changes nothing.
"""

from __future__ import annotations

import atexit
import functools
import heapq
import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from capplan.errors import ConfigError

if TYPE_CHECKING:
    from capplan.mix import TrafficMix
    from capplan.sim.results import SimResult

# (the simulator is imported where a job runs: this module imports fast, so that a caller
# can start the workers first and import the simulator while their fork server does)

PRELOAD = ["capplan.sim.run", "capplan.solve.jobs"]
"""Modules the fork server imports once, so that every worker starts with them."""

CHAIN = (0, 0.0)
"""Priority of a search's next step: a thread waits on it and more work follows it, so it
goes before every prefetched run (`bulk`)."""


def bulk(cost_s: float) -> tuple[int, float]:
    """Priority of a prefetched run expected to take `cost_s`: after every search step, the
    longest first (the last to start are short, so the cores finish together)."""
    return (1, -cost_s)


def default_workers() -> int:
    """$CAPPLAN_WORKERS, else 1 (everything in this process). Worker processes import the
    caller's main module, as multiprocessing's do: a script that sizes with more than one
    needs an `if __name__ == "__main__":` guard, so the library stays serial unless asked."""
    env = os.environ.get("CAPPLAN_WORKERS", "1")
    if not env.isdigit():
        raise ConfigError(f"CAPPLAN_WORKERS must be a whole number, got {env!r}")
    return max(1, int(env))


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cli_workers(given: int | None) -> int:
    """The CLI's worker count: --workers, else $CAPPLAN_WORKERS, else every usable CPU."""
    if given is not None:
        return given
    return default_workers() if "CAPPLAN_WORKERS" in os.environ else usable_cpus()


HOLD_S = 0.02
"""A worker that ran a search's step (CHAIN) the search thread was waiting for stays free
this long for a search's next step before a prefetched run may take it: the thread asks for
its next step within milliseconds, and a prefetched run started in between would make that
step, the critical path, wait seconds for a worker."""


class _Promise(Future[Any]):
    """A job's future that knows whether it is a search's step and whether a thread waited
    for its result."""

    chain = False
    awaited = False

    def result(self, timeout: float | None = None) -> Any:
        self.awaited = True
        return super().result(timeout)


_Job = tuple[tuple[int, float], int, "Future[Any]", Callable[..., Any], tuple[Any, ...]]


class _Dispatcher:
    """`workers` forkserver processes fed from a priority queue (ProcessPoolExecutor alone
    runs jobs first come, first served): a job is handed over only when a worker is free.

    The workers start at once (the fork server imports the simulator first, about half a
    second); until the first of them is ready, this process runs the next job itself, one
    at a time, so that the search does not wait for them (a simulation's result is the
    same wherever it runs)."""

    def __init__(self, workers: int) -> None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else (
            "spawn")  # Windows
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            multiprocessing.set_forkserver_preload(PRELOAD)
        self._ex = ProcessPoolExecutor(workers, mp_context=ctx)
        self._free = 0  # workers ready for a job (one counts once it has started)
        self._holds: list[float] = []  # free workers kept for CHAIN jobs, until then
        self._starting = True  # no worker is ready yet
        self._here = False  # this process is running a job
        self._queue: list[_Job] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        threading.Thread(target=self._feed, name="capplan-jobs", daemon=True).start()
        # launching the workers blocks until the fork server has imported: not in _feed
        threading.Thread(target=self._start, args=(workers,), name="capplan-start",
                         daemon=True).start()

    def _start(self, workers: int) -> None:
        """Start every worker: each counts as free once it has run a job that does nothing."""
        for i in range(workers):
            try:
                job = self._ex.submit(_ready)
            except BaseException:  # a broken pool: jobs go to it and fail there, saying why
                with self._cond:
                    self._starting = False
                    self._free += workers - i
                    self._cond.notify()
                return
            job.add_done_callback(self._started)

    def _started(self, job: Future[Any]) -> None:
        with self._cond:
            self._starting = False
            self._free += 1
            self._cond.notify()

    def submit(
        self, priority: tuple[int, float], fn: Callable[..., Any], *args: Any
    ) -> Future[Any]:
        out = _Promise()
        out.chain = priority <= CHAIN
        with self._cond:
            heapq.heappush(self._queue, (priority, next(self._order), out, fn, args))
            self._cond.notify()
        return out

    def promote(self, out: Future[Any], to: tuple[int, float] = CHAIN) -> None:
        """`out`, if still queued, takes priority `to` when that comes sooner than its own
        (CHAIN, the default: a thread now waits for a prefetched run, which then goes first,
        as a search's step)."""
        with self._cond:
            for i, (priority, order, job, fn, args) in enumerate(self._queue):
                if job is out:
                    if to < priority:
                        self._queue[i] = (to, order, job, fn, args)
                        heapq.heapify(self._queue)
                        job.chain = to <= CHAIN  # type: ignore[attr-defined]
                        self._cond.notify()
                    return

    def drop_queued(self) -> None:
        """Cancel every job not yet handed to a worker."""
        with self._cond:
            queued, self._queue = self._queue, []
        for _, _, out, _, _ in queued:
            out.cancel()

    def close(self) -> None:
        """Drop what is queued and let the workers end. A process that exits while its fork
        server is still starting a worker leaves that worker to fail on a semaphore already
        gone, printing its traceback after the command's output; waiting here avoids it."""
        self.drop_queued()
        self._ex.shutdown(wait=True, cancel_futures=True)

    def _feed(self) -> None:
        while True:
            with self._cond:
                while (where := self._where()) is None:
                    self._cond.wait(min(self._holds) - time.monotonic() if self._holds
                                    else None)
                _, _, out, fn, args = heapq.heappop(self._queue)
                here = where == "here"
            if not out.set_running_or_notify_cancel():
                self._release(here=here)
                continue
            if here:
                threading.Thread(target=self._run_here, args=(out, fn, args),
                                 name="capplan-here", daemon=True).start()
                continue
            try:
                job = self._ex.submit(fn, *args)
            except BaseException as e:  # a broken pool: the caller sees why
                out.set_exception(e)
                self._release()
                continue
            job.add_done_callback(functools.partial(self._done, out))

    def _where(self) -> str | None:
        """Where the first job in the queue runs now ("worker", taking it, or "here": this
        process), None while it must wait."""
        if self._holds:  # expired holds go first: _feed's wait must not time out at once
            now = time.monotonic()
            self._holds = [t for t in self._holds if t > now]
        if not self._queue:
            return None
        chain = self._queue[0][0] <= CHAIN
        if self._free > (0 if chain else len(self._holds)):
            self._free -= 1
            if chain and self._holds:
                self._holds.pop(0)
            return "worker"
        if self._starting and not self._here:
            self._here = True
            return "here"
        return None

    def _run_here(self, out: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """A job in this process (while the workers start)."""
        try:
            result = fn(*args)
        except BaseException as e:
            out.set_exception(e)
        else:
            out.set_result(result)
        finally:
            self._release(here=True)

    def _release(self, *, here: bool = False) -> None:
        with self._cond:
            if here:
                self._here = False
            else:
                self._free += 1
            self._cond.notify()

    def _done(self, out: Future[Any], job: Future[Any]) -> None:
        with self._cond:
            self._free += 1
            if getattr(out, "chain", False) and getattr(out, "awaited", False):
                # its search is about to ask for its next step
                self._holds.append(time.monotonic() + HOLD_S)
            self._cond.notify()
        exc = job.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(job.result())


_DISPATCHERS: dict[int, _Dispatcher] = {}
_LOCK = threading.Lock()


def _dispatcher(workers: int) -> _Dispatcher:
    """One set of `workers` processes, started on first use and kept for the process's life."""
    with _LOCK:
        if workers not in _DISPATCHERS:
            _DISPATCHERS[workers] = _Dispatcher(workers)
        return _DISPATCHERS[workers]


def promote(workers: int, future: Future[Any], to: tuple[int, float] = CHAIN) -> None:
    """`future`, a job submitted with `workers`, if still queued, takes priority `to` when
    that comes sooner (`_Dispatcher.promote`; CHAIN: a thread waits for it now)."""
    with _LOCK:
        d = _DISPATCHERS.get(workers)
    if d is not None:
        d.promote(future, to)


def drop_queued() -> None:
    """Cancel every simulation not yet started (the caller was interrupted)."""
    with _LOCK:
        dispatchers = list(_DISPATCHERS.values())
    for d in dispatchers:
        d.drop_queued()


@atexit.register
def _close_all() -> None:
    """Every dispatcher's workers ended before the interpreter's own teardown."""
    with _LOCK:
        dispatchers = list(_DISPATCHERS.values())
    for d in dispatchers:
        d.close()


def _ready() -> None:
    """A job that does nothing: running it starts a worker."""


def warm(workers: int) -> None:
    """Start the workers now (the fork server imports while the caller goes on)."""
    _dispatcher(workers)


def submit(
    workers: int, priority: tuple[int, float], mix: TrafficMix, pool: str, replicas: int,
    **kwargs: Any,
) -> Future[tuple[SimResult, float]]:
    """`simulate_timed(mix, pool, replicas, **kwargs)` in a worker process."""
    return _dispatcher(workers).submit(priority, _simulate, mix, pool, replicas, kwargs)


def _simulate(
    mix: TrafficMix, pool: str, replicas: int, kwargs: dict[str, Any]
) -> tuple[SimResult, float]:
    from capplan.sim.run import simulate_timed

    return simulate_timed(mix, pool, replicas, **kwargs)


class InOrder:
    """Pools sized side by side tell their progress as if sized one after another: pool i's
    log lines and start wait until every pool before it has finished, so the output is the
    serial run's, line for line. A pool that fails ends the telling (serially, the pools
    after it would not have run)."""

    def __init__(
        self,
        names: list[str],
        log: Callable[[str], None] | None,
        on_pool: Callable[[str, int, int], None] | None,
    ) -> None:
        self._names = names
        self._log = log
        self._on_pool = on_pool
        self._lines: list[list[str]] = [[] for _ in names]
        self._done = [False] * len(names)
        self._failed = [False] * len(names)
        self._current = 0
        self._halted = False
        self._lock = threading.Lock()
        if names and on_pool is not None:
            on_pool(names[0], 0, len(names))

    def logger(self, i: int) -> Callable[[str], None] | None:
        """The log of pool i (None when nobody listens)."""
        if self._log is None:
            return None

        def tell(line: str) -> None:
            with self._lock:
                if self._halted:
                    return
                if i == self._current:
                    assert self._log is not None
                    self._log(line)
                else:
                    self._lines[i].append(line)

        return tell

    def finished(self, i: int, *, failed: bool = False) -> None:
        """Pool i is done; the next pools' waiting lines follow."""
        with self._lock:
            self._done[i] = True
            self._failed[i] = failed
            n = len(self._names)
            while not self._halted and self._current < n and self._done[self._current]:
                if self._failed[self._current]:
                    self._halted = True
                    return
                self._current += 1
                if self._current == n:
                    return
                if self._on_pool is not None:
                    self._on_pool(self._names[self._current], self._current, n)
                for line in self._lines[self._current]:
                    assert self._log is not None
                    self._log(line)
                self._lines[self._current].clear()
