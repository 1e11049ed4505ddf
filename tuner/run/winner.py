"""Naming a winner under timing noise, for `tuner.run.tune`.

Two medians taken minutes apart differ by drift (clocks, temperature, other work on the
machine) that one interleave does not have. So the search anchors a new timing that is close
to the incumbent's against it (`tune.run_search`, within `drift_margin`, which follows the drift
the anchors so far measured), and at the end a winner is named only after the finalists (the
fastest few, and every other within the noise of the best) were re-timed in one interleave
and the fastest re-checked on fresh inputs (`pick_winner`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

from tuner.core.settings import Settings
from tuner.core.values import Measurement, Record, Status
from tuner.exec.evaluate import Evaluator
from tuner.exec.measure import retimed_status
from tuner.run.report import Progress
from tuner.run.store import Store

ANCHOR_DRIFT = "drift"  # run_search's anchor margin follows the measured drift (`drift_margin`)
DRIFT_DEFAULT = 0.03  # the drift believed before anchors measured it (the offline replays' noise)
DRIFT_PRIOR_ANCHORS = 10  # ... with the weight of this many anchors
DRIFT_MARGIN = (0.01, 0.10)  # the margin's bounds


def measured_drift(records: list[Record]) -> tuple[float | None, int]:
    """The drift between evaluations that the anchors measured, and how many anchors: each
    anchored record's own median over its figure against the incumbent is its evaluation's
    drift against the incumbent's; their robust spread (1.4826 x the median absolute deviation
    of the log ratios). None with fewer than two anchors."""
    logs = [math.log(r.seconds / r.anchored_s) for r in records
            if r.status is Status.OK and r.anchored_s and r.seconds > 0 and r.anchored_s > 0]
    if len(logs) < 2:
        return None, len(logs)
    centre = statistics.median(logs)
    return 1.4826 * statistics.median(abs(x - centre) for x in logs), len(logs)


def drift_margin(records: list[Record]) -> float:
    """How much slower than the incumbent a new timing may be and still be timed against it:
    twice the drift between evaluations (a config's median taken minutes after the
    incumbent's, under other clocks and load), within `DRIFT_MARGIN`. The drift is what the
    anchors so far measured (`measured_drift`), pooled with `DRIFT_DEFAULT` weighted as
    `DRIFT_PRIOR_ANCHORS` anchors (a spread from a dozen anchors alone varies by a third, and a
    margin too small hides the faster configs again). A quiet device re-times less; a noisy
    one more, where a faster config is more often hidden behind its evaluation's drift."""
    spread, n = measured_drift(records)
    k = DRIFT_PRIOR_ANCHORS
    drift = math.sqrt((k * DRIFT_DEFAULT ** 2 + n * (spread or 0.0) ** 2) / (k + n))
    return min(max(2.0 * drift, DRIFT_MARGIN[0]), DRIFT_MARGIN[1])


def finalists(records: list[Record], at_least: int = 3, at_most: int = 8, margin: float = 0.05) -> list[Record]:
    """The kernels to re-time interleaved before a winner is named, fastest first, one per
    binary: the fastest `at_least`, and every other within the noise of the best, up to
    `at_most`, ranked by the figure the search ranked them by (`Record.search_s`: where a
    config was timed against the incumbent in one interleave, the incumbent's figure times
    their ratio, which has no drift between evaluations in it; else its own median). Within
    the noise: at most `margin` slower, or more where the two medians' own uncertainty says so
    (twice the sum of their relative standard errors, from each timing's IQR and sample
    count): a config measured minutes later under other drift may be the faster one, and only
    an interleave tells them apart."""
    ok = sorted((r for r in records if r.status is Status.OK), key=lambda r: r.search_s)
    top, seen = [], set()
    for r in ok:
        if r.build.binary_hash not in seen:
            seen.add(r.build.binary_hash)
            top.append(r)
    if not top:
        return []
    best = top[0]

    def rel_err(r: Record) -> float:  # the median's standard error over the median, ~ 1.25 sigma/sqrt(n)
        n = len(r.measurement.samples)
        return 0.0 if n < 4 or r.seconds <= 0 else 1.25 * (r.measurement.iqr / 1.349) / math.sqrt(n) / r.seconds
    out = []
    for r in top:
        within = r.search_s <= best.search_s * (1 + max(margin, 2 * (rel_err(best) + rel_err(r))))
        if len(out) < max(1, at_least) or (within and len(out) < max(at_least, at_most)):
            out.append(r)
        else:
            break
    return out


def pick_winner(store: Store, evaluator: Evaluator, settings: Settings,
                on_progress: Callable[[Progress], None] | None = None) -> Record | None:
    """Re-time the finalists interleaved, re-check the fastest on fresh inputs, and return it."""
    top = finalists(store.records(), settings.retime_top, settings.retime_max, settings.retime_margin)
    if not top:
        return None
    # The reference is re-timed in the same interleave: a speedup measured on a busy machine
    # then compares times taken under the same load.
    samples = evaluator.retime(top, with_reference=True)
    if samples is not None and samples and not isinstance(samples[-1], str) and samples[-1]:
        evaluator.reference_samples = list(samples[-1])
        evaluator.reference_s = statistics.median(samples[-1])
        evaluator.reference_retimed = True
        samples = samples[:-1]
    if samples is not None:
        retimed = []
        for r, s in zip(top, samples):
            if isinstance(s, str):  # its re-timed calls were wrong (or suspect): recorded, out of the running
                store.append(Record(r.op_key, r.skeleton_hash, r.config, r.build,
                                    Measurement(retimed_status(s), detail=s), r.device, r.toolchain,
                                    time.time(), r.trial))
                continue
            retimed.append(Record(r.op_key, r.skeleton_hash, r.config, r.build,
                                  Measurement(Status.OK, tuple(s), r.measurement.max_abs_err,
                                              r.measurement.max_rel_err, "re-timed interleaved with the top "
                                              f"{len(top)}"), r.device, r.toolchain, time.time(), r.trial))
        top = sorted(retimed, key=lambda r: r.seconds)
        evaluator.retimed_top = top
    for r in top:
        why = evaluator.recheck(r)
        if why is None:
            # Where the device has a memory checker, the winner runs once under it: a stray
            # access far from any buffer is seen there and nowhere else.
            checked = evaluator.memcheck(r)
            evaluator.memcheck_result = checked
            if not checked.startswith("errors"):
                return r
            why = f"memcheck: {checked}"
        store.append(Record(r.op_key, r.skeleton_hash, r.config, r.build,
                            Measurement(Status.WRONG_RESULT, detail=f"winner re-check: {why}"),
                            r.device, r.toolchain, time.time(), r.trial))
    return None
