"""Disclosure rules counted in patients when a site's frame holds several rows per patient.

A ``Surv(start, stop, event)`` frame holds one row per interval of follow-up:
a patient with time-varying covariates has several rows, and the frame's
index names each row's patient. The small-cell rules of
:mod:`fedstats.site.cell_rules` and the differencing guard count *rows*, so
``k`` rows of one patient would pass for ``k`` patients: a 0/1 column true on
the three intervals of one patient is that patient's indicator. So, when the
index repeats, every rule is applied again with patients as the unit of
privacy:

* **threshold** — the design covers at least ``min_count`` patients;
* **cells** — every indicator (each row set the exact checks register, and the
  event indicator) holds on the rows of 0 or at least ``k`` patients and fails
  on the rows of 0 or at least ``k`` patients;
* **mode and dominance** — no design column differs from its most common value
  on the rows of 1 to ``k - 1`` patients, and no ``k - 1`` patients hold more
  than ``(k - 1)/k`` of its total absolute deviation from its median;
* **differencing** — each row set, as the set of patients with a row in it, goes
  to a differencing guard over patients, kept in the same record as the site's
  guard over rows (:meth:`~fedstats.site.differencing.DifferencingGuard.companion`),
  so it outlives a restart as that one does.

And for every ``Surv(start, stop, event)`` design (index repeating or not), the
rows that enter late (``start > 0``) form a row set of the guard: two requests
that differ only in a few patients' delayed entries are refused like any two
row sets that differ on a few rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from fedstats.errors import DisclosureError
from fedstats.site.cell_rules import dominated, unit_segments
from fedstats.site.differencing import DifferencingGuard, mode_mask
from fedstats.site.task import SiteContext

RowSets = list[tuple[str, np.ndarray]]


def patients_of(frame: pd.DataFrame) -> np.ndarray | None:
    """One code per frame row naming its patient (the index), or ``None`` if the index is
    unique (one row per patient)."""
    if not frame.index.has_duplicates:
        return None
    return pd.factorize(frame.index)[0]


def count_patients(ctx: SiteContext, rows: np.ndarray | None, n_rows: int) -> int:
    """How many distinct patients the frame rows ``rows`` belong to."""
    patients = patients_of(ctx.frame)
    if patients is None:
        return n_rows
    return len(np.unique(patients if rows is None else patients[rows]))


def patient_release_sets(
    ctx: SiteContext,
    *,
    rows: np.ndarray,
    entry: np.ndarray | None,
    entry_name: str | None,
    event: tuple[str, np.ndarray],
    columns: list[tuple[str, np.ndarray]],
    sets: RowSets,
    over_frame: Callable[[np.ndarray], np.ndarray],
) -> RowSets:
    """Apply the patient-level rules (module docstring) before an exact release.

    ``rows`` are the frame positions of the design's rows; ``entry``, ``event``
    (what it is, its 0/1 values) and ``columns`` (name, values) are over the
    design's rows; ``sets`` are the
    row sets (frame masks) the row-level guard is about to check. Returns the
    extra row sets for that guard (the late entries). Raises
    :class:`~fedstats.errors.DisclosureError`.
    """
    extra: RowSets = []
    if entry is not None:
        extra.append((f"rows entering after 0 ({entry_name})", over_frame(entry > 0)))
    patients = patients_of(ctx.frame)
    if patients is None:
        return extra
    policy, site, k = ctx.policy, ctx.name, ctx.policy.k_cell
    mine = patients[rows]
    n_patients = len(np.unique(mine))
    if n_patients < policy.min_count:
        raise DisclosureError(
            site=site,
            task=None,
            reason=(
                f"the design's rows belong to fewer patients than the disclosure threshold of "
                f"{policy.min_count} (the frame's index names each row's patient)"
            ),
            rule="threshold",
        )
    in_design = np.zeros(len(patients), dtype=bool)
    in_design[rows] = True
    masks = [*sets, *extra, (event[0], over_frame(event[1].astype(bool)))]
    for label, mask in masks:
        holds = len(np.unique(patients[mask & in_design]))
        fails = len(np.unique(patients[~mask & in_design]))
        if 0 < holds < k or 0 < fails < k:
            raise DisclosureError(
                site=site,
                task=None,
                reason=(
                    f"{label!r} would single out fewer than {k} patients (their rows count "
                    "once per patient)"
                ),
                rule="cells",
            )
    for name, values in columns:
        problem = _column_problem(values, mine, k)
        if problem is not None:
            raise DisclosureError(
                site=site, task=None, reason=f"design column {name!r} {problem}", rule="cells"
            )
    guard: DifferencingGuard | None = ctx.cache.get("patient guard")
    if guard is None:
        guard = ctx.guard.companion("patients", int(patients.max()) + 1)
        ctx.cache["patient guard"] = guard
    guard.check_row_sets(
        site,
        None,
        [
            (f"{label} (patients)", np.bincount(patients[mask], minlength=guard.n) > 0)
            for label, mask in [*sets, *extra]
        ],
    )
    return extra


def _column_problem(values: np.ndarray, patient: np.ndarray, k: int) -> str | None:
    """The mode and dominance rules of :func:`fedstats.site.cell_rules.column_problem`, with the
    rows of one patient counted together."""
    differs = mode_mask(values)
    odd = len(np.unique(patient[differs]))
    if 0 < odd < k:
        return f"differs from its most common value on the rows of fewer than {k} patients"
    if k > 1 and odd >= k and dominated(values[None, :], k, unit_segments(patient))[0]:
        return (
            f"has fewer than {k} patients holding most of its variation "
            "(a column dominated by a few patients reproduces them)"
        )
    return None
