"""Prevalence-shift correction: calibration at a target population, and the exact shift."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy.special import expit, logit

import fedstats
from fedstats.errors import PrevalenceShiftWarning

PREVALENCES = [0.05, 0.10, 0.20, 0.30, 0.40]
SHIFT = np.array([0.8, -0.5, 0.3])  # class 1 mean; class 0 at 0; unit covariance
COLUMNS = ["x1", "x2", "x3"]


def label_shift_sample(rng, n: int, prevalence: float) -> pd.DataFrame:
    """Shared class-conditionals N(0, I) and N(SHIFT, I): linear log-odds at every site."""
    y = (rng.random(n) < prevalence).astype(int)
    X = rng.normal(size=(n, len(SHIFT))) + y[:, None] * SHIFT
    return pd.DataFrame(X, columns=COLUMNS).assign(y=y)


@pytest.fixture(scope="module")
def shifted():
    rng = np.random.default_rng(2026)
    frames = {f"s{i}": label_shift_sample(rng, 20_000, p) for i, p in enumerate(PREVALENCES)}
    target = label_shift_sample(rng, 200_000, 0.25)
    fed = fedstats.Federation.in_process(frames)
    per_site = fedstats.LogisticRegression("y ~ x1 + x2 + x3", site_intercepts=True).fit(fed)
    pooled = fedstats.LogisticRegression("y ~ x1 + x2 + x3").fit(fed)
    return frames, target, per_site, pooled


def mean_prediction(result, frame: pd.DataFrame) -> float:
    X = np.column_stack([np.ones(len(frame)), frame[COLUMNS].to_numpy()])
    return float(expit(X @ result.params[["Intercept", *COLUMNS]].to_numpy()).mean())


def test_site_intercepts_corrected_to_a_target_are_calibrated_in_the_large(shifted):
    _, target, per_site, pooled = shifted
    corrected = per_site.recalibrate(target_prevalence=0.25)
    assert list(corrected.params.index) == ["Intercept", *COLUMNS]
    gap = mean_prediction(corrected, target) - 0.25
    uncorrected = mean_prediction(pooled, target) - 0.25
    with pytest.warns(PrevalenceShiftWarning, match="site_intercepts=True"):
        pooled_corrected = pooled.recalibrate(target_prevalence=0.25)
    pooled_gap = mean_prediction(pooled_corrected, target) - 0.25
    print(f"calibration-in-the-large at pi_T = 0.25: site intercepts corrected {gap:+.4f}; "
          f"pooled uncorrected {uncorrected:+.4f}; pooled corrected {pooled_gap:+.4f}")  # fmt: skip
    assert abs(gap) <= 0.005
    assert abs(uncorrected) > 0.02 and abs(pooled_gap) > abs(gap)
    # slopes are the shared ones; the true target intercept is -|SHIFT|^2/2 + logit(0.25)
    assert np.allclose(corrected.params[COLUMNS], per_site.params[COLUMNS])
    assert corrected.params["Intercept"] == pytest.approx(
        -SHIFT @ SHIFT / 2 + logit(0.25), abs=0.05
    )


def test_the_stated_shift_is_applied_exactly(shifted):
    frames, _, per_site, pooled = shifted
    n = {s: len(f) for s, f in frames.items()}
    prevalence = {s: f["y"].sum() / len(f) for s, f in frames.items()}
    weight = {s: n[s] / sum(n.values()) for s in n}
    delta = logit(0.25) - sum(weight[s] * logit(prevalence[s]) for s in n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrevalenceShiftWarning)
        moved = pooled.recalibrate(target_prevalence=0.25)
    assert moved.params["Intercept"] - pooled.params["Intercept"] == pytest.approx(delta, abs=1e-12)
    assert (moved.params[COLUMNS] == pooled.params[COLUMNS]).all()
    expected = sum(
        weight[s] * (per_site.params[f"site[{s}]"] - logit(prevalence[s])) for s in n
    ) + logit(prevalence["s3"])
    own = per_site.recalibrate(site="s3")
    assert own.params["Intercept"] == pytest.approx(expected, abs=1e-12)


def test_the_corrected_intercepts_variance_is_that_of_its_linear_combination(shifted):
    """Against statsmodels' covariance of the site-intercept fit on the pooled data."""
    frames, _, per_site, _ = shifted
    pooled = pd.concat([f.assign(site=s) for s, f in frames.items()], ignore_index=True)
    reference = sm.GLM.from_formula(
        "y ~ 0 + C(site) + x1 + x2 + x3", pooled, family=sm.families.Binomial()
    ).fit(tol=1e-12)
    n = pooled["site"].value_counts().sort_index().to_numpy()
    weights = n / n.sum()
    cov = reference.cov_params().to_numpy()
    expected = weights @ cov[:5, :5] @ weights
    corrected = per_site.recalibrate(target_prevalence=0.25)
    assert corrected.bse["Intercept"] ** 2 == pytest.approx(expected, rel=1e-6)
    assert corrected.bse[COLUMNS].to_numpy() == pytest.approx(per_site.bse[COLUMNS].to_numpy())


def test_bad_requests_are_refused(shifted):
    _, _, per_site, _ = shifted
    with pytest.raises(ValueError, match="not both"):
        per_site.recalibrate(0.2, site="s1")
    with pytest.raises(ValueError, match="not both"):
        per_site.recalibrate()
    with pytest.raises(ValueError, match="unknown site"):
        per_site.recalibrate(site="elsewhere")
    with pytest.raises(fedstats.StudyConfigurationError, match=r"\(0, 1\)"):
        per_site.recalibrate(1.2)


def test_a_private_fit_recalibrates_from_its_noisy_counts_at_no_further_cost(tmp_path):
    import accounting

    rng = np.random.default_rng(9)
    frames = {f"s{i}": label_shift_sample(rng, 4000, p) for i, p in enumerate(PREVALENCES[:3])}
    ledgers = {}
    for site in frames:
        ledgers[site] = accounting.Ledger(tmp_path / f"{site}.ledger")
        ledgers[site].set_budget(
            accounting.Scope(unit="patient", owner=site, study="study"), epsilon=10, delta=1e-6
        )
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers, noise_seed=3)
    private = fedstats.LogisticRegression("y ~ x1 + x2 + x3", site_intercepts=True).fit(
        fed,
        privacy=fedstats.RecordDP(epsilon=5.0, bounds={c: (-5, 5) for c in COLUMNS}),
    )
    spent = {s: ledgers[s].spent(accounting.Scope("patient", s, "study")).epsilon for s in frames}
    corrected = private.recalibrate(target_prevalence=0.25)
    counts = private.n_events_by_site / pd.Series(private.provenance.n_obs)
    assert not np.allclose(counts, [f["y"].mean() for f in frames.values()], atol=1e-12)  # noisy
    weights = pd.Series(private.provenance.n_obs) / sum(private.provenance.n_obs.values())
    expected = sum(
        weights[s] * (private.params[f"site[{s}]"] - logit(counts[s])) for s in frames
    ) + logit(0.25)
    assert corrected.params["Intercept"] == pytest.approx(expected, abs=1e-12)
    for site in frames:  # post-processing: nothing more is charged
        scope = accounting.Scope("patient", site, "study")
        assert ledgers[site].spent(scope).epsilon == spent[site]
