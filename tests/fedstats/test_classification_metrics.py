"""A fitted logistic regression scored at sites (``logistic.evaluate``), training and held out,
against statsmodels' pooled fit scored by scikit-learn on the same rows.

The heart-disease hospitals with FLamby's split: the exact federated fit on the training
splits, then each site's test split scored with it. Per site, accuracy, AUC, Brier score and
log-loss equal scikit-learn's on statsmodels' predictions (the coefficients agree to about
1e-9); the pooled AUC comes from the sites' logit histograms (bins of 0.01, merged to ``k``
patients), so it agrees to the bins' width.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

import fedstats
from fedstats import datasets
from fedstats.errors import MalformedRequestError, PrevalenceShiftWarning

FORMULA = datasets.HEART_EXACT_FORMULA.replace("C(cp)", "I(cp == 3) + I(cp == 4)")
SITES = ("cleveland", "hungary")
POLICY = fedstats.DisclosurePolicy(max_parameter_ratio=0.5, min_count=1)


@pytest.fixture(scope="module")
def split():
    train, test = datasets.heart_disease_split()
    return {s: train[s] for s in SITES}, {s: test[s] for s in SITES}


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    training = fedstats.Federation.in_process(train, disclosure=POLICY)
    return training, fedstats.LogisticRegression(FORMULA).fit(training)


def oracle(train: dict[str, pd.DataFrame]):
    pooled = pd.concat(train.values(), ignore_index=True)
    return smf.logit(FORMULA, pooled).fit(disp=0, tol=1e-12, maxiter=100)


def test_held_out_scores_equal_scikit_learn_on_statsmodels_predictions(split, fitted):
    train, test = split
    training, fit = fitted
    reference = oracle(train)
    np.testing.assert_allclose(np.sort(fit.params.to_numpy()),
                               np.sort(reference.params.to_numpy()), atol=1e-7)  # fmt: skip
    held_out = fedstats.Federation.in_process(test, disclosure=POLICY, keys_of=training)
    scores = fedstats.classification_metrics(fit, held_out)
    table = scores.table
    for site in SITES:
        frame = test[site]
        p = reference.predict(frame).to_numpy()
        y = frame.eval(reference.model.endog_names).to_numpy().astype(float)
        row = table.loc[site]
        assert row["n"] == len(frame) and row["n_events"] == y.sum()
        assert row["accuracy"] == pytest.approx(np.mean((p > 0.5) == (y == 1)), abs=1e-12)
        assert row["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-9)
        assert row["brier"] == pytest.approx(brier_score_loss(y, p), abs=1e-7)
        assert row["log_loss"] == pytest.approx(log_loss(y, p), abs=1e-7)
    outcome = reference.model.endog_names
    pooled_y = np.concatenate([test[s].eval(outcome).to_numpy() for s in SITES]).astype(float)
    pooled_p = np.concatenate([reference.predict(test[s]).to_numpy() for s in SITES])
    assert table.loc["pooled", "auc"] == pytest.approx(roc_auc_score(pooled_y, pooled_p), abs=0.01)
    assert scores.mean_site_accuracy == pytest.approx(table.loc[list(SITES), "accuracy"].mean())


def test_a_fit_scored_on_its_own_training_rows_is_calibrated_in_the_large(fitted):
    """At the maximum-likelihood point the scores' mean equals the event rate (the score
    equation's intercept row), so the pooled calibration intercept and slope are 0 and 1 up
    to the histogram's bins."""
    training, fit = fitted
    pooled = fedstats.classification_metrics(fit, training).table.loc["pooled"]
    assert abs(pooled["calibration_intercept"]) < 0.01
    assert abs(pooled["calibration_slope"] - 1.0) < 0.01


def test_a_derived_result_names_what_to_pass(fitted):
    _, fit = fitted
    with pytest.warns(PrevalenceShiftWarning):
        derived = fit.recalibrate(0.3)
    with pytest.raises(fedstats.StudyConfigurationError, match=r"LogisticRegression\.fit"):
        fedstats.classification_metrics(derived, fitted[0])


def test_a_frame_with_several_rows_per_patient_is_not_scored(split, fitted):
    """The reply's k rules count rows: a site whose frame names a patient on several rows
    refuses, naming why, and reads nothing more."""
    _, test = split
    training, fit = fitted
    repeated = {
        site: pd.concat([frame, frame.iloc[:5]]).sort_index() for site, frame in test.items()
    }
    held_out = fedstats.Federation.in_process(repeated, disclosure=POLICY, keys_of=training)
    with pytest.raises(MalformedRequestError, match="several rows per patient"):
        fedstats.classification_metrics(fit, held_out)
