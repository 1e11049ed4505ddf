"""The history check: whether a kernel's time depends on the calls before it (used by
tuner/exec/measure.py after every timing and re-timing).

Contract: `check_history(backend, kernel, op, median, rotation)` (`rotation`: the
`measure.Rotation` the kernel was timed through) returns (why the kernel is
SUSPECT, or None; the samples that replace its timed ones, or None), and raises
`checks.Caught` when a call on new buffers was wrong."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, NamedTuple

from tuner.core.ops import Op
from tuner.exec import checks

_rng = random.SystemRandom()

_FRESH_CALLS = 3      # single calls on never-seen inputs, after the timing
_HISTORY_FACTOR = 2.0  # where the backend states none (`Backend.history_factor`)
_HISTORY_S = 20e-6     # absolute slack where the backend states none (`Backend.history_slack_s`)


class _Round(NamedTuple):
    """One history round: the fastest of its lone calls on never-seen buffers, how many there
    were, and the calls on the timed buffers right before them (`_IN_FLOW` before each)."""
    cold: float
    lone: int
    flow: tuple[float, ...]


def check_history(backend, kernel, op: Op, median: float,
                  rotation: Any) -> tuple[str | None, tuple[float, ...] | None]:
    """(why the kernel's time depends on the calls before it, or None; the samples that replace
    its timed ones, or None). Rounds `_HISTORY_PAUSE_S` apart (other work on the machine can
    hold all of one round's lone calls, which follow each other within milliseconds: an honest
    35 us C kernel read 2 ms three times in a row on a busy CI machine), until one passes (its
    lone calls near the median timed before any round) or two flag (SUSPECT); at most
    `_HISTORY_ROUNDS`. A round whose lone calls were slow and whose calls on the timed buffers
    right before them were as slow (within the factor) does not flag: the machine was slower
    then (an honest C softmax's calls on a 2-core machine read 0.95 and 2.0 ms by turns, whole
    seconds at a time), or the kernel slowed the calls around the check. Either way the timed
    buffers' calls of that round become the kernel's samples when no round passes: a kernel
    that slowed them to be excused is recorded at their time, at least its work on new buffers
    over the factor, which is what it could have gained without the trick."""
    made: list = []  # every set stays alive until the end: later rounds' addresses are new too
    factor = getattr(backend, "history_factor", _HISTORY_FACTOR)
    slack = getattr(backend, "history_slack_s", _HISTORY_S)

    def slower(t: float, than: float) -> bool:
        return t > factor * than and t - than > slack
    flagged: list[_Round] = []
    excused: list[_Round] = []
    for k in range(_HISTORY_ROUNDS):
        if k:
            time.sleep(_HISTORY_PAUSE_S)
        r = _round(backend, kernel, op, rotation, made)
        if not slower(r.cold, median):
            return None, None
        # Excused by the factor alone, never the absolute slack: its time is then theirs, and
        # that bounds what it gains (by the slack, a 1 us cheat of 20 us work would be excused).
        (flagged if r.cold > factor * statistics.median(r.flow) else excused).append(r)
        if len(flagged) == 2:
            return (f"{r.cold / median:.1f}x slower on buffers it had never seen ({r.cold * 1e6:.1f} us, the "
                    f"fastest of {r.lone} single calls) than on the buffers it was timed on ({median * 1e6:.1f} us "
                    f"median): its time depends on the calls before it (results kept between calls, or work "
                    f"skipped on buffers seen before); the calls on the timed buffers right before the single "
                    f"ones: {statistics.median(r.flow) * 1e6:.1f} us median (in two rounds, at least "
                    f"{_HISTORY_PAUSE_S:g} s apart)"), None
    return None, min((r.flow for r in excused), key=statistics.median)


_HISTORY_ROUNDS = 4  # at most: until one passes or two flag (rounds the machine's slowness excused in between)
_HISTORY_PAUSE_S = 1.0  # between the history check's rounds: a passing load passes
_IN_FLOW = 3  # calls on the rotation's sets right before each lone call (see _round)


def _round(backend, kernel, op: Op, rotation: Any, made: list) -> _Round:
    """What a kernel takes on inputs it has never seen (`check_history` judges it). Single calls on inputs
    it has never seen (each from a brand-new seed, in new buffers, outputs poisoned, its
    reference made only after the call), timed as the timed calls are and then checked: an
    honest kernel takes about its median; one that skips work on buffers or inputs it has
    seen (a result cache keyed by the inputs, wherever it keeps it: even an uninitialised
    local array that the next call finds where the last one left it), or that copies the
    reference of its inputs from device memory (none exists here while it runs), is fast only
    on the rotation's, and one that skips work here too is wrong here (raises Caught). Pooled seeds would not do: the rotation's
    inputs come from the pool, and a cache keyed by their contents would hit here too.
    A sample in which the device may have waited for the host's launch (the backend's
    `last_call_clean`: a lone call on a loaded machine) may read slow: while fewer than three
    were clean, more fresh sets are made (one more batch), never a second call on the same
    ones (a kernel could answer it from the first); the fastest of all of them is compared.
    Each lone call comes in the flow of timed calls: right after `_IN_FLOW` calls on the
    rotation's sets, as the timed calls follow each other (whether the timed buffers were slow
    at that moment too tells a slow machine from buffers the kernel has not seen; a kernel that
    saw the first lone call's new inputs knows the calls around the next ones and could slow
    them, so they excuse a round only at the price `check_history` states). After a pause (the new inputs being
    made) a kernel whose threads another process's work holds off its cores waits for the
    scheduler's next tick: 147 us at 2 ms apart, 8 ms at 5 ms apart (bench/RESULTS.md). The
    calls before it are on buffers the kernel has seen, so they tell it nothing of what comes
    next. Where a kernel can read memory beyond its buffers (a GPU's), each set is made after
    those calls, right before its own: made earlier, its inputs would lie where the calls before
    could find them and compute their result ahead. Where kernels are isolated (a process that
    maps a buffer at its first call), the sets are made first: making one is host work, a
    pause."""
    clean, unclean = [], []
    in_flow: list[float] = []  # the timed buffers' calls right before the lone ones
    ahead = backend.isolated_kernels

    def new_set():
        # Its reference is made after the calls: while it runs, none of these inputs' results
        # exists anywhere a kernel could copy it from (see checks.check_reference_after).
        return checks.unreferenced_set(backend, op, _rng.randrange(1, 2**31))

    for _ in range(2):  # a second batch only while too few samples were clean
        n = _FRESH_CALLS - len(clean)
        made.append([new_set() for _ in range(n)] if ahead else [])  # kept: new addresses too
        for k in range(n):
            in_flow += backend.time_calls(rotation.call, _IN_FLOW, rotation.before)
            if not ahead:
                made[-1].append(new_set())
            fresh = made[-1][k]
            t = backend.time_call(lambda: backend.launch(kernel, fresh.args))
            (clean if getattr(backend, "last_call_clean", True) else unclean).append(t)
        for fresh in made[-1]:
            checks.make_reference(backend, op, fresh)
            why, _, _ = fresh.verdict()
            if why:
                raise checks.Caught(f"a call on buffers it had not seen before was wrong (its checks and timed "
                             f"calls had passed): {why}")
        if len(clean) >= _FRESH_CALLS:
            break
    # Every lone call counts, clean or not: a host's delay only ever adds to a call's time, so
    # the fastest of all is never below what the kernel took. More sets were made only so that
    # enough calls stood a chance of running undelayed.
    return _Round(min(clean + unclean), len(clean + unclean), tuple(in_flow))

