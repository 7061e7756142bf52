"""Cross-cells: the outcome crossed with each two-valued column, level and stratum.

The rules of :mod:`fedstats.site.cell_rules` look at one column at a time: a
design column, the outcome, a stratum each hold 0 or at least ``k`` rows. That
is not enough. With a binary column ``x`` and a binary outcome ``y`` the exact
replies of a site give its whole 2x2 table: the first round's ``X'y`` entry of
``x`` is the count of the cell ``x = 1, y = 1``, and a site's own fit (the
per-site estimates of a heterogeneity or meta-analysis) inverts to all four
cells (Woolf's formulas: ``exp(b) `` is the cells' odds ratio and ``se^2`` the
sum of their reciprocals). A cell of one patient is that patient's outcome,
however large the column's and the outcome's margins.

So, before an exact release, with ``k = policy.k_cell``, the four cells of the
binary outcome (or the event indicator of a survival design) crossed with

* each design column that takes exactly two values (a 0/1 column, a level's
  dummy, an interaction of dummies, a computed indicator such as
  ``I(age > 60)``),
* each level of each categorical term, the reference level included (its cell
  is the outcome total minus the other levels' cells),
* each true/false value the formula computed on the way,
* each stratum,

hold 0 or at least ``k`` patients (rows, when the frame holds one row per
patient; the rows of one patient count once when its index repeats, as in
:mod:`fedstats.site.patient_rows`; with frequency weights, rows of positive
weight). This is the cross-classification rule of tabular disclosure control
(every cell of a released table at or above the threshold; Hundepool et al.,
*Statistical Disclosure Control*, 2012, §5.2), applied to the tables an exact
model fit implies.

It is a heuristic, like the rules it extends. It is pairwise: the outcome
crossed with the *intersection* of two columns (exposed *and* old) is a cell
no pairwise rule sees. A logistic or binomial fit of ``x1 + x2`` does not
release it (the outcome enters every reply only through ``X'y`` and
``y'X beta``), and a design that names the interaction as a column is
checked; but a column that takes more than two values is not a cell here,
and a computed one can encode a cell in its ``X'y`` entry: with ``a`` in the
design, ``I(a + 2 * b * (1 - a))`` (values 0, 1, 2) gives the count of
diseased patients with ``b`` and not ``a``, and adding a small multiple of a
continuous column spreads it over many values. Sums over the risk sets of a
Cox or Fine–Gray fit carry more than the cells. Only an approved protocol
(the formula fixed in advance) or differential privacy bounds what exact
aggregates of coordinator-chosen columns reveal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedstats.errors import DisclosureError
from fedstats.site.disclosure import DisclosurePolicy

Mask = tuple[str, np.ndarray]
"""What a true/false value is (for the refusal's text), and its values over the rows."""


def two_valued_columns(names: Sequence[str], X: np.ndarray | Sequence[np.ndarray]) -> list[Mask]:
    """The columns of ``X`` (a matrix, or its columns) that take exactly two values, each as
    the mask of its larger one."""
    masks: list[Mask] = []
    for j, name in enumerate(names):
        column = X[:, j] if isinstance(X, np.ndarray) else X[j]
        if column.size == 0 or np.unique(column[:64]).size > 2:  # three values: not two
            continue
        low, high = column.min(), column.max()
        if low != high and bool(((column == low) | (column == high)).all()):
            masks.append((f"the design column {name!r}", column == high))
    return masks


def level_masks(what: str, codes: np.ndarray, labels: Sequence[object]) -> list[Mask]:
    """One mask per agreed level of a categorical term (``codes`` index ``labels``)."""
    return [(f"level {label!r} of {what}", codes == i) for i, label in enumerate(labels)]


def small_cells(outcome: np.ndarray, mask: np.ndarray, unit: np.ndarray | None, k: int) -> bool:
    """Whether a cell of ``mask`` x ``outcome`` holds 1 to ``k - 1`` units (rows, or the
    patients ``unit`` names: a patient is in a cell when one of their rows is)."""
    cell = 2 * mask.astype(np.int64) + outcome.astype(np.int64)
    if unit is not None:
        cell = np.unique(unit.astype(np.int64) * 4 + cell) % 4
    counts = np.bincount(cell, minlength=4)
    return bool(((counts > 0) & (counts < k)).any())


def check_cross_cells(
    policy: DisclosurePolicy,
    *,
    site: str,
    task: str | None,
    outcome: Mask,
    crossed: Sequence[Mask],
    patients: np.ndarray | None = None,
    counted: np.ndarray | None = None,
) -> None:
    """Refuse when a cell of ``outcome`` x any of ``crossed`` holds 1 to ``k_cell - 1`` units.

    ``patients`` (one code per row) makes the unit a patient; ``counted`` keeps only those
    rows (the rows of positive frequency weight). The refusal names the rule
    (``cross-cells``) and what was crossed, never the count it found.
    """
    name, y = outcome
    y = np.asarray(y) == 1
    keep = None if counted is None else np.asarray(counted, bool)
    if keep is not None:
        y = y[keep]
        patients = None if patients is None else patients[keep]
    k = policy.k_cell
    for what, mask in crossed:
        mask = np.asarray(mask, bool) if keep is None else np.asarray(mask, bool)[keep]
        if small_cells(y, mask, patients, k):
            unit = "patients" if patients is None else "patients (their rows count once)"
            raise DisclosureError(
                site=site,
                task=task,
                reason=(
                    f"{name} crossed with {what} has a cell of fewer than {k} {unit}: "
                    "an exact fit gives every cell of that table"
                ),
                rule="cross-cells",
            )
