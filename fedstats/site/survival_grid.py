"""Survival time grids fixed by the study, and exact survival requests refused whole.

The attack: Kaplan–Meier requests over grids the coordinator chooses per
request — ``[g, very large]`` for every ``g`` — give the number of deaths up to
every ``g``, and so every death time to the day, though each reply's cells
hold ``k`` or more patients; a withheld small group follows from the other
groups' counts.

So, for exact (not differentially private) releases on a time grid — the
``survival.counts`` task and the pooled Cox model's grid sums:

* **the grid is the study's.** The first grid a site answers about for an
  outcome ``(time, event)`` is pinned for the study (kept with the
  differencing guard, across runs); a later exact request must use that grid
  or a prefix of it (the same points, ending earlier: its counts are counts
  the pinned grid gives, so nothing can be differenced out of them). Any
  other grid is refused (:class:`~fedstats.errors.DisclosureError`, rule
  ``grid``). Private requests may use any grid: their noise protects them and
  the site charges for them.
* **a grouped request ends every group where the first must end**
  (:func:`fedstats.site.handlers.survival.grid_counts` with ``common_horizon``): a
  group whose next interval would hold fewer than ``k`` patients at risk, or
  1 to ``k - 1`` events, ends all the groups' curves there. A grouped request
  covers every row (its levels are the column's agreed levels), so an
  ungrouped curve minus the other groups gives back no cell of a group that
  was cut, and a group below ``k`` is released as zeros along with all the
  others (secondary suppression, Hundepool et al. 2012, §5.2).

A group with no patients at the site (a level agreed for the study but
absent here) releases zeros and ends no other group's curve.
"""

from __future__ import annotations

import numpy as np

from fedstats.errors import DisclosureError
from fedstats.site.task import SiteContext


def require_study_grid(
    ctx: SiteContext, time: str, event: str, grid: np.ndarray, *, task: str
) -> None:
    """Refuse an exact request whose grid is neither the study's grid nor a prefix of it.

    The study's grid is the approved protocol's ``time_grid`` for the outcome
    when it fixes one, else the first grid this site answered.
    """
    approved = None if ctx.protocol is None else ctx.protocol.survival_grid(time, event)
    pinned = approved if approved is not None else ctx.guard.study_grid(f"{time}|{event}", grid)
    if len(grid) <= len(pinned) and np.array_equal(grid, pinned[: len(grid)]):
        return
    raise DisclosureError(
        site=ctx.name,
        task=task,
        reason=(
            f"the study's time grid for Surv({time}, {event}) is fixed at the first grid this "
            f"site answered ({len(pinned)} points from {pinned[0]:g} to {pinned[-1]:g}); an "
            "exact request must use it or end it earlier, because counts on other grids could "
            "be differenced against it. Use the study's grid, or ask for a private release "
            "(any grid)"
        ),
        rule="grid",
    )
