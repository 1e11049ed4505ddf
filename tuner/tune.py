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
import random
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .evaluate import Evaluator
from .ops import ceiling, load_op
from .search import STALL_GAIN, Searcher
from .settings import Settings
from .skeleton import Skeleton
from .store import Store
from .values import Config, Measurement, OpSpec, Record, Status

STALL_ASKS = 300  # consecutive asks that bring nothing new: the sampler has run dry
# This many evaluations in a row failing with one and the same message while no config has
# passed: the skeleton is broken, not its configs, and the rest of the budget would fail the
# same way (a compile each on a GPU). The search stops and says so.
SAME_FAILURE_STOP = 8


@dataclass
class Progress:
    """What a progress view shows, updated after every record."""

    budget: int
    evaluations: int = 0
    invalid: int = 0
    repeats: int = 0
    best_s: float | None = None
    best_config: Config | None = None
    failures: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    phase: str = "searching"
    same_failure: tuple[str | None, int] = (None, 0)  # the last failure, how many in a row (none passed)
    stopped: str = ""  # why the search stopped before its budget, when it did (see SAME_FAILURE_STOP)


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
    if progress.best_s is None and status is not Status.OK:
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


def asks_more(meta: dict, budget: int, patience: int | None) -> bool:
    """Whether resuming a run (its run.json `meta`) with this budget and patience asks for more
    than it had: a larger budget, or another patience, where it had one. Such a resume counts
    patience afresh (`Searcher.restart_patience`): else a run that patience stopped would
    evaluate nothing more, whatever it was given."""
    return bool(meta.get("patience")) and (budget > (meta.get("budget") or budget)
                                           or patience != meta.get("patience"))


def keep_resume_settings(store: Store, budget: int, patience: int | None) -> bool:
    """Keep `budget` and `patience` in the run's run.json for the next resume; True when they
    ask for more than the run had (`asks_more`: its patience then counts afresh)."""
    meta = store.meta()
    more = asks_more(meta, budget, patience)
    if (meta.get("budget"), meta.get("patience")) != (budget, patience):
        store.write_meta({**meta, "budget": budget, "patience": patience})
    return more


class Interrupted(Exception):
    """The search was asked to stop (`stop`: a sweep's Ctrl-C reaches its tasks so). The
    evaluations in flight were recorded; no summary is written, so the run resumes as a
    killed one does."""


