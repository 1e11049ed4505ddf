"""Offline sweeps: ops x shapes x dtypes in one command, resumable, with one summary table.

A sweep file (YAML):

    name: nightly-cpu          # the sweep folder: sweeps/<name> (or --out DIR); default: file name
    backend: cpu               # one backend for every task (default: an accelerator if usable)
    dtypes: [fp32]             # default dtypes of every op
    budget: 40                 # evaluations per task ...
    # total_budget: 400        # ... or in total, split evenly over the tasks
    # time_budget_s: 120       # wall time of one task's search (with or without budget)
    # total_time_s: 3600       # wall time of the whole sweep: tasks not started by then are skipped
    sampler: guided            # the default, as for tuner tune; seed: 0 (each task's seed is derived from it)
    # warm_start: true         # later shapes of an op start from its first task (below); false: all cold
                               # (also per entry: those tasks cold, e.g. a shape whose best is unlike the rest)
    # patience: 20             # stop a task after this many evaluations without a 0.5 % gain
    ops:
      softmax: {shapes: [256x1024, 4096x4096]}
      rmsnorm: {shapes: [1024x4096], dtypes: [fp32]}
      mykernel: {op: softmax, shapes: [64x128], template: t.txt.j2, space: s.yaml}
      mylinear: {problem: linear.py, sizes: [{batch: 8}, {batch: 64}], template: l.c.j2, space: l.yaml}

`ops` may also be a list of mappings with an `op:` key. A task whose op has no library skeleton
for the backend's language names a `template` and `space` (paths relative to the sweep file).
A `problem:` entry is a KernelBench-format problem file (as `tuner tune --op FILE`), with its
own template and space; `sizes:` lists overrides of its module-level integer constants, one
task each (default: the file's own sizes).

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
import hashlib
import math
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
import yaml

from .backends import BackendUnavailable, default_backend, get_backend
from .ops import BUILTINS, OpError, builtin_spec, load_op
from .problem import spec_from_problem_file
from .settings import Settings
from .skeleton import Skeleton, SkeletonError, library_skeleton, load_skeleton
from .store import Store, StoreError
from .report import SweepView
from .tune import (Interrupted, Progress, asks_more, create_run, execute, keep_resume_settings,
                   stopped_by_patience)
from .values import OpSpec

TOP_KEYS = {"name", "backend", "dtypes", "budget", "total_budget", "time_budget_s", "total_time_s",
            "sampler", "seed", "ops", "out", "concurrency", "warm_start", "patience"}
OP_KEYS = {"op", "shapes", "dtypes", "template", "space", "budget", "problem", "sizes", "warm_start"}


class SweepError(ValueError):
    """A sweep file that cannot be used; the message names the file and the entry."""


@dataclass
class Task:
    op: str
    shape: str
    dtype: str
    backend: str
    template: str | None = None
    space: str | None = None
    budget: int | None = None  # set by the plan
    problem: str | None = None  # a problem file: `shape` is then a label of `sizes`
    sizes: tuple[tuple[str, int], ...] = ()
    cold: bool = False  # its entry says `warm_start: false`: never warm-started, nor a warm start

    @property
    def key(self) -> str:
        return f"{self.op}-{self.shape}-{self.dtype}-{self.backend}"

    @property
    def family(self) -> tuple:
        """Tasks that search the same space: the same op and skeleton on the same backend
        (shapes and dtypes differ)."""
        return (self.op, self.template, self.space, self.problem, self.backend)

    @functools.cached_property
    def spec(self) -> OpSpec:
        if self.problem:  # imports the file (bounded in time): once per task
            return spec_from_problem_file(self.problem, self.dtype, dict(self.sizes))
        return builtin_spec(self.op, self.shape, self.dtype)

    def skeleton(self) -> Skeleton:
        if self.template:
            return load_skeleton(self.template, self.space)
        return library_skeleton(self.op, get_backend(self.backend).language)


@dataclass
class Plan:
    name: str
    source: str  # the sweep file
    backend: str
    tasks: list[Task]
    sampler: str = "guided"
    seed: int = 0
    time_budget_s: float | None = None
    total_time_s: float | None = None
    concurrency: int | None = None
    out: str | None = None
    text_hash: str = ""
    warm_start: bool = True
    patience: int | None = None

    def folder(self, override: str | None = None) -> Path:
        return Path(override or self.out or Path("sweeps") / self.name)

    def anchor(self, task: Task) -> Task | None:
        """The task that `task` is warm-started from: its family's first (None for that one,
        and for every task with `warm_start: false`)."""
        if not self.warm_start or task.cold:
            return None
        first = next(t for t in self.tasks if t.family == task.family and not t.cold)
        return None if first is task else first

    def task_seed(self, task: Task) -> int:
        return int(hashlib.sha256(f"{self.seed}:{task.key}".encode()).hexdigest()[:8], 16) % 2**31


def _list(value, what: str, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int)):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return [str(v) for v in value]
    raise SweepError(f"{where}: {what} must be a list, e.g. [256x1024, 1024x4096]")


def _problem_tasks(name: str, entry: dict, base: Path, backend: str, dtypes: list[str], where: str,
                   budgets: dict[str, int]) -> list[Task]:
    """The tasks of a `problem:` entry: one per sizes override and dtype."""
    if entry.get("shapes") is not None or entry.get("op") is not None:
        raise SweepError(f"{where}: a `problem:` entry takes `sizes:` (overrides of the file's integer "
                         f"constants, e.g. sizes: [{{batch: 64}}]), not `shapes:` or `op:`")
    if not entry.get("template") or not entry.get("space"):
        raise SweepError(f"{where}: a `problem:` entry needs its own `template:` and `space:` (there is "
                         f"no library skeleton for a problem file)")
    problem = str(base / str(entry["problem"]))
    raw = entry.get("sizes")
    sizes_list = raw if isinstance(raw, list) else [raw or {}]
    tasks = []
    for sizes in sizes_list:
        if not isinstance(sizes, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
            raise SweepError(f"{where}: each `sizes:` item maps constant names to integers, e.g. "
                             f"{{batch: 64, features: 4096}}; got {sizes!r}")
        sizes_t = tuple(sorted((str(k), int(v)) for k, v in sizes.items()))
        label = "_".join(f"{k}={v}" for k, v in sizes_t) or "default"
        for dtype in _list(entry.get("dtypes", dtypes), "dtypes", where):
            t = Task(re.sub(r"[^\w.-]", "_", str(name)), label, str(dtype), backend, str(base / entry["template"]),
                     str(base / entry["space"]), problem=problem, sizes=sizes_t)
            try:
                t.spec
            except OpError as e:
                raise SweepError(f"{where}: {e}") from None
            tasks.append(t)
            if entry.get("budget") is not None:
                budgets[t.key] = _num(where, "budget", entry["budget"], int)
    return tasks


def load_plan(path: str | Path, backend: str | None = None) -> Plan:
    """Read and check a sweep file: every task's op, shape, dtype and skeleton, before anything runs."""
    path = Path(path)
    try:
        text = path.read_text()
        data = yaml.safe_load(text) or {}
    except OSError as e:
        raise SweepError(f"cannot read the sweep file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping with an `ops:` key (see `tuner sweep --help`)")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise SweepError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(TOP_KEYS))}")
    if "backend" in data and data["backend"] is None:
        data["backend"] = "null"  # YAML reads `backend: null` as no value; it means the null backend
    backend = backend or data.get("backend") or default_backend()
    dtypes = _list(data.get("dtypes", ["fp32"]), "dtypes", str(path))
    ops = data.get("ops")
    if isinstance(ops, dict):
        for name, v in ops.items():
            if v is not None and not isinstance(v, dict):
                raise SweepError(f"{path}: ops.{name}: expected a mapping such as {{shapes: [1024x1024]}}, "
                                 f"got {v!r}")
        entries = [(name, dict(v or {})) for name, v in ops.items()]
    elif isinstance(ops, list):
        entries = []
        for i, v in enumerate(ops):
            if not isinstance(v, dict) or "op" not in v:
                raise SweepError(f"{path}: ops[{i}]: expected a mapping with an `op:` key")
            entries.append((str(v["op"]), dict(v)))
    else:
        raise SweepError(f"{path}: `ops:` must map op names to {{shapes: [...]}} (or be a list of them)")
    base = path.parent
    tasks: list[Task] = []
    problems: list[str] = []
    budgets: dict[str, int] = {}
    for name, entry in entries:
        where = f"{path}: ops.{name}"
        unknown = set(entry) - OP_KEYS
        if unknown:
            raise SweepError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(OP_KEYS))}")
        warm = entry.get("warm_start", True)
        if not isinstance(warm, bool):
            raise SweepError(f"{where}: `warm_start:` must be true or false, got {warm!r}")
        if entry.get("problem") is not None:
            for t in _problem_tasks(name, entry, base, backend, dtypes, where, budgets):
                t.cold = not warm
                _add(tasks, t, where)
            continue
        if entry.get("sizes") is not None:
            raise SweepError(f"{where}: `sizes:` is for `problem:` entries; a built-in op takes `shapes:`")
        op = str(entry.get("op", name))
        if op not in BUILTINS:
            hint = (" (a problem file goes under `problem:`, with its `template:` and `space:`)"
                    if op.endswith(".py") else "")
            raise SweepError(f"{where}: unknown op {op!r}; built-in ops: {', '.join(BUILTINS)}{hint}")
        raw = entry.get("shapes")
        for shape in raw if isinstance(raw, list) else [raw]:
            if isinstance(shape, int) and not isinstance(shape, bool):
                raise SweepError(f"{where}: bad shape {shape!r}: a number, not a string like 64x128 (YAML "
                                 f"reads 0x.. as a hexadecimal number); write it MxN..., quoted if it "
                                 f"starts with 0x")
        shapes = _list(raw, "shapes", where)
        if not shapes:
            raise SweepError(f"{where}: give `shapes: [...]`, e.g. shapes: [{'x'.join(['1024'] * len(BUILTINS[op].size_names))}]")
        template = entry.get("template")
        space = entry.get("space")
        if bool(template) != bool(space):
            raise SweepError(f"{where}: give both `template:` and `space:`, or neither (the library skeleton)")
        template = str(base / template) if template else None
        space = str(base / space) if space else None
        for shape in shapes:
            for dtype in _list(entry.get("dtypes", dtypes), "dtypes", where):
                try:
                    builtin_spec(op, shape, dtype)
                except OpError as e:
                    raise SweepError(f"{where}: {e}") from None
                t = Task(op, shape, dtype, backend, template, space, cold=not warm)
                if not _add(tasks, t, where):
                    continue
                if entry.get("budget") is not None:
                    budgets[t.key] = _num(where, "budget", entry["budget"], int)
    if not tasks:
        raise SweepError(f"{path}: no tasks (ops x shapes x dtypes is empty)")
    if data.get("budget") is not None and data.get("total_budget") is not None:
        raise SweepError(f"{path}: give `budget:` (per task) or `total_budget:` (split over the tasks), not both")
    checked: dict[tuple, str | None] = {}
    for t in tasks:  # every skeleton resolves and the backend can run the op, before any run
        k = (t.op, t.template, t.space)
        if k not in checked:
            try:
                t.skeleton()
                checked[k] = None
            except (SkeletonError, BackendUnavailable, OpError) as e:
                checked[k] = str(e)
        if checked[k]:
            problems.append(f"{t.key}: {checked[k]}")
            continue
        try:
            get_backend(backend).render_context(load_op(t.spec))
        except (BackendUnavailable, OpError) as e:
            problems.append(f"{t.key}: {e}")
    if problems:
        raise SweepError(f"{path}: {len(problems)} task(s) cannot run:\n  " + "\n  ".join(problems))
    budget = _num(path, "budget", data.get("budget"), int)
    total = _num(path, "total_budget", data.get("total_budget"), int)
    if total is not None:
        n = len(tasks)
        per, extra = divmod(total, n)
        if per < 1:
            raise SweepError(f"{path}: total_budget {total} is less than one evaluation per task ({n} tasks)")
        for i, t in enumerate(tasks):
            t.budget = budgets.get(t.key, per + (1 if i < extra else 0))
    else:
        default = budget if budget is not None else (10**9 if data.get("time_budget_s") else 40)
        for t in tasks:
            t.budget = budgets.get(t.key, default)
    for t in tasks:
        if t.budget < 1:
            raise SweepError(f"{path}: {t.key}: budget must be at least 1")
    from .search import SAMPLERS
    sampler = str(data.get("sampler", "guided"))  # tuner tune's default: the searcher of bench/RESULTS.md
    if sampler not in SAMPLERS:  # else every task fails on it, one after another
        raise SweepError(f"{path}: unknown sampler {sampler!r}; one of {', '.join(SAMPLERS)}")
    concurrency = _num(path, "concurrency", data.get("concurrency"), int)
    if concurrency is not None and concurrency < 1:
        raise SweepError(f"{path}: `concurrency:` must be at least 1, got {concurrency}")
    warm = data.get("warm_start", True)
    if not isinstance(warm, bool):
        raise SweepError(f"{path}: `warm_start:` must be true or false, got {warm!r}")
    patience = _num(path, "patience", data.get("patience"), int)
    if patience is not None and patience < 1:
        raise SweepError(f"{path}: `patience:` must be at least 1, got {patience}")
    return Plan(name=str(data.get("name") or path.stem), source=str(path), backend=backend,
                tasks=tasks, sampler=sampler, seed=_num(path, "seed", data.get("seed", 0), int),
                time_budget_s=_num(path, "time_budget_s", data.get("time_budget_s"), float, positive=True),
                total_time_s=_num(path, "total_time_s", data.get("total_time_s"), float, positive=True),
                concurrency=concurrency, out=data.get("out"),
                text_hash=hashlib.sha256(text.encode()).hexdigest()[:16], warm_start=warm, patience=patience)


