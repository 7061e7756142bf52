"""Site heterogeneity: site estimates, Cochran's Q and I² against statsmodels; outcome distances."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from statsmodels.stats.meta_analysis import combine_effects

import fedstats
from fedstats import datasets
from fedstats.models.federation import Federation

FORMULA = "y ~ x1 + x2 + C(arm)"


@pytest.fixture(scope="module")
def sites():
    """Five sites; the effect of x1 differs between sites, that of x2 does not."""
    rng = np.random.default_rng(8)
    frames = {}
    for i, slope in enumerate([0.2, 0.5, 0.9, 0.4, 1.2]):
        n = 1500 + 400 * i
        x1, x2 = rng.normal(size=n), rng.normal(size=n)
        arm = rng.choice(["a", "b", "c"], n)
        eta = -0.5 + slope * x1 - 0.7 * x2 + np.where(arm == "c", 0.6, 0.0)
        frames[f"site{i}"] = pd.DataFrame(
            {"x1": x1, "x2": x2, "arm": arm, "y": (rng.random(n) < 1 / (1 + np.exp(-eta))) * 1}
        )
    return frames


def test_site_estimates_q_and_i2_equal_statsmodels(sites):
    fed = fedstats.Federation.in_process(sites)
    result = fedstats.heterogeneity(fedstats.LogisticRegression(FORMULA), fed)
    assert not result.excluded
    for site, frame in sites.items():
        reference = sm.GLM.from_formula(FORMULA, frame, family=sm.families.Binomial()).fit(
            tol=1e-12
        )
        names = result.estimates.columns
        assert np.allclose(result.estimates.loc[site], reference.params[names], atol=1e-7)
        assert np.allclose(result.std_errors.loc[site], reference.bse[names], atol=1e-7)
    summary = result.summary_frame
    for name in result.estimates.columns:
        # statsmodels takes the root of its random-effects variances, negative with a negative
        # untruncated tau2 (x2): NaN there, a RuntimeWarning, and nothing compared here
        with np.errstate(invalid="ignore"):
            meta = combine_effects(
                result.estimates[name].to_numpy(), result.std_errors[name].to_numpy() ** 2,
                method_re="dl",
            )  # fmt: skip
        row = summary.loc[name]
        assert row["q"] == pytest.approx(meta.q, rel=1e-12)
        assert row["i2_untruncated"] == pytest.approx(meta.i2, rel=1e-12, abs=1e-12)
        assert row["tau2_untruncated"] == pytest.approx(meta.tau2, rel=1e-12, abs=1e-15)
        assert row["i2"] == max(0.0, row["i2_untruncated"])
        assert row["tau2"] == max(0.0, row["tau2_untruncated"])
        assert row["estimate_fe"] == pytest.approx(meta.mean_effect_fe, rel=1e-12)
        assert row["se_fe"] == pytest.approx(meta.sd_eff_w_fe, rel=1e-12)
    assert summary.loc["x1", "i2"] > 0.5 and summary.loc["x1", "p_value"] < 0.01
    assert summary.loc["x2", "p_value"] > 0.01  # a shared slope
    figure = result.plot("x1")
    assert figure.axes and "I²" in figure.axes[0].get_title()


def test_prevalence_and_distances_between_outcome_distributions(sites):
    fed = fedstats.Federation.in_process(sites)
    result = fedstats.heterogeneity(fedstats.LogisticRegression(FORMULA), fed)
    prevalence = pd.Series({s: f["y"].mean() for s, f in sites.items()})
    assert np.allclose(result.prevalence, prevalence, atol=1e-15)
    expected = np.abs(prevalence.to_numpy()[:, None] - prevalence.to_numpy()[None, :])
    assert np.allclose(result.total_variation, expected)
    assert np.allclose(result.wasserstein, expected)


def test_sites_without_estimates_are_listed_with_the_reason():
    """Heart disease, with the two abnormal resting ECGs as one level (the reference model's
    ``C(restecg)`` crossed with ``disease`` holds a one-patient cell at Cleveland and at
    Hungary): Switzerland refuses (its cells are too small); VA refuses for the cross-cell of
    sex and disease (two healthy women; before that rule it was fitted and separated on chest
    pain)."""
    heart = datasets.heart_disease()
    fed = fedstats.Federation.in_process(heart.frames)
    formula = datasets.HEART_FORMULA.replace("C(restecg)", "I(restecg > 0)")
    result = fedstats.heterogeneity(fedstats.LogisticRegression(formula), fed)
    assert set(result.excluded) == {"switzerland", "va"}
    assert "DisclosureError" in result.excluded["switzerland"]
    assert "fewer than 3 rows" in result.excluded["switzerland"]
    assert "crossed with the design column 'sex'" in result.excluded["va"]
    assert list(result.estimates.index) == ["cleveland", "hungary"]
    meta = combine_effects(
        result.estimates["age"].to_numpy(), result.std_errors["age"].to_numpy() ** 2
    )
    assert result.summary_frame.loc["age", "q"] == pytest.approx(meta.q, rel=1e-12)


def test_survival_distances_between_site_curves():
    """Each site's curve is lifelines' Kaplan-Meier; W1 is the area between step curves."""
    from lifelines import KaplanMeierFitter
    from lifelines.datasets import load_rossi

    rossi = load_rossi()
    site = np.arange(len(rossi)) % 3
    frames = {f"s{k}": rossi[site == k].reset_index(drop=True) for k in range(3)}
    fed = fedstats.Federation.in_process(frames, disclosure=fedstats.DisclosurePolicy(min_count=1))
    grid = np.arange(1.0, 53.0)
    result = fedstats.survival_heterogeneity(fed, "week", "arrest", grid=grid)
    curves = {}
    for name, frame in frames.items():
        fitter = KaplanMeierFitter().fit(frame["week"], frame["arrest"])
        curves[name] = fitter.survival_function_at_times(grid).to_numpy()
        assert np.allclose(result.curves[name].to_numpy(), curves[name], atol=1e-12)
    fine = np.linspace(0, 52, 520_001)[:-1]  # the area between the curves on [0, 52)
    step = {n: np.r_[1.0, c][np.searchsorted(grid, fine, side="right")] for n, c in curves.items()}
    area = np.abs(step["s0"] - step["s1"]).mean() * 52
    assert result.wasserstein.loc["s0", "s1"] == pytest.approx(area, rel=1e-4)
    masses = {n: np.r_[1 - c[0], -np.diff(c), c[-1]] for n, c in curves.items()}
    tv = 0.5 * np.abs(masses["s0"] - masses["s2"]).sum()
    assert result.total_variation.loc["s2", "s0"] == pytest.approx(tv, abs=1e-12)
    assert (np.diag(result.wasserstein) == 0).all()


def test_a_result_is_a_value_that_names_its_model(sites):
    """Results hold no federation: the site-by-site fits of a result's model are a function."""
    fed = fedstats.Federation.in_process(sites)
    model = fedstats.LogisticRegression(FORMULA)
    result = model.fit(fed)
    assert result.model is model
    assert not hasattr(result, "heterogeneity")
    # the coordinator's class: fedstats.Federation (in process) and every subset or remote
    # federation are instances of it
    assert not any(isinstance(v, Federation) for v in vars(result).values())
    direct = fedstats.heterogeneity(fedstats.LogisticRegression(FORMULA), fed)
    assert fedstats.heterogeneity(result.model, fed).summary_frame.equals(direct.summary_frame)
