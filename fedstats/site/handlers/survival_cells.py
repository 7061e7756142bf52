"""Site side of a survival-counts request: its arguments, and the cells its rows fall in.

A ``survival.counts`` request may split the counts by a ``group`` column
(agreed ``levels``), by ``strata`` columns (their agreed ``strata_levels``;
a stratified log-rank test sums over strata, Mantel & Haenszel 1959), and may
weight each row by a column of frequency weights (``weights``). The counts
come per *cell*: stratum (the crossing of the strata columns' levels, in
row-major order) times group, ``cell = stratum * n_groups + group``.

The attacks these arguments open, and what refuses them before any count
leaves the site (exact releases only: a private release's noise protects it
and weights are refused under privacy):

* **a stratum of a few patients** (an identifier or a crafted column as a
  stratum): a stratum present on 1 to ``k - 1`` rows is refused
  (:func:`fedstats.site.cell_rules.check_groups`); a larger stratum whose
  curve must end early ends every cell's curve there (the common horizon of
  :func:`fedstats.site.handlers.survival.grid_counts`);
* **differencing** a stratified or grouped request against another one
  (two strata or group columns that differ on one patient give that
  patient's event time by subtraction; a stratified against an unstratified
  request gives nothing more than each releases, by the common horizon): every
  stratum's and group's rows, and the rows of positive weight, go to the
  differencing guard (:mod:`fedstats.site.differencing`);
* **weights that select or single out rows** (0/1 weights keeping a few rows;
  one row weighing as much as all others): the rows of positive weight pass
  the small-cell rule and no row carries more than ``1/k`` of the total
  weight (:func:`fedstats.site.weights.check_weight_dominance`); the weights
  column passes the mode and dominance rules of a design column
  (:func:`fedstats.site.cell_rules.column_problem`: weights of 1 but on one
  row are refused); and each released weighted count must stand for at least
  ``k`` rows of positive weight, none of which carries more than ``1/k`` of it
  (:func:`fedstats.site.handlers.survival.grid_counts`).

These are heuristics, like the rules they extend. What they do not see: two
weights columns with the same rows of positive weight whose values differ on
one row (weighted counts of the one minus the other give that row's at-risk
indicator and event, scaled); weighted minus unweighted counts, which are the
counts of the rows whose weight is not 1 (at least ``k_cell`` of them, by the
mode rule, but possibly fewer than ``k``). An approved protocol naming the
analysis's ``weights`` column is the guarantee (:mod:`fedstats.site.protocol`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedstats.contract.tasks.survival import CountsRequest, _malformed
from fedstats.errors import DisclosureError
from fedstats.site.cell_rules import check_groups, column_problem
from fedstats.site.handlers.design import as_agreed_categorical
from fedstats.site.task import SiteContext
from fedstats.site.weights import check_weight_dominance


def group_codes(ctx: SiteContext, request: CountsRequest, data: pd.DataFrame) -> np.ndarray:
    """Each row's group index (0 when the request is not grouped)."""
    if request.group is None:
        return np.zeros(len(data), dtype=np.int64)
    agreed = as_agreed_categorical(
        ctx.name, request.group, data[request.group], tuple(request.levels)
    )
    return np.asarray(agreed.codes, dtype=np.int64)


def stratum_codes(ctx: SiteContext, request: CountsRequest, data: pd.DataFrame) -> np.ndarray:
    """Each row's stratum index, the strata columns' level indices in row-major order."""
    if not request.strata:
        return np.zeros(len(data), dtype=np.int64)
    codes = [
        np.asarray(
            as_agreed_categorical(ctx.name, column, data[column], tuple(levels)).codes,
            dtype=np.int64,
        )
        for column, levels in zip(request.strata, request.strata_levels, strict=True)
    ]
    shape = tuple(len(levels) for levels in request.strata_levels)
    return np.ravel_multi_index(tuple(codes), shape).astype(np.int64)


def check_exact_cells(
    ctx: SiteContext,
    request: CountsRequest,
    *,
    task: str,
    groups: np.ndarray,
    strata: np.ndarray,
    weights: np.ndarray | None,
) -> None:
    """Refuse strata, groups and weights that single out patients (see the module docstring);
    then record their row sets with the differencing guard."""
    policy = ctx.policy
    if request.strata:
        check_groups(
            policy, site=ctx.name, task=task, what=f"the strata {list(request.strata)}",
            codes=strata,
        )  # fmt: skip
    row_sets: list[tuple[str, np.ndarray]] = []
    if weights is not None:
        check_weight_dominance(
            policy, site=ctx.name, task=task, column=str(request.weights), weights=weights
        )
        problem = column_problem(weights, policy.k_cell)
        if problem is not None:
            raise DisclosureError(
                site=ctx.name,
                task=task,
                reason=f"the weights column {request.weights!r} {problem}",
                rule="cells",
            )
        row_sets.append((f"{request.weights} > 0", weights > 0))
    for name, codes in ((request.group, groups), (" x ".join(request.strata), strata)):
        if name:
            row_sets += [(f"{name} = level {int(c)}", codes == c) for c in np.unique(codes)]
    if ctx.guard is not None:
        ctx.guard.check_row_sets(ctx.name, task, row_sets)


def refuse_private_weights(request: CountsRequest) -> None:
    """Frequency weights under privacy are refused: one row would move a count by its weight,
    a sensitivity no noise calibrated to one patient covers."""
    if request.weights is not None:
        raise _malformed(
            f"frequency weights ({request.weights!r}) are not released under differential "
            "privacy: a row moves each count by its weight, which the noise for one patient "
            "does not cover; ask for unweighted private counts, or exact weighted ones"
        )
