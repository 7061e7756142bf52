"""The private log-rank test holds its level, because it adds the noise's variance.

The oracle is the null hypothesis itself: the arm is drawn independently of
survival, so a test at level 0.05 should reject in about 5 % of studies. On
noisy counts the hypergeometric variance alone makes the test reject far
more often; with the noise's covariance from the parametric bootstrap it
holds its level. Every fit's noise is fixed by its ``noise_seed``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_kaplan_meier_private import GRID, ledgers, study

import fedstats
from fedstats.models import logrank
from fedstats.models.utility import NOISE_DOMINATES

LEVEL = 0.05
STUDIES = 200
SITES = [f"s{k}" for k in range(4)]


def private_test(frames, books, *, epsilon, seed):
    fed = fedstats.Federation.in_process(frames, ledgers=books, noise_seed=seed)
    return fedstats.logrank_test(
        fed, "t", "e", "arm", levels=[0, 1], grid=GRID,
        privacy=fedstats.RecordDP(epsilon=epsilon, delta=1e-6),
    )  # fmt: skip


def test_private_logrank_holds_its_level_where_ignoring_the_noise_does_not(tmp_path, monkeypatch):
    books = ledgers(tmp_path, SITES)
    private, naive, shares = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fedstats.PrivacyUtilityWarning)
        for i in range(STUDIES):
            frames = study(1000 + i, n_per_site=150)
            result = private_test(frames, books, epsilon=1.0, seed=5000 + i)
            private.append(result.p_value)
            shares.append(result.noise_share.iloc[0])
            with monkeypatch.context() as patch:  # the same noise, its variance left out
                patch.setattr(logrank, "_noise_covariance", lambda c, d, rng, w: np.zeros((2, 2)))
                naive.append(private_test(frames, books, epsilon=1.0, seed=5000 + i).p_value)
    private_rate = np.mean(np.array(private) < LEVEL)
    naive_rate = np.mean(np.array(naive) < LEVEL)
    se = np.sqrt(LEVEL * (1 - LEVEL) / STUDIES)
    assert np.mean(shares) > NOISE_DOMINATES  # a regime where the noise matters
    assert naive_rate > 0.2, naive_rate  # ignoring the noise: rejects four times too often
    assert LEVEL - 3 * se <= private_rate <= LEVEL + 3 * se, private_rate


def test_noise_dominated_test_warns_and_says_so(tmp_path):
    books = ledgers(tmp_path, SITES)
    with pytest.warns(fedstats.PrivacyUtilityWarning, match="little power") as caught:
        result = private_test(study(7, n_per_site=150), books, epsilon=0.3, seed=11)
    assert any("0 (" in str(w.message) and "1 (" in str(w.message) for w in caught)
    assert result.noise_dominated
    assert (result.noise_share > NOISE_DOMINATES).all()
    assert result.variance_method == logrank.PRIVATE_VARIANCE
    text = result.summary()
    assert "noise share" in text and "WARNING:" in text and "parametric bootstrap" in text


def test_large_private_study_keeps_its_power_without_a_warning(tmp_path):
    rng = np.random.default_rng(3)
    frames = study(8, n_per_site=5000)
    for frame in frames.values():  # arm 1 dies twice as fast, censored at grid points
        fast = frame["arm"].to_numpy() == 1
        event = np.where(fast, rng.exponential(2.5, len(frame)), rng.exponential(5.0, len(frame)))
        censor = rng.choice(np.r_[GRID, np.inf], len(frame))
        frame["t"], frame["e"] = np.minimum(event, censor), event <= censor
    with warnings.catch_warnings():
        warnings.simplefilter("error", fedstats.PrivacyUtilityWarning)
        result = private_test(frames, ledgers(tmp_path, SITES), epsilon=1.0, seed=12)
    assert result.p_value < 1e-10
    assert not result.noise_dominated
    assert (result.noise_share < 0.2).all()


def test_exact_test_has_no_noise_share():
    frames = study(9, n_per_site=200)
    fed = fedstats.Federation.in_process(frames, disclosure=fedstats.DisclosurePolicy(min_count=1))
    result = fedstats.logrank_test(fed, "t", "e", "arm", levels=[0, 1], grid=GRID)
    assert result.noise_share is None and not result.utility_warnings
    assert result.variance_method == logrank.EXACT_VARIANCE
    assert "hypergeometric" in result.summary()
