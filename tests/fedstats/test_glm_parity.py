"""Federated GLMs equal the pooled fit of statsmodels, and the results R and Stata print.

Oracles:

* statsmodels ``GLM`` on the concatenated rows, fitted to full convergence
  (``tol=1e-13``, then once more from its own estimate so that its weights,
  hence its standard errors, are those at the MLE);
* outside oracles kept in statsmodels' test results: R's ``glm`` on the
  Star98 data and R/Stata's Gaussian fit of the Longley data (at one site: its 16 rows
  split over two are refused). R's and Stata's Poisson fits of the 17-row
  capital-punishment data are refused by the column dominance rule at every site
  configuration (``k_cell = 2``), which a test asserts; R's Poisson ``glm`` is run live on
  larger data instead (``test_r_oracle.py::test_poisson_rate_model_equals_r_glm``).

Each federation splits the rows over several sites (Longley aside); a weighted fit is also
checked against the unweighted fit on the rows repeated as many times as
their weight says (frequency weights, an exact oracle).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.genmod.tests.results import results_glm

import fedstats
from fedstats import datasets
from tests.conftest import pooled

TOL = 1e-8
OPEN = fedstats.DisclosurePolicy(min_count=1, max_parameter_ratio=1.0)
"""For the small outside-oracle data (17 states, 16 years): arithmetic, not disclosure."""

SM_FAMILY = {
    "binomial": sm.families.Binomial,
    "poisson": sm.families.Poisson,
    "gaussian": sm.families.Gaussian,
}


def reference(formula: str, data: pd.DataFrame, family: str, **kwargs):
    model = smf.glm(formula, data, family=SM_FAMILY[family](), **kwargs)
    first = model.fit(tol=1e-13)
    return model.fit(start_params=first.params, tol=1e-13)


def assert_parity(result: fedstats.GLMResults, ref, tol: float = TOL) -> None:
    index = result.params.index
    assert set(index) == set(ref.params.index)
    assert np.max(np.abs(result.params - ref.params[index])) < tol
    assert np.max(np.abs(result.bse - ref.bse[index])) < tol
    assert abs(result.llf - ref.llf) < tol
    assert abs(result.deviance - ref.deviance) < tol * max(1.0, abs(ref.deviance))
    assert result.scale == pytest.approx(ref.scale, rel=tol)
    assert result.converged


def split(data: pd.DataFrame, n_sites: int) -> dict[str, pd.DataFrame]:
    return {f"site{s}": data.iloc[s::n_sites].reset_index(drop=True) for s in range(n_sites)}


# ---------------------------------------------------------------- real clinical data


def test_gaussian_heart_disease_three_hospitals_equals_pooled_statsmodels(heart_exact):
    formula = "thalach ~ age + sex + C(cp) + trestbps"
    fed = fedstats.Federation.in_process(heart_exact.frames)
    result = fedstats.GLM(formula, family="gaussian").fit(fed)
    assert_parity(result, reference(formula, pooled(heart_exact.frames), "gaussian"))
    assert result.iterations <= 3
    assert "Scale (dispersion)" in result.summary()


def tcga_person_time(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Deaths and person-years of follow-up per patient; follow-up of 0 days has no
    person-time at risk, so those patients are left out (and counted by the test)."""
    out = {}
    for site, frame in frames.items():
        kept = frame[frame["time"] > 0].copy()
        kept["person_years"] = kept["time"] / 365.25
        kept["log_py"] = np.log(kept["person_years"])
        out[site] = kept.reset_index(drop=True)
    return out


