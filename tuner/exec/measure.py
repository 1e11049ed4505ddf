"""Verify and time one compiled candidate. Runs inside a benchmark worker process.

The candidate is assumed to be trying to win without doing the work, so a timed call must
be one it cannot tell from a checked one:

* Checks: random inputs (never zeros) whose float64 reference is known, outputs filled
  before the launch with a poison drawn at random each time (NaN, or a random finite value:
  a kernel that computes only when it sees NaN is caught), every buffer between guard bands,
  inputs compared with their pristine copies afterwards, a per-dtype tolerance; two checks
  (tuner/exec/checks.py).
* Range: one check more on inputs scaled by RANGE_SCALE (exact in binary floating point; whole
  rows and outliers in the others, `checks._scaled`), held
  to torch's own error there and to its sensitivity to its inputs' rounding (torch_slack): a
  kernel correct only on inputs of the checks' magnitude (a softmax or cross-entropy without
  the row max, an accumulation in a narrower type that overflows) fails it, where torch's own
  implementation in the op's dtype stays finite (an op whose own implementation overflows, or
  leaves its domain, at that range is not held to it).
* Timing rotates over several buffer sets (distinct inputs, outputs and addresses), so no two
  consecutive calls see the same buffers, and each timed call's outputs are poisoned afresh
  before it, untimed (no call finds its own earlier result there to skip the work on); after
  every chunk of timed calls, outside the timed region, the outputs of each set are checked
  against that set's reference, its inputs and guard bands against their pristine state, and
  its outputs poisoned again. The order of the sets and the length of each chunk are drawn
  at random: a kernel that knew which of its calls would be checked (each set's last call of
  a chunk) could do the work on those alone. A candidate whose timed outputs are wrong is
  WRONG_RESULT, with the call that showed it.
* History: single calls on inputs the candidate has never seen, their references made only
  after the calls, are timed after the search's timing; a candidate much faster on buffers
  it has seen (a result cache, a skip when handed the same buffers, a copy of a reference
  found in device memory) is SUSPECT, with both times (tuner/exec/history.py). The re-timings
  that name a winner (`time_many`) end with the same check.
* Physics: a median under `floor_s` (the time the op's bytes or FLOPs take at the device's
  measured peaks, with a margin: tuner/exec/evaluate.py) is SUSPECT, with the bound it broke,
  after a re-check on brand-new inputs.

Timing (`bench`, `Rotation`, here): a warm-up and a number of repetitions sized from an estimate, caches flushed before
each, raw samples kept, and an early stop once a candidate is clearly slower than the best.
"""

from __future__ import annotations

import math
import random
import statistics
import time
import traceback
from typing import Any, Callable

from tuner.backends.base import BackendUnavailable, ClockMismatch, OutsideKill
from tuner.core.ops import Op, load_op
from tuner.core.settings import Settings
from tuner.core.tolerance import torch_slack
from tuner.core.values import Measurement, OpSpec, Status
from tuner.exec import checks
from tuner.exec.history import check_history

_rng = random.SystemRandom()
# Where this process's measurements spent their time (seconds per phase, counts): read by the
# worker's "stats" request, so that a slow sweep can be told apart from a slow harness.
TIMES: dict[str, float] = {"measures": 0, "load_s": 0.0, "check_s": 0.0, "bench_s": 0.0, "reps": 0}