def run_search(store: Store, evaluator: Evaluator, searcher: Searcher, budget: int,
               time_budget_s: float | None, parallel: int | Callable[[], int],
               on_progress: Callable[[Progress], None] = lambda p: None,
               restart_patience: bool = False, stop: threading.Event | None = None) -> Progress:
    """`parallel`: evaluations kept in flight, or a function asked before each ask (a sweep
    raises it as its other tasks finish, so that the last ones keep the devices fed).
    `restart_patience`: the records on disk do not count towards `--patience` (see
    `Searcher.restart_patience`). `stop`: once set, nothing new is asked; the evaluations in
    flight finish and are recorded, then `Interrupted` is raised."""
    space = searcher.space
    limit = parallel if callable(parallel) else (lambda: parallel)
    known: dict[str, Record] = {}
    progress = Progress(budget=budget)
    for r in store.records():
        known[r.config.key] = r
        _count(progress, r)

    if searcher.persistent:
        # A killed run leaves trials RUNNING: tell those that have a record, drop the rest.
        for number, config in searcher.running_trials():
            if config.key in known:
                searcher.tell(number, known[config.key])
            else:
                searcher.abandon(number)
    else:
        searcher.replay(list(known.values()))
    if restart_patience:
        searcher.restart_patience()

    inflight: dict[cf.Future, tuple[object, Config]] = {}
    waiting: dict[str, list] = {}  # config key -> trials asking for a config already in flight
    stall = 0
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    on_progress(progress)

    def finish(trial, record: Record) -> None:
        store.append(record)  # on disk before Optuna hears of it: a kill loses nothing
        known[record.config.key] = record
        searcher.tell(trial, record)
        for other in waiting.pop(record.config.key, []):
            searcher.tell(other, record, repeat=True)
        _count(progress, record)
        on_progress(progress)

    # Threads start as evaluations are submitted: the bound is never reached when fixed.
    with cf.ThreadPoolExecutor(max_workers=parallel if isinstance(parallel, int) else 256) as pool:
        while True:
            while (len(inflight) < max(1, limit()) and progress.evaluations + len(inflight) < budget
                   and (deadline is None or time.monotonic() < deadline) and stall < STALL_ASKS
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
                fut = pool.submit(evaluator.evaluate, config, progress.best_s, trial.number)
                inflight[fut] = (trial, config)
            if not inflight:
                break
            try:
                done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            except KeyboardInterrupt:
                # Leaving the pool waits for the evaluations in flight anyway: record them, so
                # that a resume does not evaluate them again.
                for fut in cf.as_completed(inflight):
                    trial, _config = inflight[fut]
                    if fut.exception() is None:
                        finish(trial, fut.result())
                raise
            for fut in done:
                trial, _config = inflight.pop(fut)
                finish(trial, fut.result())
    if stop is not None and stop.is_set():
        raise Interrupted("stopped on request; the records are kept, resume the run")
    if not progress.stopped and searcher.stalled():  # said in the summary: a resume has no more to do
        progress.stopped = (f"{PATIENCE_STOP} {searcher.patience}: the last {searcher.patience} evaluations "
                            f"found nothing {STALL_GAIN:.1%} faster than the best")
    # Trials still waiting on a config that finished are told above; any left are abandoned.
    for trials in waiting.values():
        for t in trials:
            searcher.abandon(t.number)
    return progress


def pick_winner(store: Store, evaluator: Evaluator, settings: Settings,
                on_progress: Callable[[Progress], None] | None = None) -> Record | None:
    """Re-time the top few interleaved, re-check the fastest on fresh inputs, and return it."""
    ok = sorted((r for r in store.records() if r.status is Status.OK), key=lambda r: r.seconds)
    top, seen = [], set()
    for r in ok:
        if r.build.binary_hash not in seen:
            seen.add(r.build.binary_hash)
            top.append(r)
        if len(top) >= max(1, settings.retime_top):
            break
    if not top:
        return None
    samples = evaluator.retime(top) if len(top) > 1 else None
    if samples is not None:
        top = [Record(r.op_key, r.skeleton_hash, r.config, r.build,
                      Measurement(Status.OK, tuple(s), r.measurement.max_abs_err,
                                  r.measurement.max_rel_err, "re-timed interleaved with the top "
                                  f"{len(top)}"), r.device, r.toolchain, time.time(), r.trial)
               for r, s in zip(top, samples)]
        top.sort(key=lambda r: r.seconds)
    for r in top:
        why = evaluator.recheck(r)
        if why is None:
            return r
        store.append(Record(r.op_key, r.skeleton_hash, r.config, r.build,
                            Measurement(Status.WRONG_RESULT, detail=f"winner re-check: {why}"),
                            r.device, r.toolchain, time.time(), r.trial))
    return None


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
        "op": meta["op"], "backend": meta["backend"], "device": info.to_json() if info else None,
        "skeleton": meta.get("skeleton"), "space_size": evaluator.skeleton.space.size,
        "evaluations": sum(1 for r in records if r.status is not Status.INVALID),
        "invalid": sum(1 for r in records if r.status is Status.INVALID),
        "failures": failures, "wall_s": round(wall_s, 2), "timeline": timeline or {},
        "reference": {"what": "the modelled roofline bound (simulated)" if info and info.simulated
                      else "torch " + ("eager" if meta["op"]["kind"] == "builtin" else "Model.forward"),
                      "median_s": ref_s, "samples": evaluator.reference_samples[:200]},
        "flops": op.flops, "bytes": op.bytes, "best": None,
    }
    if stopped:
        summary["search_stopped"] = stopped
    if winner is not None:
        t = winner.seconds
        best = {"config": winner.config.to_json(), "median_s": t, "iqr_s": winner.measurement.iqr,
                "samples": len(winner.measurement.samples), "gbps": op.bytes / t / 1e9,
                "gflops": (op.flops / t / 1e9) if op.flops else None,
                "speedup_vs_reference": (ref_s / t) if ref_s else None,
                "max_abs_err": winner.measurement.max_abs_err, "trial": winner.trial}
        c = ceiling(op.flops, op.bytes, t, op.spec.dtype, dict(info.peaks) if info else {})
        if c is not None:
            if info and info.simulated:
                c["what"] = c["what"].replace("(measured)", "(simulated)")
            best["ceiling"] = c
        summary["best"] = best
    store.write_json("summary.json", summary)
    return summary


