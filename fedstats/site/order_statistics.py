"""Exact order statistics of a long column from a short pass: the median and the extremes.

The small-cell rules and the differencing guard read, for every design column, its median
and its few smallest and largest values (:mod:`fedstats.site.cell_rules`,
:mod:`fedstats.site.near_copies`). A full selection (``numpy.partition``) moves the whole
column around; here a sample of the column brackets the values wanted first, and only the
rows inside the bracket are selected from — the sampling step of Floyd & Rivest's selection
algorithm ("Expected time bounds for selection", *Commun. ACM* 18(3), 1975). The answer is
exact whatever the sample: a bracket is used only when the counts of one pass prove that it
holds the ranks asked for, and the whole column is selected from otherwise (a column whose
order defeats the sample costs one more pass, never a wrong value).
"""

from __future__ import annotations

import numpy as np

SAMPLE = 1024
"""Rows sampled (evenly spaced) to place a bracket."""

_SHORT = 16 * SAMPLE
"""Columns up to this length are selected from directly."""


def ends(values: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` smallest and the ``count`` largest entries of ``values`` (with repeats,
    each ascending).

    The ``count``-th smallest of a sample bounds the ``count``-th smallest of the column from
    above (the sample holds ``count`` entries at or below it), so each of the column's
    ``count`` smallest entries lies at or below it: they are selected from those rows only;
    the largest, likewise, from the rows at or above the sample's ``count``-th largest. One
    sample, and one check that it may be taken, serve both ends.
    """
    n = len(values)
    if count <= 0:
        return values[:0].copy(), values[:0].copy()
    if count >= n:
        return np.sort(values), np.sort(values)
    low = high = values
    sample = values[:: _step(n)]
    s = len(sample)
    if count <= s // 8 and _sampled(values):
        bounds = np.partition(sample, (count - 1, s - count))
        low, high = values[values <= bounds[count - 1]], values[values >= bounds[s - count]]
    m = len(high)
    return (
        np.sort(np.partition(low, count - 1)[:count]),
        np.sort(np.partition(high, m - count)[m - count :]),
    )


def middle(values: np.ndarray) -> tuple[float, float]:
    """The entries of rank ``(n - 1) // 2`` and ``n // 2`` (from 0, ascending; ``n >= 1``): the
    median is their mean. A sample's central values bracket them; the bracket is used when
    the rows below it and inside it show that both ranks fall inside."""
    n = len(values)
    low, high = (n - 1) // 2, n // 2
    if _sampled(values):
        sample = np.sort(values[:: _step(n)])
        s = len(sample)
        spread = int(2 * np.sqrt(s)) + 1  # a sample rank strays about sqrt(s) / 2
        lower, upper = sample[max(0, s // 2 - spread)], sample[min(s - 1, s // 2 + spread)]
        below = int(np.count_nonzero(values < lower))
        inside = values[(values >= lower) & (values <= upper)]
        if below <= low and below + len(inside) > high:
            both = np.partition(inside, (low - below, high - below))
            return float(both[low - below]), float(both[high - below])
    both = np.partition(values, (low, high))
    return float(both[low]), float(both[high])


def _sampled(values: np.ndarray) -> bool:
    """Whether a sample is worth taking: a long column of finite numbers (a NaN, which
    selection places last and no comparison holds, is left to a full selection)."""
    return len(values) > _SHORT and bool(np.isfinite(values).all())


def _step(n: int) -> int:
    """The spacing of about :data:`SAMPLE` evenly spaced rows among ``n``."""
    return max(1, n // SAMPLE)
