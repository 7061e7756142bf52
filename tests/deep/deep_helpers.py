"""Shared data of the deep-model tests: small synthetic sites and FLamby's heart-disease split."""

from __future__ import annotations

import numpy as np
import pandas as pd

import accounting
import fedstats
from fedstats import datasets

BOUNDS = {"x1": (-4.0, 4.0), "x2": (-4.0, 4.0)}


def synthetic_frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    p = 1 / (1 + np.exp(-(0.3 + 1.2 * x1 - 0.8 * x2 + 0.5 * x1 * x2)))
    return pd.DataFrame({"x1": x1, "x2": x2, "y": (rng.random(n) < p).astype(int)})


def ledgers(tmp_path, sites, epsilon: float, delta: float, study: str = "study") -> dict:
    out = {}
    for site in sites:
        ledger = accounting.Ledger(tmp_path / f"{site}.db")
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site, study=study), epsilon=epsilon, delta=delta
        )
        out[site] = ledger
    return out


def heart_split():
    """FLamby's Fed-Heart-Disease split (:func:`fedstats.datasets.heart_disease_split`)."""
    return datasets.heart_disease_split()


HEART_POLICY = fedstats.DisclosurePolicy(max_parameter_ratio=0.5, k_cell=2)
"""FLamby's published, non-private setting at the least small-cell threshold a site may set
(``k_cell = 2``): its four training splits as sites hold cells of one patient crossed with the
outcome (Hungary's LV hypertrophy, VA's women), which every policy refuses; held by two sites
(``test_heart_disease.HEART_SITES``) they hold cells of two, which this threshold allows and
the default (3) refuses."""