class Rotation:
    """The buffer sets that timed calls go through (one per pooled seed, up to `n`), in an order
    drawn at random: consecutive calls never see the same buffers, and each set's outputs are
    checked after every chunk of timed calls (`verify`, outside the timed region)."""

    def __init__(self, backend, kernel, op: Op, n: int = 3):
        self.backend, self.kernel = backend, kernel
        pooled = checks.pooled(op, backend)
        self.sets = [checks.BufferSet(backend, op, *checks.device_set(backend, op, seed, ref))
                     for seed, ref in _rng.sample(pooled, min(n, len(pooled)))]
        self.last = -1  # the set of the last call
        self.next: int | None = None  # the set `before` made ready for the next call
        self.calls = 0
        self.used: set[int] = set()  # sets called since the last verify

    def before(self) -> None:
        """Untimed, ahead of each timed call (the backend's `before`): picks the set of the next
        call (any but the last one's) and fills its outputs with a fresh poison. No timed call
        finds the result an earlier call left in its outputs: a kernel that computes a sample
        of its result, finds it already there and skips the rest would otherwise be timed
        skipping, and for a kernel of a few microseconds the history check cannot tell."""
        self.next = self._any_but_last()
        self.sets[self.next].poison()

    def call(self) -> None:
        k, self.next = self.next, None
        self._call(self._any_but_last() if k is None else k)  # None: a warm-up call, not timed

    def _any_but_last(self) -> int:
        return _rng.choice([j for j in range(len(self.sets)) if j != self.last] or [0])

    def _call(self, k: int) -> None:
        self.last = k
        self.calls += 1
        self.used.add(k)
        self.backend.launch(self.kernel, self.sets[k].args)

    def decoy_round(self) -> None:
        """One more call on each set, its outputs holding another set's result: whatever the
        poisons drawn while timing, a kernel that skips work on outputs that look done is
        caught (raises Caught)."""
        n = len(self.sets)
        if n < 2:
            return
        self.backend.sync()
        for k, s in enumerate(self.sets):
            s.poison(self.sets[(k + 1) % n].ref, always=True)
        order = _rng.sample(range(n), n)
        if order[0] == self.last:
            order.reverse()
        for k in order:
            self._call(k)
        self.verify()

    def verify(self) -> None:
        """Raise Caught when a set's last timed call did not do the work."""
        self.backend.sync()
        used, self.used = self.used, set()
        n = len(self.sets)
        for k in sorted(used):
            decoys = self.sets[(k + 1) % n].ref if n > 1 else None
            why, _, _ = self.sets[k].verdict(decoys)
            if why:
                raise checks.Caught(f"a timed call's result was wrong (buffer set {k + 1} of {len(self.sets)}, "
                             f"after {self.calls} timed calls; its checks had passed): {why}")


_CHUNK = 32  # timed repetitions queued before the host waits and checks (on average: drawn per chunk)


