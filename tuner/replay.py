"""Recorded landscapes: search strategies compared offline, answered from measurements.

A landscape is every (or many) configs of one space measured on one device at one shape.
Two formats are read:

* a landscape JSON (`record_matmul.py`'s format): `{"space": {param: [values]}, "shapes":
  [[M, N, K], ...], "records": [{"config", "compile", "compile_err", "compile_s",
  "runs": {"MxNxK": {"status": "ok", "ms"} | {"status": "runtime_error", "err_msg"}}}],
  "reference": {"MxNxK": ms}, "device"}` -- several shapes in one file;
* the tool's own run directory (or its `records.jsonl`), typically from an exhaustive
  `tuner tune ... --sampler grid --budget <space size>` run: one shape, with the run's own
  space (constraints and resource formulas included) in `skeleton/space.json`. The records
  may be gzipped (`records.jsonl.gz`, for landscapes kept for good: ~10x smaller).

Two ways to replay one:

* in process, fast (`replay_search`): the real `tune.run_search` loop and `Searcher` with an
  in-memory store and an evaluator that looks configs up -- thousands of searches a minute,
  which is what `bench/search_efficiency.py` and the efficiency tests use;
* through the whole pipeline (`python -m tuner.replay skeleton LANDSCAPE --out DIR`, then
  `tuner tune matmul --shape 64x64x64 --backend replay --template DIR/replay.txt.j2 --space
  DIR/replay.yaml`): the generated template renders a config into a small script naming the
  landscape and the config; the `replay` backend looks it up and answers with the recorded
  build status, failure message and time (see `tuner/backends/replay.py`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .search import SearchError
from .space import Param, Space
from .values import Build, Config, Measurement, Record, Status

_JSON_STATUS = {"ok": Status.OK, "runtime_error": Status.RUNTIME_ERROR, "wrong": Status.WRONG_RESULT,
                "wrong_result": Status.WRONG_RESULT, "compile_error": Status.COMPILE_ERROR,
                "timeout": Status.RUN_TIMEOUT, "run_timeout": Status.RUN_TIMEOUT,
                "compile_timeout": Status.COMPILE_TIMEOUT}


class LandscapeError(SearchError):
    """A landscape file that cannot be read, or a shape it does not hold."""


@dataclass(frozen=True)
class Outcome:
    """What happened to one config: its status, its time when OK, why it failed otherwise."""

    status: Status
    seconds: float = math.inf
    detail: str = ""
    compile_s: float = 0.0


@dataclass
class Landscape:
    space: Space
    outcomes: dict[str, Outcome]  # config key -> outcome
    name: str = ""
    shape: str = ""
    device: str = ""
    reference_s: float | None = None
    context: dict[str, Any] = field(default_factory=dict)  # sizes the space's formulas read
    limits: dict[str, float] = field(default_factory=dict)  # the recorded device's limits

    @property
    def best_s(self) -> float:
        return min((o.seconds for o in self.outcomes.values() if o.status is Status.OK), default=math.inf)

    def lookup(self, config: Config) -> Outcome | None:
        return self.outcomes.get(config.key)

    def within(self, tolerance: float) -> set[str]:
        """Keys of the configs at most `tolerance` (0.03: 3 %) slower than the best."""
        cut = self.best_s * (1 + tolerance)
        return {k for k, o in self.outcomes.items() if o.status is Status.OK and o.seconds <= cut}

    def ranked(self, k: int | None = None) -> list[Config]:
        """The OK configs, fastest first (warm starts for a related search)."""
        ok = sorted((o.seconds, key) for key, o in self.outcomes.items() if o.status is Status.OK)
        return [Config.of(json.loads(key)) for _, key in ok[:k]]


# ---- loading ------------------------------------------------------------------------------

def shapes(path: str | Path) -> list[str]:
    """The shapes a landscape file holds (one, unnamed, for a run directory)."""
    path = Path(path)
    if _is_run(path):
        return [""]
    data = _read_json(path)
    if not isinstance(data, dict):
        raise LandscapeError(f"{path}: a landscape JSON has 'space' (param -> values) and 'records'")
    return [_shape_key(s) for s in data.get("shapes", [])] or sorted(data.get("reference", {}))


def load(path: str | Path, shape: str | None = None) -> Landscape:
    """A landscape JSON at one of its shapes (`4096x4096x4096`; optional when it holds one),
    or a run directory / its records.jsonl."""
    path = Path(path)
    if _is_run(path):
        return _load_run(path)
    return _load_json(path, shape)


_cache: dict[tuple[str, str, float], Landscape] = {}


def load_cached(path: str | Path, shape: str | None = None) -> Landscape:
    """`load`, kept per process (a backend answers every config of a search from one file)."""
    p = Path(path).resolve()
    target = _records_path(p) if p.is_dir() else p
    try:
        mtime = target.stat().st_mtime
    except OSError as e:
        raise LandscapeError(f"cannot read landscape {path}: {e.strerror}") from None
    key = (str(p), shape or "", mtime)
    if key not in _cache:
        _cache[key] = load(p, shape)
    return _cache[key]


def _is_run(path: Path) -> bool:
    return path.is_dir() or path.name.endswith((".jsonl", ".jsonl.gz"))


def _records_path(run: Path) -> Path:
    plain = run / "records.jsonl"
    return plain if plain.exists() or not (run / "records.jsonl.gz").exists() else run / "records.jsonl.gz"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise LandscapeError(f"cannot read landscape {path}: {e.strerror}") from None
    except ValueError as e:
        raise LandscapeError(f"{path} is not JSON ({e}); a landscape or warm-start source is a run "
                             f"directory, its records.jsonl, a landscape JSON or a JSON list of configs") from None


def _shape_key(shape: Any) -> str:
    return "x".join(str(v) for v in shape) if isinstance(shape, (list, tuple)) else str(shape)


def _load_json(path: Path, shape: str | None) -> Landscape:
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("space"), dict) or not isinstance(data.get("records"), list):
        raise LandscapeError(f"{path}: a landscape JSON has 'space' (param -> values) and 'records'")
    have = shapes(path)
    if shape is None:
        if len(have) != 1:
            raise LandscapeError(f"{path} holds {len(have)} shapes; pick one of {', '.join(have)}")
        shape = have[0]
    if shape not in have:
        raise LandscapeError(f"{path} has no shape {shape!r}; it has {', '.join(have)}")
    space = Space(tuple(Param(n, tuple(v), _pow2(v)) for n, v in data["space"].items()),
                  source=f"{path}@{shape}", meta=(("language", "script"),))
    outcomes: dict[str, Outcome] = {}
    for r in data["records"]:
        config = Config.of(r["config"])
        compile_s = float(r.get("compile_s", 0.0) or 0.0)
        if r.get("compile", "ok") != "ok":
            status = _JSON_STATUS.get(r["compile"], Status.COMPILE_ERROR)
            if status is Status.RUN_TIMEOUT:
                status = Status.COMPILE_TIMEOUT
            outcomes[config.key] = Outcome(status if status is not Status.OK else Status.COMPILE_ERROR,
                                           detail=r.get("compile_err", ""), compile_s=compile_s)
            continue
        run = r.get("runs", {}).get(shape)
        if run is None:
            continue  # not measured at this shape: replay reports it as unrecorded
        status = _JSON_STATUS.get(run.get("status"), Status.RUNTIME_ERROR)
        if status is Status.OK:
            outcomes[config.key] = Outcome(Status.OK, float(run["ms"]) / 1e3, compile_s=compile_s)
        else:
            detail = run.get("err_msg") or f"recorded {run.get('status')}" + (
                f" (error {run['err']:.3g})" if isinstance(run.get("err"), (int, float)) else "")
            outcomes[config.key] = Outcome(status, detail=detail, compile_s=compile_s)
    ref = data.get("reference", {}).get(shape)
    return Landscape(space, outcomes, name=f"{path.stem}@{shape}", shape=shape,
                     device=str(data.get("device", "")),
                     reference_s=float(ref) / 1e3 if isinstance(ref, (int, float)) else None)


def _pow2(values: Iterable[Any]) -> bool:
    """Consecutive powers of two (what a space's {pow2: [lo, hi]} declares)."""
    vs = list(values)
    return (len(vs) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in vs)
            and vs[0] > 0 and vs[0] & (vs[0] - 1) == 0 and all(b == 2 * a for a, b in zip(vs, vs[1:])))


