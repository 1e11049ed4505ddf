"""The Searcher: owns the Optuna study through ask/tell.

Encoding (one place, `distributions`): numeric params are ordinal integer indices into their
sorted value list, so TPE and CMA-ES see that 64 sits between 32 and 128 (pow2 ranges are
then on a log scale for free); booleans and strings are categoricals.

What Optuna is told (one place, `tell`): the objective is log10(seconds). A config that is
invalid or fails is told COMPLETE with a penalty value *and* a violated constraint
(`trial.set_constraint`), because built-in samplers ignore FAILed trials entirely and would
propose the same bad region again; TPE ranks constraint-violating trials below every
feasible one. The searcher never evaluates a config twice: the caller answers repeats from
its record cache through `tell`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from .space import Space
from .values import Config, Record, Status

SAMPLERS = ("tpe", "random", "cmaes", "grid")
PENALTY = math.log10(3600.0)  # an hour: worse than any real kernel
GRID_MAX = 100_000

optuna.logging.set_verbosity(optuna.logging.WARNING)


class SearchError(ValueError):
    pass


def distributions(space: Space) -> dict[str, Any]:
    return {p.name: IntDistribution(0, len(p.values) - 1) if p.ordered and len(p.values) > 1
            else CategoricalDistribution(list(p.values)) for p in space.params}


def encode(space: Space, config: Config) -> dict[str, Any]:
    d = config.as_dict()
    return {p.name: p.values.index(d[p.name]) if p.ordered and len(p.values) > 1 else d[p.name]
            for p in space.params}


def decode(space: Space, params: dict[str, Any]) -> Config:
    return Config.of({p.name: p.values[int(params[p.name])] if p.ordered and len(p.values) > 1
                      else params[p.name] for p in space.params})


def make_sampler(name: str, space: Space, seed: int | None, n_startup: int):
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
        grid = {p.name: list(range(len(p.values))) if p.ordered and len(p.values) > 1
                else list(p.values) for p in space.params}
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise SearchError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}")


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


class Searcher:
    def __init__(self, space: Space, sampler: str = "tpe", seed: int | None = None,
                 storage: str | None = None, study_name: str = "tuner", n_startup: int = 8):
        self.space = space
        self.dists = distributions(space)
        self.sampler_name = sampler
        try:
            self.study = optuna.create_study(
                direction="minimize", sampler=make_sampler(sampler, space, seed, n_startup),
                storage=open_storage(storage), study_name=study_name, load_if_exists=True)
        except (ValueError, ImportError, RuntimeError) as e:
            if isinstance(e, SearchError):
                raise
            raise SearchError(f"cannot open the Optuna storage {storage!r}: {e}") from None

    @property
    def persistent(self) -> bool:
        """Whether the study lives in an Optuna storage that outlives this process."""
        return not isinstance(self.study._storage, optuna.storages.InMemoryStorage)  # noqa: SLF001

    def replay(self, records: list[Record]) -> None:
        """Teach a fresh in-memory study what the records say, without asking the sampler.
        records.jsonl is the run's durable log; an in-memory study rebuilt from it is as good as
        a persistent Optuna storage, and far cheaper per trial."""
        trials = []
        for r in records:
            if not self.space.contains(r.config):
                continue
            ok = r.status is Status.OK
            trials.append(optuna.trial.create_trial(
                params=encode(self.space, r.config), distributions=self.dists,
                value=math.log10(max(r.seconds, 1e-12)) if ok else PENALTY,
                constraints={"failed": 0.0 if ok else 1.0}))
        self.study.add_trials(trials)

    def enqueue(self, config: Config) -> None:
        """Propose `config` next (the skeleton's default, warm starts, a proposer's picks)."""
        self.study.enqueue_trial(encode(self.space, config), skip_if_exists=True)

    def ask(self) -> tuple[optuna.Trial, Config]:
        trial = self.study.ask(self.dists)
        return trial, decode(self.space, trial.params)

    def tell(self, trial: optuna.Trial | int, record: Record) -> None:
        t = trial if isinstance(trial, optuna.Trial) else optuna.Trial(self.study, self._trial_id(trial))
        ok = record.status is Status.OK
        t.set_constraint("failed", 0.0 if ok else 1.0)
        value = math.log10(max(record.seconds, 1e-12)) if ok else PENALTY
        self.study.tell(t, value)

    def _trial_id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(  # noqa: SLF001
            self.study._study_id, number)  # noqa: SLF001

    def abandon(self, number: int) -> None:
        """A trial whose evaluation never finished (the run was killed): it taught nothing."""
        self.study.tell(number, state=optuna.trial.TrialState.FAIL)

    def running_trials(self) -> list[tuple[int, Config]]:
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            try:
                out.append((t.number, decode(self.space, t.params)))
            except (KeyError, IndexError, ValueError):
                out.append((t.number, Config.of({})))
        return out
