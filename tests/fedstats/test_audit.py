"""The one-run audit's statistics: valid at its confidence, with the documented ceiling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedstats.errors import StudyConfigurationError
from fedstats.models.audit import audit, draw_inclusion, epsilon_lower_bound, p_value


def test_the_bound_is_valid_for_randomised_response_at_its_confidence():
    """Guesses right with probability e^eps/(1+e^eps) exactly: the bound exceeds eps <= 5 %."""
    rng = np.random.default_rng(11)
    for epsilon in (0.5, 2.0):
        p = math.exp(epsilon) / (1 + math.exp(epsilon))
        bounds = [
            epsilon_lower_bound(1000, 200, int(rng.binomial(200, p)), delta=0.0) for _ in range(400)
        ]
        exceed = np.mean(np.array(bounds) > epsilon)
        assert exceed <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400), (epsilon, exceed)
        assert np.median(bounds) > 0.3 * epsilon  # and it is not trivially zero


def test_perfect_guesses_reach_the_documented_ceiling():
    ceiling = epsilon_lower_bound(1000, 200, 200, delta=0.0)
    assert ceiling == pytest.approx(math.log(0.05 ** (1 / 200) / (1 - 0.05 ** (1 / 200))), abs=1e-4)
    assert 4.1 < ceiling < 4.3
    assert epsilon_lower_bound(1000, 200, 100, delta=0.0) == 0.0


@given(
    m=st.integers(10, 2000),
    data=st.data(),
    epsilon=st.floats(0, 8),
    delta=st.sampled_from([0.0, 1e-6, 1e-4]),
)
def test_p_value_grows_with_delta_and_falls_with_correct_guesses(m, data, epsilon, delta):
    r = data.draw(st.integers(1, m))
    v = data.draw(st.integers(1, r))
    assert p_value(m, r, v, epsilon, delta) >= p_value(m, r, v, epsilon, 0.0) - 1e-15
    if v < r:
        assert p_value(m, r, v + 1, epsilon, delta) <= p_value(m, r, v, epsilon, delta) + 1e-12
    assert epsilon_lower_bound(m, r, v, delta) <= epsilon_lower_bound(m, r, v, 0.0) + 1e-6


def test_audit_finds_membership_when_scores_reveal_it_and_not_otherwise():
    rng = np.random.default_rng(5)
    included = draw_inclusion(1000, rng)
    revealing = included + 0.01 * rng.normal(size=1000)
    found = audit(revealing, included, delta=1e-5, guess_grid=[50, 100, 200])
    assert found.epsilon_lower > 3.5
    assert found.correct == found.guesses
    blind = audit(rng.normal(size=1000), included, delta=1e-5, guess_grid=[50, 100, 200])
    assert blind.epsilon_lower < 1.0
    record = found.to_record()
    assert record["method"].startswith("one-run canary audit")
    with pytest.raises(StudyConfigurationError):
        audit(revealing, included[:10], delta=1e-5, guess_grid=[10])
    with pytest.raises(StudyConfigurationError):
        audit(revealing, included, delta=1e-5, guess_grid=[5000])
