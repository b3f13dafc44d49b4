"""Non-negative least squares, the one fitting routine behind every scheduling-cost model.

Costs are sums of non-negative per-unit prices (a price per request matched, per token, per
node), so coefficients are constrained to be >= 0: Lawson and Hanson's active-set algorithm,
written with numpy (small problems: a handful of features, hundreds of rows).
"""

from __future__ import annotations

import numpy as np


def nnls(x: np.ndarray, y: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """argmin ||x b - y|| subject to b >= 0 (Lawson-Hanson, on unit-norm columns so that
    features of very different scales, requests and tokens, meet one tolerance)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    norms = np.linalg.norm(x, axis=0)
    used = norms > 0
    beta = np.zeros(x.shape[1])
    if used.any():
        beta[used] = _nnls_unit(x[:, used] / norms[used], y, max_iter) / norms[used]
    return beta


def _nnls_unit(x: np.ndarray, y: np.ndarray, max_iter: int) -> np.ndarray:
    n = x.shape[1]
    beta = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-10 * max(1.0, float(np.linalg.norm(y)))
    for _ in range(max_iter):
        gradient = x.T @ (y - x @ beta)
        candidates = ~passive & (gradient > tol)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(x[:, passive], y, rcond=None)[0]
            if (trial[passive] > 0).all():
                beta = trial
                break
            shrinking = np.flatnonzero(passive & (trial <= 0))
            steps = beta[shrinking] / (beta[shrinking] - trial[shrinking])
            blocking = shrinking[int(np.argmin(steps))]
            beta = beta + float(steps.min()) * (trial - beta)
            beta[blocking] = 0.0  # the coefficient that reached zero first leaves
            passive &= beta > 0
            beta[~passive] = 0.0
    return beta


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    y = np.asarray(y, dtype=float)
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        return 1.0
    return 1.0 - float(((y - predicted) ** 2).sum()) / total
