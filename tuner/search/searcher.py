"""The Searcher: owns the Optuna study through ask/tell.

Encoding (one place, `distributions`): numeric params are ordinal integer indices into their
sorted value list (whatever order the space lists them in), so TPE and CMA-ES see that 64
sits between 32 and 128 (pow2 ranges are then on a log scale for free); booleans and strings
are categoricals. `encoding="categorical"` (benchmarks only) makes every param a categorical.

Samplers (`SAMPLERS`): `guided`, the default, is the model-based strategy of
`tuner.search.guided` (a Gaussian process over the whole finite space with a learned model of
where configs fail, searching outward from the best config so far); `tpe`, `random`,
`cmaes`, `gp` (Optuna's GPSampler; needs scipy) and `grid` (every config once) are Optuna's.
All of them go through the same ask/tell loop and the same storage, so a run resumes with
any of them. A `check` (the space's formulas under the run's sizes and device limits) lets
`guided` skip configs that would be INVALID without spending an ask on them.

Warm starts and a proposer's picks are `enqueue`d: Optuna hands them out first, in order.
`patience` (off by default) stops a search once that many evaluations in a row brought no
config at least 0.5 % faster than the best so far (`stalled`).

What Optuna is told (one place, `tell`): the objective is log10(seconds) (`Record.search_s`:
a config timed against the incumbent in one interleave is told as the incumbent's figure
times their ratio there). A config that is
invalid or fails is told COMPLETE with a penalty value *and* a violated constraint
(`trial.set_constraint`), because built-in samplers ignore FAILed trials entirely and would
propose the same bad region again; TPE ranks constraint-violating trials below every
feasible one. The searcher never evaluates a config twice: the caller answers repeats from
its record cache through `tell`. This study lives in memory and is rebuilt from
records.jsonl on a resume; what `--storage` keeps is a study written for people
(tuner.search.study).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tuner.core.space import Space
from tuner.core.values import Config, Record, Status

SAMPLERS = ("guided", "tpe", "random", "cmaes", "gp", "grid")
DEFAULT_SAMPLER = "guided"
STALL_GAIN = 0.005  # what counts as an improvement for `patience`
PENALTY = math.log10(3600.0)  # an hour: worse than any real kernel
GRID_MAX = 100_000

optuna.logging.set_verbosity(optuna.logging.WARNING)


class SearchError(ValueError):
    pass


def _ordinal(p) -> bool:
    return p.ordered and len(p.values) > 1


def ordinal_values(p) -> tuple:
    """The values an ordinal index counts through: sorted, so that index order is value order."""
    return tuple(sorted(p.values)) if _ordinal(p) else p.values


def distributions(space: Space, encoding: str = "ordinal") -> dict[str, Any]:
    if encoding == "categorical":
        return {p.name: CategoricalDistribution(list(p.values)) for p in space.params}
    return {p.name: IntDistribution(0, len(p.values) - 1) if _ordinal(p)
            else CategoricalDistribution(list(p.values)) for p in space.params}


def encode(space: Space, config: Config) -> dict[str, Any]:
    d = config.as_dict()
    return {p.name: ordinal_values(p).index(d[p.name]) if _ordinal(p) else d[p.name]
            for p in space.params}


def decode(space: Space, params: dict[str, Any]) -> Config:
    return Config.of({p.name: ordinal_values(p)[int(params[p.name])] if _ordinal(p) else params[p.name]
                      for p in space.params})


def make_sampler(name: str, space: Space, seed: int | None, n_startup: int,
                 check=None, encoding: str = "ordinal", options: dict | None = None):
    if name == "guided":
        from tuner.search.guided_sampler import GuidedSampler
        if encoding != "ordinal":
            raise SearchError("the guided sampler encodes the space itself; use encoding='ordinal'")
        return GuidedSampler(space, distributions(space), encode, decode, seed=seed, check=check,
                             **(options or {}))
    if name == "gp":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=n_startup)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        if not any(p.ordered and len(p.values) > 1 for p in space.params):
            raise SearchError("cmaes needs at least one numeric param; use --sampler tpe")
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise SearchError("--sampler cmaes needs the cmaes package: pip install cmaes") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=n_startup)
    if name == "grid":
        if space.size > GRID_MAX:
            raise SearchError(f"--sampler grid walks every point; this space has {space.size} "
                              f"(limit {GRID_MAX}); use tpe")
        grid = {p.name: list(range(len(p.values))) if _ordinal(p) and encoding == "ordinal"
                else list(p.values) for p in space.params}
        return _GridSampler(grid, seed=seed)
    raise SearchError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}")


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, without its `study.stop()` once every point is taken: that only works
    inside `study.optimize` and raises under ask/tell. run_search stops on its own when the
    space is exhausted."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def open_storage(storage: str | None):
    """None: in memory (the default: records.jsonl is the durable log and the study is rebuilt
    from it on resume). A path ending in .journal: Optuna's append-only journal file. Else an
    RDB URL (sqlite:///study.db, postgresql://...). Persistent storages cost an fsync or a
    commit per write, several per trial (measured ~10-60 ms a trial for a journal, ~70 ms for
    SQLite on this class of machine), against ~3 ms in memory."""
    if storage is None or "://" in storage:
        return storage
    if storage.endswith(".journal"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        return JournalStorage(JournalFileBackend(storage))
    raise SearchError(f"--storage {storage!r}: give an Optuna storage URL (sqlite:///study.db, "
                      f"postgresql://...) or a path ending in .journal")


def check_storage(storage: str | None) -> None:
    """Open `storage` once, so that one that cannot be opened (a missing directory, an unknown
    database driver, a refused login) is refused before a run directory exists."""
    if storage is not None:
        try:
            optuna.storages.get_storage(open_storage(storage))
        except SearchError:
            raise
        except Exception as e:  # SQLAlchemy's errors are its own classes
            raise _storage_error(storage, e) from None


def _storage_error(storage: str, e: Exception) -> SearchError:
    return SearchError(f"cannot open the Optuna storage {storage!r}: {type(e).__name__}: {e}")


class Searcher:
    def __init__(self, space: Space, sampler: str = DEFAULT_SAMPLER, seed: int | None = None,
                 n_startup: int = 8,
                 check=None, patience: int | None = None, encoding: str = "ordinal",
                 sampler_options: dict | None = None, stop_gain: float = 0.0):
        """`check(config) -> reason or None`: the space's formulas under the run's sizes and
        limits (what the evaluator rejects as INVALID). `patience`, `stop_gain`: see `stalled`.
        `encoding`: "ordinal" (the default) or "categorical" (for benchmarks).
        `sampler_options`: keyword options of the guided sampler (`guided.GuidedSearch`)."""
        self.space = space
        self.encoding = encoding
        self.dists = distributions(space, encoding)
        self.sampler_name = sampler
        self.patience = patience
        self.stop_gain = stop_gain
        self._patience_from = 0  # evaluations before this one do not count (`restart_patience`)
        if encoding == "categorical":
            self._encode, self._decode = (lambda sp, c: c.as_dict()), (lambda sp, p: Config.of(dict(p)))
        else:
            self._encode, self._decode = encode, decode
        # Made outside the try: its errors (a seed out of range) are not the storage's.
        made = make_sampler(sampler, space, seed, n_startup, check, encoding, sampler_options)
        self.study = optuna.create_study(direction="minimize", sampler=made)

    def replay(self, records: list[Record]) -> None:
        """Teach the fresh study what the records say, without asking the sampler.
        records.jsonl is the run's durable log; a study rebuilt from it is as good as one kept
        in an Optuna storage, and far cheaper per trial."""
        trials = []
        for r in records:
            if not self.space.contains(r.config) or r.status is Status.INFRA_ERROR:
                continue
            ok = r.status is Status.OK
            trials.append(optuna.trial.create_trial(
                params=self._encode(self.space, r.config), distributions=self.dists,
                value=math.log10(max(r.search_s, 1e-12)) if ok else PENALTY,
                constraints={"failed": 0.0 if ok else 1.0}, user_attrs={"status": r.status.value}))
        self.study.add_trials(trials)

    def enqueue(self, config: Config) -> None:
        """Propose `config` next (the skeleton's default, warm starts, a proposer's picks)."""
        self.study.enqueue_trial(self._encode(self.space, config), skip_if_exists=True)

    def queued(self) -> int:
        """Configs enqueued and not asked yet: the next asks are these, whatever is known."""
        return len(self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))

    def ask(self) -> tuple[optuna.Trial, Config]:
        trial = self.study.ask(self.dists)
        return trial, self._decode(self.space, trial.params)

    def tell(self, trial: optuna.Trial | int, record: Record, repeat: bool = False) -> None:
        """`repeat`: the sampler asked for a config already evaluated, answered from its record
        (it cost nothing, so `patience` does not count it)."""
        if record.status is Status.INFRA_ERROR:  # the machine's failure: teaches the sampler nothing
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        t = trial if isinstance(trial, optuna.Trial) else optuna.Trial(self.study, self._trial_id(trial))
        ok = record.status is Status.OK
        t.set_constraint("failed", 0.0 if ok else 1.0)
        t.set_user_attr("status", record.status.value)
        if repeat:
            t.set_user_attr("repeat", True)
        value = math.log10(max(record.search_s, 1e-12)) if ok else PENALTY
        self.study.tell(t, value)

    def stalled(self) -> bool:
        """With `patience` N: the last N evaluations (INVALID configs and repeats cost none)
        brought no config at least STALL_GAIN faster than the best before them. Read from the
        study, so it holds across a resume. Always False without `patience`. With `stop_gain`
        > 0, also the guided model's expected improvement (`expected_gain`) is below it: a stall
        while the model still expects that much more goes on (another sampler: the stall alone)."""
        if not self.patience:
            return False
        evaluations = self._evaluations()
        best, last = math.inf, -1  # the best so far, and where it was found
        for k, t in enumerate(evaluations):
            feasible = all(v <= 0.0 for v in t.constraints.values())
            if feasible and t.value is not None and t.value < best + math.log10(1 - STALL_GAIN):
                best, last = t.value, k
        if len(evaluations) - max(last + 1, self._patience_from) < self.patience:
            return False
        gain = self.expected_gain() if self.stop_gain > 0 else None
        return gain is None or gain < self.stop_gain

    def expected_gain(self) -> float | None:
        """The guided search's model's largest expected improvement at its last ask, as a
        fraction of the best time (None: another sampler, or no model yet)."""
        return getattr(getattr(self.study.sampler, "search", None), "expected_gain", None)

    def restart_patience(self) -> None:
        """Count `patience` from here on (the best so far still counts): a resume that asks for
        more than the run had (a larger budget, another patience) gets a whole window of its own.
        Else a run that patience stopped would evaluate nothing more, whatever it was given."""
        self._patience_from = len(self._evaluations())

    def _evaluations(self) -> list:
        return [t for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get("status") != Status.INVALID.value and not t.user_attrs.get("repeat")]

    def _trial_id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(  # noqa: SLF001
            self.study._study_id, number)  # noqa: SLF001

    def abandon(self, number: int) -> None:
        """A trial whose evaluation never finished (the run was killed): it taught nothing."""
        self.study.tell(number, state=optuna.trial.TrialState.FAIL)


def prepare_searcher(space: Space, sampler: str, seed: int | None, check, context: dict[str, Any],
                     limits: dict[str, float] | None, first: Iterable[Config] = (),
                     notes: list[str] | None = None, sampler_options: dict | None = None,
                     **searcher_options: Any) -> Searcher:
    """The Searcher a search starts from, the same for a run (`tune.execute`) and an offline
    replay (`offline.replay.replay_search`), so that replayed figures are what a run would do.

    Configs are queued to be tried first, in this order: where the space starts (its default,
    or the nearest config the formulas accept at this shape), `first` (a resume's seeds, warm
    starts, a proposer's picks), then the space's `promising:` configs (`notes` gets a line for
    each one the formulas reject here). Each is completed with the space's defaults for params
    it lacks; one that is not a point of the space is left out. The guided sampler repairs its
    candidates under the formulas at this shape (`Space.repair`) unless `sampler_options`
    brings its own `repair`."""
    if sampler == "guided":
        options = dict(sampler_options or {})
        options.setdefault("repair", lambda c, keep=(): space.repair(c, context, limits, 30, keep))
        sampler_options = options
    searcher = Searcher(space, sampler, seed, check=check, sampler_options=sampler_options,
                        **searcher_options)
    for config in (*space.starts(context, limits), *first, *space.promising_configs(context, limits, notes)):
        config = space.complete(config)
        if config is not None:
            searcher.enqueue(config)
    return searcher
