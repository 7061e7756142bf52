"""The vertical studies' oracle: statsmodels on the rows joined by the patients' true identity.

The hospital holds the covariates and the registry the outcome ``died``; the true pairs
``(registry row, hospital row)`` come from the synthetic people behind both (never from the
linkage under test). statsmodels' GLM Binomial, ``fit(tol=1e-12)``, on those rows is what a
vertical fit must equal.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import statsmodels.api as sm
from formulaic import model_matrix

SEX_LEVELS = ["female", "male"]
"""The levels of ``sex`` the studies agree, written into the oracle's formula."""


def joined_by_truth(
    hospital: pd.DataFrame, registry: pd.DataFrame, truth: Iterable[tuple[int, int]]
) -> pd.DataFrame:
    """The hospital's rows of the truly shared patients, with the registry's ``died``, in the
    order of the sorted true pairs."""
    pairs = pd.DataFrame(sorted(truth), columns=["registry", "hospital"])
    joined = hospital.drop(columns="died", errors="ignore").loc[pairs["hospital"]]
    joined = joined.reset_index(drop=True)
    joined["died"] = registry["died"].loc[pairs["registry"]].to_numpy(dtype=float)
    joined["sex"] = joined["sex"].astype(str)
    return joined


def statsmodels_on_joined(joined: pd.DataFrame, formula: str) -> tuple[list[str], object]:
    """statsmodels' fit of ``formula`` on the joined rows, and its design columns named as
    fedstats names them (``C(sex)[T.male]``)."""
    levels = f"C(sex, levels={SEX_LEVELS})"
    y, X = model_matrix(formula.replace("C(sex)", levels), joined)
    reference = sm.GLM(y.to_numpy().ravel(), X.to_numpy(), family=sm.families.Binomial())
    names = [column.replace(f", levels={SEX_LEVELS}", "") for column in X.columns]
    return names, reference.fit(tol=1e-12)


TOLERANCE = 1e-6
"""The largest gap allowed between a vertical fit and statsmodels on the joined rows."""


def assert_equals_joined_fit(
    fit: dict, hospital: pd.DataFrame, registry: pd.DataFrame, truth: set, formula: str, label: str
) -> None:
    """A recorded vertical fit (``params`` and ``bse`` by design column) equals statsmodels on
    the rows joined by true identity, column by column, within :data:`TOLERANCE`."""
    names, reference = statsmodels_on_joined(joined_by_truth(hospital, registry, truth), formula)
    assert sorted(names) == sorted(fit["params"])
    params = np.array([fit["params"][name] for name in names], dtype=float)
    bse = np.array([fit["bse"][name] for name in names], dtype=float)
    params_gap = np.abs(params - reference.params).max()
    bse_gap = np.abs(bse - reference.bse).max()
    print(f"{label}: {len(truth)} pairs, max |params gap| {params_gap:.2e}, "
          f"max |bse gap| {bse_gap:.2e}")  # fmt: skip
    assert params_gap <= TOLERANCE and bse_gap <= TOLERANCE
