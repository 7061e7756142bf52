"""Small-cell rules on everything a site's exact aggregates are computed from.

The threshold rule of :mod:`fedstats.site.disclosure` counts the patients behind a
whole reply. That is not enough when the coordinator chooses the design: a
column that is the indicator of one patient turns a gradient into that
patient's outcome, however many patients the reply covers. So every design
column, the outcome, every stratum and group, and every true/false value a
formula computes on the way are checked with ``k = policy.k_cell``:

* **cells** — an indicator (a comparison, ``&``, ``|``, ``~``, a 0/1 column,
  the outcome, a stratum or group) holds on 0 or at least ``k`` rows, and
  fails on 0 or at least ``k`` rows;
* **mode** — no column differs from its most common value on 1 to ``k - 1``
  rows (DataSHIELD's ``nfilter.tab``/``nfilter.glm`` idea, Gaye et al.,
  Int J Epidemiol 2014);
* **dominance** — no ``k - 1`` rows hold more than ``(k - 1)/k`` of a
  column's total absolute deviation from its median, the share they would
  hold if only ``k`` rows shared it equally (the (n, p)-dominance rule of the
  ESSnet SDC handbook, Hundepool et al. 2012, §4.2.2, applied to a design
  column): a smooth bump around one patient's values is refused like the
  indicator it approximates.

These are heuristics: they stop the known reconstruction attacks (indicator
columns, row indicators, crafted outcomes) but cannot bound what exact
aggregates of coordinator-chosen functions reveal in general. Only an
approved protocol or differential privacy is a guarantee (see the README's
threat model).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedstats.errors import DisclosureError
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.order_statistics import ends, middle


def check_indicator(
    policy: DisclosurePolicy, *, site: str, task: str | None, term: str, mask: np.ndarray
) -> None:
    """Refuse a true/false value that holds, or fails, on 1 to ``k_cell - 1`` rows."""
    k = policy.k_cell
    holds = int(np.count_nonzero(mask))
    fails = int(mask.size) - holds
    if 0 < holds < k or 0 < fails < k:
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"{term!r} would single out fewer than {k} rows (the small-cell rule applies "
                "to every indicator a formula computes)"
            ),
            rule="cells",
        )


def column_problem(values: np.ndarray, k: int) -> str | None:
    """Why a design column breaks the mode or dominance rule (``None`` if it does not).

    In linear time: a value held by more than half the rows is the median, so
    the mode rule needs only the median's count; the dominance rule needs the
    median, the total deviation and the ``k - 1`` smallest and largest values,
    which exact selection gives without a full sort
    (:mod:`fedstats.site.order_statistics`).
    """
    n = values.size
    if n == 0:
        return None
    if n < 2 * k + 2:
        return problem_of_sorted_column(np.sort(values), k)
    lower, upper = middle(values)
    median = 0.5 * (lower + upper)
    held = int(np.count_nonzero(values == median))
    differing = n - held if 2 * held > n else n  # else no value holds more than half the rows
    if 0 < differing < k:
        return _MODE_TEXT.format(k=k)
    if k > 1 and differing >= k:
        extremes = np.concatenate(ends(values, k - 1))
        return _dominance(extremes, float(np.abs(values - median).sum()), median, k)
    return None


_MODE_TEXT = "differs from its most common value on fewer than {k} rows"
_DOMINANCE_TEXT = (
    "has fewer than {k} rows holding most of its variation "
    "(a column dominated by a few rows reproduces them)"
)


def _dominance(ends: np.ndarray, total: float, median: float, k: int) -> str | None:
    """The dominance rule from the ``k - 1`` smallest and largest values (``ends``): the
    ``k - 1`` largest deviations from the median lie among them."""
    if total <= 0:
        return None
    top = np.sort(np.abs(ends - median))[-(k - 1) :]
    if float(top.sum()) > (k - 1) / k * total * (1 + 1e-12):
        return _DOMINANCE_TEXT.format(k=k)
    return None


def problem_of_sorted_column(ordered: np.ndarray, k: int) -> str | None:
    """:func:`column_problem` of a short column, from its sorted values."""
    n = ordered.size
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1], [True])))
    differing = n - int(np.diff(starts).max())
    if 0 < differing < k:
        return _MODE_TEXT.format(k=k)
    if k > 1 and differing >= k:
        median = 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])
        total = float(np.abs(ordered - median).sum())
        ends = np.concatenate((ordered[: k - 1], ordered[-(k - 1) :])) if n >= k else ordered
        return _dominance(ends, total, median, k)
    return None


def check_columns(
    policy: DisclosurePolicy,
    *,
    site: str,
    task: str | None,
    names: Sequence[str],
    X: np.ndarray | Sequence[np.ndarray],
) -> None:
    """Apply the mode and dominance rules to every column of ``X`` (a matrix, or its columns;
    named by ``names``)."""
    for j, name in enumerate(names):
        column = X[:, j] if isinstance(X, np.ndarray) else X[j]
        problem = column_problem(np.asarray(column, dtype=np.float64), policy.k_cell)
        if problem is not None:
            raise DisclosureError(
                site=site,
                task=task,
                reason=f"design column {name!r} {problem}",
                rule="cells",
            )


def check_groups(
    policy: DisclosurePolicy, *, site: str, task: str | None, what: str, codes: np.ndarray
) -> None:
    """Refuse groups (outcome values, strata, levels) present on 1 to ``k_cell - 1`` rows."""
    k = policy.k_cell
    _, counts = np.unique(codes, return_counts=True)
    if counts.size and int(counts.min()) < k:
        raise DisclosureError(
            site=site,
            task=task,
            reason=f"a value of {what} is present on fewer than {k} rows",
            rule="cells",
        )


Segments = tuple[np.ndarray, np.ndarray]
"""Rows grouped by unit (patient): an order of the rows and where each unit starts in it."""


def unit_segments(units: np.ndarray) -> Segments:
    """The rows of each unit together (:data:`Segments`), for :func:`dominated`."""
    order = np.argsort(units, kind="stable")
    return order, np.flatnonzero(np.r_[True, np.diff(units[order]) != 0])


def dominated(values: np.ndarray, k: int, segments: Segments | None = None) -> np.ndarray:
    """The dominance rule, per row of ``values`` (``m x n``): do the ``k - 1`` units (rows,
    or the patients of ``segments``) deviating most from the row's median hold more than
    ``(k - 1)/k`` of its total absolute deviation (Hundepool et al. 2012, §4.2.2)?"""
    deviation = np.abs(values - np.median(values, axis=1, keepdims=True))
    if segments is not None:
        order, starts = segments
        deviation = np.add.reduceat(deviation[:, order], starts, axis=1)
    total = deviation.sum(axis=1)
    top_k = min(k - 1, deviation.shape[1])
    if top_k < 1:
        return np.zeros(len(values), dtype=bool)
    top = np.partition(deviation, deviation.shape[1] - top_k, axis=1)[:, -top_k:].sum(axis=1)
    return (total > 0) & (top > (k - 1) / k * total * (1 + 1e-12))
