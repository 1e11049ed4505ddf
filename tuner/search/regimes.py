"""Switches and regimes: the guided search's moves that its model alone makes late.

A *switch* is a value that is a feature of its own (`Encoding`): each value of an unordered
param, and an ordered param's 'off' 0 before a geometric run. A switch often selects the
kernel's *regime* (one pass or looped, persistent or not, a load kind), and a switch's effect in
one regime says little of it in another; the objective model is stationary and reads it as one
slope. So the guided search (`tuner.search.guided`) asks this module for three kinds of move:

* `screen`: before the model picks, each switch value flipped once from the first config
  timed (then the incumbent), one factor at a time;
* `regime_flip`: at a stall, a switch flipped on the best config of another regime, that
  regime kept;
* `runner_up`: at a stall, the best config of another regime close enough to the best that
  its own neighbourhood is worth a walk (the search centres its trust region there).

Contract: every method is pure given its arguments and the rng (caches live in the caller's
`valid`); a move it returns is a config index vector not in `seen`, accepted by `valid`, or
None when it has none to offer.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from tuner.core.values import Config
from tuner.search.encoding import Encoding

RUNNER_UP_WITHIN = math.log10(1.10)  # `runner_up` walks near another regime's best this close to the best


class Regimes:
    """The switch and regime moves over one encoded space.

    `valid(flat key)`: whether the space's formulas accept the config; `repair(config,
    keep=names)`: the nearest valid config leaving the params `keep` names as they are, or None
    (None: no repair); `screen_max`: `screen` stays off on spaces with more switch values than
    this besides the start's (0: off)."""

    def __init__(self, enc: Encoding, valid: Callable[[int], bool],
                 repair: Callable[..., Config | None] | None, screen_max: int):
        self.enc = enc
        self.valid = valid
        self.repair = repair
        self.screen_max = screen_max

    def switches(self) -> list[tuple[int, int]]:
        """(param, value index) of every value that is a feature of its own: each value of an
        unordered param, and an ordered param's 'off' 0."""
        enc = self.enc
        return [(j, v) for j, n in enumerate(enc.n_values) if n > 1 and not enc.ordered[j] for v in range(n)] + \
            [(j, 0) for j in range(len(enc.params)) if enc.zero[j]]

    def regime_flip(self, ranked: list, turn: int, seen: np.ndarray,
                    rng: np.random.Generator) -> tuple[int, ...] | None:
        """A switch flip from the best config of another regime (see `GuidedSearch`'s `regimes`): for each
        switch param, from the `turn`-th on, the best config timed with another value of it
        than the incumbent's (on where the incumbent is 'off', or the reverse); the first
        such config with a flip not yet seen gives it. None when none has."""
        enc = self.enc
        params = sorted({j for j, _ in self.switches()})
        inc = ranked[0][0]
        for k in range(len(params)):
            j = params[(turn + k) % len(params)]
            if enc.ordered[j]:
                centre = next((idx for idx, _ in ranked[1:] if (idx[j] == 0) != (inc[j] == 0)), None)
                keep = None if centre is None else (j, 0 if centre[j] == 0 else None)
            else:
                centre = next((idx for idx, _ in ranked[1:] if idx[j] != inc[j]), None)
                keep = None if centre is None else (j, int(centre[j]))
            flip = self._flip(centre, keep, seen, rng) if centre is not None else None
            if flip is not None:
                return flip
        return None

    def runner_up(self, ranked: list, turn: int) -> tuple[int, ...] | None:
        """The best config of another regime than the incumbent's (see `GuidedSearch`'s `runner_up`): for each
        switch param, from the `turn`-th on, the best timed with another value of it (on where
        the incumbent is 'off', or the reverse), the first such one at most `RUNNER_UP_WITHIN`
        slower than the incumbent; None when there is none."""
        params = sorted({j for j, _ in self.switches()})
        inc = ranked[0][0]
        for k in range(len(params)):
            j = params[(turn + k) % len(params)]
            other = (lambda idx: (idx[j] == 0) != (inc[j] == 0)) if self.enc.ordered[j] else \
                (lambda idx: idx[j] != inc[j])
            centre = next(((idx, y) for idx, y in ranked[1:] if other(idx)), None)
            if centre is not None and centre[1] - ranked[0][1] <= RUNNER_UP_WITHIN:
                return tuple(centre[0])
        return None

    def _flip(self, centre: Sequence[int], keep: tuple[int, int | None], seen: np.ndarray,
              rng: np.random.Generator) -> tuple[int, ...] | None:
        """A config not yet seen that flips one switch of `centre` (to another unordered value,
        or an ordered param to its 'off' 0), the regime `keep` names kept, completed by `repair`
        where the formulas reject it; None when every such flip was seen."""
        enc, inside = self.enc, self._inside(keep)
        taken = set(int(f) for f in seen)
        flips = [(j, v) for j, v in self.switches() if j != keep[0] and int(centre[j]) != v]
        for k in rng.permutation(len(flips)):
            j, v = flips[k]
            idx = np.array(centre, dtype=np.int64)
            idx[j] = v
            if not self.valid(int(enc.flat(idx[None])[0])):
                fixed = self.repair(enc.config(idx), keep=(enc.params[j].name, enc.params[keep[0]].name)) \
                    if self.repair else None
                got = enc.index(fixed) if fixed is not None else None
                if got is None or got[j] != v:
                    continue
                idx = np.array(got, dtype=np.int64)
            flat = int(enc.flat(idx[None])[0])
            if flat not in taken and self.valid(flat) and inside(idx):
                return tuple(int(x) for x in idx)
        return None

    def _inside(self, keep: tuple[int, int | None]) -> Callable[[Sequence[int]], bool]:
        """Whether a config (index vector) is in the regime `keep` (param, value; None: not the
        'off' 0) names."""
        j, v = keep
        return (lambda idx: int(idx[j]) == v) if v is not None else (lambda idx: int(idx[j]) != 0)

    def screen(self, timed: np.ndarray, failed: np.ndarray, seen: np.ndarray, bases: Sequence[Sequence[int]],
                rng: np.random.Generator) -> tuple[int, ...] | None:
        """The first of `bases` (the first config timed, then the incumbent) with one switch
        value that is still untried (see `screen` in `GuidedSearch`'s notes), completed by `repair`
        when the formulas reject the move; None when none is left to try, or the space has more
        than `screen` switch values besides the start's. Each switch flipped from the same
        start (one factor at a time) gives the model each one's effect from one base: flipped
        from a moving incumbent, the first flip that helps leads the rest into its regime (a
        one-pass cross-entropy at 1.4x the optimum, where not persistent was the way).
        Untried: in no config `timed` (or in flight), and in fewer than two that `failed` (a
        default the formulas reject at this shape says nothing of its switches' speed; two
        failures say the value does not work here)."""
        switches = self.switches()
        unordered = {j for j, _ in switches if not self.enc.ordered[j]}
        # The space's count, not the history's, so that the decision is the same on every ask.
        if not switches or len(switches) - len(unordered) > self.screen_max:
            return None
        untried = [(j, v) for j, v in switches
                   if not (timed[:, j] == v).any() and (failed[:, j] == v).sum() < 2]
        taken = set(int(f) for f in seen)
        for base in bases:
            for k in rng.permutation(len(untried)):
                j, v = untried[k]
                idx = np.array(base, dtype=np.int64)
                idx[j] = v
                if not self.valid(int(self.enc.flat(idx[None])[0])):
                    fixed = self.repair(self.enc.config(idx), keep=(self.enc.params[j].name,)) if self.repair else None
                    got = self.enc.index(fixed) if fixed is not None else None
                    if got is None or got[j] != v:
                        continue
                    idx = np.array(got, dtype=np.int64)
                flat = int(self.enc.flat(idx[None])[0])
                if flat not in taken and self.valid(flat):
                    return tuple(int(x) for x in idx)
        return None