def bench(backend, fn: Callable[[], None], settings: Settings, best_s: float | None = None,
          between: Callable[[], None] | None = None,
          before: Callable[[], None] | None = None) -> tuple[list[float], bool]:
    """Raw samples of `fn` in seconds, and whether timing stopped early (clearly slower).
    `between` runs after the warm-up and after every chunk of timed calls, untimed (the
    rotation's checks: it raises to stop); `before` ahead of every timed call, untimed (the
    rotation's poison: see the backends' `time_calls`)."""
    first = backend.time_call(fn, before)  # also a warm-up: first-touch, lazy loading
    t0 = time.perf_counter()
    est = min(first, backend.time_call(fn, before))
    # The budget is wall time: a repetition costs its cache flush and launch too. Sized from
    # the kernel's time alone, a 20 us kernel on the cpu backend (whose flush writes twice the
    # last-level cache, milliseconds) got max_reps repetitions: ~15 s per candidate, ~90 s
    # for the re-timing of a 3-evaluation run.
    per_rep = max(est, time.perf_counter() - t0, 1e-7)
    n_warm = int(min(100, settings.warmup_s / max(est, 1e-7)))
    for _ in range(n_warm):
        fn()
    backend.sync()
    if between is not None:
        between()
    reps = int(max(settings.min_reps, min(settings.max_reps, settings.bench_budget_s / per_rep)))
    samples: list[float] = []
    while len(samples) < reps:
        # In chunks (queued, waited for once): min_reps first, so that a clearly slower
        # candidate stops as early as before, then larger ones.
        chunk = settings.min_reps if not samples else _rng.randint(_CHUNK // 2, _CHUNK * 3 // 2)
        samples.extend(backend.time_calls(fn, min(chunk, reps - len(samples)), before))
        if between is not None:
            between()
        if (best_s is not None and len(samples) >= settings.min_reps
                and statistics.median(samples) > settings.early_stop_factor * best_s):
            return samples, True
        if settings.precision > 0 and len(samples) >= _PRECISE_MIN and precise(samples, settings.precision):
            break
    return samples, False


def _forgiving_one_late_start(what: str, step: Callable[[], Any]) -> Any:
    """`step()` (calls of a kernel: its checks, its timing, its calls on fresh buffers), run once
    more after a pause when its kernel's process began its calls late (ClockMismatch): a loaded
    machine delays a process's wake-up as a kernel that goes on working after it answered does
    (an honest 9 us C kernel's calls began 260 us late on a 2-core machine under a test suite).
    What the first round measured is dropped; only a second late round counts against the
    kernel. A kernel that answers early gains only if it does so on most calls, and then it is
    late in both rounds."""
    try:
        return step()
    except ClockMismatch:
        time.sleep(_LATE_PAUSE_S)
    try:
        return step()
    except ClockMismatch as e:
        raise ClockMismatch(f"{e} (in two rounds of {what})") from None


_LATE_PAUSE_S = 0.1  # between the two rounds: long enough for a passing load to pass


_PRECISE_MIN = 32  # samples before the spread is trusted to say the median is known


def precise(samples: list[float], precision: float) -> bool:
    """Whether the median of `samples` is known to within `precision` (relative standard
    error). The spread is read from the interquartile range, which a few outliers (a clock
    step, another process) do not inflate: for normal noise sigma = IQR / 1.349, and the
    median's standard error is 1.2533 sigma / sqrt(n). A stable GPU kernel (IQR ~1 %) gets
    there in about a hundred repetitions, a noisy one runs to its time budget."""
    q = statistics.quantiles(samples, n=4)
    med = statistics.median(samples)
    return med > 0 and 0.929 * (q[2] - q[0]) / math.sqrt(len(samples)) <= precision * med


def prepare(backend, spec: OpSpec) -> None:
    """Build what the first measurement of `spec` needs before it can check a kernel: the live
    op (a problem file's is drawn and run on the host), its pooled verification sets on the
    device with their references, and torch's own error on one (the tolerance). Sent while the
    model writes, so that its first candidate is timed seconds after it compiles, not after
    all of this (4-5 s at 8192x8192 on an H200)."""
    op = load_op(spec)
    for seed, ref in checks.pooled(op, backend):
        pristine, ref_dev = checks.device_set(backend, op, seed, ref)
    torch_slack(op, pristine, ref_dev)
    backend.sync()


def measure(backend, artifact: str, spec: OpSpec, settings: Settings,
            best_s: float | None = None, reference_s: float | None = None,
            floor: tuple[float, str] | None = None) -> Measurement:
    """`floor`: (seconds, what bound they are) under which no honest kernel runs here."""
    op = load_op(spec)
    floor_s, bound = floor if floor else (None, "")
    t0 = time.perf_counter()
    TIMES["measures"] += 1
    try:
        kernel = backend.load(artifact, op)
    except (BackendUnavailable, OutsideKill):
        raise  # the tool's or the machine's failure, not the candidate's
    except Exception as e:
        return Measurement(Status.RUNTIME_ERROR, detail=f"load failed: {type(e).__name__}: {e}"[:2000])
    finally:
        t1 = time.perf_counter()
        TIMES["load_s"] += t1 - t0
    max_abs = max_rel = 0.0
    t2 = None  # when timing began
    try:
        for seed, ref in _rng.sample(checks.pooled(op, backend), 2):
            why, a, r = _forgiving_one_late_start("checks", lambda: checks.check(backend, kernel, op, seed, ref))
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if why:
                return Measurement(Status.WRONG_RESULT, max_abs_err=a, max_rel_err=r,
                                   detail=f"{why} (input seed {seed})")
        why = _forgiving_one_late_start("checks", lambda: checks.range_check(backend, kernel, op))
        if why:
            return Measurement(Status.WRONG_RESULT, max_abs_err=max_abs, max_rel_err=max_rel, detail=why)
        rotation = Rotation(backend, kernel, op)
        t2 = time.perf_counter()
        samples, stopped = _forgiving_one_late_start(
            "timing", lambda: bench(backend, rotation.call, settings, best_s, rotation.verify, rotation.before))
        rotation.decoy_round()
        TIMES["reps"] += len(samples)
        median = max(statistics.median(samples), 1e-12)  # 0 s is suspect, not a division by zero
        history, retimed = (None, None) if stopped else _forgiving_one_late_start(
            "calls on fresh buffers", lambda: check_history(backend, kernel, op, median, rotation))
    except checks.Caught as e:
        return Measurement(Status.WRONG_RESULT, max_abs_err=max_abs, max_rel_err=max_rel, detail=str(e))
    except ClockMismatch as e:
        return Measurement(Status.SUSPECT, max_abs_err=max_abs, max_rel_err=max_rel, detail=str(e))
    except OutsideKill:
        raise  # the machine's failure: the worker reports it, the request is sent once more
    except Exception as e:  # a candidate that raises at run time (e.g. a Triton launch error)
        tb = traceback.format_exception_only(type(e), e)
        return Measurement(Status.RUNTIME_ERROR, detail="".join(tb).strip()[:2000])
    finally:
        t3 = time.perf_counter()
        TIMES["check_s"] += (t2 or t3) - t1
        TIMES["bench_s"] += t3 - t2 if t2 is not None else 0.0
    if history:
        return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel, history)
    detail = f"stopped early: slower than {settings.early_stop_factor:g}x the best" if stopped else ""
    if retimed:
        detail = (f"timed again at the calls on new buffers, which read slower than its {median * 1e6:.1f} us "
                  f"median; so did its calls on the timed buffers there: {statistics.median(retimed) * 1e6:.1f} "
                  f"us median of {len(retimed)}, kept (the machine was slower then, or the kernel was)")
        samples, median = list(retimed), statistics.median(retimed)
    beats = floor_s is not None and median < floor_s
    if beats or (reference_s and median * settings.suspect_speedup < reference_s):
        # Too good to be true until shown otherwise: re-check on inputs never seen before.
        claim = (f"{floor_s / median:.2f}x faster than this device can run it ({bound})" if beats
                 else f"{reference_s / median:.1f}x faster than the reference")
        for _ in range(2):
            seed = _rng.randrange(1, 2**31)
            why, _, _ = checks.check(backend, kernel, op, seed, checks.reference(op, seed, backend.data_device()))
            if why:
                return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                                   f"{claim}, but on fresh inputs: {why}")
        if beats:
            return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                               f"{claim}; correct on fresh inputs, but no kernel beats the hardware: "
                               f"a cheat the checks do not see, or a ceiling measured too low")
        detail = f"{claim}; re-verified on fresh inputs"
    return Measurement(Status.OK, tuple(samples), max_abs, max_rel, detail)



