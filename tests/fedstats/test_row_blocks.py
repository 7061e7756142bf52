"""A round's sums taken over blocks of rows equal the whole-column formulas and statsmodels'.

:func:`fedstats.site.handlers.logistic.exact_sums` sums the score, information and
log-likelihood block by block (:mod:`fedstats.site.row_blocks`). Oracles: the textbook
whole-column products written here (``X'(y - mu)``, ``X' diag(mu (1 - mu)) X``) and
statsmodels' Binomial GLM (score, Hessian and log-likelihood at the same coefficients),
on designs spanning one block, several, and a last partial block, in either memory order
and copied block by block from the design's columns (as a site's kept design is read).
"""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.special import expit

from fedstats.site.handlers.logistic import exact_sums
from fedstats.site.row_blocks import BLOCK_BYTES, Information, column_blocks, row_blocks


def blocks(X: np.ndarray, kind: str):
    """The design's blocks of rows: slices of the matrix, or copies from its columns."""
    if kind == "columns":
        return column_blocks([np.ascontiguousarray(X[:, j]) for j in range(X.shape[1])], len(X))
    return ((rows, X[rows]) for rows in row_blocks(*X.shape))


def design(n: int, p: int, seed: int, order: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    beta = rng.normal(0, 0.4, p)
    y = (rng.random(n) < expit(X @ beta)).astype(float)
    return np.asarray(X, order=order), y, beta


@pytest.mark.parametrize(("order", "kind"), [("C", "rows"), ("F", "rows"), ("C", "columns")])
@pytest.mark.parametrize("n", [7, 256, BLOCK_BYTES // (8 * 6) * 3 + 11])
def test_block_sums_equal_the_whole_column_formulas_and_statsmodels(n, order, kind):
    X, y, beta = design(n, 6, seed=n, order=order)
    offset = np.linspace(-0.5, 0.5, n)
    sums = exact_sums(blocks(X, kind), y, offset, beta)
    eta = X @ beta + offset
    mu = expit(eta)
    gradient = X.T @ (y - mu)
    hessian = X.T @ (X * (mu * (1 - mu))[:, None])
    scale = np.abs(hessian).max()
    assert np.max(np.abs(sums["gradient"] - gradient)) <= 1e-12 * max(1.0, np.abs(gradient).max())
    assert np.max(np.abs(sums["hessian"] - hessian)) <= 1e-12 * scale
    assert np.array_equal(sums["hessian"], sums["hessian"].T)  # symmetric to the last bit
    model = sm.GLM(y, X, family=sm.families.Binomial(), offset=offset)
    assert np.allclose(sums["gradient"], model.score(beta), rtol=1e-11, atol=1e-11)
    assert np.allclose(sums["hessian"], -model.hessian(beta), rtol=1e-11, atol=1e-11)
    assert sums["loglik"] == pytest.approx(model.loglike(beta), rel=1e-12)
    assert sums["all_extreme"] is False and sums["any_extreme"] is False


def test_the_separation_flags_cover_every_block():
    n = BLOCK_BYTES // (8 * 2) * 2 + 5
    X = np.column_stack([np.ones(n), np.linspace(-1, 1, n)])
    y = (X[:, 1] > 0).astype(float)
    flat = exact_sums(blocks(X, "columns"), y, None, np.zeros(2))
    assert not flat["any_extreme"] and not flat["all_extreme"]
    steep = exact_sums(blocks(X, "columns"), y, None, np.array([0.0, 1e4]))  # near 0: not
    assert steep["any_extreme"] and not steep["all_extreme"]
    X[np.abs(X[:, 1]) < 0.01, 1] = 1.0  # no row near 0 any longer
    assert exact_sums(blocks(X, "rows"), y, None, np.array([0.0, 1e4]))["all_extreme"]


def test_blocks_cover_every_row_once():
    for n in (0, 1, 255, 256, 257, 10_000):
        for p in (1, 7, 300):
            covered = np.zeros(n, dtype=int)
            for rows in row_blocks(n, p):
                covered[rows] += 1
            assert (covered == 1).all()
            X = np.arange(n * p, dtype=np.float64).reshape(n, p)
            for rows, block in column_blocks([X[:, j].copy() for j in range(p)], n):
                assert np.array_equal(block, X[rows])


def test_the_information_of_weights_with_zeros_and_nan():
    X = np.arange(12.0).reshape(6, 2)
    information = Information(2)
    information.add(X[:3], np.array([0.0, 1.0, 2.0]))
    information.add(X[3:], np.array([0.5, 0.0, 1.0]))
    w = np.array([0.0, 1.0, 2.0, 0.5, 0.0, 1.0])
    assert np.allclose(information.total(), X.T @ (X * w[:, None]), rtol=1e-15)
    information.add(X[:1], np.array([np.nan]))
    assert np.isnan(information.total()).all()
