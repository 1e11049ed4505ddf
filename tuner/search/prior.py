"""What the same space measured elsewhere says about this search: the guided searcher's prior.

A kernel re-tuned at another shape, on another device or after an earlier run has a landscape
much like the one it had: the same tiles spill, the same pipelines pay off, often the same
region is fastest. `tuner tune --warm-start` and `tuner retune` enqueue the sources' best
configs; past those, without more, the search knew nothing of the other landscape (recorded
layernorm 4096x4096 warm-started from 8192x8192: 73 evaluations to within 3 % of the best,
cold 60.5). With the sources' timings as the objective model's mean, the model learns only
where this landscape differs from theirs: 11 (medians of 20 seeds; bench/RESULTS.md, "warm
starts with a prior").

The mean is a + b x the sources' log10(seconds / their best), a and b fitted to the timings so
far, b drawn towards a start weight: a source whose ranking disagrees with the timings loses
its say within a few evaluations, one that agrees keeps it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from tuner.search.encoding import Encoding

RIDGE = 0.02  # how firmly b is held at its start: about as much as two timings 0.1 apart in log10
NEAREST_BY_LINES = 2048  # sources measuring more configs: nearest searched along one param first
COVERAGE_SAMPLE = 2048  # configs sampled to estimate a source's coverage of a larger space


class Prior:
    """Sources' timings over one space (`Encoding`): mappings config -> seconds (None: failed),
    one per source. `clip`: log-time differences past this factor count as the factor, as the
    objective model clips (a failure counts as the clip)."""

    def __init__(self, enc: Encoding, sources: Sequence[Mapping[Any, float | None]], clip: float | None):
        self.enc = enc
        cap = math.log10(clip or 2.0)
        rows: list[tuple[int, ...]] = []
        vals: list[float] = []
        for src in sources:
            ok = [s for s in src.values() if s is not None and math.isfinite(s) and s > 0]
            if not ok:
                continue
            best = min(ok)
            for c, s in src.items():
                idx = enc.index(c)
                if idx is not None:
                    rows.append(idx)
                    vals.append(min(math.log10(s / best), cap) if s is not None and math.isfinite(s) and s > 0
                                else cap)
        # Averaged over the sources that measured a config.
        flat = enc.flat(np.array(rows, dtype=np.int64)) if rows else np.zeros(0, dtype=np.int64)
        self.keys, where = np.unique(flat, return_inverse=True)
        self.values = np.bincount(where, weights=vals, minlength=len(self.keys)) / np.bincount(where)
        self._nearest: dict[int, float] = {}  # flat key -> value, for configs no source measured
        self._coverage: float | None = None

    def __bool__(self) -> bool:
        return len(self.keys) > 0

    def best(self, k: int) -> np.ndarray:
        """Flat keys of the `k` configs the sources rate best."""
        return self.keys[np.argsort(self.values, kind="stable")[:k]]

    def at(self, flat: np.ndarray) -> np.ndarray:
        """The sources' value at each config. One no source measured (a tile the other shape's
        formulas rejected; most of the space, after a guided run) takes the mean value of the
        nearest measured configs (steps summed over params, `Encoding.step`). Drawn towards the
        sources' mean with distance instead (halfway per step), a grid-recorded rope warm-started
        across head counts took 73 evaluations to 3 %, not 10: BLOCK_H 32, the optimum at 32
        heads, did not exist at 8 and read as average."""
        keys, vals, memo = self.keys, self.values, self._nearest
        at = np.minimum(np.searchsorted(keys, flat), len(keys) - 1)
        hit = keys[at] == flat
        out = np.where(hit, vals[at], 0.0)
        miss = np.flatnonzero(~hit)
        todo = np.unique(np.array([int(flat[k]) for k in miss if int(flat[k]) not in memo], dtype=np.int64))
        if len(todo):
            for f, v in zip(todo, self._nearest_values(todo)):
                memo[int(f)] = float(v)
        for k in miss:
            out[k] = memo[int(flat[k])]
        return out

    def _nearest_values(self, todo: np.ndarray) -> np.ndarray:
        enc, keys, vals = self.enc, self.keys, self.values
        C = enc.unflat(todo)
        dist = np.full(len(C), np.inf)
        total = np.zeros(len(C))
        count = np.zeros(len(C))
        if len(keys) > NEAREST_BY_LINES:
            # Nearest along one param first: cheap, and with a full grid for a source the usual
            # case. What it leaves is searched among every measured config below.
            for j, n in enumerate(enc.n_values):
                for v in range(n):
                    D = C.copy()
                    D[:, j] = v
                    f = enc.flat(D)
                    a = np.minimum(np.searchsorted(keys, f), len(keys) - 1)
                    known = (keys[a] == f) & (C[:, j] != v)
                    d = np.where(known, enc.step(j, np.full(len(C), v), C[:, j]), np.inf)
                    closer = d < dist
                    total = np.where(closer, 0.0, total)
                    count = np.where(closer, 0.0, count)
                    dist = np.minimum(dist, d)
                    same = known & (d == dist)
                    total = total + np.where(same, vals[a], 0.0)
                    count = count + same
        rest = np.flatnonzero(count == 0)
        if len(rest):
            K = enc.unflat(keys)
            chunk = max(1, 2 ** 20 // len(keys))
            for lo in range(0, len(rest), chunk):
                r = rest[lo:lo + chunk]
                c = C[r]
                d = sum(enc.step(j, c[:, None, j], K[None, :, j]) for j in range(c.shape[1]))
                near = d == d.min(1, keepdims=True)
                total[r] = (near * vals[None, :]).sum(1)
                count[r] = near.sum(1)
        return total / count

    def coverage(self, valid: Callable[[int], bool]) -> float:
        """The share of the configs the formulas accept here (`valid`, by flat key) that a
        source measured (from a sample of COVERAGE_SAMPLE in a larger space). A grid run at
        another shape measured most; a guided run a few dozen of thousands, and the rest of its
        prior is the nearest of those, read across most of the space: trusted from the start,
        such a prior cost recorded rmsnorm 4096x1024 (warm-started from a 60-evaluation run at
        16384x2048) 22.5 evaluations to 3 % where the warm start alone took 5."""
        if self._coverage is None:
            size = self.enc.size
            if size <= COVERAGE_SAMPLE:
                flat = np.arange(size, dtype=np.int64)
            else:
                flat = np.random.default_rng(0).integers(0, size, COVERAGE_SAMPLE, dtype=np.int64)
            ok = np.array([valid(int(f)) for f in flat])
            at = np.minimum(np.searchsorted(self.keys, flat), len(self.keys) - 1)
            measured = self.keys[at] == flat
            self._coverage = float((measured & ok).sum() / max(ok.sum(), 1))
        return self._coverage

    def mean(self, rows: np.ndarray, y: np.ndarray, start: float) -> Callable[[np.ndarray], np.ndarray]:
        """flat keys -> the log10 seconds the prior expects there: a + b x the sources' value,
        fitted to the timings so far (`rows`: flat keys, `y`: their clipped log10 seconds), b
        drawn towards `start` (by RIDGE) and kept within [0, 2]."""
        p = self.at(rows)
        pc, yc = p - p.mean(), y - y.mean()
        b = float((pc @ yc + RIDGE * start) / (pc @ pc + RIDGE))
        b = min(max(b, 0.0), 2.0)
        a = float(y.mean() - b * p.mean())
        return lambda flat: a + b * self.at(flat)


__all__ = ["Prior"]