class _ReferenceCall:
    """The torch reference as a timed call, cold as a kernel's call is: `before` evicts its
    inputs and its last call's outputs, whose memory the allocator hands the next call's
    outputs (Backend.evict; nothing where time_call flushes the whole cache)."""

    def __init__(self, backend, op, xs: list):
        self.backend, self.op, self.xs = backend, op, xs
        self.inputs = [x for x in xs if hasattr(x, "untyped_storage")]
        self.last: list = []

    def call(self) -> None:
        out = self.op.torch_impl(self.xs)
        self.last = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if hasattr(t, "untyped_storage")]

    def before(self) -> None:
        self.backend.evict(self.inputs + self.last)
        self.last = []


def time_reference(backend, spec: OpSpec, settings: Settings) -> list[float]:
    """Samples of the torch implementation a user would run today, on the same device."""
    op = load_op(spec)
    where = backend.data_device()
    try:
        xs = op.make_inputs(1, where) if where is not None else [backend.to_device(x) for x in op.make_inputs(1)]
        ref = _ReferenceCall(backend, op, xs)
        samples, _ = bench(backend, ref.call, settings, before=ref.before)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        # The first thing a run puts on the device: say what to change, not only what broke.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MemoryError(f"{spec.key}: the inputs and the torch reference at this shape do not fit "
                          f"the device's memory ({first[:300]}); pick a smaller shape") from None
    return samples


def recheck(backend, artifact: str, spec: OpSpec) -> str | None:
    """One more verification on brand-new inputs (for the winner); the reason it fails, or None.
    Its reference is made only after the kernel has run (`checks.check_reference_after`)."""
    op = load_op(spec)
    kernel = backend.load(artifact, op)
    try:
        # A second round draws new inputs too: none the kernel has been called on.
        why, _, _ = _forgiving_one_late_start(
            "checks", lambda: checks.check_reference_after(backend, kernel, op, _rng.randrange(1, 2**31)))
    except (OutsideKill, BackendUnavailable):
        raise
    except Exception as e:  # its process died under it (cpu), a launch error
        return f"{type(e).__name__}: {e}"[:2000]
    return why


def round_order(n: int, r: int) -> list[int]:
    """The order of n contenders in round r of an interleave: each round starts one place
    later, so that over n rounds each takes every place once. A place that reads slower (a
    compute-bound kernel timed right after another heats the chip: one attention kernel read
    2298-2408 us by its place) then falls on all alike, where a fixed order hands it to one."""
    return [(r + j) % n for j in range(n)]


