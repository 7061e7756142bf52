"""Where each site's survival counts stop, and which pooled values are pooled estimates.

Each site ends each group's counts at its *safe horizon*
(:func:`fedstats.site.handlers.survival.grid_counts`): from the next grid
point on it releases zeros, and its patients still followed are censored
there. Summing over sites, a grid point beyond one site's horizon holds the
other sites' counts only, and the Kaplan–Meier product through it,
``prod_j (1 - d_j / n_j)``, is no longer the pooled estimate: the left-out
site's deaths and patients are missing from every later factor (and as the
horizon is decided by the next interval's counts, the sites that drop out are
those about to have a few deaths, Andersen, Borgan, Gill & Keiding, 1993,
IV.3). So a pooled value is *released* at grid point ``g_j`` of group ``c``
only if every site's counts for ``c`` reach ``g_j``; elsewhere it is "not
released" (NaN, with the sites and horizons that stop it).

**The reach of a site's counts**, per group: the last grid index ``h`` at
which the site released a positive number at risk, when the site reports
patients censored at a horizon (``truncated > 0``); the grid's last index
when it reports none (its counts are then complete, even where they fall to
0 because its patients' follow-up ends). ``-1``: the counts stop before the
first grid point.

**Why stating it releases nothing new.** The reach is computed by the
coordinator from what every site already released, its numbers at risk and
its truncation count; it is a function of them (post-processing), so it
cannot tell a coordinator anything those did not. In particular it carries no
per-point flag: nothing says *why* the counts after ``h`` are zeros (1 to
``k - 1`` events in the next interval, fewer than ``k`` patients at risk, or a
deferred death never released), so a site whose cut interval holds 1 death
and one whose cut interval holds ``k - 1`` (with as many patients leaving it)
give the same replies and the same reach, on every grid a site answers (the
study's grid or a prefix of it, :mod:`fedstats.site.survival_grid`), grouped
or not, deferred or not (``tests/security/test_survival_horizons.py``).

A conservative consequence: a site that censored patients in one group
cannot be told, from its counts, to have a level absent rather than cut
before the first point; that group's pooled curve is then not released.

Under secure aggregation the coordinator sees only the sums, so it cannot
say where each site's counts stop: when the summed truncation count is 0
every value is released, otherwise none is (the sums past the first horizon
are not the pooled counts, and which point that is stays hidden).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SECURE = "all sites"
"""The one "site" of counts summed by secure aggregation."""


def site_reach(at_risk: np.ndarray, truncated: int) -> np.ndarray:
    """Per row (group) of one site's released numbers at risk, the last grid index its counts
    reach (see the module docstring): the grid's last index when ``truncated`` is 0, else
    the last index with a positive number at risk, ``-1`` if none."""
    at_risk = np.atleast_2d(np.asarray(at_risk, dtype=np.float64))
    points = at_risk.shape[1]
    if truncated == 0:
        return np.full(len(at_risk), points - 1, dtype=np.int64)
    positive = at_risk > 0
    last = points - 1 - np.argmax(positive[:, ::-1], axis=1)
    return np.where(positive.any(axis=1), last, -1).astype(np.int64)


def released_points(reach: Mapping[str, np.ndarray] | None, shape: tuple[int, int]) -> np.ndarray:
    """``cells x grid`` booleans: where every site's counts reach the point (``reach`` None:
    unknown, nothing released)."""
    if reach is None:
        return np.zeros(shape, dtype=bool)
    released = np.ones(shape, dtype=bool)
    index = np.arange(shape[1])
    for cells in reach.values():
        released &= index[None, :] <= np.asarray(cells)[:, None]
    return released


def horizon_times(
    reach: Mapping[str, np.ndarray], grid: np.ndarray, labels: Sequence[Any]
) -> dict[str, dict[Any, float | None]]:
    """Per site and group, the last grid time its counts reach (``None``: before the first)."""
    return {
        site: {
            label: (None if h < 0 else float(grid[h]))
            for label, h in zip(labels, cells, strict=True)
        }
        for site, cells in reach.items()
    }


def cut_short(
    reach: Mapping[str, np.ndarray], grid: np.ndarray, labels: Sequence[str]
) -> dict[str, tuple[float, list[tuple[str, float | None]]]]:
    """Per group whose pooled curve is not released to the grid's end: the first grid time
    not released, and each site whose counts stop before it with its horizon (``None``:
    before the first grid time)."""
    times = horizon_times(reach, grid, labels)
    released = released_points(reach, (len(labels), len(grid)))
    out = {}
    for row, label in enumerate(labels):
        if released[row].all():
            continue
        first = float(grid[int(np.argmin(released[row]))])
        out[label] = (
            first,
            [
                (site, groups[label])
                for site, groups in times.items()
                if groups[label] is None or groups[label] < first
            ],
        )
    return out


def describe_stops(stops: Sequence[tuple[str, float | None]], grid: np.ndarray) -> str:
    """``"region_0 before the first grid time (365), region_5 at 365"``."""
    return ", ".join(
        f"{site} before the first grid time ({grid[0]:g})" if h is None else f"{site} at {h:g}"
        for site, h in stops
    )


def cut_short_warnings(
    reach: Mapping[str, np.ndarray] | None,
    grid: np.ndarray,
    labels: Sequence[str],
    *,
    truncated: int = 0,
) -> list[str]:
    """One warning per group whose pooled curve is not released to the grid's end, naming
    the first time not released and each site whose counts stop earlier, with where."""
    if reach is None:
        return [
            f"no pooled value of the survival curve is released: {truncated:,} patients were "
            "censored at their site's safe horizon and secure aggregation hides where each "
            "site's counts stop, so no summed count can be told to be the pooled one; fit "
            "without secure aggregation (the sites' horizons then show) or use a coarser grid"
        ]
    return [
        f"the pooled survival curve of group {label} is not released from time {first:g}: "
        "these sites' counts stop earlier, at their safe horizon (a later count would stand "
        f"for fewer than k patients): {describe_stops(stops, grid)}; a value past a site's "
        "horizon would leave that site's patients out, so it is not a pooled estimate. Use a "
        "coarser grid (or sparse_events='defer', if the sites do not defer already)"
        for label, (first, stops) in cut_short(reach, grid, labels).items()
    ]
