"""Where `tune.run_search` runs the evaluations it keeps in flight, and the clock its pace and
time budget are read from: `Flight` (the contract), `ThreadFlight` (a device run's: threads
and the wall clock). A replay's is `tuner.offline.replay.SimulatedFlight` (simulated time, so
that the same seed replays the same search)."""

from __future__ import annotations

import concurrent.futures as cf
import time


class Flight:
    """Where `run_search` runs its evaluations, and its clock. Contract: `submit(fn, *args)`
    returns a `concurrent.futures.Future` of `fn(*args)`; `wait(futures)` blocks until at
    least one of them is done and returns the done ones (a set); `now()` is the time in
    seconds, monotonic, that the run's pace and `time_budget_s` are read from; used as a
    context manager around the search (leaving it waits for what is in flight)."""

    def submit(self, fn, *args) -> cf.Future:
        raise NotImplementedError

    def wait(self, futures) -> set:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class ThreadFlight(Flight):
    """A device run's flight: a thread per evaluation in flight (each drives a worker process,
    so the GIL is not held while it waits), the wall clock. Threads start as evaluations are
    submitted: the bound is never reached when fixed."""

    def __init__(self, workers: int):
        self.pool = cf.ThreadPoolExecutor(max_workers=workers)

    def submit(self, fn, *args) -> cf.Future:
        return self.pool.submit(fn, *args)

    def wait(self, futures) -> set:
        return cf.wait(futures, return_when=cf.FIRST_COMPLETED)[0]

    def now(self) -> float:
        return time.monotonic()

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(wait=True)
