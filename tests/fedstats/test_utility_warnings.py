"""Private results that noise has swamped say so: PrivacyUtilityWarning, a flag, the record.

The noise share of a coefficient is checked against an independent estimate
(the spread of repeated private fits about the exact fit); the thresholds are
those of :mod:`fedstats.models.utility`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import accounting
import fedstats
from fedstats import datasets
from fedstats.models.utility import (
    DISCARDED_EVENTS,
    NOISE_DOMINATES,
    count_warnings,
    discarded_events_warning,
    noise_shares,
    noise_warnings,
)

BIG_FORMULA = "y ~ x1 + x2 + x3 + C(group)"
BIG_LEVELS = {"group": ["a", "b", "c"]}
BIG_BOUNDS = {c: (-5.0, 5.0) for c in ("x1", "x2", "x3")}


def ledgers_for(folder, frames, epsilon=100.0, delta=1e-2, study="study"):
    books = {}
    for site in frames:
        ledger = accounting.Ledger(folder / f"{site}.ledger")
        ledger.set_budget(accounting.Scope(unit="patient", owner=site, study=study), epsilon, delta)
        books[site] = ledger
    return books


def utility_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message) for w in record if issubclass(w.category, fedstats.PrivacyUtilityWarning)
    ]


def test_heart_disease_at_epsilon_0_2_warns_naming_the_coefficients(tmp_path):
    """Four hospitals, 920 patients, epsilon 0.2 per site: the noise swamps every
    coefficient and two sites' noisy counts; the warning names them, the result is
    flagged, and its record and summary carry the warning and each noise share."""
    frames = datasets.heart_disease().frames
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers_for(tmp_path, frames))
    model = fedstats.LogisticRegression(datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS)
    privacy = fedstats.RecordDP(epsilon=0.2, delta=1e-5, bounds=datasets.HEART_BOUNDS)
    with pytest.warns(fedstats.PrivacyUtilityWarning) as caught:
        result = model.fit(fed, privacy=privacy)
    messages = " ".join(utility_warnings(caught.list))
    dominated = result.noise_share[result.noise_share > NOISE_DOMINATES].index
    assert {"sex", "age", "oldpeak"} <= set(dominated)
    for name in dominated:
        assert f"{name} (" in messages
    assert result.noise_dominated
    record = result.to_record()
    assert record["utility_warnings"] == result.utility_warnings
    assert set(record["noise_share"]) == set(result.params.index)
    assert "Ferrando" in record["interval_method"]
    summary = result.summary()
    assert "noise share" in summary and "WARNING: privacy noise dominates" in summary


def test_the_noise_share_matches_the_spread_of_repeated_private_fits(tmp_path):
    """Oracle: over 60 private fits (noise seeds 0..59) at epsilon 6, where noise and
    sampling variance are of one size, the mean squared deviation of the private from the
    exact estimate is the noise's variance ``V_n``, and ``V_n / (V_n + exact se^2)`` the
    observed noise share. Every reported share agrees with it within 0.15, and the
    reported noise variance with ``V_n`` within a factor of 2."""
    sites = datasets.synthetic_logistic(n_sites=4, n_per_site=1500, n_covariates=3, seed=5)
    exact = fedstats.LogisticRegression(BIG_FORMULA).fit(fedstats.Federation.in_process(sites))
    deviations, noise_variances, shares = [], [], []
    for run in range(60):
        folder = tmp_path / str(run)
        folder.mkdir()
        books = ledgers_for(folder, sites)
        fed = fedstats.Federation.in_process(sites, ledgers=books, noise_seed=run)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fedstats.PrivacyUtilityWarning)
            private = fedstats.LogisticRegression(BIG_FORMULA, levels=BIG_LEVELS).fit(
                fed, privacy=fedstats.RecordDP(epsilon=6.0, bounds=BIG_BOUNDS)
            )
        deviations.append((private.params - exact.params).to_numpy())
        noise_variances.append((private.bse**2 * private.noise_share).to_numpy())
        shares.append(private.noise_share.to_numpy())
    observed_noise = np.mean(np.square(deviations), axis=0)
    observed_share = observed_noise / (observed_noise + exact.bse.to_numpy() ** 2)
    reported = np.mean(shares, axis=0)
    assert np.all(np.abs(observed_share - reported) < 0.15), (observed_share, reported)
    ratio = observed_noise / np.mean(noise_variances, axis=0)
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio


def test_a_large_study_at_epsilon_1_raises_none(tmp_path):
    """N = 100,000 over 10 sites at epsilon 1 with secure aggregation (one central noise):
    no coefficient is noise-dominated and no count implausible, so no warning. Without
    secure aggregation each of the 10 sites adds the whole noise (10 times the variance)
    and the same fit says its slopes are noise-dominated."""
    sites = datasets.synthetic_logistic(n_sites=10, n_per_site=10_000, n_covariates=3, seed=11)
    model = fedstats.LogisticRegression(BIG_FORMULA, levels=BIG_LEVELS)
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6, bounds=BIG_BOUNDS)
    books = ledgers_for(tmp_path, sites)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        secure = model.fit(
            fedstats.Federation.in_process(sites, ledgers=books),
            privacy=privacy,
            secure_aggregation=fedstats.SecureAggregation(),
        )
    assert utility_warnings(caught) == [] and not secure.noise_dominated
    assert (secure.noise_share < NOISE_DOMINATES).all()
    with pytest.warns(fedstats.PrivacyUtilityWarning, match="x1"):
        local = model.fit(fedstats.Federation.in_process(sites, ledgers=books), privacy=privacy)
    assert local.noise_dominated


def test_a_coarse_grid_pooled_cox_fit_warns_and_reports_the_events_it_used():
    """TCGA-BRCA, one baseline across six regions on a 1000-day grid: each region's
    follow-up ends at its safe horizon, so the fit uses 81 of 151 events; the header says
    so and the fit warns."""
    fed = fedstats.Federation.in_process(datasets.tcga_brca().frames)
    model = fedstats.CoxPH("Surv(time, event) ~ age_at_index", strata=None, width=1000,
                           horizon=6000)  # fmt: skip
    with pytest.warns(fedstats.PrivacyUtilityWarning, match=r"used 81 of 151 events"):
        fit = model.fit(fed)
    assert fit.events_used == 81 and fit.noise_dominated
    assert "81 of 151 used" in fit.summary()
    assert fit.to_record()["events_used"] == 81


def test_a_stratified_cox_fit_uses_every_event_and_does_not_warn():
    fed = fedstats.Federation.in_process(datasets.tcga_brca().frames)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fedstats.PrivacyUtilityWarning)
        fit = fedstats.CoxPH("Surv(time, event) ~ age_at_index").fit(fed)
    assert fit.events_used is None and not fit.noise_dominated


def test_noise_shares_are_the_noise_variance_over_the_total():
    sampling, noise = np.diag([1.0, 4.0, 0.0]), np.diag([1.0, 1.0, 0.0])
    shares = noise_shares(sampling, noise)
    assert shares[:2] == pytest.approx([0.5, 0.2]) and np.isnan(shares[2])
    assert noise_warnings(["a", "b"], np.array([0.5, 0.2])) == []
    assert "a (51%)" in noise_warnings(["a", "b"], np.array([0.51, 0.2]))[0]


def test_implausible_noisy_counts_are_named_by_site():
    (message,) = count_warnings({"x": -3.0, "y": 50.0, "z": 40.0}, {"x": 1.0, "y": 50.0, "z": 0.0})
    assert "x: -3 patients" in message and "y: 50 events among 50 patients" in message
    assert "z: 0 events" in message and "baseline" not in message
    (cox,) = count_warnings({"x": 10.0}, {"x": 0.0}, used_for="the fit's starting baseline")
    assert cox.endswith("and so is the fit's starting baseline, computed from them")
    assert count_warnings({"x": 10.0}, {"x": 2.0}) == []


def test_discarded_events_warn_above_the_stated_share():
    assert discarded_events_warning((1 - DISCARDED_EVENTS) * 100, 100) == []
    assert discarded_events_warning(79, 100) and discarded_events_warning(0, 0) == []
