"""Frequency weights: reading a weights column and the rules a weighted release obeys.

A frequency weight ``w_i`` says row ``i`` stands for ``w_i`` identical
patients (a grouped table, a de-duplicated extract): every sum a site
releases becomes ``sum_i w_i f(x_i, y_i)``, so a weighted fit equals the
unweighted fit on the rows repeated ``w_i`` times (statsmodels'
``freq_weights``; lifelines' ``weights_col``; R's ``weights=``).

The attack a weights column opens: the coordinator names the column, so it
can pick one that (a) is 0 on all but a few rows — a 0/1 weight selects a
subset of rows exactly as an indicator term would — or (b) gives one row a
weight that dwarfs the others, so the weighted sums are that row's values up
to a small remainder. Hence, before any exact weighted release:

* the rows with positive weight form an indicator under the small-cell rule
  (:func:`fedstats.site.cell_rules.check_indicator`) and a row set for the
  differencing guard (:func:`fedstats.site.handlers.design.check_exact_release`);
* **dominance** (:func:`check_weight_dominance`): no row carries more than
  ``1 / k`` of the total weight (``k`` the site's cell threshold), the largest
  share any row has in an unweighted sum over ``k`` rows — the (n, k)
  dominance rule with ``n = 1`` (Hundepool et al., *Statistical Disclosure
  Control*, Wiley 2012, §4.2.2);
* **mode and dominance of a column** (:func:`fedstats.site.cell_rules.column_problem`):
  the weights differ from their most common value on 0 or at least ``k`` rows,
  and no ``k - 1`` rows hold most of their deviation from the median. Weights
  of 1 but 2 on one row, against the unweighted answer (weights all 1), give
  that row's terms by subtraction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedstats.errors import DisclosureError, InconsistentColumnError
from fedstats.site.cell_rules import check_columns, check_indicator
from fedstats.site.column_values import as_numbers
from fedstats.site.disclosure import DisclosurePolicy


def frequency_weights(site: str, values: pd.Series, column: str) -> np.ndarray:
    """The weights column as float64; every value must be a finite number ``>= 0``.

    Raises :class:`~fedstats.errors.InconsistentColumnError` naming the site,
    the column and how many rows are not valid weights.
    """
    weights = as_numbers(values)
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        raise InconsistentColumnError(
            site=site,
            column=column,
            reason=(
                f"has {int(bad.sum())} rows whose weight is not a finite number >= 0; frequency "
                "weights count the patients each row stands for: fix or drop those rows"
            ),
        )
    if not (weights > 0).any():
        raise InconsistentColumnError(
            site=site, column=column, reason="is 0 on every row, so the site has nothing to add"
        )
    return weights


def check_weight_dominance(
    policy: DisclosurePolicy,
    *,
    site: str,
    task: str | None,
    column: str,
    weights: np.ndarray,
) -> None:
    """Refuse weights that single out rows: too few weighted rows, or one row dominating.

    With ``k = policy.k_cell``: the rows of positive weight must pass the
    small-cell rule (0 or at least ``k`` rows hold it, and fail it), the weights
    the mode and dominance rules of a design column, and no row may carry more
    than ``1/k`` of the total weight.
    """
    k = policy.k_cell
    check_indicator(policy, site=site, task=task, term=f"{column} > 0", mask=weights > 0)
    total = float(weights.sum())
    if weights.size and float(weights.max()) * k > total * (1 + 1e-12):
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"one row carries {float(weights.max()) / total:.0%} of the total weight of "
                f"{column!r}; a weighted sum may be no more dominated by one row than an "
                f"unweighted sum over {k} rows (at most {1 / k:.0%})"
            ),
            rule="cells",
        )
    check_columns(policy, site=site, task=task, names=[column], X=weights[:, None])
