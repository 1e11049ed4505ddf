"""The default search strategy (`--sampler guided`): a model of the whole finite space.

Kernel spaces are small and finite (hundreds to a few hundred thousand configs), and every
evaluation costs a compile and a timed run, so the strategy spends CPU on a model to spend
fewer evaluations. Each ask:

* **Encoding** (`tuner.search.encoding`). A config is a point of [0, 1]^d: ordered params as their
  value's index (pow2 ranges on a log scale), unordered choices one-hot, a 0 before a
  geometric run an 'off' switch of its own.
* **Objective model.** A GP (Matern 5/2, one length scale per dimension, fitted by MAP
  marginal likelihood) on log10(seconds), so a 2x difference counts the same anywhere; times
  more than 2x the best so far are clipped there, so that the model spends itself on the
  fast region, not on explaining why the worst config is 50x slow.
* **Failures and cliffs** (`tuner.search.failures`). A failed config (resources exceeded, compile error, crash, wrong
  answer) and a config past a *cliff* (more than 2.5x slower than an adjacent evaluated one:
  spilled registers, collapsed occupancy -- a different regime, not a slope) feed a model of
  where configs fail: a kernel smoother (failures make their neighbourhood suspect), a
  logistic regression (a resource limit is nearly a linear boundary in log-sized params, and
  the fit learns which params do not matter for it) and, for real failures, dominance (at
  least as large in every ordered param probably fails too), trusted as far as the history
  bears it out. The regression does not rule out a neighbour of a config that worked, unless
  one that failed is next to it too (P(works) at least a half there): a boundary between two
  adjacent configs is a guess one evaluation settles. Failures stay out of the objective
  model: a config that did not fit or did not build says nothing about how fast its
  neighbours run, and the fastest configs often sit right against a resource limit (the
  largest tiles that fit).
* **Completions and rescues.** A one-step move from the incumbent that the space's formulas
  reject (a bigger tile that needs more warps) or that fell past a cliff (a bigger tile that
  spilled at 4 warps) still says which way the time trends. The move fixed up by other
  params -- the nearest config the formulas accept with the moved param at its new value (a
  *completion*), or the cliff config with one other ordered param one step off (8 warps,
  fewer stages, the other tile dimension down: a *rescue*; two at most per cliff, as some
  moves no rescue saves) -- counts as one trust-region step and is worth at least what the
  objective model expected from the move itself. The model alone rarely tries one: it is
  stationary, and more warps measured slower on the small tiles it has seen.
* **Acquisition.** Expected improvement x P(works) x decay^(steps from the best so far - 1),
  over every config not yet seen (all of them when the space holds up to `ENUMERATE_MAX`;
  else a random sample plus the one- and two-step neighbourhoods of the best few): a soft
  trust region that walks outward from the incumbent and gives way when nothing near it
  looks promising any more. Once `explore` timings in a row bring no new best, every
  `explore_every`-th ask drops the trust region (the best EI x P(works) anywhere): real
  landscapes have plateaus a few percent off the best with the optimum in another basin
  (grid-recorded rope, attention), where a purely local walk did worse than random search.
  Every other such ask first flips a switch of the best config of another regime, in that
  regime (`regimes`): the model learns one switch's effect across all regimes; and every other
  one of the rest walks the trust region around that regime's best instead (`runner_up`).
  Configs rejected by the space's own formulas (`check`) are never
  proposed. A candidate more likely to fail than not has its expected improvement taken
  from the objective model told the failures as 2x the best, when that is lower: past a
  resource limit the timings' trend promises gains that no config there delivers, and even
  a small P(works) times such a promise kept the search probing the limit.
* **A second opinion** (`tuner.search.guided_sampler`). Every `tpe_every`-th ask from the tenth timing on (none that is
  already a stall's global ask or regime flip, none with a prior) is Optuna's multivariate
  TPE's pick from the same history instead (repaired to a valid config; the model's when it
  is one already seen or one the failure model expects to fail: TPE reads a failure as a
  slow config, not a wall). The model's trust region walks in steps, and on spaces of many
  switches that each move the time by a percent around a few ordered levers (CUDA C++
  kernels: load kinds, streaming stores, launch bounds around the threads per row) it spent
  the budget on steps inside the noise; TPE's draws from the good configs' marginals jump
  the levers there.
* **Prior.** Timings of the same space measured elsewhere (another shape, device, an
  earlier run) become the model's mean, scaled to the timings so far: the model learns
  where this landscape differs from the other, not the whole landscape again.
* **Cost.** An ask is bounded whatever the space and the history: a few thousand candidates,
  a model conditioned on at most `TRAIN_MAX` points whose hyperparameters are fitted on at
  most `FIT_MAX` (the GP itself is in `tuner.search.gp`). Scoring every point of a 32k space with a
  GP on 200 points cost ~0.8 s an ask; the search barely looks beyond a few steps of the
  incumbent anyway.
* **Start.** The caller enqueues the space's default and any warm starts or proposer picks;
  they come first. With nothing timed yet, candidates spread out away from failures. Then,
  without a prior, each value of a switch (a boolean, an unordered choice, an 'off' 0) that
  no config has had yet is tried, flipped from the start (`screen`): a switch often
  selects the kernel's regime (one pass or looped, persistent or not), which the model alone
  tries late.

The sampler keeps no state of its own (only caches): the history is re-read from the study
on each ask, so a resumed run continues where its records say it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tuner.core.space import Space
from tuner.core.values import Config
from tuner.search.encoding import Encoding
from tuner.search.failures import FailureModel
from tuner.search.gp import GP, expected_improvement, sqdist
from tuner.search.prior import Prior
from tuner.search.regimes import Regimes

ENUMERATE_MAX = 4096  # spaces up to this size are scored whole on every ask
SAMPLE_CANDIDATES = 2048  # else this many random configs plus the best ones' neighbourhoods
TRAIN_MAX = 256  # the objective model is conditioned on at most this many timings
FIT_MAX = 64  # and its hyperparameters fitted on at most this many (bounded cost per ask)


@dataclass(frozen=True)
class GuidedOptions:
    """The guided search's knobs; each is described in `GuidedSearch`'s docstring."""

    n_startup: int = 1
    clip: float = 2.0
    cliff: float | None = 2.5
    decay: float = 0.1
    classifier: float | None = 0.03
    dominance: bool | str = True
    impute: float | None = 2.0
    explore: int | None = 3
    explore_every: int = 3
    rescue: int = 2
    promise: bool = True
    prior_weight: float = 0.25
    screen: int = 6
    off_switch: bool = True
    regimes: bool = True
    runner_up: bool = True


class GuidedSearch:
    """Chooses the next config from the history. Pure: same history and rng, same answer.

    Options (the defaults are what bench/search_efficiency.py measured best across recorded
    and generated landscapes; the measurements behind each are in bench/RESULTS.md, "The
    guided search's options"):

    * `n_startup`: timings needed before the model is used (the caller's enqueued default
      config is the first); before that, candidates near the best so far, in random order.
    * `clip`: timings more than this factor slower than the best are told to the model as
      exactly that factor (the model's effort goes to the fast region).
    * `cliff`: a config this factor slower than an adjacent evaluated one (one param one step
      away) is past a cliff and counts as a failure; None: off.
    * `decay`: the acquisition of a config k steps (index moves, one per changed choice) from
      the best so far is weighted by decay**(k - 1): a soft trust region around the incumbent
      that gives way when nothing near it looks promising any more.
    * `classifier`: L2 weight of the logistic failure model (None: only the kernel smoother);
      weak, so that a boundary the history separates cleanly is learned sharply. It says at
      most P(fail) 0.5 next to a config that worked with no failure next to it.
    * `dominance`: extend hard failures to every config at least as large (see `tuner.search.failures`).
    * `impute`: for candidates with P(works) < 0.5, expected improvement is also taken from
      the objective model told the hard failures as this factor slower than the best, and
      the lower figure counts (see `_improvement`); None: off. Failures are not told to the
      model that scores the rest, and cliffs never enter the objective model: the fast
      configs often sit right next to one.
    * `explore`, `explore_every`: after `explore` timings without a new best, every
      `explore_every`-th ask scores the whole space without the trust region (None: never).
    * `regimes`: every other one of those asks instead flips a switch of the best config of
      another regime (the best timed with another value of one switch param than the
      incumbent's, the params in turn), keeping that regime, when such a flip is not yet
      seen; else it stays global. A switch's effect in one regime says little of it in the
      other, and the model, stationary, reads it as one slope: in a layernorm, a persistent
      grid was 1.4x slower in the one-pass kernel and the optimum in the looped one, and the
      search polished the one-pass basin 3.5 % off. As `screen`, only without a prior (False:
      off).
    * `runner_up`: every other one of the remaining stall asks walks the trust region around
      the best config of another regime instead of dropping it (the regimes' switch params in
      turn, as `regimes` takes them; one whose best is at most 10 % slower than the best,
      `regimes.RUNNER_UP_WITHIN`): a regime whose best is a few per cent behind may hold the
      optimum one or two ordered steps from it (the layernorm above: looped and not persistent
      at 8.4 % off, the optimum one num_warps step away), which neither a switch flip nor a
      model trained mostly on the incumbent's regime proposes. Needs `regimes` (False: off).
    * `repair`: (config, keep=()) -> a valid config near it that leaves the params named in
      `keep` as they are, or None (`Space.repair` under the run's sizes and limits). When no
      candidate passes `check`, the best few are repaired instead; and a one-step move from
      the incumbent that the formulas reject is *completed*: the nearest valid config with
      the moved param at its new value counts as one step away, however many other params it
      had to change (constraints couple params).
    * `promise`: a completed or rescued move (see the module notes) is worth at least the
      expected improvement of the move it fixes up (False: only its own).
    * `prior`: timings of the same space measured elsewhere (another shape, device or
      earlier run; `tuner tune --warm-start`, `tuner retune`): mappings config -> seconds
      (None: failed), one per source. The objective model is then of the difference from
      them (`tuner.search.prior`); `prior_weight` x the sources' coverage is where their
      weight starts before the timings fit it.
    * `screen`: the switches (booleans, unordered choices, an 'off' 0: the values that are a
      feature of their own) are each tried once, flipped from the first config timed, before
      the model picks, when the space has at most this many such values besides the start's
      (0: off; see `Regimes.screen`).
      The model alone flips a switch late: its features are far from everything timed, so
      it predicts the timings' average there, while the slopes it learned along the ordered
      params promise more (a one-pass softmax, a non-persistent cross-entropy: the optimum's
      regime, found after 30-40 evaluations from a start in the other).
    * `off_switch`: a 0 before a geometric run (PROGS_PER_SM 0, 1, 2, 4) is an 'off' switch
      of its own (`tuner.search.encoding`); False: the run's next point down.
    * `rescue`: rescues tried at most per cliff next to the incumbent (see the module notes;
      0: off). Only ordered params rescue, and only cliffs, not hard failures (left to the
      failure model, which learns which way is feasible).
    """

    def __init__(self, space: Space, check: Callable[[Config], str | None] | None = None,
                 repair: Callable[..., Config | None] | None = None,
                 prior: Sequence[Mapping[Any, float | None]] = (), **options: Any):
        """`options`: the knobs of `GuidedOptions` by name (a name it lacks is a TypeError)."""
        self.opt = GuidedOptions(**options)
        self.enc = Encoding(space, self.opt.off_switch)
        self.failures = FailureModel(self.enc, self.opt.cliff, self.opt.classifier, self.opt.dominance)
        self.check = check
        self.repair = repair
        # After an ask that used the model: the largest expected improvement among the configs
        # it weighed, as a fraction of the best time (what a stop is explained with); None
        # before the model is used.
        self.expected_gain: float | None = None
        self._invalid: set[int] = set()  # flat keys the space's own formulas reject
        self._all: np.ndarray | None = None
        self._theta: np.ndarray | None = None
        self._ls: np.ndarray | None = None
        self._completed: tuple[int, np.ndarray, np.ndarray] | None = None  # (incumbent, completions, the moves)
        # None also when no source timed a config of this space (an empty Prior is falsy).
        self._prior = (Prior(self.enc, prior, self.opt.clip) if prior else None) or None
        self.regime_moves = Regimes(self.enc, self._valid, repair, self.opt.screen)

    # -- candidates --

    def _candidates(self, seen: np.ndarray, good: np.ndarray, completed: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
        enc = self.enc
        if enc.size <= ENUMERATE_MAX:
            if self._all is None:
                self._all = np.arange(enc.size, dtype=np.int64)
            flat = self._all
        else:
            sample = rng.integers(0, enc.size, SAMPLE_CANDIDATES, dtype=np.int64)
            # The configs a prior rates best are candidates too: a random sample would miss them.
            top = self._prior.best(64) if self._prior is not None else sample[:0]
            flat = np.unique(np.concatenate([sample, self._neighbours(good), completed, top]))
        mask = ~np.isin(flat, seen)
        if self._invalid:
            mask &= ~np.isin(flat, np.fromiter(self._invalid, dtype=np.int64))
        return flat[mask]

    def _neighbours(self, good: np.ndarray) -> np.ndarray:
        """Configs one or two steps of one param from each of `good` (best first), and two
        params one step each from the best: where the trust region looks, so a sampled
        candidate set must hold them."""
        enc, out = self.enc, []
        for k, idx in enumerate(enc.unflat(good) if len(good) else []):
            for j, v in self._moves(idx, 2):
                nb = idx.copy()
                nb[j] = v
                out.append(nb)
            if k == 0:
                near = self._moves(idx, 1)
                for a, (j1, v1) in enumerate(near):
                    for j2, v2 in near[a + 1:]:
                        if j1 != j2:
                            nb = idx.copy()
                            nb[j1], nb[j2] = v1, v2
                            out.append(nb)
        return enc.flat(np.array(out)) if out else np.zeros(0, dtype=np.int64)

    def _moves(self, idx: np.ndarray, most: int) -> list[tuple[int, int]]:
        """(param, new value) of every move of one param by 1 to `most` steps from `idx`."""
        out = []
        for j, n in enumerate(self.enc.n_values):
            values = np.arange(n)
            far = self.enc.step(j, values, int(idx[j]))
            out += [(j, int(v)) for v in values[(far >= 1) & (far <= most)]]
        return out

    def _rescues(self, incumbent: Sequence[int], done: list, hard: list) -> tuple[np.ndarray, np.ndarray]:
        """The rescue moves of the incumbent (see `rescue` in the class notes): for each
        one-step move from it that fell past a cliff, that config with one other ordered
        param moved one step. Returns their flat keys and, row for row, the cliff each rescues."""
        enc = self.enc
        inc = np.array(incumbent, dtype=np.int64)
        real = {tuple(h) for h in hard}
        past = [i for i, y in done if y is None and tuple(i) not in real]
        out, src = [], []
        if past:
            A = np.array(past, dtype=np.int64)
            steps = np.stack([enc.step(j, A[:, j], inc[j]) for j in range(len(inc))], 1)
            D = np.array([i for i, _ in done], dtype=np.int64)
            for cliff, row in zip(A, steps):
                if row.sum() != 1:  # not a one-step move from the incumbent
                    continue
                moved = int(np.argmax(row))
                # Its rescues evaluated so far: configs one step of another ordered param from it.
                d = np.stack([enc.step(j, D[:, j], cliff[j]) for j in range(len(inc))], 1)
                if ((d.sum(1) == 1) & (d[:, moved] == 0) & enc.ordered[np.argmax(d, 1)]).sum() >= self.opt.rescue:
                    continue
                for k, v in self._moves(cliff, 1):
                    if k != moved and enc.ordered[k]:
                        nb = cliff.copy()
                        nb[k] = v
                        out.append(nb)
                        src.append(cliff)
        if not out:
            return np.zeros(0, np.int64), np.zeros((0, len(inc)), np.int64)
        return enc.flat(np.array(out)), np.array(src)

    def _valid(self, flat: int) -> bool:
        if flat in self._invalid:
            return False
        if self.check is None or self.check(self.enc.config(self.enc.unflat(np.array([flat]))[0])) is None:
            return True
        self._invalid.add(int(flat))
        return False

    def _completions(self, incumbent: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The completed one-step moves from `incumbent` (see `repair` in the class notes): for
        each move the formulas reject, the nearest valid config that keeps the moved param's
        new value. Returns their flat keys and, row for row, the rejected move each completes.
        Cached per incumbent."""
        enc = self.enc
        inc = np.array(incumbent, dtype=np.int64)
        key = int(enc.flat(inc[None])[0])
        if self._completed is not None and self._completed[0] == key:
            return self._completed[1], self._completed[2]
        out, src = [], []
        for j, v in self._moves(inc, 1) if self.repair is not None else []:
            moved = inc.copy()
            moved[j] = v
            if self._valid(int(enc.flat(moved[None])[0])):
                continue
            fixed = self.repair(enc.config(moved), keep=(enc.params[j].name,))
            idx = enc.index(fixed) if fixed is not None else None
            if idx is not None and idx[j] == v:
                out.append(int(enc.flat(np.array([idx]))[0]))
                src.append(moved)
        self._completed = (key, np.array(out, dtype=np.int64),
                           np.array(src, dtype=np.int64).reshape(len(src), len(inc)))
        return self._completed[1], self._completed[2]

    def _pick(self, flat: np.ndarray, score: np.ndarray, rng: np.random.Generator,
              seen: np.ndarray | None = None) -> int | None:
        """The best-scoring candidate that the space's formulas accept (ties at random); when
        none does, the nearest valid config to one of the best few (`repair`) not yet seen."""
        # Scores equal to float32 precision are ties, broken by the rng: in exact arithmetic
        # symmetric moves (BM up or BN up from a square tile) score the same, and the last
        # bits, which differ between BLAS kernels and CPUs, must not pick among them. (Scaled
        # to the best first: tiny scores keep their order instead of underflowing to ties.)
        top = float(score.max()) if len(score) else 0.0
        key = (score / top if top > 0 else score).astype(np.float32)
        order = np.lexsort((rng.random(len(flat)), -key))
        for i in order[:5000]:
            if self._valid(int(flat[i])):
                return int(flat[i])
        if self.repair is not None:
            taken = set() if seen is None else set(int(f) for f in seen)
            for i in order[:8]:
                fixed = self.repair(self.enc.config(self.enc.unflat(flat[i:i + 1])[0]))
                idx = self.enc.index(fixed) if fixed is not None else None
                if idx is not None:
                    f = int(self.enc.flat(np.array([idx]))[0])
                    if f not in taken and self._valid(f):
                        return f
        return None

    # -- the step --

    def propose(self, done: list[tuple[tuple[int, ...], float | None]], pending: list[tuple[int, ...]],
                rng: np.random.Generator) -> tuple[int, ...] | None:
        """`done`: (index vector, log10 seconds or None for a failure), oldest first;
        `pending`: in flight. None when every config has been seen."""
        enc = self.enc
        hard = [i for i, y in done if y is None]
        if self.opt.cliff:
            done = self.failures.cliffs_as_failures(done)
        seen_idx = [d[0] for d in done] + list(pending)
        seen = enc.flat(np.array(seen_idx)) if seen_idx else np.zeros(0, dtype=np.int64)
        ok = [(i, y) for i, y in done if y is not None]
        ranked = sorted(ok, key=lambda t: t[1])
        stall = self._stall_ask(ok, len(pending)) if ok else None
        good = enc.flat(np.array([i for i, _ in ranked[:3]])) if ok else np.zeros(0, np.int64)
        # Moves the formulas (completions) or the hardware (rescues) rejected, each fixed up by
        # changing another param: one trust-region step, and worth what the move promised.
        fixed, moves = self._completions(ranked[0][0]) if ok else \
            (np.zeros(0, np.int64), np.zeros((0, len(enc.params)), np.int64))
        if ok and self.opt.rescue:
            rescues, cliffs = self._rescues(ranked[0][0], done, hard)
            fixed, moves = np.concatenate([fixed, rescues]), np.concatenate([moves, cliffs])
        if ok and self.opt.screen and self._prior is None:  # a prior already rates the switches
            real = {tuple(h) for h in hard}
            timed = [i for i, y in done if y is not None or tuple(i) not in real] + list(pending)
            failed = np.array(hard).reshape(len(hard), len(enc.params))
            flip = self.regime_moves.screen(np.array(timed), failed, seen, (ok[0][0], ranked[0][0]), rng)
            if flip is None and stall is not None and stall % 2 == 1 and self.opt.regimes:
                # The switch params in turn, by the history's length (a new best restarts the
                # stall count).
                turn = (len(ok) + len(pending)) // (2 * self.opt.explore_every)
                flip = self.regime_moves.regime_flip(ranked, turn, seen, rng)
            if flip is not None:
                return flip
        # Every other global ask of a stall walks near the best config of another regime
        # instead (`runner_up`): its own trust region, as if it were the incumbent.
        centre = None
        if ok and stall is not None and stall % 4 == 2 and self.opt.runner_up and self.opt.regimes:
            centre = self.regime_moves.runner_up(ranked, stall // 4)
            if centre is not None:
                good = np.concatenate([enc.flat(np.array([centre])), good])
        completed = np.unique(fixed)
        flat = self._candidates(seen, good, completed, rng)
        if len(flat) == 0:
            return None
        cidx = enc.unflat(flat)
        if enc.dim == 0:
            pick = self._pick(flat, np.zeros(len(flat)), rng, seen)
            return None if pick is None else tuple(int(v) for v in enc.unflat(np.array([pick]))[0])
        Xc = enc.features(cidx)
        p_ok = self.failures.p_works(cidx, Xc, done, hard, self._ls)
        if not ok:  # nothing timed yet: spread out, away from what failed
            score = self._spread(Xc, enc.features(np.array(seen_idx)) if seen_idx else None, rng) * p_ok
        elif len(ok) < self.opt.n_startup:
            score = self._near(cidx, ranked[0][0], np.isin(flat, completed)) * (0.5 + rng.random(len(cidx))) * p_ok
        else:
            incumbent = ranked[0][0]
            # The model's rows: at most TRAIN_MAX timings (see `_keep`); failures are not told
            # to it (see `_improvement`).
            rows = [ok[k] for k in self._keep(ok, incumbent, TRAIN_MAX)]
            X = enc.features(np.array([i for i, _ in rows]))
            y = np.array([v for _, v in rows])
            y = np.minimum(y, y.min() + math.log10(self.opt.clip)) if self.opt.clip else y
            # With timings of related runs (`prior`), the model is of the difference from them.
            row_keys = enc.flat(np.array([i for i, _ in rows]))
            if self._prior is not None:
                prior = self._prior.mean(row_keys, y, self.opt.prior_weight * self._prior.coverage(self._valid))
            else:
                prior = lambda flat: np.zeros(len(flat))  # noqa: E731
            y_min = float(y.min())
            y = y - prior(row_keys)
            # Hyperparameters: refitted on every ask early on, then every 4th; on at most
            # FIT_MAX rows (the fit is O(n^3) per step), the model then conditioned on all rows.
            theta = self._theta
            if theta is None or len(ok) <= 30 or len(ok) % 4 == 0:
                fit = self._keep(rows, incumbent, FIT_MAX)
                theta = GP(X[fit], y[fit], theta).theta
            gp = GP(X, y, theta, fit=False)
            self._theta, self._ls = gp.theta, gp.ls
            Xp = enc.features(np.array(pending)) if pending else None
            if Xp is not None:  # in flight: believe the model's mean there (keeps parallel asks apart)
                gp = gp.with_points(Xp, gp.predict(Xp)[0])
            score = self._improvement(gp, Xc, prior(flat), p_ok, X, y, y_min, prior, hard, incumbent, Xp) * p_ok
            if len(fixed) and self.opt.promise:  # a fixed-up move is worth what the move promised
                mean, sd = gp.predict(enc.features(moves))
                promised = np.zeros(len(flat))
                at = np.searchsorted(flat, fixed)  # `flat` is sorted, and holds every one not yet seen
                hit = (at < len(flat)) & (flat[np.minimum(at, len(flat) - 1)] == fixed)
                best = (y_min - prior(enc.flat(moves)) - gp.mean) / gp.scale
                np.maximum.at(promised, at[hit], (expected_improvement(mean, sd, best) * gp.scale)[hit])
                score = np.maximum(score, promised * p_ok)
            self.expected_gain = float(1.0 - 10.0 ** -float(score.max())) if len(score) else 0.0
            if stall is None:
                score = score * self._near(cidx, incumbent, np.isin(flat, completed))
            elif centre is not None:
                score = score * self._near(cidx, centre, np.zeros(len(flat), dtype=bool))
        pick = self._pick(flat, score, rng, seen)
        return None if pick is None else tuple(int(v) for v in enc.unflat(np.array([pick]))[0])

    def _stall_ask(self, ok: list, in_flight: int = 0) -> int | None:
        """n when this ask is the n-th (from 0) since the last new best that looks beyond the
        trust region: every `explore_every`-th ask once `explore` timings in a row brought no
        new best; else None. Asks in flight count as asks, so that parallel asks made on the
        same history do not all go global or all stay local."""
        if not self.opt.explore:
            return None
        stall = len(ok) + in_flight - 1 - int(np.argmin([y for _, y in ok]))
        if stall >= self.opt.explore and (stall - self.opt.explore) % self.opt.explore_every == 0:
            return (stall - self.opt.explore) // self.opt.explore_every
        return None

    def _improvement(self, gp: GP, Xc: np.ndarray, m_c: np.ndarray, p_ok: np.ndarray, X: np.ndarray,
                     y: np.ndarray, y_min: float, prior: Callable[[np.ndarray], np.ndarray], hard: list,
                     incumbent: Sequence[int], Xp: np.ndarray | None) -> np.ndarray:
        """Expected improvement (log10 seconds) at Xc. Where P(works) < 0.5, also from the same
        model told the hard failures (the TRAIN_MAX / 4 nearest the incumbent) as `impute` x
        the best, and the lower figure counts: the timings' trend runs on past a resource limit,
        and near a failure nothing better than the best is to be expected. The model is of the
        difference from the prior (`prior`, flat keys -> log10 seconds; `m_c` its value at Xc),
        so a candidate improves on `y_min`, the best timing, by more than its model mean says
        where the prior expects it faster."""
        mean, sd = gp.predict(Xc)
        ei = expected_improvement(mean, sd, (y_min - m_c - gp.mean) / gp.scale) * gp.scale
        doubtful = p_ok < 0.5
        if self.opt.impute and hard and doubtful.any():
            failed = [(h, None) for h in hard]
            fidx = np.array([failed[k][0] for k in self._keep(failed, incumbent, TRAIN_MAX // 4)])
            Xf = self.enc.features(fidx)
            told_y = y_min + math.log10(self.opt.impute) - prior(self.enc.flat(fidx))
            told = GP(np.vstack([X, Xf]), np.concatenate([y, told_y]), gp.theta, fit=False)
            if Xp is not None:  # in flight, as for the main model
                told = told.with_points(Xp, told.predict(Xp)[0])
            m2, s2 = told.predict(Xc[doubtful])
            told_ei = expected_improvement(m2, s2, (y_min - m_c[doubtful] - told.mean) / told.scale)
            ei[doubtful] = np.minimum(ei[doubtful], told_ei * told.scale)
        return ei

    def _steps(self, idx: np.ndarray, incumbent: Sequence[int]) -> np.ndarray:
        """Steps from the incumbent, summed over params (`Encoding.step`)."""
        return sum(self.enc.step(j, idx[:, j], int(incumbent[j])) for j in range(idx.shape[1]))

    def _keep(self, rows: list, incumbent: Sequence[int], cap: int) -> list[int]:
        """Positions of at most `cap` of `rows` ((index, log seconds or None)), in order: the
        fastest half, then the nearest to the incumbent (failures, None, count as slowest).
        Past a few dozen points, far and slow ones no longer change where the next config is
        picked, and every point costs: O(n^3) to fit, O(candidates x n^2) to ask."""
        if len(rows) <= cap:
            return list(range(len(rows)))
        order = sorted(range(len(rows)), key=lambda k: math.inf if rows[k][1] is None else rows[k][1])
        keep = order[:cap // 2]
        rest = np.array(order[cap // 2:])
        dist = self._steps(np.array([rows[k][0] for k in rest]), incumbent)
        keep += [int(k) for k in rest[np.argsort(dist, kind="stable")[:cap - len(keep)]]]
        return sorted(keep)

    def _near(self, cidx: np.ndarray, incumbent: tuple[int, ...], completed: np.ndarray) -> np.ndarray:
        """decay ** (steps from the incumbent - 1); a completed move (`completed`: a mask) is one step."""
        steps = np.where(completed, 1, self._steps(cidx, incumbent))
        return self.opt.decay ** np.maximum(steps - 1, 0)

    def _spread(self, Xc: np.ndarray, Xs: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        """Far from what was seen, but not pinned to the corners (maximin in a random subset)."""
        noise = rng.random(len(Xc))
        if Xs is None or len(Xs) == 0:
            return noise
        d = np.sqrt(sqdist(Xc, Xs, np.ones(Xc.shape[1]))).min(1)
        keep = noise < min(1.0, 64.0 / len(Xc))
        return np.where(keep, 1.0 + d, noise * 1e-3)

    # -- what the Optuna sampler (tuner.search.guided_sampler) asks of the search --

    @property
    def has_prior(self) -> bool:
        """Whether timings measured elsewhere rate the space (`prior`)."""
        return self._prior is not None

    def stall_ask(self, done: list[tuple[tuple[int, ...], float | None]], in_flight: int = 0) -> int | None:
        """For `done` as `propose` takes it: n when the next ask is the n-th look beyond the
        trust region since the last new best (see `explore`), else None."""
        ok = [(i, y) for i, y in done if y is not None]
        return self._stall_ask(ok, in_flight) if ok else None

    def p_works(self, idx: Sequence[int], done: list[tuple[tuple[int, ...], float | None]]) -> float:
        """The failure model's P(works) for the config `idx`, given `done` as `propose` takes it."""
        one = np.array([idx], dtype=np.int64)
        told = self.failures.cliffs_as_failures(done)
        return float(self.failures.p_works(one, self.enc.features(one), told, [i for i, y in done if y is None],
                                           self._ls)[0])
