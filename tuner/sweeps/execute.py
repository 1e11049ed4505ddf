"""Offline sweeps: ops x shapes x dtypes in one command, resumable, with one summary table.
The sweep file and its Plan: `tuner.sweeps.plan`.

Every task is a whole run directory, `<sweep>/tasks/<op>-<shape>-<dtype>-<backend>`, created by
`tune.create_run` and searched by `tune.execute`, so that re-running the same command resumes:
finished tasks are read back, a killed one continues from its records, the rest start.

Warm starts. The tasks of one op (the same skeleton, on the same backend) form a family; its
first task in the file runs cold, and the others are warm-started from it, as `tuner tune
--warm-start` would be: its best config is tried first and, for the guided searcher, all its
timings are the prior. So that every executor runs the same searches whatever finishes first,
each family's first task is run before the rest (the first tasks of all families first, side by
side under Ray), and a later task starts only once its family's first has ended; with fewer
families than lanes, some lanes wait meanwhile (`warm_start: false`: every task cold, no wait).

Executors. `local`: one task at a time, each with the local compile pool and benchmark workers
(tasks side by side would time on the same cores or GPU). `ray`: several tasks at once (by
default one more than the devices, or one per 4 compile CPUs when that is more), all sharing the
cluster's device actors and compile CPUs; the evaluations in flight over all tasks are about the
cluster's slots (devices + compile CPUs).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import math
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.backends import BackendUnavailable
from tuner.core.ops import OpError
from tuner.core.settings import Settings
from tuner.core.skeleton import SkeletonError
from tuner.run.report import Progress, SweepView
from tuner.run.store import Store, StoreError
from tuner.run.tune import (
    Interrupted,
    asks_more,
    create_run,
    execute,
    keep_resume_settings,
    stopped_by_patience,
    with_backend_options,
)
from tuner.sweeps.plan import Plan, SweepError, Task

# ---- a task's state (shown by report.SweepView) -------------------------------------------

@dataclass
class TaskState:
    task: Task
    state: str = "waiting"  # waiting | running | done | failed | skipped | interrupted
    progress: Progress | None = None
    note: str = ""
    summary: dict | None = None
    run: str = ""
    error: str = ""
    wall_s: float = 0.0
    warm_from: list = dataclasses.field(default_factory=list)  # the tasks it was warm-started from
    after: "TaskState | None" = None  # the task it waits for (its op's first: its warm start)

    @property
    def ready(self) -> bool:
        """Whether it may start: the task it waits for (if any) has ended."""
        return self.after is None or self.after.state in ("done", "failed", "skipped")


# ---- running ------------------------------------------------------------------------------

def _task_done(store: Store, task: Task, time_budget_s: float | None, patience: int | None) -> dict | None:
    """The task's summary when it needs no more work, else None (to start or resume it)."""
    summary = store.read_json("summary.json")
    if summary is None:
        return None
    if summary.get("evaluations", 0) >= task.budget:
        return summary
    if summary.get("evaluations", 0) + summary.get("invalid", 0) >= summary.get("space_size", math.inf):
        return summary  # the space is exhausted
    if time_budget_s is not None:
        return summary  # it ran out of time; re-running would spend the budget again
    if stopped_by_patience(summary) and not asks_more(store.meta(), task.budget, patience):
        return summary  # it stalled (`patience:`); re-running would only stop again
    return None


