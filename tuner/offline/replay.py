"""Search strategies compared offline, answered from recorded landscapes (`tuner.core.landscape`).

Two ways to replay one:

* in process, fast (`replay_search`): the real `tune.run_search` loop and `Searcher` with an
  in-memory store and an evaluator that looks configs up -- thousands of searches a minute,
  which is what `bench/search_efficiency.py` and the efficiency tests use;
* through the whole pipeline (`python -m tuner.offline.replay skeleton LANDSCAPE --out DIR`, then
  `tuner tune matmul --shape 64x64x64 --backend replay --template DIR/replay.txt.j2 --space
  DIR/replay.yaml`): the generated template renders a config into a small script naming the
  landscape and the config; the `replay` backend looks it up and answers with the recorded
  build status, failure message and time (see `tuner/backends/replay.py`).

Also: generated landscapes (`synthetic`) for strategies' tests and benches.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable

from tuner.core.landscape import Landscape, LandscapeError, Outcome, load, load_cached, shapes, skeleton_files
from tuner.core.space import Param, Space
from tuner.core.values import Build, Config, Measurement, Record, Status
from tuner.run.flight import Flight
from tuner.run.tune import run_search
from tuner.search.searcher import prepare_searcher

# ---- in-process replay through run_search -------------------------------------------------

class MemoryStore:
    """The two Store methods run_search uses, in memory."""

    def __init__(self) -> None:
        self._records: list[Record] = []

    def records(self) -> list[Record]:
        return list(self._records)

    def append(self, record: Record) -> None:
        self._records.append(record)


@dataclass(frozen=True)
class Noise:
    """Timing noise for a replay, so that strategies and the winner's naming are compared as
    they behave on a device. One evaluation (one config timed once) runs under its own drift
    factor (lognormal, sigma `drift`: clocks, temperature, other work on the machine, which
    differ between evaluations minutes apart), and each of its `calls` timed calls adds jitter
    (lognormal, sigma `jitter`) and, with probability `outlier_p`, a stall of up to
    `outlier_max` of its time. An interleaved re-timing shares one drift factor: that is what
    interleaving is for. Assumed, not fitted: the recorded landscapes hold one median per config
    (`Noise.parse("0.03,0.01")`: drift, jitter)."""

    drift: float = 0.03
    jitter: float = 0.01
    outlier_p: float = 0.05
    outlier_max: float = 0.3
    calls: int = 15

    @classmethod
    def parse(cls, text: str) -> "Noise":
        try:
            parts = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            parts = []
        if not 1 <= len(parts) <= 2 or any(x < 0 for x in parts):
            raise ValueError(f"noise {text!r}: DRIFT[,JITTER] as fractions, e.g. 0.03,0.01")
        return cls(*parts)

    def factor(self, rng) -> float:
        return math.exp(rng.gauss(0.0, self.drift))

    def samples(self, seconds: float, rng, factor: float) -> tuple[float, ...]:
        out = []
        for _ in range(self.calls):
            t = seconds * factor * math.exp(rng.gauss(0.0, self.jitter))
            if rng.random() < self.outlier_p:
                t *= 1 + rng.uniform(0.0, self.outlier_max)
            out.append(t)
        return tuple(out)


class ReplayEvaluator:
    """The Evaluator's interface for run_search (`check`, `evaluate`, `retime`), answered by
    lookup. `context`/`limits` are what the space's formulas are checked against (default: the
    landscape's own); a config that they reject is INVALID and never 'evaluated'. With `noise`,
    an OK config's samples are drawn around its recorded time (`Noise`, seeded by `seed`);
    without, its one sample is the recorded time."""

    def __init__(self, landscape: Landscape, context: dict | None = None, limits: dict | None = None,
                 noise: Noise | None = None, seed: int = 0):
        self.landscape = landscape
        self.context = dict(landscape.context if context is None else context)
        self.limits = dict(landscape.limits if limits is None else limits)
        self.noise = noise
        self.seed = seed
        self.retimes = 0  # interleaves asked for

    def _rng(self, *what):
        """The noise of one evaluation or interleave, drawn from a generator of its own keyed by
        the seed and what is timed (the config and trial, the interleave's number): a config's
        noise does not depend on the order evaluations happen to run in (with threads, a shared
        generator had made the same seed replay differently from run to run)."""
        import random
        return random.Random(":".join(map(str, (self.seed, *what))))

    def _samples(self, seconds: float, rng, factor: float | None = None) -> tuple[float, ...]:
        if self.noise is None:
            return (seconds,)
        return self.noise.samples(seconds, rng, self.noise.factor(rng) if factor is None else factor)

    def retime(self, records: list[Record], with_reference: bool = False) -> list[list[float]]:
        """The records' configs re-timed in one interleave (one drift factor for all)."""
        self.retimes += 1
        rng = self._rng("retime", self.retimes)
        factor = self.noise.factor(rng) if self.noise else 1.0
        return [list(self._samples(self.landscape.lookup(r.config).seconds, rng, factor)) for r in records]

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
            return self._record(config, build, Measurement(Status.OK, self._samples(
                o.seconds, self._rng("evaluate", config.key, trial))), trial)
        return self._record(config, build, Measurement(o.status, detail=o.detail), trial)

    def _record(self, config: Config, build: Build, meas: Measurement, trial: int) -> Record:
        return Record(self.landscape.shape, "replay", config, build, meas, self.landscape.device or "replay",
                      time=time.time(), trial=trial)


class SimulatedFlight(Flight):
    """A device run's evaluations in simulated time, so that a replay with several in flight is
    the same every time for a seed (threads and the wall clock would order the answers, and
    the run's pace, differently from run to run). Each evaluation compiles on a worker of its
    own for its recorded `compile_s`, then waits for one of `slots` devices, which time one
    kernel at a time, in the order the compiles finished (then the order submitted), for
    `timing_s` each (the bench budget and the checks around it); one whose build failed ends
    with its compile. `wait` moves the clock to the earliest end among the futures and returns
    all that have ended by then. The answer itself is looked up at `submit`. Not modelled: the
    device time of interleaves that re-time configs against the incumbent."""

    def __init__(self, timing_s: float = 0.5, slots: int = 1):
        self.t = 0.0
        self.timing_s = timing_s
        self.free = [0.0] * max(1, slots)  # when each device is next free
        self.ready: list[tuple[float, int, cf.Future]] = []  # compiled (or compiling), not yet timed
        self.ends: dict[cf.Future, float] = {}
        self.submitted = 0

    def submit(self, fn, *args) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            record = fn(*args)
        except Exception as e:  # noqa: BLE001 - the future holds it, as a thread's would
            fut.set_exception(e)
            self.ends[fut] = self.t
            return fut
        fut.set_result(record)
        compiled = self.t + max(0.0, record.build.compile_s or 0.0)
        if record.build.status is Status.OK:
            self.ready.append((compiled, self.submitted, fut))
        else:
            self.ends[fut] = compiled
        self.submitted += 1
        return fut

    def wait(self, futures) -> set:
        while True:
            done = {f for f in futures if self.ends.get(f, math.inf) <= self.t}
            if done:
                return done
            i = min(range(len(self.free)), key=self.free.__getitem__)
            if self.free[i] <= self.t and self.ready:
                # A device is idle: it takes the evaluation whose compile ends first. Nothing is
                # submitted while this waits, so none can come before it.
                self.ready.sort(key=lambda e: e[:2])
                compiled, _, fut = self.ready.pop(0)
                self.ends[fut] = self.free[i] = max(self.t, compiled) + self.timing_s
                continue
            later = [e for e in (*self.ends.values(), *self.free) if e > self.t]
            if not later:
                raise RuntimeError("SimulatedFlight.wait: nothing in flight ends")
            self.t = min(later)

    def now(self) -> float:
        return self.t


@dataclass
class Trace:
    """One replayed search: the evaluated configs' recorded (true) times in order (inf for a
    failure), and the winner it named (`named`, its true time `named_s`): the search's best
    without noise; with noise, the fastest of `winner.finalists` re-timed in one interleave, as
    `winner.pick_winner` names it."""

    times: list[float]
    best_s: float
    asks: int = 0
    wall_s: float = 0.0
    configs: list[Config] = field(default_factory=list)  # row for row with `times`
    named: Config | None = None
    named_s: float = math.inf
    retimed: int = 0  # configs in the final interleave
    anchored: int = 0  # configs timed again against the incumbent during the search
    measured: list[float] = field(default_factory=list)  # row for row: the medians timed (noise included; inf: failed)

    def named_within(self, tolerance: float) -> bool:
        return self.named_s <= self.best_s * (1 + tolerance)

    def timings(self) -> dict[Config, float | None]:
        """config -> seconds (None: failed), as `warm_timings` reads a run: a prior for another
        search."""
        return {c: (t if math.isfinite(t) else None) for c, t in zip(self.configs, self.times)}

    def measured_timings(self) -> dict[Config, float | None]:
        """config -> the median this search timed (None: failed), as `warm_timings` reads the
        run a search under noise leaves: the prior a later run of the same command is given."""
        return {c: (t if math.isfinite(t) else None) for c, t in zip(self.configs, self.measured)}

    def evaluations_to(self, tolerance: float) -> float:
        """Evaluations spent until one config within `tolerance` of the optimum; inf if none."""
        cut = self.best_s * (1 + tolerance)
        for i, t in enumerate(self.times, 1):
            if t <= cut:
                return i
        return math.inf


def replay_search(landscape: Landscape, sampler: str = "guided", seed: int = 0, budget: int = 100,
                  seeds: Iterable[Config] = (), stop_within: float | None = None,
                  parallel: int = 1, noise: Noise | None = None, finalists: tuple[int, int, float] = (3, 8, 0.05),
                  anchor_margin: float | str | None = None, **searcher_options) -> Trace:
    """Run `tune.run_search` with a fresh Searcher against the landscape, as `tune.execute`
    would (the space's default first, then `seeds`), then name the winner as `winner.pick_winner`
    does (`finalists`: its at_least, at_most, margin). `stop_within`: stop at the first config
    truly within that fraction of the optimum (the budget still caps it). `noise`: timings
    drawn around the recorded ones (`Noise`), seeded by `seed`. `anchor_margin`: as
    `tune.run_search` takes it. `parallel` evaluations in flight run in simulated time
    (`SimulatedFlight`): the same seed replays the same search."""
    from tuner.run.winner import finalists as pick_finalists
    t0 = time.monotonic()
    ev = ReplayEvaluator(landscape, noise=noise, seed=seed)
    searcher = prepare_searcher(landscape.space, sampler, seed, ev.check, ev.context, ev.limits, seeds,
                                **searcher_options)
    store = MemoryStore()
    cut = None if stop_within is None else landscape.best_s * (1 + stop_within)

    def true_s(r: Record) -> float:
        o = landscape.lookup(r.config) if r.status is Status.OK else None
        return o.seconds if o is not None else math.inf
    if cut is not None:
        class _Stop(Exception):
            pass

        def watch(progress) -> None:
            if progress.best_s is not None and min(map(true_s, store.records()), default=math.inf) <= cut:
                raise _Stop
        try:
            run_search(store, ev, searcher, budget, None, parallel, watch, anchor_margin=anchor_margin,
                       flight=SimulatedFlight())
        except _Stop:
            pass
    else:
        run_search(store, ev, searcher, budget, None, parallel, anchor_margin=anchor_margin, flight=SimulatedFlight())
    done = [r for r in store.records() if r.status is not Status.INVALID]
    anchored = ev.retimes
    top = pick_finalists(done, *finalists)
    named, retimed = None, 0
    if top and noise is not None:
        samples = ev.retime(top)
        retimed = len(top)
        named = min(zip(top, samples), key=lambda rs: statistics.median(rs[1]))[0]
    elif top:
        named = top[0]
    return Trace([true_s(r) for r in done], landscape.best_s, len(searcher.study.trials),
                 time.monotonic() - t0, [r.config for r in done],
                 named.config if named else None, true_s(named) if named else math.inf, retimed, anchored,
                 [r.seconds if r.status is Status.OK else math.inf for r in done])


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
    p = argparse.ArgumentParser(prog="python -m tuner.offline.replay", description=__doc__.split("\n\n")[0])
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


__all__ = ["Landscape", "LandscapeError", "Outcome", "Trace", "load", "load_cached", "shapes",
           "replay_search", "skeleton_files", "synthetic", "SYNTHETIC"]