def _load_run(path: Path) -> Landscape:
    run = path if path.is_dir() else path.parent
    records_path = _records_path(path) if path.is_dir() else path
    records = _records_from(records_path)
    if not records:
        raise LandscapeError(f"{records_path} holds no records")
    space_json = run / "skeleton" / "space.json"
    meta: dict[str, Any] = {}
    if (run / "run.json").is_file():
        try:
            meta = json.loads((run / "run.json").read_text())
        except ValueError:
            meta = {}
    if space_json.is_file():
        space = Space.from_json(json.loads(space_json.read_text()))
    else:  # infer a space from the values seen
        names = sorted({k for r in records for k in r.config.as_dict()})
        space = Space(tuple(Param(n, tuple(sorted({r.config[n] for r in records}, key=_order)))
                            for n in names), source=str(records_path))
    outcomes: dict[str, Outcome] = {}
    for r in records:
        if r.status is Status.OK:
            o = Outcome(Status.OK, r.seconds, compile_s=r.build.compile_s)
        else:
            o = Outcome(r.status, detail=r.reason.splitlines()[0][:500] if r.reason else "",
                        compile_s=r.build.compile_s)
        prev = outcomes.get(r.config.key)
        # A winner re-check that failed is appended after the OK record: the later word wins.
        outcomes[r.config.key] = o if prev is None or o.status is not Status.OK else prev
    device = meta.get("device") or {}
    sizes = (meta.get("op") or {}).get("sizes") or {}
    context: dict[str, Any] = dict(sizes)
    dtype = (meta.get("op") or {}).get("dtype")
    if dtype:
        from .ops import DTYPE_BYTES
        context["DTYPE_BYTES"] = DTYPE_BYTES.get(dtype, 4)
    if device.get("cores"):
        context["CORES"] = device["cores"]
    return Landscape(space, outcomes, name=run.name, shape=records[0].op_key,
                     device=device.get("name", records[0].device), context=context,
                     limits=dict(device.get("limits") or {}))


