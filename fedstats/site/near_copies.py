"""Near-copies of a column: on how few rows (or patients) does ``b`` differ from ``c a + d``?

Two exact answers over columns ``a`` and ``b`` that agree on every row but a
few give those rows' terms by subtraction: ``sum_i b_i y_i - sum_i a_i y_i =
sum_{i in D} (b_i - a_i) y_i`` over the differing rows ``D``, and likewise for
``X'X`` and every other sum (the differencing attack of Duncan & Pearson,
Stat Sci 1991, applied to values instead of row sets). An affine image
``b = c a + d`` (``c != 0``) off ``D`` leaks the same way, since the site's sums
of ``c a + d`` are ``c`` times those of ``a`` plus ``d`` times those of a
constant. :func:`differing_units` counts ``|D|`` for the best such map:

* the identity map, compared exactly (a change of any size on one row counts);
* every map through two *anchor* rows ``i != j``:
  ``c = (b_i - b_j) / (a_i - a_j)``, ``d = b_i - c a_i``; a row differs when
  ``|b_r - (c a_r + d)| > RTOL (|b_r| + |c a_r| + |d|)`` (the tolerance absorbs
  the rounding of an affine map computed in floating point).

Why the anchors find the map whenever ``1 <= |D| <= k - 1``: the anchors are,
for the ``k + 1`` smallest and the ``k + 1`` largest distinct values of ``b``,
up to ``k`` rows holding each value. At most ``k - 1`` values can be held by
differing rows only, so at least two of each ``k + 1`` values are held by an
agreeing row, and one of the ``k`` rows taken for such a value agrees (at most
``k - 1`` rows differ). Two agreeing rows with distinct ``b`` values have
distinct ``a`` values (``c != 0``), so their pair gives ``c`` and ``d``; pairing
a small value with a large one keeps the pair well conditioned. (A column that
is constant off ``D``, ``c = 0``, is the mode rule's business:
:func:`fedstats.site.cell_rules.column_problem`.)

This is a heuristic like the rest of the differencing guard: it detects
near-copies of single remembered columns, not of combinations of several.
"""

from __future__ import annotations

import numpy as np

RTOL = 1e-12
"""Relative tolerance of an affine match (about 4,500 units in the last place): well above
the rounding of ``c a + d``, far below any change that moves a released sum."""

_BLOCK = 1 << 22
"""Most matrix cells compared at once (memory stays near 100 MB whatever is remembered)."""


def anchor_rows(column: np.ndarray, k: int) -> np.ndarray:
    """Rows through which the candidate affine maps pass (module docstring)."""
    values, first = np.unique(column, return_index=True)
    if values.size < 2:
        return np.zeros(0, dtype=np.int64)
    chosen = values if values.size <= 2 * (k + 1) else np.r_[values[: k + 1], values[-k - 1 :]]
    rows = [np.flatnonzero(column == value)[:k] for value in chosen]
    return np.unique(np.concatenate(rows)) if rows else first[:0]


def differing_units(
    stored: np.ndarray, column: np.ndarray, k: int, units: np.ndarray | None = None
) -> np.ndarray:
    """For each row ``a`` of ``stored``, the fewest units on which ``column`` differs from
    ``c a + d`` (the identity or an affine map, module docstring).

    Parameters
    ----------
    stored:
        Remembered columns, one per row, over the same rows as ``column`` (``m x n``).
    column:
        The new column (``n`` finite values).
    k:
        The site's cell threshold: the anchors cover up to ``k - 1`` differing rows.
    units:
        The patient of each row, when a frame holds several rows per patient; the count is
        then of patients with a differing row. ``None``: each row is its own unit.

    Returns
    -------
    numpy.ndarray
        ``m`` counts; ``0`` means ``column`` is the column ``a`` (or an exact affine image).
    """
    m, n = stored.shape
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    anchors = anchor_rows(column, k)
    pairs = [
        (i, j) for x, i in enumerate(anchors) for j in anchors[x + 1 :] if column[i] != column[j]
    ]
    segments = None
    if units is not None:
        order = np.argsort(units, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(units[order]) != 0])
        segments = (order, starts)
    best = np.empty(m, dtype=np.int64)
    step = max(1, _BLOCK // max(n, 1))
    for lo in range(0, m, step):
        block = stored[lo : lo + step]
        fewest = _count(block != column, segments)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for i, j in pairs:
                c = (column[i] - column[j]) / (block[:, i] - block[:, j])
                d = column[i] - c * block[:, i]
                scaled = c[:, None] * block
                fitted = scaled + d[:, None]
                tolerance = RTOL * (np.abs(column) + np.abs(scaled) + np.abs(d)[:, None])
                differs = ~(np.abs(column - fitted) <= tolerance)  # a NaN (a_i = a_j) differs
                fewest = np.minimum(fewest, _count(differs, segments))
        best[lo : lo + step] = fewest
    return best


def _count(differs: np.ndarray, segments: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Differing rows per stored column, or differing units when ``segments`` groups rows."""
    if segments is None:
        return differs.sum(axis=1)
    order, starts = segments
    return np.logical_or.reduceat(differs[:, order], starts, axis=1).sum(axis=1)