def write_best(store: Store, skeleton: Skeleton, evaluator: Evaluator, winner: Record) -> None:
    """best/: the kernel source with the config baked in, and the config as JSON."""
    source = skeleton.render(winner.config, evaluator.context)
    from .skeleton import EXTENSIONS
    store.write_text(f"best/kernel.{EXTENSIONS.get(skeleton.language, 'txt')}", source)
    store.write_json("best/config.json", {"config": winner.config.to_json(), "median_s": winner.seconds,
                                          "op": store.meta()["op"], "skeleton_hash": skeleton.hash})


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
    from . import __version__
    from .ops import check_fits, load_op
    from .skeleton import EXTENSIONS
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
        _keep_problem(store, spec)
        store.write_json("skeleton/space.json", skeleton.space.to_json())
        store.write_json("skeleton/skeleton.json", skeleton.to_json())
        store.write_meta({"id": store.path.name, "op": spec.to_json(), "backend": backend,
                          "skeleton": {"name": skeleton.name, "hash": skeleton.hash,
                                       "template": skeleton.template_path, "space": skeleton.space.source},
                          "sampler": sampler, "seed": seed, "storage": storage,
                          "command": command, "tuner": __version__,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})})
    except OSError:
        if path is None:  # a new directory that could not be written whole (a full disk): no debris
            shutil.rmtree(store.path, ignore_errors=True)
        raise
    return store


def _keep_problem(store: Store, spec: OpSpec) -> None:
    """A problem file's op: a copy of the file in the run, read from there if the file is
    moved or deleted later (`Store.op_spec`)."""
    copy = store.path / Store.PROBLEM_COPY
    if spec.kind == "kernelbench" and Path(spec.source).resolve() != copy.resolve():
        shutil.copyfile(spec.source, copy)


