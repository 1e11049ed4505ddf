"""One tuning run: search a skeleton's space for an op on a backend, keep everything, name a winner.

The loop keeps `parallel` evaluations in flight (threads driving worker processes), asks
the Searcher for configs, answers repeats from the record cache, filters invalid configs
without compiling them, writes each Record before telling Optuna, and stops on the budget
(evaluations or wall time) or when the sampler has nothing new left to offer. At the end
the top few are re-timed interleaved, the winner is re-checked on fresh inputs, and the
run directory gets best/ and summary.json.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import random
import re
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tuner.core.landscape import LandscapeError
from tuner.core.ops import ceiling, load_op
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton
from tuner.core.values import Config, Measurement, OpSpec, Record, RunMeta, Status
from tuner.exec.evaluate import Evaluator
from tuner.exec.measure import retimed_status
from tuner.exec.sandbox import missing as missing_sandbox
from tuner.run.flight import Flight, ThreadFlight
from tuner.run.pace import Pace, in_flight_cap
from tuner.run.report import Progress, timing_flags
from tuner.run.store import Store
from tuner.run.winner import ANCHOR_DRIFT, drift_margin, measured_drift, pick_winner
from tuner.run.warm import any_passed, warm_starts, warm_timings
from tuner.search.searcher import STALL_GAIN, Searcher, prepare_searcher

STALL_ASKS = 300  # consecutive asks that bring nothing new: the sampler has run dry
# This many evaluations in a row failing with one and the same message while no config has
# passed: the skeleton is broken, not its configs, and the rest of the budget would fail the
# same way (a compile each on a GPU). The search stops and says so.
SAME_FAILURE_STOP = 8
def _failure_signature(record: Record) -> str | None:
    """A failure's first line with the config's own parts taken out (build folders); None where
    the outcome depends on the config by nature (resource limits) or it is no failure."""
    if record.status in (Status.OK, Status.INVALID) or not record.reason:
        return None
    first = record.reason.strip().splitlines()[0] if record.reason.strip() else ""
    if re.search(r"out of resource|overflow|exceed", first, re.IGNORECASE):
        return None
    # Directories dropped, file names kept: each config builds in its own folder.
    return f"{record.status.value}: " + re.sub(r"(?:[\w.+-]*/)+(?=[\w.+-])", "", first)[:300]


def _count(progress: Progress, record: Record) -> None:
    status = record.status
    if status is Status.INVALID:
        progress.invalid += 1
        return
    progress.evaluations += 1
    if progress.best_s is None and status not in (Status.OK, Status.INFRA_ERROR):
        sig = _failure_signature(record)
        seen, n = progress.same_failure
        progress.same_failure = (sig, n + 1 if sig is not None and sig == seen else 1)
        if sig is not None and progress.same_failure[1] >= SAME_FAILURE_STOP and not progress.stopped:
            progress.stopped = (f"no config has passed and the last {progress.same_failure[1]} evaluated "
                                f"all failed the same way ({sig}): the skeleton is broken, not its "
                                f"configs; fix it and run again")
    if status is Status.OK:
        if progress.best_s is None or record.seconds < progress.best_s:
            progress.best_s, progress.best_config = record.seconds, record.config
    else:
        progress.failures[status.value] = progress.failures.get(status.value, 0) + 1


PATIENCE_STOP = "--patience"  # how a summary's `search_stopped` begins when patience ran out


def stopped_by_patience(summary: dict) -> bool:
    """Whether the run's search stalled (`--patience`): searched again with the same budget and
    patience, it would only stop again."""
    return str(summary.get("search_stopped", "")).startswith(PATIENCE_STOP)


def asks_more(meta: RunMeta, budget: int, patience: int | None) -> bool:
    """Whether resuming a run (its run.json `meta`) with this budget and patience asks for more
    than it had: a larger budget, or another patience, where it had one. Such a resume counts
    patience afresh (`Searcher.restart_patience`): else a run that patience stopped would
    evaluate nothing more, whatever it was given."""
    return bool(meta.patience) and (budget > (meta.budget or budget) or patience != meta.patience)


def keep_resume_settings(store: Store, budget: int, patience: int | None) -> bool:
    """Keep `budget` and `patience` in the run's run.json for the next resume; True when they
    ask for more than the run had (`asks_more`: its patience then counts afresh)."""
    meta = store.meta()
    more = asks_more(meta, budget, patience)
    if (meta.budget, meta.patience) != (budget, patience):
        store.write_meta(meta.replace(budget=budget, patience=patience))
    return more


class Interrupted(Exception):
    """The search was asked to stop (`stop`: a sweep's Ctrl-C reaches its tasks so). The
    evaluations in flight were recorded; no summary is written, so the run resumes as a
    killed one does."""


def run_search(store: Store, evaluator: Evaluator, searcher: Searcher, budget: int,
               time_budget_s: float | None, parallel: int | Callable[[], int],
               on_progress: Callable[[Progress], None] = lambda p: None,
               restart_patience: bool = False, stop: threading.Event | None = None,
               on_record: Callable[[Record], None] = lambda r: None,
               anchor_margin: float | str | None = None, flight: Flight | None = None) -> Progress:
    """`parallel`: evaluations kept in flight, or a function asked before each ask (a sweep
    raises it as its other tasks finish, so that the last ones keep the devices fed).
    `restart_patience`: the records on disk do not count towards `--patience` (see
    `Searcher.restart_patience`). `stop`: once set, nothing new is asked; the evaluations in
    flight finish and are recorded, then `Interrupted` is raised. `on_record`: called with each
    new record once it is on disk (the study kept for people: tuner.search.study).
    `anchor_margin`: see `anchored` below: a fraction, or `ANCHOR_DRIFT` (the margin follows
    the drift the anchors so far measured: `drift_margin`); None: every config is told its own
    median. `flight`: where the evaluations run and what time it is (`Flight`; default: threads
    and the wall clock; a replay passes `tuner.offline.replay.SimulatedFlight`)."""
    space = searcher.space
    limit = parallel if callable(parallel) else (lambda: parallel)
    known: dict[str, Record] = {}
    progress = Progress(budget=budget)
    for r in store.records():
        if r.status is Status.INFRA_ERROR:
            continue  # the machine failed under it, not the config: tried again
        known[r.config.key] = r
        _count(progress, r)

    # In the order the trials were asked (their numbers), not the order they finished: with
    # evaluations in flight the two differ, and `--patience` read from a study replayed in
    # finishing order could disagree with the run that stopped (a resume with the same
    # settings then searched on). Records no trial asked for (a proposer's checks) first.
    searcher.replay(sorted(known.values(), key=lambda r: (r.trial >= 0, r.trial, r.time)))
    if restart_patience:
        searcher.restart_patience()

    def anchored(record: Record) -> Record:
        """A config timed within `anchor_margin` of the best (or faster) is timed again in one
        interleave with the incumbent, and the search is told the incumbent's figure times
        their ratio there: medians taken minutes apart differ by drift (clocks, temperature,
        other work) that one interleave does not have, and the search walks on from its best.
        Configs that timed a little slower than the incumbent are included because drift can
        hide a faster one there: told their own median, they would be written off for good."""
        if anchor_margin is None or record.status is not Status.OK:
            return record
        ok = [r for r in known.values() if r.status is Status.OK and r.build.binary_hash != record.build.binary_hash]
        if not ok:
            return record
        incumbent = min(ok, key=lambda r: r.search_s)
        margin = drift_margin(ok) if anchor_margin == ANCHOR_DRIFT else float(anchor_margin)
        if record.seconds > incumbent.search_s * (1 + margin):
            return record
        retime = getattr(evaluator, "retime", None)
        samples = retime([record, incumbent]) if retime else None
        if samples and isinstance(samples[0], str):  # its re-timed calls were wrong (or suspect): so is it
            return dataclasses.replace(record, measurement=Measurement(
                retimed_status(samples[0]), detail=f"re-timed against the incumbent: {samples[0]}"))
        if not samples or len(samples) < 2 or any(isinstance(x, str) or not x for x in samples[:2]):
            return record  # not re-timed (a worker failure; the incumbent's calls wrong): its own figure
        ratio = statistics.median(samples[0]) / statistics.median(samples[1])
        progress.anchored += 1
        return dataclasses.replace(record, anchored_s=incumbent.search_s * ratio)

    inflight: dict[cf.Future, tuple[object, Config]] = {}
    waiting: dict[str, list] = {}  # config key -> trials asking for a config already in flight
    stall = 0
    flight = flight or ThreadFlight(parallel if isinstance(parallel, int) else 256)
    deadline = None if time_budget_s is None else flight.now() + time_budget_s
    on_progress(progress)

    pace = Pace()
    slots = max(1, getattr(evaluator, "timing_slots", 1))

    def finish(trial, record: Record) -> None:
        record = anchored(record)
        pace.add(record, flight.now())
        store.append(record)  # on disk before Optuna hears of it: a kill loses nothing
        on_record(record)
        known[record.config.key] = record
        searcher.tell(trial, record)
        for other in waiting.pop(record.config.key, []):
            searcher.tell(other, record, repeat=True)
        _count(progress, record)
        on_progress(progress)

    def room() -> int:
        """Evaluations that may be in flight now: the configs the search was given to try first
        fill every worker (they do not depend on any answer); its own asks are held to what
        keeps the devices busy (`in_flight_cap`)."""
        if searcher.queued():
            return max(1, limit())
        return in_flight_cap(limit(), progress.evaluations, pace.compile_s(), pace.gap_s(), slots)

    with flight:
        while True:
            while (len(inflight) < room() and progress.evaluations + len(inflight) < budget
                   and (deadline is None or flight.now() < deadline) and stall < STALL_ASKS
                   and len(known) + len(inflight) < space.size and not searcher.stalled()
                   and not progress.stopped and not (stop is not None and stop.is_set())):
                trial, config = searcher.ask()
                if config.key in known:
                    searcher.tell(trial, known[config.key], repeat=True)
                    progress.repeats += 1
                    stall += 1
                    continue
                if any(c.key == config.key for _, c in inflight.values()):
                    waiting.setdefault(config.key, []).append(trial)
                    stall += 1
                    continue
                why = evaluator.check(config)
                if why is not None:
                    finish(trial, evaluator.evaluate(config, trial=trial.number))
                    stall += 1
                    continue
                stall = 0
                fut = flight.submit(evaluator.evaluate, config, progress.best_s, trial.number)
                inflight[fut] = (trial, config)
            if not inflight:
                break
            try:
                done = flight.wait(inflight)
            except KeyboardInterrupt:
                # Leaving the pool waits for the evaluations in flight anyway: record them, so
                # that a resume does not evaluate them again.
                for fut in cf.as_completed(inflight):
                    trial, _config = inflight[fut]
                    if fut.exception() is None:
                        finish(trial, fut.result())
                raise
            # In the order they were asked, not the set's (a future's hash): evaluations that
            # finished together are told in the same order every run.
            for fut in sorted(done, key=lambda f: inflight[f][0].number):
                trial, _config = inflight.pop(fut)
                finish(trial, fut.result())
    if stop is not None and stop.is_set():
        raise Interrupted("stopped on request; the records are kept, resume the run")
    if not progress.stopped and searcher.stalled():  # said in the summary: a resume has no more to do
        gain = searcher.expected_gain()
        progress.stopped = (f"{PATIENCE_STOP} {searcher.patience}: the last {searcher.patience} evaluations "
                            f"found nothing {STALL_GAIN:.1%} faster than the best"
                            + ("" if gain is None else f"; the search's model expected at most {gain:.1%} "
                               f"from the configs it weighed last")
                            + (f" (under --stop-gain {searcher.stop_gain:.1%})"
                               if searcher.stop_gain > 0 and gain is not None else ""))
    # Trials still waiting on a config that finished are told above; any left are abandoned.
    for trials in waiting.values():
        for t in trials:
            searcher.abandon(t.number)
    return progress


def summarize(store: Store, winner: Record | None, evaluator: Evaluator, wall_s: float,
              timeline: dict | None = None, stopped: str = "") -> dict:
    meta = store.meta()
    op = load_op(store.op_spec())
    records = store.records()
    failures: dict[str, dict] = {}
    for r in records:
        if r.status not in (Status.OK,):
            f = failures.setdefault(r.status.value, {"count": 0, "example": "", "config": ""})
            f["count"] += 1
            if not f["example"]:
                f["example"], f["config"] = r.reason.splitlines()[0][:200] if r.reason else "", str(r.config)
    info = evaluator.device_info
    ref_s = evaluator.reference_s
    summary = {
        "op": meta.op.to_json(), "backend": meta.backend, "device": info.to_json() if info else None,
        "skeleton": meta.skeleton, "space_size": evaluator.skeleton.space.size,
        "evaluations": sum(1 for r in records if r.status is not Status.INVALID),
        "invalid": sum(1 for r in records if r.status is Status.INVALID),
        "failures": failures, "wall_s": round(wall_s, 2), "timeline": timeline or {},
        "reference": {"what": "the modelled roofline bound (simulated)" if info and info.simulated
                      else "torch " + ("eager" if meta.op.kind == "builtin" else "Model.forward"),
                      "median_s": ref_s, "iqr_s": _iqr(evaluator.reference_samples),
                      "interleaved": evaluator.reference_retimed,
                      "cached_from": getattr(evaluator, "reference_cached", ""),
                      "samples": evaluator.reference_samples[:200]},
        "flops": op.flops, "bytes": op.bytes, "best": None,
    }
    if stopped:
        summary["search_stopped"] = stopped
    # The top configs as re-timed side by side (the figures the winner was named by; the
    # feedback ranks them by these, not by their search-time medians taken minutes apart).
    summary["retimed"] = [{"config": r.config.to_json(), "median_s": r.seconds, "iqr_s": r.measurement.iqr,
                           "samples": len(r.measurement.samples)}
                          for r in getattr(evaluator, "retimed_top", ())]
    if winner is not None:
        t = winner.seconds
        best = {"config": winner.config.to_json(), "median_s": t, "iqr_s": winner.measurement.iqr,
                "samples": len(winner.measurement.samples), "gbps": op.bytes / t / 1e9,
                "gflops": (op.flops / t / 1e9) if op.flops else None,
                "speedup_vs_reference": (ref_s / t) if ref_s else None,
                "max_abs_err": winner.measurement.max_abs_err, "trial": winner.trial,
                "memcheck": evaluator.memcheck_result,
                # Its own median when the search timed it, minutes before the re-timing: a far
                # figure says the machine's load changed in between (`timing_flags`).
                "search_median_s": min((r.seconds for r in records if r is not winner and r.status is Status.OK
                                        and r.config == winner.config), default=None)}
        c = ceiling(op.flops, op.bytes, t, op.spec.dtype, dict(info.peaks) if info else {})
        if c is not None:
            if info and info.simulated:
                c["what"] = c["what"].replace("(measured)", "(simulated)")
            best["ceiling"] = c
        summary["best"] = best
    summary["flags"] = timing_flags(summary)
    facts = dict(info.toolchain).get("sandbox", "") if info else ""
    summary["sandbox"] = {"facts": facts, "missing": missing_sandbox(facts) if facts else
                          ["no sandbox facts: the device did not report them"]}
    store.write_json("summary.json", summary)
    return summary




def write_best(store: Store, skeleton: Skeleton, evaluator: Evaluator, winner: Record) -> None:
    """best/: the kernel source with the config baked in, and the config as JSON."""
    source = skeleton.render(winner.config, evaluator.context)
    from tuner.core.skeleton import EXTENSIONS
    store.write_text(f"best/kernel.{EXTENSIONS.get(skeleton.language, 'txt')}", source)
    store.write_json("best/config.json", {"config": winner.config.to_json(), "median_s": winner.seconds,
                                          "op": store.meta().op.to_json(), "skeleton_hash": skeleton.hash})


class QuietView:
    """The progress view's interface, showing nothing (library use, tests, sweeps)."""

    def __call__(self, progress: Progress) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def create_run(settings: Settings, spec: OpSpec, backend: str, skeleton: Skeleton,
               sampler: str = "guided", seed: int | None = None, storage: str | None = None,
               command: str = "", path: str | Path | None = None, extra: dict | None = None) -> Store:
    """A new run directory holding everything `execute` needs, so that it can also resume it.
    `path` puts it at that path (a round of a multi-round run) instead of a new one under
    runs/; `extra` adds keys to its run.json."""
    from tuner import __version__
    from tuner.core.ops import check_fits, load_op
    from tuner.core.skeleton import EXTENSIONS
    check_fits(load_op(spec))  # a shape too large to verify fails here, not in a worker
    seed = seed if seed is not None else random.randrange(2**31)
    shape = "x".join(str(v) for _, v in spec.sizes) if spec.kind == "builtin" else "file"
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        store = Store(path)
    else:
        store = Store.create(settings.runs_dir, f"{spec.name}-{shape}-{spec.dtype}-{backend}")
    try:
        store.write_text(f"skeleton/template.{EXTENSIONS.get(skeleton.language, 'txt')}.j2", skeleton.template)
        keep_problem(store, spec)
        store.write_json("skeleton/space.json", skeleton.space.to_json())
        store.write_json("skeleton/skeleton.json", skeleton.to_json())
        store.write_meta(RunMeta.from_json({
            "id": store.path.name, "op": spec.to_json(), "backend": backend,
            "skeleton": {"name": skeleton.name, "hash": skeleton.hash,
                         "template": skeleton.template_path, "space": skeleton.space.source},
            "sampler": sampler, "seed": seed, "storage": storage, "study_name": store.path.name,
            "command": command,
            "tuner": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}))
    except OSError:
        if path is None:  # a new directory that could not be written whole (a full disk): no debris
            shutil.rmtree(store.path, ignore_errors=True)
        raise
    return store


def keep_problem(store: Store, spec: OpSpec) -> None:
    """A problem file's op: a copy of the file in the run, read from there if the file is
    moved or deleted later (`Store.op_spec`)."""
    copy = store.path / Store.PROBLEM_COPY
    if spec.kind == "kernelbench" and Path(spec.source).resolve() != copy.resolve():
        shutil.copyfile(spec.source, copy)


def _related(meta: RunMeta, space, view) -> tuple[tuple[Config, ...], tuple]:
    """From the same space measured elsewhere (the `--warm-start` sources; for a retune, the
    old run): configs to try first (each source's best) and, for the guided sampler, every
    source's timings (its prior; other samplers have no use for them). A source that cannot be
    read any more (moved or deleted since the run began; a new run checks its sources before it
    starts) is skipped with a note: the search goes on as it would have without it."""
    readable = []
    for src in meta.warm_start:
        try:
            fits = warm_starts([src], space)
        except (LandscapeError, OSError) as e:
            view.note(f"not warm-starting from {src}: {e}")
            continue
        if fits:
            readable.append(src)
        elif not any_passed([src]):  # e.g. a sweep's first task of an op, where every config failed
            view.note(f"not warm-starting from {src}: no config passed there")
        else:  # another op's or skeleton's run: its params are not this space's
            view.note(f"not warm-starting from {src}: none of the configs it passed is a point of "
                      f"this skeleton's space (params {', '.join(space.names)})")
    prior_from = readable + ([meta.retune_of["run"]] if meta.retune_of else [])
    if meta.sampler != "guided":
        prior_from = []
    prior: list = []
    for src in prior_from:
        try:
            prior.extend(warm_timings([src], space))
        except (LandscapeError, OSError) as e:
            view.note(f"not using {src}'s timings: {e}")
    return warm_starts(readable, space), tuple(prior)


def execute(store: Store, settings: Settings, budget: int, time_budget_s: float | None = None,
            parallel: int | Callable[[], int] | None = None, view=None, seeds: tuple[Config, ...] = (),
            make_evaluator: Callable[..., Evaluator] | None = None, restart_patience: bool = False,
            stop: threading.Event | None = None) -> dict:
    """Search (or continue searching) a run until its budget, name the winner, write the summary.

    `seeds` are configs to try first (warm starts, a proposer's picks) after the skeleton's
    default. Calling it again on the same store resumes: records on disk are never redone.
    """
    view = view or QuietView()
    started = time.monotonic()
    meta = store.meta()
    spec = store.op_spec()
    skeleton = store.skeleton()
    # make_evaluator: where evaluations run (the Evaluator signature; default local workers,
    # `executor_ray.RayExecutor.evaluator` for a Ray cluster).
    if make_evaluator is None:  # a library call: the run's own backend options (e.g. the sim's chip)
        make_evaluator = with_backend_options(None, meta.backend_options, meta.devices or None)
    evaluator = (make_evaluator or Evaluator)(meta.backend, spec, skeleton, settings, store.path)
    try:
        # Run dirs / landscapes of the same space measured elsewhere: their best first, and
        # for the guided sampler their timings as its prior.
        warm, prior = _related(meta, skeleton.space, view)
        notes: list[str] = []
        searcher = prepare_searcher(skeleton.space, meta.sampler, meta.seed, evaluator.check,
                                    evaluator.context, evaluator.limits, (*seeds, *warm), notes,
                                    {"prior": prior} if meta.sampler == "guided" else None,
                                    patience=meta.patience, stop_gain=settings.stop_gain)
        mirror = None
        if meta.storage:
            from tuner.search.study import StudyMirror
            mirror = StudyMirror(meta.storage, meta.study_name or meta.id, skeleton.space,
                                 {"run": str(store.path), "op": meta.op.key, "backend": meta.backend})
            mirror.sync(store.records())
        for line in notes if not store.records() else ():  # said once, not again on a resume
            view.note(line)
        if not store.records():
            refuse_empty_space(skeleton, evaluator.context, evaluator.limits)
        view.note(f"measuring the device and the reference on {meta.backend}…")
        started_unix = time.time() - (time.monotonic() - started)
        evaluator.warm_up()
        # The device facts and the reference are taken while the first configs compile: on a
        # GPU sweep the start of each task (device facts, reference, first compiles) was a
        # fixed ~15 s, and a single GPU run asked for no compile in its first 7-8 s.
        def keep_device(info) -> None:  # in run.json as soon as known: a killed run has it too
            if meta.device is None:
                store.write_meta(store.meta().replace(device=info))
        evaluator.start(wait=False, on_device=keep_device)
        progress = run_search(store, evaluator, searcher, budget, time_budget_s,
                              parallel or getattr(evaluator, "default_parallel", None)
                              or settings.n_compile_workers, view, restart_patience, stop,
                              mirror.add if mirror is not None else (lambda r: None),
                              anchor_margin=ANCHOR_DRIFT if settings.anchors(meta.backend) else None)
        evaluator.wait_reference()  # a search that measured nothing has not waited for it
        timeline = {"device_s": round((evaluator.device_done or time.monotonic()) - started, 2)}
        timeline["device_and_reference_s"] = round((evaluator.reference_done or time.monotonic()) - started, 2)
        timeline["search_done_s"] = round(time.monotonic() - started, 2)
        firsts = [r.time for r in store.records() if r.status is not Status.INVALID and r.time >= started_unix]
        if firsts:  # where a short run's time went: starting up or searching
            timeline["first_evaluation_s"] = round(min(firsts) - started_unix, 2)
        progress.phase = "re-timing the top configs"
        view(progress)
        winner = pick_winner(store, evaluator, settings)
        if winner is not None:
            write_best(store, skeleton, evaluator, winner)
        summary = summarize(store, winner, evaluator, time.monotonic() - started, timeline, progress.stopped)
        # Configs timed again against the incumbent during the search (`run_search`'s anchor),
        # and the drift between evaluations they measured: how far apart two timings of the same
        # kernel minutes apart read on this device, and the margin the search ended with.
        summary["anchored"] = sum(1 for r in store.records() if r.anchored_s is not None)
        if settings.anchors(meta.backend):
            drift, n = measured_drift(store.records())
            summary["drift"] = {"measured": drift, "anchors": n, "margin": drift_margin(store.records())}
        from tuner.run.html import report_at_end
        return report_at_end(store, summary, settings.report, view.note)
    finally:
        evaluator.close()


def refuse_empty_space(skeleton: Skeleton, context: dict[str, Any], limits: dict[str, float] | None,
                       limit: int = 20000) -> None:
    """A space where no config satisfies the constraints at this shape and device (`context`
    and `limits` as the evaluator's) is an error to fix before any worker starts, not a search
    of nothing: known at once where a constraint that reads no param fails, else by
    enumerating a space of at most `limit` configs. `tuner tune` asks before it creates the
    run directory, so that a refused space leaves no empty run behind."""
    from collections import Counter

    from tuner.core.space import SpaceError
    space = skeleton.space
    failed = space.failed_shape_constraint(context)
    if failed is not None:  # fails whatever the params: no need to enumerate (or sample) the space
        raise SpaceError(f"{space.source or skeleton.name}: the constraint {failed!r} reads no param, and it "
                         f"fails at this shape on this device: no config of the space can run here. Use "
                         f"another skeleton (or language) for this shape, or change the constraint")
    if space.size > limit:
        return
    reasons: Counter[str] = Counter()
    for config in space.configs():
        why = space.check(config, context, limits)
        if why is None:
            return
        reasons[why] += 1
    common = "; ".join(f"{why} ({n} configs)" for why, n in reasons.most_common(3))
    raise SpaceError(f"{space.source or skeleton.name}: none of the {space.size} configs satisfies the "
                     f"space's constraints at this shape on this device; most common: {common}. Loosen "
                     f"the constraints or add values to the params")


def with_backend_options(make_evaluator, options: dict | None, devices: tuple[int, ...] | None = None):
    """`make_evaluator` (None: local workers) with the run's backend options (e.g. the sim's
    chip) and device indices bound, as `tune.execute` calls it."""
    if not options and not devices:
        return make_evaluator
    if make_evaluator is None:
        from tuner.exec.evaluate import Evaluator
        make_evaluator = Evaluator
    kw: dict[str, Any] = {}
    if options:
        kw["options"] = options
    if devices:
        kw["devices"] = tuple(devices)
    return functools.partial(make_evaluator, **kw)


def _iqr(samples: list[float]) -> float | None:
    if len(samples) < 4:
        return None
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]