def _add(tasks: list[Task], t: Task, where: str) -> bool:
    """Append `t` unless the sweep has its task already (a shape listed twice); False then. The
    same op, shape and dtype with another skeleton would share its run directory: refused."""
    same = next((o for o in tasks if o.key == t.key), None)
    if same is None:
        tasks.append(t)
        return True
    if (same.template, same.space, same.problem) != (t.template, t.space, t.problem):
        raise SweepError(f"{where}: {t.key} is a task of this sweep already, with another skeleton; a "
                         f"sweep runs one task per op, shape, dtype and backend: tune the other "
                         f"skeleton in a sweep of its own")
    return False


def _num(where, key: str, v, kind=int, positive: bool = False):
    """A number of the sweep file (None stays None), or a SweepError that names the key: a
    `budget: lots` was a ValueError traceback."""
    if v is None:
        return None
    try:
        if isinstance(v, bool) or (kind is int and isinstance(v, float) and not v.is_integer()):
            raise ValueError
        x = kind(v)
    except (TypeError, ValueError, OverflowError):
        raise SweepError(f"{where}: `{key}:` must be {'an integer' if kind is int else 'a number'}, "
                         f"got {v!r}") from None
    if positive and not x > 0:
        raise SweepError(f"{where}: `{key}:` must be positive, got {v!r}")
    return x


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
            from .executor_ray import RayExecutor
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
            from .evaluate import Evaluator, WorkerPools
            owned = WorkerPools(settings, folder / "workers.log")  # one set of workers for every task
            make_evaluator = functools.partial(Evaluator, workers=owned)
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
                        state.warm_from = [Path(w).name for w in store.meta().get("warm_start") or []]
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
                                                             "budget": task.budget, "patience": plan.patience})
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
                                            view.for_task(state), make_evaluator=make_evaluator,
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