def _related(meta: dict, space, view) -> tuple[tuple[Config, ...], tuple]:
    """From the same space measured elsewhere (the `--warm-start` sources; for a retune, the
    old run): configs to try first (each source's best) and, for the guided sampler, every
    source's timings (its prior; other samplers have no use for them). A source that cannot be
    read any more (moved or deleted since the run began; a new run checks its sources before it
    starts) is skipped with a note: the search goes on as it would have without it."""
    from .replay import LandscapeError, any_passed, warm_starts, warm_timings
    readable = []
    for src in meta.get("warm_start") or []:
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
    prior_from = readable + ([meta["retune_of"]["run"]] if meta.get("retune_of") else [])
    if meta["sampler"] != "guided":
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
        from .retune import with_backend_options
        make_evaluator = with_backend_options(None, meta.get("backend_options"),
                                              tuple(meta["devices"]) if meta.get("devices") else None)
    evaluator = (make_evaluator or Evaluator)(meta["backend"], spec, skeleton, settings, store.path)
    try:
        # Run dirs / landscapes of the same space measured elsewhere: their best first, and
        # for the guided sampler their timings as its prior.
        warm, prior = _related(meta, skeleton.space, view)
        options = None
        if meta["sampler"] == "guided":
            # It repairs candidates when a space's constraints reject nearly all, and
            # completes a one-step move they reject (keeping the moved param).
            options = {"repair": lambda c, keep=(): skeleton.space.repair(c, evaluator.context, evaluator.limits,
                                                                          30, keep),
                       "prior": prior}
        searcher = Searcher(skeleton.space, meta["sampler"], meta["seed"], meta["storage"],
                            study_name=meta.get("study_name", "tuner"), check=evaluator.check,
                            patience=meta.get("patience"), sampler_options=options)
        starts = skeleton.space.starts(evaluator.context, evaluator.limits)
        notes: list[str] = []
        hunches = skeleton.space.hunches(evaluator.context, evaluator.limits, notes)
        for line in notes if not store.records() else ():  # said once, not again on a resume
            view.note(line)
        for config in (*starts, *seeds, *warm, *hunches):
            config = skeleton.space.complete(config)  # a param added since: its default
            if config is not None:
                searcher.enqueue(config)
        if not store.records():
            refuse_empty_space(skeleton, evaluator.check)
        view.note(f"measuring the device and the reference on {meta['backend']}…")
        started_unix = time.time() - (time.monotonic() - started)
        evaluator.warm_up()
        # The device facts and the reference are taken while the first configs compile: on a
        # GPU sweep the start of each task (device facts, reference, first compiles) was a
        # fixed ~15 s, and a single GPU run asked for no compile in its first 7-8 s.
        def keep_device(info) -> None:  # in run.json as soon as known: a killed run has it too
            if "device" not in meta:
                store.write_meta({**store.meta(), "device": info.to_json()})
        evaluator.start(wait=False, on_device=keep_device)
        progress = run_search(store, evaluator, searcher, budget, time_budget_s,
                              parallel or getattr(evaluator, "default_parallel", None)
                              or settings.n_compile_workers, view, restart_patience, stop)
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
        return summarize(store, winner, evaluator, time.monotonic() - started, timeline, progress.stopped)
    finally:
        evaluator.close()


def refuse_empty_space(skeleton: Skeleton, check: Callable[[Config], str | None], limit: int = 20000) -> None:
    """A space (small enough to enumerate) where no config satisfies the constraints at this
    shape and device is an error to fix before any worker starts, not a search of nothing.
    `check` is `Evaluator.check` (or the same test made without one: `tuner tune` asks before
    it creates the run directory, so that a refused space leaves no empty run behind)."""
    from collections import Counter

    from .space import SpaceError
    space = skeleton.space
    if space.size > limit:
        return
    reasons: Counter[str] = Counter()
    for config in space.configs():
        why = check(config)
        if why is None:
            return
        reasons[why] += 1
    common = "; ".join(f"{why} ({n} configs)" for why, n in reasons.most_common(3))
    raise SpaceError(f"{space.source or skeleton.name}: none of the {space.size} configs satisfies the "
                     f"space's constraints at this shape on this device; most common: {common}. Loosen "
                     f"the constraints or add values to the params")


# ---- multi-round runs: a proposer writes and revises the skeleton --------------------------

