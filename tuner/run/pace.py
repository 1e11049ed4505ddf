"""How many evaluations a search keeps in flight: enough to keep the devices busy, no more
(`in_flight_cap`), from the pace a run's evaluations finish at (`Pace`). `tune.run_search`
asks both before each of the search's own asks."""

from __future__ import annotations

import math
import statistics

from tuner.core.values import Record, Status

IN_FLIGHT_START = 1  # the search's own asks in flight before any evaluation has finished (`in_flight_cap`)
PACE_WINDOW, PACE_MIN = 8, 3  # the finishes a run's pace is read from (`Pace`)


def in_flight_cap(limit: int, done: int, compile_s: float | None = None, gap_s: float | None = None,
                  slots: int = 1) -> int:
    """How many evaluations a search keeps in flight while it asks configs of its own (those
    it was given to try first, the default, warm starts, `promising:`, go in flight at once up
    to `limit`): enough to keep the devices busy, no more.

    Asks made while others are in flight learn nothing from them. With one in flight per
    compile worker (15 on a 16-CPU machine), a 40-evaluation search on one GPU asked its first
    15 configs with nothing timed and each later one with 14 answers outstanding, though the
    GPU, timing one kernel at a time, was the bottleneck and the compiles were done in 0.2 s.
    So: at most `limit` (the compile workers, or a sweep's share of them); at most the answers
    so far, at least IN_FLIGHT_START (the count doubles with each generation of answers); and,
    once the run has measured its pace, what Little's law says keeps the `slots` devices fed:
    one being timed on each and one ready, plus one compiling per `gap_s` (the seconds between
    finished evaluations) that a compile takes (`compile_s`). Slow compiles (nvcc) raise it
    towards `limit`; instant ones (a replay) hold it at `slots` + 1. It never falls below
    `slots` + 1 once the answers allow: fewer would leave a device idle, the finishes would
    come further apart, and a pace read from them would hold the count down."""
    cap = min(limit, max(IN_FLIGHT_START, done))
    if compile_s is not None and gap_s is not None:
        fed = slots + 1 + (math.ceil(compile_s / gap_s) if gap_s > 0 else (0 if compile_s <= 0 else limit))
        cap = min(cap, fed)
    return max(1, cap)


class Pace:
    """The pace a run's evaluations finish at, for `in_flight_cap`: the median compile time
    of the last PACE_WINDOW builds and the median gap between the last PACE_WINDOW finishes
    (None until PACE_MIN of each are known)."""

    def __init__(self) -> None:
        self.finished: list[float] = []
        self.compiles: list[float] = []

    def add(self, record: Record, now: float) -> None:
        if record.status is Status.INVALID:
            return  # rejected by the formulas: never compiled or timed
        self.finished = (self.finished + [now])[-PACE_WINDOW - 1:]
        if record.build.status is Status.OK:
            self.compiles = (self.compiles + [max(0.0, record.build.compile_s)])[-PACE_WINDOW:]

    def compile_s(self) -> float | None:
        return statistics.median(self.compiles) if len(self.compiles) >= PACE_MIN else None

    def gap_s(self) -> float | None:
        if len(self.finished) < PACE_MIN + 1:
            return None
        return statistics.median(b - a for a, b in zip(self.finished, self.finished[1:]))