__all__ = ["Plan", "Task", "SweepError", "load_plan", "run_sweep", "sweep_summary"]


# ---- the `tuner sweep` command -------------------------------------------------------------

def add_cli(sub) -> None:
    s = sub.add_parser("sweep", help="tune ops x shapes x dtypes from a sweep file (resumable)",
                       description="Run every task of a sweep file; re-run the same command to resume. "
                                   "Sweep file format: see tuner/sweep.py or the README, 'Sweeps'.")
    s.add_argument("file", help="the sweep file (YAML)")
    s.add_argument("--out", help="the sweep folder (default: the file's `out:`, else sweeps/<name>)")
    s.add_argument("--backend", help="override the file's backend")
    s.add_argument("--executor", choices=("local", "ray"), default="local")
    s.add_argument("--ray-address", metavar="ADDR", help="a running Ray cluster (default: start a local one)")
    s.add_argument("--devices", type=int, help="device actors with --executor ray (default: every GPU/NPU)")
    s.add_argument("--concurrency", type=int, help="tasks at once with --executor ray "
                   "(default: devices + 1, or one per 4 CPUs when that is more)")
    s.add_argument("--parallel", type=int, help="evaluations in flight per task")
    s.add_argument("--run-timeout", type=float, help="seconds to verify and time one config")
    s.add_argument("--compile-timeout", type=float, help="seconds to compile one config")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    s.set_defaults(fn=cmd_sweep)


def cmd_sweep(args) -> int:
    import json as _json

    from .report import console, sweep_table
    settings = Settings.from_env(run_timeout_s=args.run_timeout, compile_timeout_s=args.compile_timeout)
    plan = load_plan(args.file, args.backend)
    folder = plan.folder(args.out)
    if not args.quiet:
        print(f"sweep {plan.name}: {len(plan.tasks)} tasks on {plan.backend} in {folder} "
              f"({args.executor} executor)", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    with Store(folder).lock():  # two sweeps into one folder would run every task twice at once
        args.resume_hint = shlex.join(["tuner", *sys.argv[1:]])  # what Ctrl-C or an error says to run again
        summary = run_sweep(plan, settings, args.executor, args.ray_address, args.devices, args.concurrency,
                            args.out, not args.quiet, parallel=args.parallel)
    if args.json:
        print(_json.dumps(summary, indent=1, default=str))
    else:
        console.print(sweep_table(summary, str(folder)))
    return 0 if all(r["state"] == "done" for r in summary["tasks"]) else 1
