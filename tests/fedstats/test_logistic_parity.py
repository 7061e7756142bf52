"""Federated logistic regression equals the pooled fit of independent oracles.

Oracle: statsmodels GLM Binomial on the concatenated rows, fitted to full
convergence (``fit(tol=1e-12)``) and then given one more IRLS pass started at
its own estimate, so that its IRLS weights — hence its standard errors — are
evaluated at the MLE (statsmodels reports bse from the weights of its last
iteration, which for the site-intercept heart model leaves them 6e-8 from
the exact value). Outside oracle: Stata 11's ``logit grade gpa tuce psi`` on
the Spector data, as kept in statsmodels' own test results.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.discrete.tests.results.results_discrete import Spector

import fedstats
from fedstats import datasets
from fedstats.errors import DisclosureError
from tests.conftest import pooled

TOL = 1e-8
SMALL_CELLS_ALLOWED = fedstats.DisclosurePolicy(k_cell=2)
"""The least small-cell threshold a site may set (``k_cell = 1`` is refused, issue 27). The
reference heart-disease model crossed with its outcome holds cells of one patient at Cleveland
and Hungary (``test_the_heart_model_is_refused_for_its_cross_cells``); the recoded model
:data:`fedstats.datasets.HEART_EXACT_FORMULA` holds none, and VA's two healthy women are a
cell this threshold allows."""


def reference_glm(formula: str, data: pd.DataFrame):
    model = smf.glm(formula, data, family=sm.families.Binomial())
    first = model.fit(tol=1e-12)
    return model.fit(start_params=first.params, tol=1e-12)


def our_name(name: str) -> str:
    """statsmodels' (patsy's) name of a coefficient as ours: ``C(site)[x]`` is ``site[x]``, and
    a true/false term is named without patsy's ``[T.True]``."""
    return name.replace("C(site)[", "site[").removesuffix("[T.True]")


def aligned(series: pd.Series, index: pd.Index) -> pd.Series:
    renamed = series.rename(our_name)
    return renamed[index]


def assert_parity(result: fedstats.LogisticRegressionResults, reference) -> None:
    assert set(result.params.index) == {our_name(n) for n in reference.params.index}
    d_params = np.max(np.abs(result.params - aligned(reference.params, result.params.index)))
    d_bse = np.max(np.abs(result.bse - aligned(reference.bse, result.params.index)))
    assert d_params < TOL, d_params
    assert d_bse < TOL, d_bse
    assert abs(result.llf - reference.llf) < TOL
    assert result.converged


def test_heart_disease_three_hospitals_equal_pooled_statsmodels_glm(heart_exact):
    """The three hospitals whose columns pass the single-column cell rules, fitting the model
    with the abnormal resting ECGs as one level (``HEART_EXACT_FORMULA``) at ``k_cell = 2``."""
    fed = fedstats.Federation.in_process(heart_exact.frames, disclosure=SMALL_CELLS_ALLOWED)
    result = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA).fit(fed)
    reference = reference_glm(datasets.HEART_EXACT_FORMULA, pooled(heart_exact.frames))
    assert_parity(result, reference)
    assert result.n_obs == 694
    assert result.provenance.n_obs == {"cleveland": 303, "hungary": 261, "va": 130}
    cold = smf.glm(
        datasets.HEART_EXACT_FORMULA, pooled(heart_exact.frames), family=sm.families.Binomial()
    ).fit(tol=1e-12)
    assert result.provenance.rounds <= cold.fit_history["iteration"] + 1


HEART_TWO_SITES = {
    "cleveland_va": ["cleveland", "va"],
    "hungary_switzerland": ["hungary", "switzerland"],
}
"""All four hospitals' 740 patients held by two sites: every cell of ``disease`` crossed with
the reference model's columns holds 0 or at least 3 patients at each."""


def test_heart_disease_four_hospitals_in_two_sites_equal_the_data_readme(heart):
    """The four hospitals as sites are refused at the least threshold a site may set
    (Cleveland's cross-cell of one; Switzerland's one healthy patient,
    ``test_switzerland_refuses_...``); held by two sites, the reference model fits under
    the default rules and equals statsmodels and the data README's figure for this model."""
    with pytest.raises(DisclosureError) as refused:
        fedstats.LogisticRegression(datasets.HEART_FORMULA).fit(
            fedstats.Federation.in_process(heart.frames, disclosure=SMALL_CELLS_ALLOWED)
        )
    assert refused.value.site == "cleveland" and refused.value.rule == "cross-cells"
    frames = {
        site: pd.concat([heart.frames[h] for h in hospitals], ignore_index=True)
        for site, hospitals in HEART_TWO_SITES.items()
    }
    fed = fedstats.Federation.in_process(frames)
    result = fedstats.LogisticRegression(datasets.HEART_FORMULA).fit(fed)
    assert_parity(result, reference_glm(datasets.HEART_FORMULA, pooled(heart.frames)))
    assert result.llf == pytest.approx(-310.8922, abs=5e-5)
    assert result.n_obs == 740