def _records_from(path: Path) -> list[Record]:
    out = []
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt") as f:
                lines = f.read().splitlines()
        else:
            lines = path.read_text().splitlines()
    except OSError as e:  # gzip's own errors (a truncated or not-gzip file) are OSErrors too
        raise LandscapeError(f"cannot read {path}: {e.strerror or e}") from None
    except EOFError:
        raise LandscapeError(f"cannot read {path}: the gzip stream is truncated") from None
    for i, line in enumerate(lines):
        if line.strip():
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                if i != len(lines) - 1:
                    raise LandscapeError(f"{path}:{i + 1}: corrupt record line") from None
    return out


def _order(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, repr(v))


# ---- warm starts -----------------------------------------------------------------------------

WARM_START_K = 1


def _warm_sources(sources: Iterable[str]) -> list[list[Config] | Landscape]:
    """Each warm-start source read: a landscape per shape, or a JSON list of configs (ranked)."""
    out: list[list[Config] | Landscape] = []
    for src in sources:
        path, _, shape = str(src).partition("@")
        p = Path(path)
        if p.is_file() and p.suffix == ".json" and isinstance(_read_json(p), list):
            configs = _read_json(p)
            bad = next((c for c in configs if not isinstance(c, dict)), None)
            if bad is not None or not configs:
                raise LandscapeError(f"{p}: a warm-start list holds configs, each a JSON object of "
                                     f"param -> value, e.g. [{{\"TILE\": 256}}]; found "
                                     f"{repr(bad) if configs else 'an empty list'}")
            out.append([Config.of(c) for c in configs])
            continue
        out.extend(load_cached(p, sh or None) for sh in ([shape] if shape else shapes(p)))
    return out


def warm_starts(sources: Iterable[str], space: Space, k: int = WARM_START_K) -> tuple[Config, ...]:
    """Ranked configs to try first, from earlier measurements of the same space elsewhere (another
    shape, device or run): the `k` fastest of each source that are points of `space` (params
    the space has gained since, taken from its default), interleaved by rank (every source's
    best first), duplicates dropped. A source is a run
    directory, a landscape JSON (`FILE@SHAPE` picks a shape; plain FILE takes all its shapes),
    or a JSON list of configs already ranked."""
    ranked = [src if isinstance(src, list) else src.ranked() for src in _warm_sources(sources)]
    out: list[Config] = []
    for rank in range(k):
        for configs in ranked:
            fits = [f for f in (space.complete(c) for c in configs) if f is not None]
            if rank < len(fits) and fits[rank] not in out:
                out.append(fits[rank])
    return tuple(out)


