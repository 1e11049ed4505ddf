"""A run as an Optuna study that shows it as it was (`--storage`): for optuna-dashboard,
`optuna.visualization` and `optuna.importance`.

The searcher's own study (tuner.search.searcher) is in memory and speaks the sampler's
language: log10 seconds, numeric params as indices into their sorted values, failures as
feasible-looking trials with a penalty and a violated constraint (what the samplers need).
Shown to a person that is wrong three ways, so the storage gets this second study instead,
written from the run's records (records.jsonl stays the durable log):

- the objective is the median time in **seconds**; the record's IQR, sample count, status and
  the reason it failed are user attributes;
- params are their **real values**: ints and floats over their range (log scale where the
  space declares a pow2 range), bools and strings as categoricals over their choices;
- a config that failed (compile error, crash, wrong result, time-out, suspect) is a **FAIL**
  trial, one the space's formulas rejected without compiling is **PRUNED**, each with the
  reason in `user_attrs["reason"]`.

One study per run, named after the run (`--study-name` chooses): two shapes never share a
plot. Adding is idempotent per record (a resumed run adds what the study lacks), so the
study can also be written after the fact from any run directory (`sync`)."""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.core.space import Param, Space
from tuner.core.values import Record, Status
from tuner.search.searcher import SearchError, _storage_error, open_storage

def real_distribution(p: Param) -> BaseDistribution:
    """The distribution of `p`'s real values (see the module docstring)."""
    if not p.ordered or len(p.values) < 2:
        return CategoricalDistribution(list(p.values))
    lo, hi = min(p.values), max(p.values)
    log = p.log and lo > 0
    if all(isinstance(v, int) for v in p.values):
        return IntDistribution(int(lo), int(hi), log=log)
    return FloatDistribution(float(lo), float(hi), log=log)


def _iqr(samples) -> float | None:
    if len(samples) < 2:
        return None
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]


class StudyMirror:
    """The run's records as a truthful Optuna study in `storage` (see the module docstring)."""

    def __init__(self, storage: str, study_name: str, space: Space, attrs: dict[str, Any] | None = None):
        try:
            self.study = optuna.create_study(storage=open_storage(storage), study_name=study_name,
                                             direction="minimize", load_if_exists=True)
        except SearchError:
            raise
        except Exception as e:  # SQLAlchemy's errors are its own classes
            raise _storage_error(storage, e) from None
        self.space = space
        self.dists = {p.name: real_distribution(p) for p in space.params}
        self.seen = {t.user_attrs.get("record") for t in self.study.get_trials(deepcopy=False)}
        with warnings.catch_warnings():  # experimental in Optuna, stable in use since 3.2
            warnings.simplefilter("ignore")
            self.study.set_metric_names(["median seconds per call"])  # the dashboard's axis label
        for k, v in (attrs or {}).items():
            self.study.set_user_attr(k, v)

    @staticmethod
    def _key(record: Record) -> str:
        return f"{record.config.key}@{record.time!r}"

    def add(self, record: Record) -> None:
        """Record `record` as a trial, once."""
        key = self._key(record)
        if key in self.seen or not self.space.contains(record.config):
            return
        status = record.status
        m = record.measurement
        attrs: dict[str, Any] = {"record": key, "status": status.value, "search_trial": record.trial}
        if record.reason:
            attrs["reason"] = record.reason[:4000]
        if m.samples:
            attrs["median_s"] = statistics.median(m.samples)
            attrs["samples"] = len(m.samples)
            iqr = _iqr(m.samples)
            if iqr is not None:
                attrs["iqr_s"] = iqr
        if record.build.compile_s:
            attrs["compile_s"] = round(record.build.compile_s, 3)
        if status is Status.OK and math.isfinite(record.seconds):
            state, value = optuna.trial.TrialState.COMPLETE, record.seconds
        elif status is Status.INVALID:
            state, value = optuna.trial.TrialState.PRUNED, None
        else:
            state, value = optuna.trial.TrialState.FAIL, None
        trial = optuna.trial.create_trial(state=state, value=value, params=dict(record.config.as_dict()),
                                          distributions=self.dists, user_attrs=attrs)
        self.study.add_trial(trial)
        self.seen.add(key)

    def sync(self, records: list[Record]) -> None:
        """Add every record the study lacks (a resumed run, or a run written after the fact)."""
        for r in records:
            self.add(r)
