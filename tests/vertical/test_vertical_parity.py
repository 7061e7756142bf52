"""Vertical logistic regression equals statsmodels on the joined rows.

Oracle: ``statsmodels.api.GLM(y, X, family=Binomial()).fit(tol=1e-12)`` on the joined
rows, ``X`` built by formulaic from the same formula (so the columns are the same); the
federated fit never sees the joined rows: the registry holds the outcome, the hospitals
the covariates, each site's rows relabelled and shuffled, joined only by pair ids.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from formulaic import model_matrix

import fedstats
from fedstats import datasets
from tests.vertical.linked_frames import vertical_study

HEART_FORMULA = datasets.HEART_EXACT_FORMULA


def oracle(joined: pd.DataFrame, formula: str, levels: dict | None = None):
    """statsmodels GLM Binomial on the joined rows, to full convergence."""
    text = formula
    for var, values in (levels or {}).items():
        text = text.replace(f"C({var})", f"C({var}, levels={list(values)})")
    y, X = model_matrix(text, joined)
    return sm.GLM(y.to_numpy().ravel(), X.to_numpy(), family=sm.families.Binomial()).fit(tol=1e-12)


def test_vertical_fit_equals_statsmodels_on_joined_heart_disease_rows():
    """Cleveland's 303 patients (UCI heart disease): ``disease`` at the registry, the ten
    covariates at the hospital."""
    joined = datasets.heart_disease().frames["cleveland"]
    study = vertical_study({"hospital": joined}, ["disease"], seed=5)
    model = fedstats.VerticalLogisticRegression(
        HEART_FORMULA, outcome_site="registry", covariate_sites=["hospital"],
        linkage_id="L-hospital", levels=datasets.HEART_LEVELS,
    )  # fmt: skip
    result = model.fit(study.federation)
    reference = oracle(joined, HEART_FORMULA, datasets.HEART_LEVELS)
    params_gap = np.abs(result.params.to_numpy() - reference.params).max()
    bse_gap = np.abs(result.bse.to_numpy() - reference.bse).max()
    print(f"heart: max |params gap| {params_gap:.2e}, max |bse gap| {bse_gap:.2e}")
    assert params_gap <= 1e-6 and bse_gap <= 1e-6
    assert result.llf == pytest.approx(reference.llf, abs=1e-8)
    assert result.converged and result.n_obs == len(joined)
    assert isinstance(result, fedstats.LogisticRegressionResults)
    assert "Intercept" in str(result.summary())
    assert result.conf_int().shape == (len(reference.params), 2)
    assert result.provenance.n_obs == {"hospital": len(joined)}


def synthetic(n: int, rng: np.random.Generator) -> pd.DataFrame:
    age = rng.uniform(30, 90, n)
    x = rng.normal(size=n)
    group = rng.choice(["a", "b", "c"], n)
    eta = -4.0 + 0.05 * age + 0.7 * x + 0.5 * (group == "b") - 0.4 * (group == "c")
    return pd.DataFrame(
        {"y": (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int), "age": age, "x": x,
         "group": group}
    )  # fmt: skip


def test_two_hospitals_sum_their_newton_sums_to_the_joined_fit():
    """Two hospitals, each linked to the registry for its own patients over the wire (two
    ``fedstats.link`` calls, two linkages): the fit equals statsmodels on the union of the
    joined rows."""
    rng = np.random.default_rng(11)
    parts = {"north": synthetic(160, rng), "south": synthetic(140, rng)}
    study = vertical_study(parts, ["y"], seed=3, wire=True)
    formula = "y ~ age + x + C(group)"
    result = fedstats.VerticalLogisticRegression(
        formula, outcome_site="registry", covariate_sites=["north", "south"],
        linkage_id=study.linkages,
    ).fit(study.federation)  # fmt: skip
    reference = oracle(pd.concat(parts.values(), ignore_index=True), formula)
    params_gap = np.abs(result.params.to_numpy() - reference.params).max()
    bse_gap = np.abs(result.bse.to_numpy() - reference.bse).max()
    print(f"two hospitals: max |params gap| {params_gap:.2e}, max |bse gap| {bse_gap:.2e}")
    assert params_gap <= 1e-6 and bse_gap <= 1e-6
    assert result.provenance.n_obs == {"north": 160, "south": 140}
    assert result.n_events_by_site.to_dict() == {s: int(p["y"].sum()) for s, p in parts.items()}


def test_a_second_fit_reads_the_kept_products_and_the_registry_decrypts_once():
    """Fitting the same design again needs no new decryption: the hospital kept X^T y."""
    rng = np.random.default_rng(2)
    study = vertical_study({"clinic": synthetic(200, rng)}, ["y"], seed=1)
    model = fedstats.VerticalLogisticRegression(
        "y ~ age + x", outcome_site="registry", covariate_sites=["clinic"],
        linkage_id="L-clinic",
    )  # fmt: skip
    first = model.fit(study.federation)
    second = model.fit(study.federation)
    np.testing.assert_array_equal(first.params, second.params)
    tasks = [r.task for r in study.federation.inventory.records()]
    assert tasks.count("vertical.decrypt") == 1 and tasks.count("vertical.encrypt_outcome") == 1