def any_passed(sources: Iterable[str]) -> bool:
    """Whether any of the sources holds a config that passed (a JSON list of configs does)."""
    return any(bool(src) if isinstance(src, list) else bool(src.ranked(1)) for src in _warm_sources(sources))


def warm_timings(sources: Iterable[str], space: Space) -> tuple[dict[Config, float | None], ...]:
    """What each warm-start source measured, for the guided searcher's prior (`Proposer`'s
    `prior`): config (a point of `space`) -> seconds, None where it failed. Configs a source's
    formulas rejected (never run) are left out; a JSON list of configs has no timings and
    gives nothing."""
    out = []
    for src in _warm_sources(sources):
        if isinstance(src, list):
            continue
        timed: dict[Config, float | None] = {}
        for key, o in src.outcomes.items():
            if o.status is Status.INVALID:
                continue
            c = space.complete(Config.of(json.loads(key)))
            if c is not None:
                timed[c] = o.seconds if o.status is Status.OK else None
        if timed:
            out.append(timed)
    return tuple(out)


# ---- the skeleton that the pipeline replays through ----------------------------------------

def skeleton_files(path: str | Path, shape: str | None, out: str | Path) -> tuple[Path, Path]:
    """Write `replay.yaml` (the landscape's space) and `replay.txt.j2` (a template whose
    rendering names the landscape, the shape and the config) under `out`."""
    src = Path(path).resolve()
    land = load(src, shape)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["language: script", f"description: replay of {land.name} measured on {land.device or '?'}",
             "params:"]
    for p in land.space.params:
        if _pow2(p.values):
            lines.append(f"  {p.name}: {{pow2: [{p.values[0]}, {p.values[-1]}]}}")
        else:
            lines.append(f"  {p.name}: {json.dumps(list(p.values))}")
    sj = land.space.to_json()
    if sj["sizes"]:
        lines.append(f"sizes: {json.dumps(sj['sizes'])}")
    if sj["resources"]:
        lines.append("resources:")
        lines += [f"  {n}: {json.dumps(t)}" for n, t in sj["resources"].items()]
    if sj["constraints"]:
        lines.append("constraints:")
        lines += [f"  - {json.dumps(t)}" for t in sj["constraints"]]
    if sj["default"]:
        lines.append(f"default: {json.dumps(sj['default'])}")
    space_path = out / "replay.yaml"
    space_path.write_text("\n".join(lines) + "\n")
    config = ", ".join(f'"{p.name}": {{{{ {p.name} | tojson }}}}' for p in land.space.params)
    template = (f"# replay: answered from a recorded landscape, not run\n"
                f"landscape: {src}\n" + (f"shape: {land.shape}\n" if not _is_run(src) else "")
                + f"config: {{{config}}}\n")
    template_path = out / "replay.txt.j2"
    template_path.write_text(template)
    return space_path, template_path