def test_poisson_death_rates_with_person_time_equal_pooled_statsmodels():
    """TCGA-BRCA over six regions: the death rate per person-year by age and stage."""
    tcga = datasets.tcga_brca()
    frames = tcga_person_time(tcga.frames)
    dropped = sum(len(f) for f in tcga.frames.values()) - sum(len(f) for f in frames.values())
    assert dropped < 20
    formula = "event ~ age_at_index + tumor_stage_stage_iia + ajcc_pathologic_n_n0_i"
    fed = fedstats.Federation.in_process(frames)
    data = pooled(frames)
    result = fedstats.GLM(formula, family="poisson", exposure="person_years").fit(fed)
    ref = reference(formula, data, "poisson", exposure=data["person_years"])
    assert_parity(result, ref)
    rates = result.rate_ratios()
    assert rates.loc["age_at_index", "rate_ratio"] == pytest.approx(
        np.exp(ref.params["age_at_index"]), rel=1e-9
    )
    # the same model written with the log person-time as an offset
    by_offset = fedstats.GLM(formula, family="poisson", offset="log_py").fit(
        fedstats.Federation.in_process(frames)
    )
    assert np.max(np.abs(by_offset.params - result.params)) < 1e-10


# ---------------------------------------------------------------- outside oracles


def cpunish() -> pd.DataFrame:
    data = sm.datasets.cpunish.load_pandas().data.copy()
    data["LN_VC100k96"] = np.log(data["VC100k96"])
    data["fweight"] = [1, 1, 1, 2, 2, 2, 3, 3, 3, 1, 1, 1, 2, 2, 2, 3, 3]
    return data


CPUNISH = "EXECUTIONS ~ INCOME + PERPOVERTY + PERBLACK + LN_VC100k96 + SOUTH + DEGREE"
CPUNISH_ORDER = ["INCOME", "PERPOVERTY", "PERBLACK", "LN_VC100k96", "SOUTH", "DEGREE", "Intercept"]


def test_the_capital_punishment_data_are_refused_by_the_column_dominance_rule():
    """R's ``glm(EXECUTIONS ~ ..., family=poisson)`` and Stata's ``glm executions ...
    [fweight=fweight], family(poisson)`` on the 17-state capital-punishment data
    (statsmodels' ``results_glm.Cpunish`` and ``results_poisson_fweight_nonrobust``) can no
    longer be matched with the cell rules on: Texas's 37 of the 74 executions hold most of the
    outcome's variation, so with ``k_cell = 2`` (``min_count=1``) every site holding it -- one
    site or two, weighted or not -- refuses the design (rule ``cells``) before any aggregate
    leaves, and 17 rows cannot grow. Federated Poisson parity with statsmodels'
    ``freq_weights`` and with the expanded rows stays shown on larger data
    (:func:`test_weighted_fit_equals_statsmodels_freq_weights_and_the_expanded_rows`)."""
    data = cpunish()
    assert data["EXECUTIONS"].max() / data["EXECUTIONS"].sum() == 0.5
    for sites in (1, 2):
        for weights in (None, "fweight"):
            fed = fedstats.Federation.in_process(split(data, sites), disclosure=OPEN)
            with pytest.raises(fedstats.DisclosureError, match="'EXECUTIONS'") as refused:
                fedstats.GLM(CPUNISH, family="poisson", weights=weights).fit(fed)
            assert refused.value.rule == "cells"
            assert refused.value.task == "prepare"


def test_gaussian_equals_r_and_stata_on_the_longley_data():
    """R/Stata's Gaussian fit of the 16-year Longley data, at one site with ``k_cell = 2``.

    Split over two sites (alternate years, or two blocks of years), the eight-row sites
    refuse the design (rule ``differencing``: with so few rows one column is another's affine
    map but for one or two rows) or hold more columns than rows allow; 16 rows cannot grow,
    so the outside oracle is kept on the largest configuration that passes, one site."""
    data = sm.datasets.longley.load_pandas().data
    formula = "TOTEMP ~ GNPDEFL + GNP + UNEMP + ARMED + POP + YEAR"
    two = fedstats.Federation.in_process(split(data, 2), disclosure=OPEN)
    with pytest.raises(fedstats.DisclosureError) as refused:
        fedstats.GLM(formula, family="gaussian").fit(two)
    assert refused.value.rule == "differencing"
    fed = fedstats.Federation.in_process(split(data, 1), disclosure=OPEN)
    result = fedstats.GLM(formula, family="gaussian").fit(fed)
    r = results_glm.Longley()
    order = ["GNPDEFL", "GNP", "UNEMP", "ARMED", "POP", "YEAR", "Intercept"]
    np.testing.assert_allclose(result.params[order], r.params, rtol=1e-6)
    np.testing.assert_allclose(result.bse[order], r.bse, rtol=1e-6)
    assert result.scale == pytest.approx(r.scale, rel=1e-8)
    assert result.llf == pytest.approx(r.llf, rel=1e-8)
    assert result.converged and result.iterations <= 3