def run_sweep(plan: Plan, settings: Settings, executor: str = "local", address: str | None = None,
              devices: int | None = None, concurrency: int | None = None, out: str | None = None,
              view_enabled: bool = True, ray_executor=None, parallel: int | None = None) -> dict:
    """Run (or resume) every task of the plan; write and return the sweep summary.
    `ray_executor`: an already started `RayExecutor` to use (tests, benches)."""
    folder = plan.folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    prev = Store(folder).read_json("sweep.json") or {}
    Store(folder).write_json("sweep.json", {"name": plan.name, "source": plan.source, "backend": plan.backend,
                                            "text_hash": plan.text_hash, "tasks": [t.key for t in plan.tasks],
                                            "created": prev.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    states = [TaskState(t) for t in plan.tasks]
    by_task = {id(s.task): s for s in states}
    for s in states:
        s.after = by_task[id(a)] if (a := plan.anchor(s.task)) is not None else None
    started = time.monotonic()
    deadline = None if plan.total_time_s is None else started + plan.total_time_s
    owned = None
    make_evaluator = None
    stop = threading.Event()  # set on Ctrl-C: no task starts, the running ones stop asking
    interrupted = False
    per_task_parallel = parallel
    in_flight = None  # a function: the in-flight count raised as tasks finish (Ray, unless fixed)
    k = 1
    try:
        if executor == "ray":
            from tuner.exec.ray_executor import RayExecutor
            ex = ray_executor or RayExecutor(settings, address=address, devices=devices,
                                             log_path=str(folder / "workers.log"))
            owned = ex if ray_executor is None else None
            make_evaluator = ex.evaluator
            n_dev = ex.n_devices(plan.backend)
            # Short tasks are bound by their own critical path (reference timing, the first
            # compile of an op, re-timing the top few), not by the devices: run enough of them
            # at once to keep every device fed, about one per 4 compile CPUs, at least one more
            # than the devices (measured on 2 H200s with devices + 1: bench/RESULTS.md).
            k = concurrency or plan.concurrency or max(n_dev + 1, ex.compile_slots(plan.backend) // 4)
            k = max(1, min(int(k), len(plan.tasks)))
            if per_task_parallel is None:
                total = ex.default_parallel(plan.backend)
                per_task_parallel = max(2, math.ceil(total / k))
                # As tasks finish, the last ones share the freed compile slots and devices: a
                # sweep's last fifth left two GPUs 68 % idle, the last few tasks at 3 in flight
                # each (bench/RESULTS.md, Ray, sixth run).
                # Tasks waiting for their op's first task count as active: the first task,
                # running alone, does not take every device (tried: at 17 in flight on one GPU
                # its 30 evaluations ended 17 % off the best, for no shorter sweep; RESULTS).
                def in_flight() -> int:
                    active = sum(1 for s in states if s.state in ("waiting", "running"))
                    return max(per_task_parallel, math.ceil(total / max(1, min(k, active))))
        elif executor == "local":
            k = 1
            from tuner.exec.evaluate import Evaluator
            from tuner.exec.runner import WorkerPools
            owned = WorkerPools(settings, folder / "workers.log")  # one set of workers for every task
            make_evaluator = functools.partial(Evaluator, runner=owned.runner)
        else:
            raise SweepError(f"unknown executor {executor!r}; one of local, ray")
        with SweepView(states, view_enabled) as view:
            lock = threading.Lock()
            ended = threading.Condition(lock)  # notified whenever a task ends
            # Each family's first task before the rest (see "Warm starts" above).
            pending = [s for s in states if s.after is None] + [s for s in states if s.after is not None]

            def run_one(state: TaskState) -> None:
                task = state.task
                path = folder / "tasks" / task.key
                state.run = str(path)
                t0 = time.monotonic()
                try:
                    if (path / "run.json").is_file():
                        store = Store.open(path)
                        store.repair()
                        state.warm_from = [Path(w).name for w in store.meta().warm_start]
                        done = _task_done(store, task, plan.time_budget_s, plan.patience)
                        if done is not None:
                            state.summary, state.state = done, "done"
                            view.update()
                            return
                        restart = keep_resume_settings(store, task.budget, plan.patience)
                    else:
                        anchor = plan.anchor(task)
                        warm = [str((folder / "tasks" / anchor.key).resolve())] if anchor else None
                        store = create_run(settings, task.spec, task.backend, task.skeleton(), plan.sampler,
                                           plan.task_seed(task), None, command=f"tuner sweep {plan.source}",
                                           path=path, extra={"sweep": plan.name, "warm_start": warm,
                                                             "budget": task.budget, "patience": plan.patience,
                                                             **({"backend_options": task.backend_options}
                                                                if task.backend_options else {})})
                        restart = False
                        state.warm_from = [anchor.key] if anchor else []
                    tb = plan.time_budget_s
                    if deadline is not None:
                        with lock:
                            waiting = sum(1 for s in states if s.state == "waiting") + 1
                        rounds = math.ceil(waiting / k)
                        share = max(1.0, (deadline - time.monotonic()) / rounds)
                        tb = share if tb is None else min(tb, share)
                    state.state = "running"
                    view.update()
                    state.summary = execute(store, settings, task.budget, tb, in_flight or per_task_parallel,
                                            view.for_task(state),
                                            make_evaluator=with_backend_options(make_evaluator,
                                                                                store.meta().backend_options),
                                            restart_patience=restart, stop=stop)
                    state.state = "done"
                except Interrupted:
                    state.state = "interrupted"  # no summary written: a re-run resumes it
                except (SkeletonError, StoreError, BackendUnavailable, OpError, ValueError) as e:
                    state.state, state.error = "failed", f"{type(e).__name__}: {e}"
                finally:
                    if state.state in ("waiting", "running"):  # an unexpected error on its way out
                        state.state, state.error = "failed", state.error or "stopped by an unexpected error"
                    state.wall_s = time.monotonic() - t0
                    view.update()
                    with ended:  # the tasks waiting for this one may start (else they would wait forever)
                        ended.notify_all()

            def next_task() -> TaskState | None:
                with ended:
                    while pending and not stop.is_set():
                        s = next((s for s in pending if s.ready), None)
                        if s is None:  # every one left waits for a family's first task, running now
                            ended.wait(1.0)
                            continue
                        pending.remove(s)
                        if deadline is not None and time.monotonic() >= deadline and not (
                                Path(folder / "tasks" / s.task.key / "summary.json").is_file()):
                            s.state, s.error = "skipped", "the sweep's total_time_s ran out before it started"
                            ended.notify_all()
                            continue
                        return s
                return None

            def lane() -> None:
                while (s := next_task()) is not None:
                    run_one(s)

            with cf.ThreadPoolExecutor(max_workers=k) as pool:
                lanes = [pool.submit(lane) for _ in range(k)]
                try:
                    for f in lanes:
                        f.result()
                except KeyboardInterrupt:
                    # The lanes are threads: they would run the whole queue before the pool
                    # let go. Tell them to stop instead; each running task records what it
                    # has in flight and ends without a summary, so a re-run resumes it.
                    interrupted = True
                    stop.set()
                    with ended:
                        ended.notify_all()
                    view.note("stopping: the running tasks end once their evaluations in flight are "
                              "recorded; re-run the command to resume")
                    for f in lanes:
                        f.result()
    finally:
        if owned is not None:
            owned.close()
    summary = sweep_summary(plan, states, time.monotonic() - started, executor)
    summary["tasks_at_once"] = k
    summary["evaluations_in_flight_per_task"] = per_task_parallel
    Store(folder).write_json("summary.json", summary)
    if not interrupted:
        from tuner.run.html import report_at_end
        summary = report_at_end(Store(folder), summary, settings.report,
                                lambda text: print(f"note: {text}", file=sys.stderr))
    if interrupted:
        raise KeyboardInterrupt  # the command says how to resume, and exits 130
    return summary


def sweep_summary(plan: Plan, states: list[TaskState], wall_s: float, executor: str) -> dict:
    rows = []
    for s in states:
        summ = s.summary or {}
        best = summ.get("best") or {}
        fails = {k: v["count"] for k, v in (summ.get("failures") or {}).items() if k != "INVALID"}
        ceiling = best.get("ceiling") or {}
        rows.append({"task": s.task.key, "op": s.task.op, "shape": s.task.shape, "dtype": s.task.dtype,
                     "backend": s.task.backend, "state": s.state, "error": s.error, "run": s.run,
                     "budget": s.task.budget, "evaluations": summ.get("evaluations"),
                     "invalid": summ.get("invalid"), "best_s": best.get("median_s"),
                     "best_config": best.get("config"), "ceiling_percent": ceiling.get("percent"),
                     "ceiling_what": ceiling.get("what"), "speedup_vs_reference": best.get("speedup_vs_reference"),
                     "reference_s": (summ.get("reference") or {}).get("median_s"), "failures": fails,
                     "device": (summ.get("device") or {}).get("name"), "task_wall_s": round(s.wall_s, 2),
                     "warm_start": s.warm_from,
                     "timeline": summ.get("timeline") or {}})
    return {"name": plan.name, "source": plan.source, "backend": plan.backend, "executor": executor,
            "wall_s": round(wall_s, 2), "tasks": rows,
            "evaluations": sum(r["evaluations"] or 0 for r in rows)}


__all__ = ["TaskState", "run_sweep", "sweep_summary"]
