"""Near-copies of a column: is ``b - (c a + d)`` held by fewer than ``k`` rows (or patients)?

Two exact answers over columns ``a`` and ``b`` that agree on every row but a
few give those rows' terms by subtraction: ``sum_i b_i y_i - sum_i a_i y_i =
sum_i r_i y_i`` with ``r = b - a`` (and likewise for ``X'X`` and every other
sum): the differencing attack of Duncan & Pearson (Stat Sci 1991) applied to
values instead of row sets. An affine image leaks the same way, since a site's
sums of ``c a + d`` are ``c`` times those of ``a`` plus ``d`` times those of a
constant. So :func:`near_copies` asks, for each remembered column ``a``,
whether some map ``c a + d`` leaves a *residual* ``r = b - (c a + d)`` that
breaks the dominance rule of a design column
(:func:`fedstats.site.cell_rules.column_problem`; Hundepool et al., *Statistical
Disclosure Control*, Wiley 2012, §4.2.2): its ``k - 1`` largest deviations
from its median (per patient, when a frame holds several rows per patient)
hold more than ``(k - 1)/k`` of the total. A residual on 1 to ``k - 1`` rows
holds all of it; a smooth bump around one patient (``1 / (1 + 1e6 (t - v)^2)``
added to ``a``) holds nearly all of it, and is refused like the sparse change
it approximates. A column some map reproduces exactly (``r = 0``) is a copy:
it adds nothing to remember.

The maps tried:

* the identity, compared exactly (a change of any size on one row counts);
* every map through two *anchor* rows ``i, j`` with ``b_i != b_j``:
  ``c = (b_i - b_j) / (a_i - a_j)``, ``d = b_i - c a_i``; a residual within
  ``RTOL (|b_r| + |c a_r| + |d|)`` of 0 is rounding and counts as 0.

Why the anchors find the map when ``b = c a + d`` (``c != 0``) off at most
``k - 1`` rows: they are, for the ``k + 1`` smallest and the ``k + 1`` largest
distinct values of ``b``, up to ``k`` rows holding each value. At most
``k - 1`` values are held by changed rows only, so at least two of each
``k + 1`` values are held by an unchanged row, and one of the ``k`` rows taken
for such a value is unchanged (at most ``k - 1`` rows are). Two unchanged rows
with distinct ``b`` have distinct ``a`` (``c != 0``), so their pair gives ``c``
and ``d``; pairing a small value with a large one keeps it well conditioned.
(A ``b`` constant off a few rows, ``c = 0``, or dominated by a few rows by
itself, is the business of the cell rules, which see every design column.)

This is a heuristic like the rest of the differencing guard: it detects
near-copies of one remembered column, not of combinations of several.
"""

from __future__ import annotations

import numpy as np

RTOL = 1e-12
"""Relative tolerance of an affine match (about 4,500 units in the last place): well above
the rounding of ``c a + d``, far below any change that moves a released sum."""

_BLOCK = 1 << 22
"""Most matrix cells compared at once (memory stays near 100 MB whatever is remembered)."""


def anchor_pairs(column: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The row pairs through which the candidate affine maps pass (module docstring): a
    row holding one of the ``k + 1`` smallest values with a row holding one of the ``k + 1``
    largest, up to ``k`` rows per value (every pair of distinct values when there are at
    most ``2 (k + 1)`` of them)."""
    values = np.unique(column)
    if values.size < 2:
        return []
    if values.size <= 2 * (k + 1):
        low = high = values
    else:
        low, high = values[: k + 1], values[-k - 1 :]

    def rows(chosen: np.ndarray) -> np.ndarray:
        return np.concatenate([np.flatnonzero(column == value)[:k] for value in chosen])

    return sorted(
        {(min(i, j), max(i, j)) for i in rows(low) for j in rows(high) if column[i] != column[j]}
    )


def near_copies(
    stored: np.ndarray, column: np.ndarray, k: int, units: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For each remembered column ``a`` (a row of ``stored``): is ``column`` a near-copy of
    it, and is it a copy (module docstring)?

    Parameters
    ----------
    stored:
        Remembered columns, one per row, over the same rows as ``column`` (``m x n``).
    column:
        The new column (``n`` finite values).
    k:
        The site's cell threshold.
    units:
        The patient of each row, when a frame holds several rows per patient: deviations
        are then summed per patient before the ``k - 1`` largest are taken. ``None``: each
        row is its own unit.

    Returns
    -------
    tuple of numpy.ndarray
        ``near`` and ``copy``, ``m`` booleans each; a copy is never near.
    """
    m, n = stored.shape
    near = np.zeros(m, dtype=bool)
    copy = np.zeros(m, dtype=bool)
    if m == 0 or n == 0:
        return near, copy
    segments = None
    if units is not None:
        order = np.argsort(units, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(units[order]) != 0])
        segments = (order, starts)
    # a column dominated by itself is the cell rules' business: against it, every map with
    # c near 0 would leave a dominated residual
    alone = bool(_dominated(column[None, :], k, segments)[0])
    pairs = anchor_pairs(column, k)
    step = max(1, _BLOCK // n)
    for lo in range(0, m, step):
        block = stored[lo : lo + step]
        residual = column - block
        copy[lo : lo + step] |= ~residual.any(axis=1)
        near[lo : lo + step] |= _dominated(residual, k, segments)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for i, j in pairs:
                c = (column[i] - column[j]) / (block[:, i] - block[:, j])
                d = column[i] - c * block[:, i]
                scaled = c[:, None] * block
                residual = column - (scaled + d[:, None])
                tolerance = RTOL * (np.abs(column) + np.abs(scaled) + np.abs(d)[:, None])
                valid = np.isfinite(residual).all(axis=1)
                residual = np.where(np.abs(residual) <= tolerance, 0.0, residual)
                residual[~valid] = 0.0
                copy[lo : lo + step] |= valid & ~residual.any(axis=1)
                near[lo : lo + step] |= valid & _dominated(residual, k, segments)
    return near & ~copy & (not alone), copy


def _dominated(
    residual: np.ndarray, k: int, segments: tuple[np.ndarray, np.ndarray] | None
) -> np.ndarray:
    """Per row of ``residual``: do the ``k - 1`` units deviating most from its median hold
    more than ``(k - 1)/k`` of its total absolute deviation (the dominance rule)?"""
    deviation = np.abs(residual - np.median(residual, axis=1, keepdims=True))
    if segments is not None:
        order, starts = segments
        deviation = np.add.reduceat(deviation[:, order], starts, axis=1)
    total = deviation.sum(axis=1)
    top_k = min(k - 1, deviation.shape[1])
    if top_k < 1:
        return np.zeros(len(residual), dtype=bool)
    top = np.partition(deviation, deviation.shape[1] - top_k, axis=1)[:, -top_k:].sum(axis=1)
    return (total > 0) & (top > (k - 1) / k * total * (1 + 1e-12))