def star98_expanded() -> tuple[dict[str, pd.DataFrame], list[str]]:
    """R's Star98 data: 303 districts' pass counts, one row per student, four sites."""
    star = sm.datasets.star98.load_pandas()
    X, counts = star.exog, star.endog.astype(int)
    sites: dict[str, list[pd.DataFrame]] = {f"site{s}": [] for s in range(4)}
    for i in range(len(X)):
        above, below = int(counts.iloc[i, 0]), int(counts.iloc[i, 1])
        rows = X.iloc[[i] * (above + below)].copy()
        rows["above"] = [1] * above + [0] * below
        sites[f"site{i % 4}"].append(rows)
    return {s: pd.concat(parts, ignore_index=True) for s, parts in sites.items()}, list(X.columns)


def test_star98_over_four_sites_converges_to_r_within_ten_rounds():
    """The information's condition number is ~1e14: a raw-scale step test never stops."""
    frames, columns = star98_expanded()
    assert sum(len(f) for f in frames.values()) == 267_611
    formula = "above ~ " + " + ".join(columns)
    r = results_glm.Star98()
    order = [*columns, "Intercept"]
    for model in (
        fedstats.LogisticRegression(formula),
        fedstats.GLM(formula, family="binomial"),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no ConvergenceWarning
            result = model.fit(fedstats.Federation.in_process(frames))
        assert result.converged and result.iterations <= 10
        relative = np.abs(result.params[order].to_numpy() / np.asarray(r.params) - 1)
        assert relative.max() <= 1e-6, relative.max()
        np.testing.assert_allclose(result.bse[order], r.bse, rtol=1e-5)  # R printed 7 digits


def test_star98_as_weighted_pass_and_fail_rows_equals_r():
    """The same model from 606 rows: each district's passes and fails, weighted by their counts."""
    star = sm.datasets.star98.load_pandas()
    X, counts = star.exog, star.endog.astype(int)
    passes = X.assign(above=1, n=counts.iloc[:, 0].to_numpy())
    fails = X.assign(above=0, n=counts.iloc[:, 1].to_numpy())
    rows = pd.concat([passes, fails], ignore_index=True)
    formula = "above ~ " + " + ".join(X.columns)
    fed = fedstats.Federation.in_process(split(rows, 4))
    result = fedstats.GLM(formula, family="binomial", weights="n").fit(fed)
    r = results_glm.Star98()
    relative = np.abs(result.params[[*X.columns, "Intercept"]].to_numpy() / r.params - 1)
    assert result.converged and relative.max() <= 1e-6
    assert result.nobs == 267_611


# ---------------------------------------------------------------- weights and offsets


def synthetic(n: int = 4000, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = pd.DataFrame(
        {
            "age": rng.normal(60, 10, n).round(1),
            "smoker": rng.integers(0, 2, n),
            "region": rng.choice(["north", "south", "east"], n),
            "years": rng.uniform(0.2, 8.0, n).round(2),
            "w": rng.integers(1, 4, n),
        }
    )
    rate = np.exp(-4 + 0.03 * (data.age - 60) + 0.4 * data.smoker)
    data["cases"] = rng.poisson(rate * data.years * 10)
    data["sbp"] = (120 + 0.4 * data.age + 6 * data.smoker + rng.normal(0, 12, n)).round(1)
    data["event"] = (rng.random(n) < 1 / (1 + np.exp(-(-1 + 0.5 * data.smoker)))).astype(int)
    data["log_years"] = np.log(data.years)
    return data


CASES = {
    "poisson": ("cases ~ age + smoker + C(region)", "cases"),
    "gaussian": ("sbp ~ age + smoker + C(region)", "sbp"),
    "binomial": ("event ~ age + smoker + C(region)", "event"),
}


@pytest.mark.parametrize("family", ["poisson", "gaussian", "binomial"])
def test_weighted_fit_equals_statsmodels_freq_weights_and_the_expanded_rows(family):
    data = synthetic()
    formula, _ = CASES[family]
    extra = {"offset": "log_years"} if family == "poisson" else {}
    fed = fedstats.Federation.in_process(split(data, 5))
    result = fedstats.GLM(formula, family=family, weights="w", **extra).fit(fed)
    sm_extra = {"offset": data["log_years"]} if family == "poisson" else {}
    ref = reference(formula, data, family, freq_weights=data["w"], **sm_extra)
    assert_parity(result, ref)
    assert result.nobs == data["w"].sum()
    expanded = data.loc[data.index.repeat(data["w"])].reset_index(drop=True)
    unweighted = fedstats.GLM(formula, family=family, **extra).fit(
        fedstats.Federation.in_process(split(expanded, 5))
    )
    assert np.max(np.abs(unweighted.params - result.params)) < TOL
    assert np.max(np.abs(unweighted.bse - result.bse)) < TOL
    assert unweighted.llf == pytest.approx(result.llf, abs=TOL)


def test_quasi_poisson_scale_equals_statsmodels_pearson_scale():
    data = synthetic()
    formula, _ = CASES["poisson"]
    fed = fedstats.Federation.in_process(split(data, 4))
    result = fedstats.GLM(formula, family="poisson", exposure="years", scale="X2").fit(fed)
    model = smf.glm(formula, data, family=sm.families.Poisson(), exposure=data["years"])
    ref = model.fit(start_params=model.fit(tol=1e-13).params, tol=1e-13, scale="X2")
    assert result.scale == pytest.approx(ref.scale, rel=1e-10)
    assert np.max(np.abs(result.bse - ref.bse[result.bse.index])) < TOL


def test_the_stopping_rule_does_not_depend_on_a_covariates_scale():
    """Age in years or in seconds: the same rounds, and coefficients scaled by exactly 1/c."""
    data = synthetic()
    data["age_seconds"] = data["age"] * 3.15576e7
    fits = {}
    for column in ("age", "age_seconds"):
        fed = fedstats.Federation.in_process(split(data, 3))
        fits[column] = fedstats.GLM(
            f"cases ~ {column} + smoker", family="poisson", exposure="years"
        ).fit(fed)
    years, seconds = fits["age"], fits["age_seconds"]
    assert years.converged and seconds.converged
    assert years.iterations == seconds.iterations
    assert seconds.params["age_seconds"] * 3.15576e7 == pytest.approx(years.params["age"], rel=1e-8)


def test_the_readme_glm_example_runs_and_equals_statsmodels():
    """The README section on generalised linear models runs as printed."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text.split("\n## Rates, measurements and weights", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]
    namespace: dict = {}
    exec(compile(block, f"{readme}:GLM", "exec"), namespace)
    data = pooled(namespace["frames"])
    ref = reference(
        "event ~ age_at_index + tumor_stage_stage_iia",
        data,
        "poisson",
        exposure=data["person_years"],
    )
    assert_parity(namespace["rates"], ref)
    assert namespace["bp"].converged


@pytest.mark.parametrize("family", ["poisson", "gaussian"])
def test_secure_aggregation_gives_the_fit_in_the_clear(family):
    """The coordinator sees only the sums over sites; the fit equals the clear one up to the
    fixed-point encoding of the sums."""
    data = synthetic()
    formula, _ = CASES[family]
    clear = fedstats.GLM(formula, family=family, weights="w").fit(
        fedstats.Federation.in_process(split(data, 4))
    )
    secure = fedstats.GLM(formula, family=family, weights="w").fit(
        fedstats.Federation.in_process(split(data, 4)),  # each masked round's path verified
        secure_aggregation=fedstats.SecureAggregation(),
    )
    assert np.max(np.abs(secure.params - clear.params)) < 1e-9
    assert np.max(np.abs(secure.bse - clear.bse)) < 1e-9
    assert any("secure aggregation" in note for note in secure.notes)