def parse_script(source: str) -> dict[str, Any]:
    """The rendered replay script: landscape path, optional shape, config."""
    out: dict[str, Any] = {}
    for n, line in enumerate(source.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if not sep or k not in ("landscape", "shape", "config"):
            raise ValueError(f"line {n}: expected 'landscape:', 'shape:' or 'config:', got {line!r}")
        out[k] = json.loads(v) if k == "config" else v
    if "landscape" not in out or "config" not in out:
        raise ValueError("a replay script names a 'landscape:' and a 'config:'")
    return out


# ---- in-process replay through run_search -------------------------------------------------

class MemoryStore:
    """The two Store methods run_search uses, in memory."""

    def __init__(self) -> None:
        self._records: list[Record] = []

    def records(self) -> list[Record]:
        return list(self._records)

    def append(self, record: Record) -> None:
        self._records.append(record)


class ReplayEvaluator:
    """The Evaluator's interface for run_search (`check`, `evaluate`), answered by lookup.
    `context`/`limits` are what the space's formulas are checked against (default: the
    landscape's own); a config that they reject is INVALID and never 'evaluated'."""

    def __init__(self, landscape: Landscape, context: dict | None = None, limits: dict | None = None):
        self.landscape = landscape
        self.context = dict(landscape.context if context is None else context)
        self.limits = dict(landscape.limits if limits is None else limits)

    def check(self, config: Config) -> str | None:
        return self.landscape.space.check(config, self.context, self.limits)

    def evaluate(self, config: Config, best_s: float | None = None, trial: int = -1) -> Record:
        why = self.check(config)
        if why is not None:
            return self._record(config, Build(Status.INVALID, error=why), Measurement(Status.INVALID), trial)
        o = self.landscape.lookup(config)
        if o is None:
            return self._record(config, Build(Status.COMPILE_ERROR, error="replay: not in the landscape"),
                                Measurement(Status.COMPILE_ERROR), trial)
        if o.status in (Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT, Status.INVALID):
            return self._record(config, Build(o.status, error=o.detail), Measurement(o.status), trial)
        build = Build(Status.OK, artifact=config.key, compile_s=o.compile_s, binary_hash=config.key)
        if o.status is Status.OK:
            return self._record(config, build, Measurement(Status.OK, (o.seconds,)), trial)
        return self._record(config, build, Measurement(o.status, detail=o.detail), trial)

    def _record(self, config: Config, build: Build, meas: Measurement, trial: int) -> Record:
        return Record(self.landscape.shape, "replay", config, build, meas, self.landscape.device or "replay",
                      time=time.time(), trial=trial)


@dataclass
class Trace:
    """One replayed search: the evaluated configs' times in order (inf for a failure)."""

    times: list[float]
    best_s: float
    asks: int = 0
    wall_s: float = 0.0
    configs: list[Config] = field(default_factory=list)  # row for row with `times`

    def timings(self) -> dict[Config, float | None]:
        """config -> seconds (None: failed), as `warm_timings` reads a run: a prior for another
        search."""
        return {c: (t if math.isfinite(t) else None) for c, t in zip(self.configs, self.times)}

    def evaluations_to(self, tolerance: float) -> float:
        """Evaluations spent until one config within `tolerance` of the optimum; inf if none."""
        cut = self.best_s * (1 + tolerance)
        for i, t in enumerate(self.times, 1):
            if t <= cut:
                return i
        return math.inf


def replay_search(landscape: Landscape, sampler: str = "guided", seed: int = 0, budget: int = 100,
                  seeds: Iterable[Config] = (), stop_within: float | None = None,
                  parallel: int = 1, **searcher_options) -> Trace:
    """Run `tune.run_search` with a fresh Searcher against the landscape, as `tune.execute`
    would (the space's default first, then `seeds`). `stop_within`: stop at the first config
    within that fraction of the optimum (the budget still caps it)."""
    from .search import Searcher
    from .tune import run_search

    t0 = time.monotonic()
    ev = ReplayEvaluator(landscape)
    space = landscape.space
    if sampler == "guided":  # as tune.execute: the guided sampler repairs under the formulas
        options = dict(searcher_options.get("sampler_options") or {})
        options.setdefault("repair", lambda c, keep=(): space.repair(c, ev.context, ev.limits, 30, keep))
        searcher_options = {**searcher_options, "sampler_options": options}
    searcher = Searcher(space, sampler, seed, check=ev.check, **searcher_options)
    for config in (*space.starts(ev.context, ev.limits), *seeds, *space.hunches(ev.context, ev.limits)):
        if space.contains(config):
            searcher.enqueue(config)
    store = MemoryStore()
    cut = None if stop_within is None else landscape.best_s * (1 + stop_within)
    if cut is not None:
        class _Stop(Exception):
            pass

        def watch(progress) -> None:
            if progress.best_s is not None and progress.best_s <= cut:
                raise _Stop
        try:
            run_search(store, ev, searcher, budget, None, parallel, watch)
        except _Stop:
            pass
    else:
        run_search(store, ev, searcher, budget, None, parallel)
    done = [r for r in store.records() if r.status is not Status.INVALID]
    return Trace([r.seconds for r in done], landscape.best_s, len(searcher.study.trials),
                 time.monotonic() - t0, [r.config for r in done])


# ---- synthetic landscapes (strategies are judged on more than one kernel) --------------------

SYNTHETIC = ("smooth", "rugged", "cliffs", "flat")


def synthetic(kind: str, seed: int = 0) -> Landscape:
    """A generated landscape over a 2400-config space of six params (four ordered, one
    unordered, one boolean), deterministic in (kind, seed):

    * smooth: a tilted bowl in log-time with pairwise interactions, 1 % noise;
    * rugged: the same plus 15 % per-config noise and interactions twice as strong;
    * cliffs: a bowl whose optimum sits against a resource limit (configs past it fail, as
      shared-memory overflows do) and a spill cliff (5x slower) where tiles outgrow the warps;
    * flat: an easy landscape where about a fifth of the configs are within 3 % of the best.
    """
    import numpy as np
    if kind not in SYNTHETIC:
        raise LandscapeError(f"unknown synthetic landscape {kind!r}; one of {', '.join(SYNTHETIC)}")
    rng = np.random.default_rng([SYNTHETIC.index(kind), seed])
    params = (Param("TA", (16, 32, 64, 128, 256), True), Param("TB", (16, 32, 64, 128, 256), True),
              Param("TK", (16, 32, 64, 128), True), Param("W", (1, 2, 4, 8), True),
              Param("ORDER", ("row", "col", "tiled")), Param("VEC", (False, True)))
    space = Space(params, source=f"synthetic:{kind}:{seed}", meta=(("language", "script"),))
    n = [len(p.values) for p in params]
    grid = np.stack(np.meshgrid(*[np.arange(k) for k in n], indexing="ij"), -1).reshape(-1, len(n))
    u = grid[:, :4] / (np.array(n[:4]) - 1)
    centre = rng.uniform(0.3, 0.9, 4)
    curv = rng.uniform(0.3, 1.2, 4)
    inter = rng.normal(0, 0.35 if kind != "rugged" else 0.7, (4, 4))
    d = u - centre
    logt = (curv * d * d).sum(1) + np.einsum("ni,ij,nj->n", d, np.triu(inter, 1), d)
    logt += rng.normal(0, 0.12, 3)[grid[:, 4]] + rng.normal(0, 0.08, 2)[grid[:, 5]]
    if kind == "flat":
        logt *= 0.05
    logt += rng.normal(0, 0.004 if kind != "rugged" else 0.06, len(grid))
    fail = np.zeros(len(grid), dtype=bool)
    if kind == "cliffs":
        load = u[:, 0] + u[:, 1] + u[:, 2]
        limit = np.quantile(load, 0.85)
        fail = load > limit
        logt -= 0.4 * load  # bigger is better, up to the limit
        logt = np.where(u[:, 0] + u[:, 1] - u[:, 3] > 1.0, logt + math.log10(5.0), logt)
    seconds = 1e-4 * 10.0 ** (logt - logt[~fail].min())
    outcomes = {}
    for row, s_, f in zip(grid, seconds, fail):
        config = Config.of({p.name: p.values[int(i)] for p, i in zip(params, row)})
        outcomes[config.key] = (Outcome(Status.RUNTIME_ERROR, detail="out of resource: shared memory")
                                if f else Outcome(Status.OK, float(s_)))
    return Landscape(space, outcomes, name=f"synthetic-{kind}-{seed}", shape=kind, device="synthetic")


# ---- command line ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.replay", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("skeleton", help="write a space and a template that replay a landscape "
                                        "through `tuner tune --backend replay`")
    s.add_argument("landscape", help="a landscape JSON, or a run directory (e.g. of --sampler grid)")
    s.add_argument("--shape", help="which shape of a multi-shape landscape, e.g. 4096x4096x4096")
    s.add_argument("--out", required=True, help="folder for replay.yaml and replay.txt.j2")
    i = sub.add_parser("info", help="what a landscape holds")
    i.add_argument("landscape")
    i.add_argument("--shape")
    args = p.parse_args(argv)
    try:
        if args.command == "skeleton":
            space, template = skeleton_files(args.landscape, args.shape, args.out)
            print(f"wrote {space} and {template}\nreplay it: tuner tune <op> --shape <small shape> "
                  f"--backend replay --template {template} --space {space}")
            return 0
        for shape in ([args.shape] if args.shape else shapes(args.landscape)):
            land = load(args.landscape, shape or None)
            n_ok = sum(o.status is Status.OK for o in land.outcomes.values())
            print(f"{land.name}: {len(land.outcomes)} of {land.space.size} configs recorded, {n_ok} OK; "
                  f"best {land.best_s * 1e3:.4g} ms; within 3 %: {len(land.within(0.03))}, "
                  f"10 %: {len(land.within(0.10))}")
        return 0
    except LandscapeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Landscape", "LandscapeError", "Outcome", "Trace", "any_passed", "load", "load_cached", "shapes",
           "warm_starts", "warm_timings", "replay_search", "skeleton_files", "synthetic", "SYNTHETIC"]
