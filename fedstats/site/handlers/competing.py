"""Site side of competing risks: status codes, the safe horizon, and cause-specific counts.

Competing-risks data are ``Surv(time, status)``: ``status`` is 0 for a
censored follow-up and 1, 2, ... for the cause that ended it. For the
Aalen–Johansen estimator (:mod:`fedstats.models.cumulative_incidence`) a site
returns, per group and grid point ``g_k`` (times coarsened up to the next
point, as for Kaplan–Meier: :mod:`fedstats.site.handlers.survival`), the number
at risk ``n_k``, the events of the cause asked for ``d_k`` and the events of
any other cause ``c_k``.

Disclosure control, with ``k`` the site's ``min_count``:

* every status code at the site is a cell: it covers 0 or at least
  ``k_cell`` patients (:func:`fedstats.site.cell_rules.check_groups`), and the
  rows of each code go to the differencing guard;
* **every code's events are cells at every grid point**, not only the codes
  a request releases. Each group's counts end at its *horizon*, the last grid
  point up to which at least ``k`` patients are at risk and the events of each
  cause and the censorings in every interval are 0 or at least ``k``
  (:func:`horizon`). Because the horizon does not depend on the cause asked
  for, a request for cause 1 (releasing ``d_1`` and ``d_2 + d_3``) and one for
  cause 2 (``d_2`` and ``d_1 + d_3``) give by difference only ``d_3``, itself a
  cell of 0 or at least ``k`` patients: differencing across causes yields no
  small cell. The censorings at the horizon, where the patients followed
  longer are censored, are such a cell too;
* the grid is the study's grid for ``Surv(time, status)``
  (:func:`fedstats.site.survival_grid.require_study_grid`), so no second grid
  can be differenced against the first;
* a grouped request ends every group where the first must end (secondary
  suppression, as for Kaplan–Meier).

Censoring everyone still at risk at a horizon fixed by the past of the
counting process leaves the Aalen–Johansen estimate up to it unbiased
(Andersen, Borgan, Gill & Keiding, 1993, IV.4).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.tasks.competing import TASK, _arguments, checked_cause
from fedstats.errors import (
    MissingColumnError,
    MissingValuesError,
    StatusCodeError,
)
from fedstats.site.cell_rules import check_groups
from fedstats.site.column_values import as_numbers, follow_up_times
from fedstats.site.handlers.design import as_agreed_categorical
from fedstats.site.handlers.survival import protected_count
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import SiteContext, TaskReply


def status_codes(site: str, column: str, values: pd.Series) -> np.ndarray:
    """The status column as float64 codes, NaN where missing.

    Raises :class:`~fedstats.errors.StatusCodeError` naming the site, the column
    and how many present values are not non-negative integers.
    """
    codes = as_numbers(values)
    present = values.notna().to_numpy()
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(codes) & (codes >= 0) & (codes == np.floor(codes))
    bad = int((present & ~valid).sum())
    if bad:
        raise StatusCodeError(site=site, column=column, count=bad)
    return codes


def check_status_cells(
    ctx: SiteContext, *, task: str, column: str, codes: np.ndarray, rows: np.ndarray
) -> None:
    """Every status code covers 0 or at least ``k_cell`` rows; each code's rows (positions
    ``rows`` of the frame) go to the differencing guard."""
    check_groups(ctx.policy, site=ctx.name, task=task, what=f"the status {column!r}", codes=codes)
    sets = []
    for code in np.unique(codes):
        mask = np.zeros(len(ctx.frame), dtype=bool)
        mask[rows[codes == code]] = True
        sets.append((f"{column} = {int(code)}", mask))
    ctx.guard.check_row_sets(ctx.name, task, sets)


def leaving_cells(
    point: np.ndarray, codes: np.ndarray, n_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(risk, cells)``: the number at risk at each grid point (``#{point >= j}``) and, one
    row per code present (censorings first, then each cause), how many leave at each point."""
    risk = np.cumsum(np.bincount(point, minlength=n_points)[::-1])[::-1].astype(np.float64)
    present = np.unique(np.append(codes, 0.0))
    cells = np.stack(
        [np.bincount(point[codes == c], minlength=n_points).astype(np.float64) for c in present]
    )
    return risk, cells