def test_switzerland_refuses_an_exact_heart_disease_fit_under_the_default_rules(heart):
    """Switzerland's 46 complete cases hold one patient without disease: a cell of one."""
    fed = fedstats.Federation.in_process(heart.only(["switzerland"]).frames)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression(datasets.HEART_FORMULA).fit(fed)
    assert info.value.site == "switzerland" and info.value.rule == "cells"
    assert "fewer than 3 rows" in str(info.value) and "Nothing was released" in str(info.value)


@pytest.mark.parametrize(
    ("site", "column"),
    [("cleveland", "C(restecg)[T.1]"), ("hungary", "C(restecg)[T.2]"), ("va", "sex")],
)
def test_the_heart_model_is_refused_for_its_cross_cells(heart_exact, site, column):
    """What the cross-cell rule costs the reference model under the default rules: at each
    hospital one of its two-valued columns crossed with ``disease`` holds 1-2 patients
    (Cleveland: one of the four with an ST-T abnormality is healthy; Hungary: one of those
    with LV hypertrophy is diseased; VA: two women are healthy)."""
    fed = fedstats.Federation.in_process(heart_exact.only([site]).frames)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression(datasets.HEART_FORMULA).fit(fed)
    assert info.value.site == site and info.value.rule == "cross-cells"
    assert f"the design column {column!r}" in str(info.value)


def test_heart_disease_site_intercepts_equal_statsmodels_with_site_dummies(heart_exact):
    fed = fedstats.Federation.in_process(heart_exact.frames, disclosure=SMALL_CELLS_ALLOWED)
    formula = datasets.HEART_EXACT_FORMULA
    result = fedstats.LogisticRegression(formula, site_intercepts=True).fit(fed)
    formula = formula.replace("~", "~ 0 + C(site) +")
    reference = reference_glm(formula, pooled(heart_exact.frames, with_site=True))
    assert_parity(result, reference)
    assert "Intercept" not in result.params.index
    assert list(result.params.index[:3]) == [f"site[{s}]" for s in heart_exact.frames]


def test_synthetic_ten_sites_equals_pooled_statsmodels_glm(synthetic_sites):
    formula = "y ~ x1 + x2 + x3 + x4 + C(group)"
    fed = fedstats.Federation.in_process(synthetic_sites)
    result = fedstats.LogisticRegression(formula).fit(fed)
    reference = reference_glm(formula, pooled(synthetic_sites))
    assert_parity(result, reference)
    assert result.n_obs == sum(len(f) for f in synthetic_sites.values())


def test_synthetic_ten_sites_site_intercepts_equal_statsmodels_with_site_dummies(synthetic_sites):
    formula = "y ~ x1 + x2 + x3 + x4 + C(group)"
    fed = fedstats.Federation.in_process(synthetic_sites)
    result = fedstats.LogisticRegression(formula, site_intercepts=True).fit(fed)
    reference = reference_glm(
        "y ~ 0 + C(site) + x1 + x2 + x3 + x4 + C(group)", pooled(synthetic_sites, with_site=True)
    )
    assert_parity(result, reference)


def test_offset_equals_statsmodels_glm_with_offset(synthetic_sites):
    frames = {s: f.assign(off=0.1 * f["x1"] ** 2) for s, f in synthetic_sites.items()}
    fed = fedstats.Federation.in_process(frames)
    result = fedstats.LogisticRegression("y ~ x2 + x3", offset="off").fit(fed)
    data = pooled(frames)
    model = smf.glm("y ~ x2 + x3", data, family=sm.families.Binomial(), offset=data["off"])
    first = model.fit(tol=1e-12)
    reference = model.fit(start_params=first.params, tol=1e-12)
    assert_parity(result, reference)


def test_array_interface_equals_statsmodels_glm_on_arrays(synthetic_sites):
    fed = fedstats.Federation.in_process(synthetic_sites)
    result = fedstats.LogisticRegression.from_columns("y", ["x1", "x2", "x3"]).fit(fed)
    data = pooled(synthetic_sites)
    X = sm.add_constant(data[["x1", "x2", "x3"]].to_numpy())
    model = sm.GLM(data["y"].to_numpy(), X, family=sm.families.Binomial())
    reference = model.fit(start_params=model.fit(tol=1e-12).params, tol=1e-12)
    assert list(result.params.index) == ["Intercept", "x1", "x2", "x3"]
    np.testing.assert_allclose(result.params.to_numpy(), reference.params, rtol=0, atol=TOL)
    np.testing.assert_allclose(result.bse.to_numpy(), reference.bse, rtol=0, atol=TOL)


