"""The guided searcher's view of a space: configs <-> value-index vectors <-> model features.

A config is a point of [0, 1]^d: an ordered param is its value's index in the sorted list,
scaled to [0, 1] (pow2 ranges are then on a log scale: 64 sits between 32 and 128); an unordered
choice (strings, booleans) is one-hot. One-value params vanish. A 0 before a geometric run
(PROGS_PER_SM: 0, 1, 2, 4 ...) is an 'off' switch, not the run's next point down: it gets its
own indicator and is one step from every other value (as ordinal, the non-persistent optimum of
a grid-recorded swiglu sat 'below' its slowest persistent configs, and the search took 124
evaluations where random search took 44).

Shared by the proposer (`tuner.search.guided`) and the prior (`tuner.search.prior`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tuner.core.space import Space
from tuner.core.values import Config


class Encoding:
    """Configs <-> value-index vectors <-> model features."""

    def __init__(self, space: Space, off_switch: bool = True):
        """`off_switch`: read a 0 before a geometric run as an 'off' switch (see the module notes)."""
        self.space = space
        # Ordered params count through their sorted values, whatever order the space lists them.
        self.params = tuple(type(p)(p.name, tuple(sorted(p.values)), p.log) if p.ordered else p
                            for p in space.params)
        self.n_values = np.array([len(p.values) for p in self.params], dtype=np.int64)
        self.ordered = np.array([p.ordered for p in self.params])
        # 0 before a geometric run (PROGS_PER_SM 0, 1, 2, 4 ...) is an 'off' switch: its own
        # choice next to the ordinal, one step from every other value.
        self.zero = np.array([off_switch and p.ordered and _zero_then_geometric(p.values) for p in self.params],
                             dtype=bool)
        self._index = [{_vkey(v): i for i, v in enumerate(p.values)} for p in self.params]
        cols: list[tuple[int, int | str | None]] = []  # (param, category, "zero" or None)
        for j, p in enumerate(self.params):
            if len(p.values) < 2:
                continue
            if p.ordered:
                cols.append((j, None))
                if self.zero[j]:
                    cols.append((j, "zero"))
            else:
                cols.extend((j, c) for c in range(len(p.values)))
        self.cols = cols
        self.dim = len(cols)
        self.size = int(np.prod(self.n_values))

    def index(self, config: Config | dict) -> tuple[int, ...] | None:
        d = config.as_dict() if isinstance(config, Config) else config
        try:
            return tuple(self._index[j][_vkey(d[p.name])] for j, p in enumerate(self.params))
        except KeyError:
            return None

    def config(self, idx: Sequence[int]) -> Config:
        return Config.of({p.name: p.values[int(i)] for p, i in zip(self.params, idx)})

    def features(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_2d(idx)
        out = np.empty((idx.shape[0], self.dim))
        for c, (j, cat) in enumerate(self.cols):
            if cat is None and self.zero[j]:
                out[:, c] = np.maximum(idx[:, j] - 1, 0) / (self.n_values[j] - 2)
            elif cat is None:
                out[:, c] = idx[:, j] / (self.n_values[j] - 1)
            elif cat == "zero":
                out[:, c] = (idx[:, j] == 0) * math.sqrt(0.5)
            else:
                out[:, c] = (idx[:, j] == cat) * math.sqrt(0.5)
        return out

    def step(self, j: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Trust-region steps between values `a` and `b` (indices, broadcast) of param `j`:
        index moves of an ordered param (to or from an 'off' 0: one), else one per change."""
        if not self.ordered[j]:
            return (a != b).astype(np.int64)
        d = np.abs(a - b)
        if self.zero[j]:
            d = np.where((a == 0) | (b == 0), d > 0, d)
        return d

    def flat(self, idx: np.ndarray) -> np.ndarray:
        """Mixed-radix number of each index vector (a compact key)."""
        idx = np.atleast_2d(idx)
        out = np.zeros(idx.shape[0], dtype=np.int64)
        for j in range(len(self.params)):
            out = out * self.n_values[j] + idx[:, j]
        return out

    def unflat(self, flat: np.ndarray) -> np.ndarray:
        flat = np.asarray(flat, dtype=np.int64).copy()
        out = np.empty((flat.shape[0], len(self.params)), dtype=np.int64)
        for j in range(len(self.params) - 1, -1, -1):
            out[:, j] = flat % self.n_values[j]
            flat //= self.n_values[j]
        return out


def _zero_then_geometric(values: Sequence[Any]) -> bool:
    """0 followed by a geometric run (0, 1, 2, 4, 8 ...): the 0 is an 'off' switch, not a
    point of the log scale that the others sit on."""
    if len(values) < 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return False
    rest = values[1:]
    if values[0] != 0 or rest[0] <= 0:
        return False
    ratios = [b / a for a, b in zip(rest, rest[1:])]
    return not ratios or (min(ratios) > 1.4 and max(ratios) / min(ratios) < 1.6)


def _vkey(v: Any) -> Any:
    return (type(v).__name__ == "bool", v)


__all__ = ["Encoding"]
