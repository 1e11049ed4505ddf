"""A sweep file, read and checked into a Plan: its tasks (op, shape, dtype, backend, skeleton)
and settings, or a SweepError naming the file and the entry, before any task runs
(`tuner.sweeps.execute` runs the plan).

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

`language:` (a name or a list) picks the backend's kernel language where it compiles several:
`rmsnorm: {shapes: [8192x8192], language: [triton, cuda]}` tunes the Triton and the CUDA C++
skeleton, a task each; the database keeps the best of each and the runtime serves the faster.
`ops` may also be a list of mappings with an `op:` key. A task whose op has no library skeleton
for the backend's language names a `template` and `space` (paths relative to the sweep file).
A `problem:` entry is a KernelBench-format problem file (as `tuner tune --op FILE`), with its
own template and space; `sizes:` lists overrides of its module-level integer constants, one
task each (default: the file's own sizes).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuner.backends import BackendUnavailable, backend_class, default_backend, get_backend
from tuner.core.ops import BUILTINS, OpError, builtin_spec, did_you_mean, load_op
from tuner.core.problem import spec_from_problem_file
from tuner.core.skeleton import Skeleton, SkeletonError, library_skeleton, load_skeleton
from tuner.core.values import OpSpec

TOP_KEYS = {"name", "backend", "dtypes", "budget", "total_budget", "time_budget_s", "total_time_s",
            "sampler", "seed", "ops", "out", "concurrency", "warm_start", "patience"}
OP_KEYS = {"op", "shapes", "dtypes", "template", "space", "budget", "problem", "sizes", "warm_start", "language"}


def _backend_languages(backend: str) -> tuple[str, ...]:
    cls = backend_class(backend)
    return cls.languages or (cls.language,)


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
    language: str | None = None  # the backend's language where it compiles several (cuda: cuda)

    @property
    def key(self) -> str:
        return f"{self.op}-{self.shape}-{self.dtype}-{self.backend}" + (f"-{self.language}" if self.language else "")

    @property
    def family(self) -> tuple:
        """Tasks that search the same space: the same op and skeleton on the same backend
        (shapes and dtypes differ)."""
        return (self.op, self.template, self.space, self.problem, self.backend, self.language)

    @property
    def backend_options(self) -> dict:
        return {"language": self.language} if self.language else {}

    @functools.cached_property
    def spec(self) -> OpSpec:
        if self.problem:  # imports the file (bounded in time): once per task
            return spec_from_problem_file(self.problem, self.dtype, dict(self.sizes))
        return builtin_spec(self.op, self.shape, self.dtype)

    def skeleton(self) -> Skeleton:
        if self.template:
            return load_skeleton(self.template, self.space)
        return library_skeleton(self.op, get_backend(self.backend, **self.backend_options).language)


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
    examples = {"shapes": "[256x1024, 1024x4096]", "dtypes": "[fp32, bf16]", "language": "[triton, cuda]"}
    raise SweepError(f"{where}: {what} must be a list, e.g. {examples.get(what, '[a, b]')}")


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
            raise SweepError(f"{where}: unknown op {op!r}{did_you_mean(op, BUILTINS)}; built-in ops: "
                             f"{', '.join(BUILTINS)}{hint}")
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
        languages: list[str | None] = [None]
        if entry.get("language") is not None:
            languages = [str(x) for x in _list(entry["language"], "language", where)]
            if not languages:
                raise SweepError(f"{where}: `language: []` names no language; give one or more of "
                                 f"{', '.join(_backend_languages(backend))}, or leave it out (the backend's default)")
            for language in languages:
                if language not in _backend_languages(backend):
                    raise SweepError(f"{where}: language {language!r}: the {backend} backend compiles "
                                     f"{', '.join(_backend_languages(backend))}")
        if template:  # a template is in one language, its space's: the task compiles in that one
            try:
                own = load_skeleton(template, space).language
            except SkeletonError:
                own = None  # reported with every task's problems below
            if own is not None and languages != [None] and languages != [own]:
                raise SweepError(f"{where}: the template is {own} (its space's `language:`), not "
                                 f"{', '.join(str(x) for x in languages if x != own)}: one template is one "
                                 f"language; write `language: {own}` or leave it out")
            if own is not None and own != backend_class(backend).language and own in _backend_languages(backend):
                languages = [own]  # e.g. CUDA C++ on the cuda backend, whose default is Triton
        for shape, language in ((s, lang) for s in shapes for lang in languages):
            for dtype in _list(entry.get("dtypes", dtypes), "dtypes", where):
                try:
                    builtin_spec(op, shape, dtype)
                except OpError as e:
                    raise SweepError(f"{where}: {e}") from None
                t = Task(op, shape, dtype, backend, template, space, cold=not warm, language=language)
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
        k = (t.op, t.template, t.space, t.language)
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
    from tuner.search.searcher import SAMPLERS
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

__all__ = ["Plan", "SweepError", "Task", "load_plan"]
