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
"""FLamby's published, non-private setting: its training split leaves cells of one or two
patients (Cleveland's ST-T abnormality, VA's women) that the default small-cell rules refuse;
a study training without privacy on it must allow them explicitly."""