def test_numpy_arrays_per_site_equal_statsmodels_glm(synthetic_sites):
    arrays = {
        s: (f[["x1", "x2"]].to_numpy(), f["y"].to_numpy()) for s, f in synthetic_sites.items()
    }
    fed = fedstats.Federation.in_process_arrays(arrays, columns=["age", "bmi"])
    result = fedstats.LogisticRegression.from_columns("y", ["age", "bmi"]).fit(fed)
    data = pooled(synthetic_sites)
    model = sm.GLM(
        data["y"].to_numpy(),
        sm.add_constant(data[["x1", "x2"]].to_numpy()),
        family=sm.families.Binomial(),
    )
    reference = model.fit(start_params=model.fit(tol=1e-12).params, tol=1e-12)
    np.testing.assert_allclose(result.params.to_numpy(), reference.params, rtol=0, atol=TOL)
    np.testing.assert_allclose(result.bse.to_numpy(), reference.bse, rtol=0, atol=TOL)
    assert list(result.params.index) == ["Intercept", "age", "bmi"]


def test_spector_split_over_two_sites_matches_stata_logit():
    """Stata 11: ``logit grade gpa tuce psi`` (statsmodels' results_discrete.Spector).

    Stata's printed estimate stops short of the exact MLE: at its constant
    (-13.0213483201) the score is still ~1.7e-6, and the exact constant
    (which statsmodels' Newton fit to tol=1e-14 also gives) lies 1.46e-6
    away. So slopes and standard errors are checked to an
    absolute 1e-6, the constant (and the covariance, whose constant entry
    carries the same offset) to a relative 1e-6 (1.1e-7 and 1.7e-7 here),
    and all coefficients to the exact MLE to 1e-9.
    """
    data = sm.datasets.spector.load_pandas().data
    # alternate rows leave a cell of PSI x GRADE of one student at each site (of the three
    # without PSI who got the better grade): refused by the cross-cell rule at any threshold.
    # The first and the last 16 rows leave no cell of one; site b's two students without PSI
    # are a cell of two, which k_cell = 2 allows
    alternate = {"a": data.iloc[::2], "b": data.iloc[1::2]}
    for policy in (fedstats.DisclosurePolicy(), SMALL_CELLS_ALLOWED):
        with pytest.raises(DisclosureError) as refused:
            fedstats.LogisticRegression("GRADE ~ GPA + TUCE + PSI").fit(
                fedstats.Federation.in_process(alternate, disclosure=policy)
            )
        assert refused.value.rule == "cross-cells" and "'PSI'" in str(refused.value)
    frames = {"a": data.iloc[:16], "b": data.iloc[16:]}
    fed = fedstats.Federation.in_process(frames, disclosure=SMALL_CELLS_ALLOWED)
    result = fedstats.LogisticRegression("GRADE ~ GPA + TUCE + PSI").fit(fed)
    stata = Spector.logit
    order = ["GPA", "TUCE", "PSI", "Intercept"]  # Stata orders the constant last
    ours = result.params[order].to_numpy()
    np.testing.assert_allclose(ours[:3], stata.params[:3], rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours[3], stata.params[3], rtol=1e-6, atol=0)
    np.testing.assert_allclose(result.bse[order].to_numpy(), stata.bse, rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        result.cov_params().loc[order, order].to_numpy(), stata.cov_params, rtol=1e-6, atol=0
    )
    exact = sm.Logit(data["GRADE"], sm.add_constant(data[["GPA", "TUCE", "PSI"]], prepend=False))
    exact_fit = exact.fit(method="newton", tol=1e-14, disp=0)
    np.testing.assert_allclose(ours, exact_fit.params.to_numpy(), rtol=0, atol=1e-9)
    assert result.llf == pytest.approx(-12.889634222131, abs=1e-9)


def test_inference_columns_follow_from_params_and_bse(heart_exact):
    fed = fedstats.Federation.in_process(heart_exact.frames, disclosure=SMALL_CELLS_ALLOWED)
    result = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA).fit(fed)
    reference = reference_glm(datasets.HEART_EXACT_FORMULA, pooled(heart_exact.frames))
    idx = result.params.index
    np.testing.assert_allclose(result.pvalues, aligned(reference.pvalues, idx), rtol=1e-6)
    ci = reference.conf_int().rename(index=our_name).loc[idx]
    np.testing.assert_allclose(result.conf_int()["lower"], ci[0], atol=1e-8)
    np.testing.assert_allclose(
        result.conf_int(0.1)["upper"],
        reference.conf_int(0.1).rename(index=our_name).loc[idx][1],
        atol=1e-8,
    )
    np.testing.assert_allclose(result.odds_ratios()["odds_ratio"], np.exp(result.params))
    assert result.deviance == pytest.approx(reference.deviance, abs=1e-8)
    assert result.aic == pytest.approx(reference.aic, abs=1e-8)