def horizon_ok(risk: np.ndarray, cells: np.ndarray, k: int) -> np.ndarray:
    """For each grid index ``h``, whether the counts may end there.

    True when, at every point up to ``h``, at least ``k`` patients are at risk
    (or none: nothing follows) and every cell (``cells[0]`` the censorings,
    the other rows each cause's events) is 0 or at least ``k``; and the
    censorings at ``h`` once everyone followed longer is censored there
    (``cells[0][h] + risk[h + 1]``) are 0 or at least ``k``.
    """
    small = lambda counts: (counts > 0) & (counts < k)  # noqa: E731
    point_ok = ((risk >= k) | (risk == 0)) & ~small(cells).any(axis=0)
    prefix_ok = np.cumprod(point_ok).astype(bool)
    after = np.append(risk[1:], 0.0)
    return prefix_ok & ~small(cells[0] + after)


def last_ok(ok: np.ndarray) -> int:
    """The last index where ``ok`` holds, -1 if none."""
    where = np.flatnonzero(ok)
    return int(where[-1]) if len(where) else -1


def counts(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """At-risk, cause and competing-cause counts per group and grid point (module docstring)."""
    grid, time_name, status_name, group_name, levels = _arguments(args)
    cause = checked_cause(args)
    require_study_grid(ctx, time_name, status_name, grid, task=TASK)
    frame = ctx.frame
    needed = [time_name, status_name] + ([group_name] if group_name else [])
    for column in needed:
        if column not in frame.columns:
            raise MissingColumnError(site=ctx.name, column=column)
    missing = frame[needed].isna().sum()
    if missing.any():
        column = str(missing[missing > 0].index[0])
        raise MissingValuesError(site=ctx.name, column=column, count=int(missing[column]))
    time = follow_up_times(ctx.name, time_name, frame[time_name])
    codes = status_codes(ctx.name, status_name, frame[status_name])
    check_status_cells(ctx, task=TASK, column=status_name, codes=codes, rows=np.arange(len(codes)))
    if group_name:
        agreed = as_agreed_categorical(ctx.name, group_name, frame[group_name], tuple(levels))
        group = np.asarray(agreed.codes, dtype=np.int64)
    else:
        group = np.zeros(len(time), dtype=np.int64)
    point, codes = coarsened(time, codes, grid)
    n_groups, k = max(len(levels), 1), ctx.policy.min_count
    ok = np.ones(len(grid), dtype=bool)
    for g in range(n_groups):
        mine = group == g
        if mine.any():
            ok &= horizon_ok(*leaving_cells(point[mine], codes[mine], len(grid)), k)
    horizon = last_ok(ok)
    late = point > horizon
    shape = (n_groups, len(grid))
    at_risk, events, competing = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    if horizon >= 0:
        point = np.minimum(point, horizon)
        codes = np.where(late, 0.0, codes)
        for g in range(n_groups):
            mine = group == g
            starts = np.bincount(point[mine], minlength=len(grid))
            at_risk[g] = np.cumsum(starts[::-1])[::-1]
            events[g] = np.bincount(point[mine & (codes == cause)], minlength=len(grid))
            other = mine & (codes > 0) & (codes != cause)
            competing[g] = np.bincount(point[other], minlength=len(grid))
    truncated = int(late.sum()) if horizon >= 0 else len(time)
    return TaskReply(
        {
            "at_risk": at_risk,
            "events": events,
            "competing": competing,
            "truncated": protected_count(truncated, k),
            "n_obs": len(time),
        },
        contributors=len(time),
    )


def coarsened(
    time: np.ndarray, codes: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each time's grid index ``min{k : g_k >= t}`` and its status code; a time after the last
    grid point sits there, censored (code 0)."""
    point = np.searchsorted(grid, time, side="left")
    beyond = point >= len(grid)
    return np.minimum(point, len(grid) - 1), np.where(beyond, 0.0, codes)
