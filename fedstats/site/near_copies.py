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

from collections.abc import Sequence

import numpy as np

from fedstats.site.cell_rules import Segments, dominated, unit_segments
from fedstats.site.order_statistics import ends

RTOL = 1e-12
"""Relative tolerance of an affine match (about 4,500 units in the last place): well above
the rounding of ``c a + d``, far below any change that moves a released sum."""

SAMPLE = 1024
"""Rows on which :class:`_Screen` tries to prove a map far from a near-copy."""

_BLOCK = 1 << 22
"""Most matrix cells compared at once (memory stays near 100 MB whatever is remembered)."""


def extreme_values(column: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` smallest and the ``count`` largest distinct values of ``column`` (all of
    them, sorted, when it holds fewer), without sorting the whole column: the distinct values
    of its ``m`` smallest entries are every distinct value up to the ``m``-th smallest, so
    ``m`` grows until they number ``count`` (:mod:`fedstats.site.order_statistics`); a column
    whose ends are ties (a count, a flag) is sorted instead."""

    n = len(column)
    m = 4 * count
    while 2 * m < n and m <= 32 * count:
        low, high = (np.unique(values) for values in ends(column, m))
        if low.size >= count and high.size >= count:
            return low[:count], high[-count:]
        m *= 8
    values = np.unique(column)
    return values[:count], values[-count:]


def anchor_pairs(column: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The row pairs through which the candidate affine maps pass (module docstring): a
    row holding one of the ``k + 1`` smallest values with a row holding one of the ``k + 1``
    largest, up to ``k`` rows per value (every pair of distinct values when there are at
    most ``2 (k + 1)`` of them)."""
    smallest, largest = extreme_values(column, k + 2)
    if smallest.size < 2:
        return []
    if smallest.size < k + 2 or smallest[-1] >= largest[0]:  # together, every value
        values = np.union1d(smallest, largest)
        if values.size <= 2 * (k + 1):
            low = high = values
        else:
            low, high = values[: k + 1], values[-k - 1 :]
    else:  # at least 2 (k + 2) values
        low, high = smallest[: k + 1], largest[-k - 1 :]

    def rows(chosen: np.ndarray) -> np.ndarray:  # up to k rows per value, in one pass
        # chosen holds every value from its least to its greatest: a range, not a lookup
        holding = np.flatnonzero((column >= chosen[0]) & (column <= chosen[-1]))
        return np.concatenate([holding[column[holding] == value][:k] for value in chosen])

    lows, highs = rows(low), rows(high)  # each found once, not once per pair
    return sorted({(min(i, j), max(i, j)) for i in lows for j in highs if column[i] != column[j]})


def near_copies(
    stored: np.ndarray | Sequence[np.ndarray],
    column: np.ndarray,
    k: int,
    units: np.ndarray | None = None,
    *,
    extremes: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """For each remembered column ``a`` (a row of ``stored``): is ``column`` a near-copy of
    it, and is it a copy (module docstring)?

    Parameters
    ----------
    stored:
        Remembered columns, one per row, over the same rows as ``column`` (``m x n``), or a
        sequence whose items, one after the other, are the ``m`` columns: each a column
        (``n`` values) or a matrix of them, one per row. They are never stacked: only the
        anchor rows and the screen's sample are gathered from every column, and a whole
        column is read only for a map the screen leaves open.
    column:
        The new column (``n`` finite values).
    k:
        The site's cell threshold.
    units:
        The patient of each row, when a frame holds several rows per patient: deviations
        are then summed per patient before the ``k - 1`` largest are taken. ``None``: each
        row is its own unit.
    extremes:
        Each remembered column's least and greatest value (``m`` each), when the caller
        keeps them; computed here otherwise.

    Returns
    -------
    tuple of numpy.ndarray
        ``near`` and ``copy``, ``m`` booleans each; a copy is never near.
    """
    columns = remembered_columns(stored)
    m, n = len(columns), len(column)
    near = np.zeros(m, dtype=bool)
    copy = np.zeros(m, dtype=bool)
    if m == 0 or n == 0:
        return near, copy
    segments = None if units is None else unit_segments(units)
    screen = _Screen(column, k, segments)
    pairs = anchor_pairs(column, k)
    first = np.array([i for i, _ in pairs], dtype=np.int64)
    second = np.array([j for _, j in pairs], dtype=np.int64)
    gathered = np.concatenate([first, second, screen.rows])  # the rows read from every column
    step = max(1, min(_BLOCK // n, _BLOCK // ((len(pairs) + 1) * SAMPLE)))
    for lo in range(0, m, step):
        block = columns[lo : lo + step]
        rows_of = np.stack([a[gathered] for a in block])
        at_first, at_second = rows_of[:, : len(first)], rows_of[:, len(first) : 2 * len(first)]
        sample = rows_of[:, 2 * len(first) :]
        if extremes is None:
            low = np.array([a.min() for a in block])
            high = np.array([a.max() for a in block])
        else:
            low, high = extremes[0][lo : lo + len(block)], extremes[1][lo : lo + len(block)]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # one map per row of (c, d): the identity, then every anchor pair's
            c = np.vstack(
                [
                    np.ones(len(block)),
                    (column[first, None] - column[second, None]) / (at_first.T - at_second.T),
                ]
            )
            d = np.vstack([np.zeros(len(block)), column[first, None] - c[1:] * at_first.T])
            apart = screen.clearly_apart(sample, c, d, low, high)
        open_maps = np.isfinite(c) & np.isfinite(d) & ~apart
        for which in np.flatnonzero(open_maps.any(axis=1)):
            rows = np.flatnonzero(open_maps[which])
            residual, valid = _residual(
                column,
                np.stack([block[r] for r in rows]),
                c[which, rows],
                d[which, rows],
                identity=which == 0,
            )
            copy[lo + rows] |= valid & ~residual.any(axis=1)
            open_ = valid & ~screen.spread_out(residual)  # the same proof, on every row
            near[lo + rows[open_]] |= dominated(residual[open_], k, segments)
    if near.any() and dominated(column[None, :], k, segments)[0]:
        # a column dominated by itself is the cell rules' business: against it, every map
        # with c near 0 would leave a dominated residual
        near[:] = False
    return near & ~copy, copy


def remembered_columns(stored: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """The remembered columns of ``stored`` (:func:`near_copies`), one 1-D array (a view) each."""
    parts = [stored] if isinstance(stored, np.ndarray) else list(stored)
    return [row for part in parts for row in (part if part.ndim == 2 else (part,))]


def _residual(
    column: np.ndarray, block: np.ndarray, c: np.ndarray, d: np.ndarray, *, identity: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``b - (c a + d)`` for each row ``a`` of ``block``, with differences within ``RTOL`` of
    the values set to 0 (rounding; the identity is compared exactly), and whether each map
    stayed finite (an overflowing map is no map: neither near nor a copy)."""
    if identity:
        return column - block, np.ones(len(block), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = c[:, None] * block
        residual = column - (scaled + d[:, None])
        tolerance = RTOL * (np.abs(column) + np.abs(scaled) + np.abs(d)[:, None])
    valid = np.isfinite(residual).all(axis=1)
    residual = np.where(np.abs(residual) <= tolerance, 0.0, residual)
    residual[~valid] = 0.0
    return residual, valid


class _Screen:
    """A sound, cheap test that a map's residual is neither a copy nor dominated.

    On :data:`SAMPLE` fixed rows, disjoint pairs ``(i, j)`` (a row of the sample's first
    half with one of its second) give a lower bound of the
    residual's total absolute deviation from its median, ``T >= sum |r_i - r_j|`` (each
    pair's two deviations add up to at least their difference). The ``k - 1`` units
    deviating most hold at most ``s R``, with ``R`` the residual's range and ``s`` the rows of
    the ``k - 1`` largest units, and ``R`` is bounded from the ranges of ``a`` and ``b``
    alone. So ``T_low >= k / (k - 1) s R_bound > 0`` proves the rule cannot hold (nor can
    the residual be 0): only the maps that pass no such proof are computed over every row.
    A crafted column can only make the screen prove less, never decide wrongly.
    """

    def __init__(self, column: np.ndarray, k: int, segments: Segments | None) -> None:
        n = len(column)
        self.rows = np.unique(np.linspace(0, n - 1, min(n, SAMPLE)).astype(np.int64))
        self.column = column
        self.b_low, self.b_high = float(column.min()), float(column.max())
        if segments is None:
            largest = min(k - 1, n)
        else:
            sizes = np.diff(np.r_[segments[1], n])
            largest = int(np.sort(sizes)[-(k - 1) :].sum()) if k > 1 else 0
        self.factor = k / max(k - 1, 1) * largest

    def clearly_apart(
        self, sample: np.ndarray, c: np.ndarray, d: np.ndarray, low: np.ndarray, high: np.ndarray
    ) -> np.ndarray:
        """For each map ``c[p, r] a_r + d[p, r]`` of each remembered column ``a_r`` (``sample``
        its values on the screen's rows, :attr:`rows`; ``low``, ``high`` its extremes; map 0
        is the identity, compared exactly): is it proved neither a copy nor a near-copy (its
        residual as :func:`_residual` makes it)? Tried on every eighth sample row first, then
        on the whole sample for the maps not yet proved."""
        ca_low, ca_high = np.minimum(c * low, c * high), np.maximum(c * low, c * high)
        top = self.b_high - ca_low - d  # the residual (or 0, where rounded) lies in [bottom, top]
        bottom = self.b_low - ca_high - d
        rounding = RTOL * (max(abs(self.b_low), abs(self.b_high)) + np.abs(ca_low) + np.abs(ca_high)
                           + np.abs(d))  # fmt: skip
        needed = self.factor * (np.maximum(top, 0.0) - np.minimum(bottom, 0.0) + 2 * rounding)
        proved = np.zeros(c.shape, dtype=bool)
        for taken in (slice(None, None, 8), slice(None)):
            rows = self.rows[taken]
            if len(rows) < 2:
                continue
            maps, columns = np.nonzero(~proved & np.isfinite(needed))
            if maps.size == 0:
                break
            values = self.column[rows]
            scaled = c[maps, columns, None] * sample[:, taken][columns]
            residual = values - (scaled + d[maps, columns, None])
            tolerance = RTOL * (np.abs(values) + np.abs(scaled) + np.abs(d[maps, columns, None]))
            rounded = (np.abs(residual) <= tolerance) & (maps != 0)[:, None]  # 0: the identity
            residual = np.where(rounded, 0.0, residual)
            half = len(rows) // 2  # rows far apart in the frame (clustered rows differ)
            bound = np.abs(residual[:, :half] - residual[:, half : 2 * half]).sum(axis=1)
            proved[maps, columns] = (
                np.isfinite(bound) & (bound > 0) & (bound >= needed[maps, columns] * (1 + 1e-9))
            )
        return proved

    def spread_out(self, residual: np.ndarray) -> np.ndarray:
        """The proof of :meth:`clearly_apart` on whole residuals (their exact range, and the
        pairs of every row of the first half with one of the second)."""
        half = residual.shape[1] // 2
        bound = np.abs(residual[:, :half] - residual[:, half : 2 * half]).sum(axis=1)
        spread = np.ptp(residual, axis=1) if residual.shape[1] else np.zeros(len(residual))
        return (bound > 0) & (bound >= self.factor * spread * (1 + 1e-9))
