"""``predict`` on a frame the analyst holds, as statsmodels and lifelines users expect it.

The coefficients come from federated fits; the design is built from the analyst's
frame with the design the sites agreed on (``fedstats.contract.design_matrix``).
Oracles: statsmodels' ``Logit``/``GLM`` fitted on the pooled rows and their
``predict``; lifelines' ``CoxPHFitter`` (hazard ratios between rows, and the
survival function of the pooled Breslow model on a grid holding every event time).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from hypothesis import given, settings
from hypothesis import strategies as st
from lifelines import CoxPHFitter

import fedstats
from fedstats import datasets
from fedstats.contract.design_matrix import PredictionInputError

HEART = datasets.heart_disease().only(("cleveland", "hungary"))
FORMULA = "disease ~ age + sex + C(cp) + chol"


def pooled(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([frame.assign(site=site) for site, frame in frames.items()], ignore_index=True)


@pytest.fixture(scope="module")
def heart_fit():
    fed = fedstats.Federation.in_process(HEART.frames)
    return fedstats.LogisticRegression(FORMULA).fit(fed), pooled(HEART.frames)


def test_logistic_predict_equals_statsmodels_on_the_pooled_rows(heart_fit):
    fit, rows = heart_fit
    data = rows.dropna(subset=list(fit.design["variables"]))
    oracle = smf.logit(FORMULA, data).fit(disp=0, tol=1e-12)
    assert fit.nobs == oracle.nobs
    sample = data.sample(80, random_state=1)
    mine = fit.predict(sample)
    assert mine.index.equals(sample.index)
    assert np.max(np.abs(mine - oracle.predict(sample))) < 1e-8
    linear = fit.predict(sample, which="linear")
    assert np.max(np.abs(linear - oracle.predict(sample, which="linear"))) < 1e-6


def test_a_row_with_a_missing_covariate_predicts_nan_and_keeps_its_place(heart_fit):
    fit, rows = heart_fit
    sample = rows.dropna(subset=list(fit.design["variables"])).head(6).copy()
    sample.loc[sample.index[2], "age"] = np.nan
    predicted = fit.predict(sample)
    assert predicted.isna().tolist() == [False, False, True, False, False, False]
    full = fit.predict(sample.drop(index=sample.index[2]))
    assert np.allclose(predicted.dropna(), full, rtol=0, atol=1e-15)


def test_a_level_the_fit_never_saw_is_refused_naming_the_column(heart_fit):
    fit, rows = heart_fit
    sample = rows.head(3).copy().astype({"cp": object})
    sample.loc[sample.index[0], "cp"] = 7
    with pytest.raises(PredictionInputError, match="'cp' has 1 value"):
        fit.predict(sample)
    with pytest.raises(PredictionInputError, match="no column 'age'"):
        fit.predict(rows.drop(columns="age").head(3))


@settings(max_examples=25)
@given(
    ages=st.lists(st.floats(20, 90), min_size=1, max_size=12),
    which=st.sampled_from(["mean", "linear"]),
)
def test_predict_on_any_ages_is_the_logistic_function_of_the_linear_predictor(
    heart_fit, ages, which
):
    """Read from outside: whatever ages an analyst passes, the prediction is expit(x'beta)
    of the agreed design, row by row."""
    fit, rows = heart_fit
    base = rows.dropna(subset=list(fit.design["variables"])).iloc[[0]]
    frame = pd.concat([base] * len(ages), ignore_index=True).assign(age=ages)
    linear = fit.predict(frame, which="linear")
    step = fit.params["age"] * (np.asarray(ages) - ages[0])
    assert np.allclose(linear - linear.iloc[0], step, rtol=0, atol=1e-9)
    if which == "mean":
        assert np.allclose(fit.predict(frame), 1 / (1 + np.exp(-linear)), rtol=0, atol=1e-15)


def test_poisson_predict_with_exposure_equals_statsmodels():
    rng = np.random.default_rng(4)
    frames = {}
    for site in ("a", "b", "c"):
        n = 300
        age = rng.uniform(20, 80, n)
        smoker = rng.choice(["no", "yes"], n)
        years = rng.uniform(0.5, 4, n)
        rate = np.exp(-2 + 0.02 * age + 0.5 * (smoker == "yes"))
        frames[site] = pd.DataFrame(
            {"age": age, "smoker": smoker, "years": years, "infections": rng.poisson(rate * years)}
        )
    fed = fedstats.Federation.in_process(frames)
    formula = "infections ~ age + C(smoker)"
    fit = fedstats.GLM(formula, family="poisson", exposure="years").fit(fed)
    rows = pooled(frames)
    oracle = smf.glm(formula, rows, family=sm.families.Poisson(), exposure=rows["years"]).fit(
        tol=1e-12
    )
    sample = rows.sample(50, random_state=2)
    expected = oracle.predict(sample, exposure=sample["years"])
    assert np.max(np.abs(fit.predict(sample) - expected) / expected) < 1e-7
    assert fit.nobs == oracle.nobs


def trial(rng: np.random.Generator, n: int) -> pd.DataFrame:
    age = rng.normal(60, 10, n)
    arm = rng.choice(["control", "treated"], n)
    hazard = np.exp(0.03 * (age - 60) - 0.4 * (arm == "treated")) / 900
    death, end = rng.exponential(1 / hazard), rng.uniform(365, 1800, n)
    time = np.ceil(np.minimum(death, end) / 30)  # months: tied times
    return pd.DataFrame({"age": age, "arm": arm, "time": time, "event": (death <= end) * 1})


@pytest.fixture(scope="module")
def trial_frames():
    rng = np.random.default_rng(11)
    return {site: trial(rng, 400) for site in ("north", "south", "east")}


def test_cox_partial_hazards_between_rows_equal_lifelines(trial_frames):
    fed = fedstats.Federation.in_process(trial_frames)
    fit = fedstats.CoxPH("Surv(time, event) ~ age + C(arm)", ties="efron").fit(fed)
    rows = pooled(trial_frames)
    oracle = CoxPHFitter().fit(
        rows.assign(treated=(rows["arm"] == "treated") * 1)[["age", "treated", "time", "event",
                                                              "site"]],
        "time", "event", strata=["site"],
    )  # fmt: skip
    sample = rows.sample(30, random_state=3)
    mine = fit.predict_partial_hazard(sample)
    theirs = oracle.predict_partial_hazard(sample.assign(treated=(sample["arm"] == "treated") * 1))
    ratio = mine.to_numpy() / theirs.to_numpy()
    assert np.max(np.abs(ratio / ratio[0] - 1)) < 1e-6  # lifelines centres; ratios agree
    assert np.allclose(np.log(mine), fit.predict_log_partial_hazard(sample), atol=1e-15)


def test_pooled_cox_survival_function_equals_lifelines_breslow(trial_frames):
    """On a grid holding every distinct time, the pooled grid model is Cox's with Breslow's
    ties, and its baseline Breslow's: lifelines' (ties are Efron's there, so untied data)."""
    rng = np.random.default_rng(5)
    frames = {
        s: f.assign(time=f["time"] + rng.uniform(0, 0.5, len(f))) for s, f in trial_frames.items()
    }
    rows = pooled(frames)
    grid = np.sort(rows["time"].unique())
    fed = fedstats.Federation.in_process(frames, disclosure=fedstats.DisclosurePolicy(min_count=1))
    fit = fedstats.CoxPH("Surv(time, event) ~ age", strata=None, grid=grid).fit(fed)
    oracle = CoxPHFitter(baseline_estimation_method="breslow").fit(
        rows[["age", "time", "event"]], "time", "event"
    )
    assert abs(fit.params["age"] - oracle.params_["age"]) < 1e-6
    sample = rows.sample(5, random_state=4)
    mine = fit.predict_survival_function(sample)
    theirs = oracle.predict_survival_function(sample[["age"]], times=grid)
    assert np.max(np.abs(mine.to_numpy() - theirs.to_numpy())) < 1e-6


@settings(max_examples=60)
@given(
    values=st.lists(st.sampled_from(["a", "b", "c", "zz", None]), min_size=1, max_size=30),
    categorical=st.booleans(),
)
def test_agreed_codes_count_exactly_the_values_outside_the_levels(values, categorical):
    """The one reading of agreed levels both sides use (a site's design and predict): whatever
    the column's dtype (a harmonised frame holds categoricals), only values outside the levels
    are counted, each as often as it occurs; missing values are neither."""
    from fedstats.contract.design_matrix import agreed_codes

    column = pd.Series(values, dtype="category" if categorical else object)
    codes, unknown = agreed_codes(column, ("a", "b", "c"))
    expected = pd.Series([v for v in values if v == "zz"]).value_counts()
    assert dict(unknown) == dict(expected)
    assert list(codes.categories) == ["a", "b", "c"]
    kept = [v if v in ("a", "b", "c") else None for v in values]
    assert [None if pd.isna(v) else v for v in codes] == kept
