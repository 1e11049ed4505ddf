"""`GuidedSearch` (tuner.search.guided) behind Optuna's sampler interface, with a second
opinion from Optuna's TPE: the Searcher's ask/tell loop drives it like any Optuna sampler."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import optuna

from tuner.core.space import Space
from tuner.core.values import Config
from tuner.search.guided import GuidedSearch

TPE_EVERY = 4  # every 4th ask is TPE's (GuidedSampler; 0: never)
TPE_FROM = 10  # timings (or failures) before TPE has a say


class GuidedSampler(optuna.samplers.BaseSampler):
    """`GuidedSearch` behind Optuna's sampler interface, for the Searcher's ask/tell loop.

    Reads the whole history from the study on every ask (so a resumed study continues where
    it stood): COMPLETE trials with all constraints <= 0 are timings (their value is
    log10 seconds), other COMPLETE trials are failures, RUNNING and WAITING ones are in
    flight. Enqueued trials are left to Optuna. When every config has been seen it returns
    nothing and Optuna falls back to random values, which the caller answers from its cache.
    """

    def __init__(self, space: Space, distributions: dict, encode: Callable, decode: Callable,
                 seed: int | None = None, check: Callable[[Config], str | None] | None = None,
                 tpe_every: int = TPE_EVERY, **options: Any):
        """`tpe_every`: every n-th ask is TPE's (see "A second opinion" in tuner.search.guided's
        notes; 0: never); `options`: GuidedSearch's."""
        self.space = space
        self.tpe_every = tpe_every
        self.search = GuidedSearch(space, check, **options)
        self._dists = distributions
        self._encode, self._decode = encode, decode
        self._seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        self._fallback = optuna.samplers.RandomSampler(seed=self._seed)
        self._complete: dict[int, tuple | None] = {}  # trial number -> (index, value) or None

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._dists)

    def sample_relative(self, study, trial, search_space: dict) -> dict:
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}
        TS = optuna.trial.TrialState
        done: list[tuple[tuple[int, ...], float | None]] = []
        pending: list[tuple[int, ...]] = []
        for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
            if t.number == trial.number:
                continue
            if t.number in self._complete:  # a finished trial never changes: decoded once
                if self._complete[t.number] is not None:
                    done.append(self._complete[t.number])
                continue
            if t.state == TS.WAITING:
                params = t.system_attrs.get("fixed_params") or {}
            elif t.state in (TS.COMPLETE, TS.RUNNING):
                params = t.params
            else:
                continue
            try:
                idx = self.search.enc.index(self._decode(self.space, params))
            except (KeyError, IndexError, ValueError, TypeError):
                idx = None
            if t.state == TS.COMPLETE:
                feasible = all(v <= 0.0 for v in t.constraints.values()) and t.value is not None
                self._complete[t.number] = None if idx is None else (idx, float(t.value) if feasible else None)
                if idx is not None:
                    done.append(self._complete[t.number])
            elif idx is not None:
                pending.append(idx)
        rng = np.random.default_rng([self._seed, trial.number])
        idx = self._second_opinion(study, trial, done, pending) if self._tpe_turn(done, pending) else None
        if idx is None:
            idx = self.search.propose(done, pending, rng)
        if idx is None:
            return {}
        return {k: v for k, v in self._encode(self.space, self.search.enc.config(idx)).items()
                if k in search_space}

    def _tpe_turn(self, done: list, pending: list) -> bool:
        """Whether this ask is TPE's: every `tpe_every`-th from TPE_FROM on, unless the model's
        ask is a stall's (global or a regime flip: those are what the model does about a
        plateau) or a prior rates the space (TPE would not read it)."""
        if not self.tpe_every or len(done) < TPE_FROM or self.search.has_prior:
            return False
        if (len(done) + len(pending)) % self.tpe_every:
            return False
        return self.search.stall_ask(done, len(pending)) is None

    def _second_opinion(self, study, trial, done: list, pending: list) -> tuple[int, ...] | None:
        """TPE's pick from the study's history (multivariate, seeded by the trial's number as
        the model's own draws are, not by a generator that runs on between asks), repaired
        where the formulas reject it; None when it is a config already seen, one the failure
        model expects to fail, or none could be made of it."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is "experimental"
            tpe = optuna.samplers.TPESampler(seed=(self._seed * 1_000_003 + trial.number) % 2**31,
                                             multivariate=True, n_startup_trials=0)
            params = tpe.sample_relative(study, trial, tpe.infer_relative_search_space(study, trial))
        if set(params) != set(self._dists):
            return None
        try:
            config = self._decode(self.space, params)
        except (KeyError, IndexError, ValueError, TypeError):
            return None
        check, repair = self.search.check, self.search.repair
        if check is not None and check(config) is not None:
            config = repair(config) if repair is not None else None
        idx = self.search.enc.index(config) if config is not None else None
        if idx is None or tuple(idx) in {tuple(i) for i, _ in done} | {tuple(i) for i in pending}:
            return None
        # Not where the model's failure model expects a failure: TPE reads a failure as a slow
        # config, not as a wall, and would keep drawing from a region that does not build.
        if self.search.p_works(idx, done) < 0.5:
            return None
        return tuple(int(v) for v in idx)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)
