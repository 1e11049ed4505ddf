"""Where configs fail, for `tuner.search.guided`: P(works) of each candidate from the history.

A history here is `done` as `GuidedSearch.propose` takes it: (index vector, log10 seconds or
None for a failure), oldest first; `hard` the index vectors of the real failures (resources
exceeded, compile error, crash, wrong answer), as opposed to *cliffs*: configs that ran, but
far slower than an adjacent one (spilled registers, collapsed occupancy), which
`cliffs_as_failures` turns into failures so that the objective model does not average a
different regime in.

`p_works` combines three readings of the failures, each for a reason a kernel space has:

* a kernel smoother over failures and successes, with the objective model's length scales
  (capped): failures make their neighbourhood suspect;
* a logistic regression on the features (`classifier`): a resource limit is close to a linear
  boundary in log-sized params (bytes grow as a product of tile sizes and stages), and the fit
  learns which params do not matter for it; it says at most P(fail) 0.5 next to a config that
  worked with no failure next to it (a boundary between two adjacent configs is a guess one
  evaluation settles);
* dominance (`dominance`, real failures only): a config at least as large as a failed one in
  every ordered param probably fails too, trusted as far as the history bears it out.

Pure: the same history, the same answer.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.search.encoding import Encoding
from tuner.search.gp import CHUNK, matern, sqdist


def _logistic(X: np.ndarray, label: np.ndarray, Xc: np.ndarray, l2: float) -> np.ndarray:
    """P(failure) at Xc from an L2-regularised logistic regression on (X, label), by Newton steps.
    Resource limits are roughly linear boundaries in log-sized params (bytes grow as a product
    of tile sizes and stages), which is what this can learn from a few failures, and it learns
    which params do not matter (warps, say, for shared memory)."""
    A = np.hstack([X, np.ones((len(X), 1))])
    w = np.zeros(A.shape[1])
    w[-1] = math.log((label.sum() + 0.5) / (len(label) - label.sum() + 0.5))
    reg = np.full(A.shape[1], l2)
    reg[-1] = 1e-3
    for _ in range(25):
        p = 1.0 / (1.0 + np.exp(-np.clip(A @ w, -30, 30)))
        g = A.T @ (p - label) + reg * w
        H = (A * (p * (1 - p))[:, None]).T @ A + np.diag(reg)
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-6:
            break
    Ac = np.hstack([Xc, np.ones((len(Xc), 1))])
    return 1.0 / (1.0 + np.exp(-np.clip(Ac @ w, -30, 30)))


class FailureModel:
    """`cliff`: a config this factor slower than an adjacent evaluated one counts as failed
    (None: off). `classifier`: the logistic model's L2 weight (None: only the smoother).
    `dominance`: True, "same-choices" (dominance only among configs with the same unordered
    choices) or False. The meaning of each is `GuidedOptions`'."""

    def __init__(self, enc: Encoding, cliff: float | None, classifier: float | None, dominance: bool | str):
        self.enc = enc
        self.cliff = cliff
        self.classifier = classifier
        self.dominance = dominance

    def cliffs_as_failures(self, done):
        """A config far slower than an adjacent one (one param, one step apart) sits past a
        cliff (spilled registers, collapsed occupancy): a different regime that a smooth model
        should not average in. It is modelled as a failure instead."""
        ok = [(k, np.array(i), y) for k, (i, y) in enumerate(done) if y is not None]
        if not self.cliff or len(ok) < 2:
            return done
        A = np.array([i for _, i, _ in ok])
        y = np.array([v for _, _, v in ok])
        diff = np.zeros((len(A), len(A)), dtype=np.int64)
        step = np.zeros((len(A), len(A)), dtype=np.int64)
        for j in range(A.shape[1]):
            d = self.enc.step(j, A[:, None, j], A[None, :, j])
            diff += d > 0
            step = np.maximum(step, d)
        adjacent = (diff == 1) & (step == 1)
        lowest = np.where(adjacent, y[None, :], np.inf).min(1)
        cut = math.log10(self.cliff)
        out = list(done)
        for n, (k, _, v) in enumerate(ok):
            if v - lowest[n] > cut:
                out[k] = (done[k][0], None)
        return out

    def p_works(self, cidx: np.ndarray, Xc: np.ndarray, done: list[tuple[tuple[int, ...], float | None]],
                hard: list, ls: np.ndarray | None) -> np.ndarray:
        """P(each candidate works) (`cidx` index vectors, `Xc` their features), from everything
        in `done` that failed (cliffs included, once `cliffs_as_failures` marked them); `ls`: the
        objective model's length scales, the smoother's (None before it is fitted)."""
        label = np.array([1.0 if y is None else 0.0 for _, y in done])
        if not label.any():
            return np.ones(len(cidx))
        X_all = self.enc.features(np.array([i for i, _ in done]))
        ls = ls if ls is not None and len(ls) == self.enc.dim else np.full(self.enc.dim, 0.3)
        prior = (label.sum() + 1.0) / (len(label) + 2.0)
        p_fail = np.empty(len(Xc))
        for lo in range(0, len(Xc), CHUNK):
            w = matern(np.sqrt(sqdist(Xc[lo:lo + CHUNK], X_all, np.minimum(ls, 0.5))))
            p_fail[lo:lo + CHUNK] = (w @ label + 0.5 * prior) / (w.sum(1) + 0.5)
        if self.classifier:
            p_log = _logistic(X_all, label, Xc, self.classifier)
            # A boundary that the fit draws between a config that worked and its neighbour is
            # a guess one evaluation settles, not a near-certain failure: a nearly separable
            # history makes the fit sharp (recorded softmax: ONLINE=False failed at BLOCK_N
            # 1024, worked at 4096, and the fit put every neighbour of the 4096 one, the
            # optimum's region, at P(works) ~0; 11 of 40 seeds took over 100 evaluations).
            # Unless a failure is next to it as well: along a wall that the history has found,
            # every config that worked has a neighbour across it.
            worked = np.array([i for i, y in done if y is not None])
            failed = np.array([i for i, y in done if y is None])
            sure = np.flatnonzero(p_log > 0.5)
            if len(sure) and len(worked):
                guess = self._adjacent(cidx[sure], worked)
                if len(failed):
                    guess &= ~self._adjacent(cidx[sure], failed)
                p_log[sure[guess]] = 0.5
            p_fail = np.maximum(p_fail, p_log)
        if self.dominance and hard:
            dom = self._dominates(cidx, np.array(hard))
            if dom.any():
                p_fail = np.where(dom, np.maximum(p_fail, self._dominance_trust(done, hard)), p_fail)
        return np.clip(1.0 - p_fail, 0.0, 1.0)

    def _adjacent(self, cidx: np.ndarray, others: np.ndarray) -> np.ndarray:
        """Whether each of `cidx` is at most one step (`Encoding.step`) from one of `others`."""
        steps = sum(self.enc.step(j, cidx[:, None, j], others[None, :, j]) for j in range(cidx.shape[1]))
        return (steps <= 1).any(1)

    def _dominates(self, cidx: np.ndarray, fails: np.ndarray) -> np.ndarray:
        o = self.enc.ordered
        out = np.zeros(len(cidx), dtype=bool)
        for f in fails:
            ge = (cidx[:, o] >= f[o]).all(1)
            if self.dominance == "same-choices" and (~o).any():
                ge &= (cidx[:, ~o] == f[~o]).all(1)
            out |= ge
        return out

    def _dominance_trust(self, done, hard: list) -> float:
        """How often a config that dominated an earlier failure failed too (smoothed)."""
        A = np.array([i for i, _ in done])
        hard_keys = {tuple(h) for h in hard}
        failed = np.array([tuple(i) in hard_keys for i, _ in done])
        o = self.enc.ordered
        ge = (A[:, None, o] >= A[None, :, o]).all(-1)
        if self.dominance == "same-choices" and (~o).any():
            ge &= (A[:, None, ~o] == A[None, :, ~o]).all(-1)
        earlier = np.tril(np.ones((len(A), len(A)), dtype=bool), -1)
        dom = (ge & earlier & failed[None, :]).any(1)
        hits, total = int((dom & failed).sum()), int(dom.sum())
        return (hits + 4.0) / (total + 5.0)  # a prior of 4 in 5 before any evidence
