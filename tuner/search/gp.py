"""A small Gaussian process for `tuner.search.guided` (numpy; hyperparameters by scipy's L-BFGS-B).

Kernel: Matérn 5/2 with one length scale per dimension (ARD), every hyperparameter fitted by
MAP marginal likelihood. (A linear term for extrapolation was tried: its prior variance grows
towards the edges of the space, and the acquisition then kept probing the largest tiles right
past a register-spill cliff.)
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import scipy.optimize
import scipy.special

CHUNK = 8192  # candidates per block of kernel evaluations (bounds memory)
SQRT5 = math.sqrt(5.0)


def matern(r: np.ndarray) -> np.ndarray:
    return (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * np.exp(-SQRT5 * r)


def sqdist(a: np.ndarray, b: np.ndarray, ls: np.ndarray) -> np.ndarray:
    a, b = a / ls, b / ls
    d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.maximum(d, 0.0)


class GP:
    """Zero-mean GP on standardised targets. `theta` = log of (length scales..., signal
    variance, noise variance)."""

    LS_BOUNDS = (math.log(0.03), math.log(10.0))
    LS_PRIOR = (math.log(0.5), 1.0)  # log-normal prior on each length scale
    SIGNAL_BOUNDS = (math.log(0.05), math.log(20.0))
    NOISE_BOUNDS = (math.log(1e-4), math.log(0.3))

    def __init__(self, X: np.ndarray, y: np.ndarray, theta0: np.ndarray | None = None, fit: bool = True):
        self.X = X
        self.mean, self.scale = float(y.mean()), float(y.std()) or 1.0
        self.y = (y - self.mean) / self.scale
        if theta0 is None or len(theta0) != X.shape[1] + 2:
            theta0 = self.default_theta(X.shape[1])
        self.theta = self._fit(theta0) if fit else theta0
        self._factor()

    @staticmethod
    def default_theta(d: int) -> np.ndarray:
        return np.array([math.log(0.5)] * d + [0.0, math.log(0.01)])

    def with_points(self, Xp: np.ndarray, yp_std: np.ndarray) -> "GP":
        """The same GP, conditioned also on points whose standardised targets are `yp_std`."""
        gp = GP.__new__(GP)
        gp.X, gp.mean, gp.scale, gp.theta = np.vstack([self.X, Xp]), self.mean, self.scale, self.theta
        gp.y = np.concatenate([self.y, yp_std])
        gp._factor()
        return gp

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        b = [self.LS_BOUNDS] * self.X.shape[1] + [self.SIGNAL_BOUNDS, self.NOISE_BOUNDS]
        return np.array([x[0] for x in b]), np.array([x[1] for x in b])

    def _nll(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        X, y = self.X, self.y
        n, d = X.shape
        ls, s2, nz = np.exp(theta[:d]), math.exp(theta[d]), math.exp(theta[d + 1])
        diff2 = ((X[:, None, :] - X[None, :, :]) / ls) ** 2  # n n d
        r = np.sqrt(diff2.sum(-1) + 1e-12)
        e = np.exp(-SQRT5 * r)
        kc = s2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * e
        K = kc + (nz + 1e-8) * np.eye(n)
        try:
            L = np.linalg.cholesky(K)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        Linv = np.linalg.solve(L, np.eye(n))
        Kinv = Linv.T @ Linv
        alpha = Kinv @ y
        mu, sd = self.LS_PRIOR
        nll = 0.5 * y @ alpha + np.log(np.diag(L)).sum() + 0.5 * (((theta[:d] - mu) / sd) ** 2).sum()
        W = np.outer(alpha, alpha) - Kinv
        G = s2 * (5.0 / 3.0) * (1.0 + SQRT5 * r) * e
        grad = np.empty_like(theta)
        grad[:d] = -0.5 * np.einsum("ij,ijk->k", W * G, diff2) + (theta[:d] - mu) / sd ** 2
        grad[d] = -0.5 * (W * kc).sum()
        grad[d + 1] = -0.5 * np.trace(W) * nz
        return float(nll), grad

    def _fit(self, theta0: np.ndarray) -> np.ndarray:
        lo, hi = self._bounds()
        starts = [np.clip(theta0, lo, hi)]
        default = self.default_theta(self.X.shape[1])
        if not np.allclose(starts[0], default) and len(self.X) <= 12:
            starts.append(default)
        best_theta, best_f = starts[0], math.inf
        for s in starts:
            theta, f = minimize(self._nll, s, lo, hi)
            if f < best_f:
                best_theta, best_f = theta, f
        return best_theta

    def _factor(self) -> None:
        d = self.X.shape[1]
        self.ls = np.exp(self.theta[:d])
        self.s2 = math.exp(self.theta[d])
        self.noise = math.exp(self.theta[d + 1])
        K = self._cross(self.X, self.X) + (self.noise + 1e-8) * np.eye(len(self.X))
        self.L = np.linalg.cholesky(K)
        self.alpha = np.linalg.solve(self.L.T, np.linalg.solve(self.L, self.y))

    def _cross(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return self.s2 * matern(np.sqrt(sqdist(A, B, self.ls)))

    def predict(self, Xc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation, in standardised units (in chunks: big spaces)."""
        means, sds = [], []
        for lo in range(0, len(Xc), CHUNK):
            x = Xc[lo:lo + CHUNK]
            ks = self._cross(x, self.X)
            means.append(ks @ self.alpha)
            v = np.linalg.solve(self.L, ks.T)
            sds.append(np.sqrt(np.maximum(self.s2 - (v * v).sum(0), 1e-12)))
        return np.concatenate(means), np.concatenate(sds)


def minimize(f: Callable, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, float]:
    """L-BFGS-B from `x0` within [lo, hi]; `f` returns (value, gradient)."""
    res = scipy.optimize.minimize(f, x0, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                                  options={"maxiter": 60})
    return np.clip(res.x, lo, hi), float(res.fun)


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    z = (best - mean) / sd
    return sd * (z * scipy.special.ndtr(z) + np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))