def create_rounds_run(settings: Settings, spec: OpSpec, backend: str, proposer: dict, rounds: int,
                      start: Skeleton | None = None, sampler: str = "guided", seed: int | None = None,
                      storage: str | None = None, command: str = "", patience: int | None = None) -> Store:
    """A run of `rounds` rounds. Each round is a whole run directory under rounds/NN/; round 1
    searches `start` when given, else the proposer's skeleton; later rounds the proposer's
    revision. `proposer` is the proposer's description (`Proposer.meta()`, no key). llm/ keeps every call's transcript; best/ and summary.json name the overall winner."""
    from . import __version__
    from .prompt import space_yaml
    seed = seed if seed is not None else random.randrange(2**31)
    shape = "x".join(str(v) for _, v in spec.sizes) if spec.kind == "builtin" else "file"
    store = Store.create(settings.runs_dir, f"{spec.name}-{shape}-{spec.dtype}-{backend}-{proposer['kind']}")
    try:
        if start is not None:
            store.write_json("start/skeleton.json", start.to_json())
            store.write_text("start/space.yaml", space_yaml(start))
        _keep_problem(store, spec)
        store.write_meta({"id": store.path.name, "op": spec.to_json(), "backend": backend, "rounds": rounds,
                          "proposer": proposer, "sampler": sampler, "seed": seed, "storage": storage,
                          "patience": patience,
                          "command": command, "tuner": __version__,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    except OSError:  # a directory that could not be written whole (a full disk): no debris
        shutil.rmtree(store.path, ignore_errors=True)
        raise
    return store


@dataclass
class RoundResult:
    round: int
    skeleton: Skeleton
    space_text: str
    summary: dict
    feedback: object  # feedback.Feedback


def execute_rounds(store: Store, settings: Settings, proposer, budget: int,
                   time_budget_s: float | None = None, parallel: int | None = None, view=None,
                   make_evaluator: Callable[..., Evaluator] | None = None) -> dict:
    """Run (or resume) every round: propose or revise, search with a warm start from the best
    earlier configs, summarise into feedback. Finished rounds are never redone; a reply already
    on disk is never asked for again. A round whose model never produced a valid skeleton ends
    the loop with the best of the earlier rounds (in round 1, that is an error)."""
    from .feedback import Feedback, feedback_for_run, render
    from .llm import LLMBudgetExhausted
    from .proposer import Proposal, ProposerError, RoundContext
    view = view or QuietView()
    meta = store.meta()
    spec, backend = store.op_spec(), meta["backend"]
    done: list[RoundResult] = []
    stopped = ""
    who = (meta["proposer"].get("llm") or {}).get("model") or meta["proposer"].get("kind", "the proposer")
    try:
        for r in range(1, meta["rounds"] + 1):
            rstore = Store(store.path / "rounds" / f"{r:02d}")
            if not (rstore.path / "run.json").is_file():
                previous = rstore.read_json("proposal.json") if rstore.path.is_dir() else None
                if previous and previous.get("status") == "failed":
                    if r == 1:
                        raise ProposerError(f"{previous.get('error', 'no valid skeleton')} (recorded "
                                            f"in {rstore.path / 'proposal.json'})")
                    stopped = f"round {r}: {previous.get('error', 'no valid skeleton')}"
                    break
                ctx = RoundContext(spec, backend, settings, store.path, r, budget, meta["seed"])
                start = store.read_json("start/skeleton.json") if r == 1 else None
                try:
                    if start is not None:
                        proposal = Proposal(Skeleton.from_json(start), (store.path / "start/space.yaml").read_text(),
                                            report={"source": "given", "status": "accepted"})
                    elif r == 1:
                        view.note(f"round 1: asking {who} for a skeleton…")
                        proposal = proposer.propose(ctx)
                    else:
                        view.note(f"round {r}: asking {who} to revise the skeleton…")
                        last = done[-1]
                        proposal = proposer.revise(ctx, last.skeleton, last.space_text, last.feedback)
                except LLMBudgetExhausted as e:
                    if r == 1:
                        raise
                    stopped = f"round {r} not run: {e}"
                    break
                if proposal is None:
                    break  # a proposer that does not revise
                rstore.path.mkdir(parents=True, exist_ok=True)
                rstore.write_json("proposal.json", {**proposal.report, "error": proposal.error})
                if proposal.skeleton is None:
                    if r == 1:
                        raise ProposerError(f"{proposal.error} (transcripts in {store.path / 'llm'}, "
                                            f"verdicts in {rstore.path / 'proposal.json'})")
                    stopped = f"round {r}: {proposal.error}"
                    break
                sk = proposal.skeleton
                parent = done[-1].skeleton.hash if done else ""
                sk = Skeleton(sk.template, sk.space, sk.language, sk.name, r, parent, sk.template_path)
                (rstore.path / "records.jsonl").unlink(missing_ok=True)  # from a killed attempt
                for rec in proposal.records:  # the checks already ran these configs
                    rstore.append(rec)
                rstore.write_text("skeleton/space.yaml", proposal.space_text)
                create_run(settings, spec, backend, sk, meta["sampler"], meta["seed"] + r, meta["storage"],
                           meta.get("command", ""), path=rstore.path,
                           extra={"round": r, "study_name": f"round-{r:02d}", "parent_run": store.path.name,
                                  "patience": meta.get("patience")})
            sk = rstore.skeleton()
            space_text = (rstore.path / "skeleton/space.yaml").read_text()
            fb_json = rstore.read_json("feedback.json")
            if fb_json is None:
                view.note(f"round {r}: searching {sk.space.size} configs…")
                execute(rstore, settings, budget, time_budget_s, parallel, view, seeds=_seeds(done),
                        make_evaluator=make_evaluator)
                fb = feedback_for_run(rstore)
                rstore.write_text("feedback.txt", render(fb))
                rstore.write_json("feedback.json", fb.to_json())
            else:
                fb = Feedback.from_json(fb_json)
            done.append(RoundResult(r, sk, space_text, rstore.read_json("summary.json") or {}, fb))
    finally:
        proposer.close()
    return _finish_rounds(store, done, stopped)


def _seeds(done: list[RoundResult], k: int = 5) -> tuple[Config, ...]:
    """The best configs of the earlier rounds, fastest first (execute keeps those that fit,
    a param the revised space added taking its default)."""
    best = []
    for d in done:
        for b in d.feedback.best:
            best.append((b["median_s"], Config.of(b["config"])))
    best.sort(key=lambda x: x[0])
    return tuple(c for _, c in best[:k])


def _finish_rounds(store: Store, done: list[RoundResult], stopped: str) -> dict:
    import shutil

    from .llm import transcript_usage
    if not done:
        raise RuntimeError(f"{store.path}: no round ran")
    passed = [d for d in done if (d.summary.get("best") or {}).get("median_s")]
    winner = min(passed, key=lambda d: d.summary["best"]["median_s"]) if passed else None
    by_hash = {d.skeleton.hash: d for d in done}
    lineage, cur = [], winner
    while cur is not None:
        lineage.insert(0, {"round": cur.round, "hash": cur.skeleton.hash, "parent": cur.skeleton.parent,
                           "best_s": (cur.summary.get("best") or {}).get("median_s")})
        cur = by_hash.get(cur.skeleton.parent) if cur.skeleton.parent else None
    llm_dir = store.path / "llm"
    rounds = []
    for d in done:
        proposal = Store(store.path / "rounds" / f"{d.round:02d}").read_json("proposal.json") or {}
        best = d.summary.get("best") or {}
        attempts = sum(len(c.get("attempts", [])) for c in proposal.get("candidates", []))
        rounds.append({"round": d.round, "hash": d.skeleton.hash, "parent": d.skeleton.parent,
                       "source": proposal.get("source") or proposal.get("kind", ""),
                       "candidates": len(proposal.get("candidates", [])), "attempts": attempts,
                       "space_size": d.skeleton.space.size, "evaluations": d.summary.get("evaluations"),
                       "invalid": d.summary.get("invalid"), "best_s": best.get("median_s"),
                       "best_config": best.get("config"),
                       "tokens": transcript_usage(llm_dir, f"r{d.round:02d}-").to_json()})
    base = dict((winner or done[-1]).summary)
    base.update({"rounds": rounds, "winner_round": winner.round if winner else None, "lineage": lineage,
                 "llm": transcript_usage(llm_dir).to_json(), "stopped": stopped,
                 "wall_s": round(sum(d.summary.get("wall_s", 0.0) for d in done), 2)})
    if winner is not None:
        src = store.path / "rounds" / f"{winner.round:02d}" / "best"
        shutil.rmtree(store.path / "best", ignore_errors=True)
        shutil.copytree(src, store.path / "best")
    store.write_json("summary.json", base)
    return base