RETIMED_SUSPECT = "re-timing, suspect: "  # how time_many's reasons that are not wrong results begin


def retimed_status(reason: str) -> Status:
    """The status a candidate gets for `time_many`'s reason: SUSPECT for a time that depends on
    the calls before it or a clock that did not fit, WRONG_RESULT for wrong re-timed calls."""
    return Status.SUSPECT if reason.startswith(RETIMED_SUSPECT) else Status.WRONG_RESULT


def time_many(backend, artifacts: list[str], spec: OpSpec, settings: Settings,
              rounds: int = 5, with_reference: bool = False) -> list[list[float] | str]:
    """Re-time several candidates interleaved (A B C, B C A, C A B, ...: `round_order`, the
    rounds a multiple of the contenders) so drift and a slower place in the round hit all
    alike (a fixed order handed the slow first place to the search's fastest, always first),
    each on its own rotation of buffer sets, checked as the first timing was.
    A candidate whose re-timed calls are wrong gets the reason instead of samples, and so does
    one whose calls on new buffers after the interleave are slower than its re-timed median
    (`check_history`, as after a first timing): a kernel's state can outlive its first measurement
    (a GPU kernel's scratch memory that the caching allocator hands back, in a worker serving
    the whole run), and one honest through its first timing could keep its results from then
    on, for the pooled inputs these rotations reuse.
    `with_reference`: the torch reference is timed in the same interleave, its samples last
    (a speedup measured while the machine was busy then compares like with like)."""
    op = load_op(spec)
    kernels = [backend.load(a, op) for a in artifacts]
    rotations = [Rotation(backend, k, op) for k in kernels]
    out: list[list[float] | str] = [[] for _ in kernels]
    if with_reference:
        where = backend.data_device()
        xs = op.make_inputs(1, where) if where is not None else [backend.to_device(x) for x in op.make_inputs(1)]
        ref = _ReferenceCall(backend, op, xs)
        out.append([])
    contenders = len(out)
    rounds = -(-rounds // contenders) * contenders  # each place alike; the same time each, in shorter rounds
    short = settings.replace(bench_budget_s=settings.bench_budget_s / rounds, min_reps=3, precision=0.0)
    late: set[int] = set()  # kernels whose process was once seen starting its calls late
    for r in range(rounds):
        for i in round_order(contenders, r):
            if i == len(rotations):  # the reference
                s, _ = bench(backend, ref.call, short, before=ref.before)
                out[-1].extend(s)
                continue
            rot = rotations[i]
            if isinstance(out[i], str):
                continue
            try:
                s, _ = bench(backend, rot.call, short, between=rot.verify, before=rot.before)
                rot.decoy_round()
            except checks.Caught as e:
                out[i] = f"re-timing: {e}"
                continue
            except ClockMismatch as e:
                # A busy machine delays a kernel process's wake-up as a kernel that goes on
                # working after it answered does (a 2-core machine under a test suite: an
                # honest 21 us kernel's calls began 262 us late). This round's samples are
                # dropped; only a second time counts against the kernel.
                if i not in late:
                    late.add(i)
                    continue
                out[i] = f"{RETIMED_SUSPECT}{type(e).__name__}: {e} (twice)"[:2000]
                continue
            except (OutsideKill, BackendUnavailable):
                raise
            except Exception as e:  # its process died under it (cpu), its clock did not fit the judge's
                out[i] = f"re-timing: {type(e).__name__}: {e}"[:2000]
                continue
            out[i].extend(s)
    for i, rot in enumerate(rotations):
        if isinstance(out[i], str) or not out[i]:
            continue
        median = max(statistics.median(out[i]), 1e-12)
        try:
            why, retimed = _forgiving_one_late_start(
                "calls on fresh buffers", lambda: check_history(backend, kernels[i], op, median, rot))
        except (OutsideKill, BackendUnavailable):
            raise
        except checks.Caught as e:  # wrong on new buffers
            out[i] = f"re-timing: {e}"
            continue
        except ClockMismatch as e:
            out[i] = f"{RETIMED_SUSPECT}{type(e).__name__}: {e}"[:2000]
            continue
        except Exception as e:  # its process died under it (cpu), a launch error
            out[i] = f"re-timing: {type(e).__name__}: {e}"[:2000]
            continue
        if why:
            out[i] = f"{RETIMED_SUSPECT}{why}"
        elif retimed:
            out[i] = list(retimed)
    return out

