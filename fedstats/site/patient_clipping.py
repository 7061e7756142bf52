"""One patient's total contribution to a private release, when a patient may have several rows.

The Gaussian mechanism protects the unit whose removal its sensitivity
bounds (Dwork & Roth 2014, Def. 2.4 and Thm A.1). A site's ledger charges
per *patient*, so every private release must bound what removing one patient
does to it. When the frame's index repeats (a patient of ``m`` rows:
intervals of follow-up, repeated visits; :func:`~fedstats.site.patient_rows.patients_of`),
a bound that holds for one row holds for the patient only ``m`` times over.
Two remedies, as for user-level privacy (McMahan et al., ICLR 2018: clip each
user's summed update, not each example's):

* **clip per patient** — sum the contributions of each patient's rows, then
  scale the sum down to the bound the task charges: ``g_i = sum_{r in i} g_r``,
  released ``sum_i g_i min(1, C / ||g_i||)``. A patient of one row is clipped
  exactly as before, so one-row-per-patient frames release the same numbers.
  For a sum of outer products ``H_i = sum_r w_r x_r x_r'`` the Frobenius norm
  needs no ``p x p`` matrix per patient:
  ``||H_i||_F^2 = sum_{r, s in i} w_r w_s (x_r' x_s)^2`` over the pairs of the
  patient's rows (:func:`within_patient_pairs`; a patient of more than ``p``
  rows gets its matrix instead, :func:`crowded_patients`, so memory stays
  ``O(n p)``);
* **refuse** (:func:`refuse_several_rows`) — for a mechanism that clips rows
  itself (DP-SGD's per-example gradients) or a release with no simple
  per-patient bound. The refusal depends only on the frame's layout (whether
  its index repeats), public metadata of the site, never on a patient's values,
  and is raised by the handler before the silo charges anything.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedstats.errors import DisclosureError
from fedstats.site.patient_rows import patients_of
from fedstats.site.task import SiteContext


def design_patients(ctx: SiteContext, rows: np.ndarray | None) -> np.ndarray | None:
    """Patient codes ``0..P-1`` of the frame rows ``rows`` (all rows when ``None``), or ``None``
    when the frame holds one row per patient (nothing to sum)."""
    patients = patients_of(ctx.frame)
    if patients is None:
        return None
    return pd.factorize(patients if rows is None else patients[rows])[0]


def patient_sums(patients: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each patient's rows of ``values`` summed: ``P x ...`` for ``n x ...`` values."""
    total = np.zeros((int(patients.max(initial=-1)) + 1, *values.shape[1:]))
    np.add.at(total, patients, values)
    return total


def clip_factors(norms: np.ndarray, bound: float) -> np.ndarray:
    """``min(1, bound / ||.||)`` for each norm: the factor that scales a contribution down to
    norm ``bound`` and leaves one within it unchanged (Abadi et al., CCS 2016)."""
    return np.minimum(1.0, bound / np.maximum(norms, 1e-300))


def patient_clip_factors(
    patients: np.ndarray, contributions: np.ndarray, bound: float
) -> np.ndarray:
    """Per row, the clip factor of its patient's summed ``contributions`` (``n x d``): releasing
    ``sum_r factor_r contributions_r`` moves by at most ``bound`` without any one patient."""
    sums = patient_sums(patients, contributions)
    return clip_factors(np.linalg.norm(sums, axis=1), bound)[patients]


def within_patient_pairs(
    patients: np.ndarray, max_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair ``(r, s)`` of rows of one patient, ``r == s`` included, and its
    patient: ``sum_i m_i^2`` pairs for patients of ``m_i`` rows. With ``max_rows``, only the
    patients of at most that many rows (so at most ``max_rows`` pairs per row)."""
    sizes = np.bincount(patients)
    if max_rows is not None:
        kept = sizes[patients] <= max_rows
        rows = np.flatnonzero(kept)
        first, second, owner = within_patient_pairs(patients[kept])
        return rows[first], rows[second], owner
    order = np.argsort(patients, kind="stable")
    sorted_patients = patients[order]
    starts = np.cumsum(sizes) - sizes
    repeat = sizes[sorted_patients]
    first = np.repeat(order, repeat)
    offsets = np.arange(int(repeat.sum())) - np.repeat(np.cumsum(repeat) - repeat, repeat)
    second = order[np.repeat(starts[sorted_patients], repeat) + offsets]
    return first, second, np.repeat(sorted_patients, repeat)


def crowded_patients(patients: np.ndarray, max_rows: int) -> list[tuple[int, np.ndarray]]:
    """Each patient of more than ``max_rows`` rows, with its rows: for them a per-patient matrix
    (``O(m_i p^2)``) is cheaper than the ``m_i^2`` pairs of its rows."""
    sizes = np.bincount(patients)
    order = np.argsort(patients, kind="stable")
    ends = np.cumsum(sizes)
    return [(int(i), order[ends[i] - sizes[i] : ends[i]]) for i in np.flatnonzero(sizes > max_rows)]


def gram_frobenius(patients: np.ndarray, X: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``||sum_{r in i} w_r x_r x_r'||_F`` for each patient ``i``: from the pairs of its rows,
    ``sum_{r,s} w_r w_s (x_r' x_s)^2``, or from the ``p x p`` matrix for a patient of more than
    ``p`` rows (memory ``O(n p)`` either way)."""
    p = X.shape[1]
    first, second, owner = within_patient_pairs(patients, max_rows=p)
    dots = np.einsum("ij,ij->i", X[first], X[second])
    terms = weights[first] * weights[second] * dots**2
    squares = np.bincount(owner, weights=terms, minlength=int(patients.max()) + 1).astype(float)
    for i, rows in crowded_patients(patients, p):
        squares[i] = np.sum(((X[rows] * weights[rows, None]).T @ X[rows]) ** 2)
    return np.sqrt(np.maximum(squares, 0.0))


def refuse_several_rows(ctx: SiteContext, task: str, why: str) -> None:
    """Refuse a private release on a frame with several rows per patient, saying ``why`` the
    task cannot bound a patient's rows together; nothing when each patient has one row.

    Raises :class:`~fedstats.errors.DisclosureError` (rule ``privacy-required``).
    """
    if patients_of(ctx.frame) is None:
        return
    raise DisclosureError(
        site=ctx.name,
        task=task,
        reason=(
            "the site's frame holds several rows per patient (its index names each row's "
            f"patient), and {why}, so its noise would protect a row, not a patient; ask for "
            "this analysis without differential privacy or on one row per patient"
        ),
        rule="privacy-required",
    )
