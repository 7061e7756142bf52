"""Robust aggregation, stochastic quantisation and client-level DP-FedAvg (coordinator side)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import accounting
from fedstats.contract.quantize import Quantized, dequantize, quantize
from fedstats.errors import StudyConfigurationError
from fedstats.models.aggregation import CoordinateMedian, Mean, NormBounded, TrimmedMean
from fedstats.models.client_dp import DPFedAvg


class Coordinator:
    """What a client-level release uses of a federation: its study and the coordinator's ledger."""

    def __init__(self, path, epsilon: float = 1e9) -> None:
        self.study = "s"
        self.scope = accounting.Scope(unit="site", owner="coordinator", study="s")
        self.ledger = accounting.Ledger(path)
        self.ledger.set_budget(self.scope, epsilon=epsilon, delta=1e-5)


def aggregate(options: DPFedAvg, coordinator: Coordinator, updates, clip, rng, round_no=1):
    return options.aggregate(
        coordinator, updates, clip, rng, analysis="a", task="deep.train", round_no=round_no
    )


def honest_updates(n: int, d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=d)
    return [centre + 0.1 * rng.normal(size=d) for _ in range(n)]


def test_one_scaled_update_breaks_the_mean_but_not_the_median_or_trimmed_mean():
    clean = honest_updates(5, 50)
    attacked = list(clean)
    attacked[2] = clean[2] * 1e6
    weights = [1.0] * 5
    reference = Mean()(clean, weights)
    assert np.linalg.norm(Mean()(attacked, weights) - reference) > 1e4
    for rule in (CoordinateMedian(), TrimmedMean(0.2), NormBounded(2 * np.linalg.norm(reference))):
        moved = np.linalg.norm(rule(attacked, weights) - reference)
        assert moved < 0.5 * np.linalg.norm(reference), type(rule).__name__


def test_aggregators_agree_with_numpy_and_scipy():
    from scipy import stats

    updates = honest_updates(7, 20, seed=3)
    weights = [1, 2, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(
        Mean()(updates, weights), np.average(updates, axis=0, weights=weights)
    )
    np.testing.assert_allclose(CoordinateMedian()(updates, weights), np.median(updates, axis=0))
    # scipy trims floor(beta n) per end; ours trims ceil(beta n): equal when beta n is whole.
    np.testing.assert_allclose(
        TrimmedMean(2 / 7)(updates, weights), stats.trim_mean(np.array(updates), 2 / 7, axis=0)
    )
    big = [u * 100 for u in updates]
    bounded = NormBounded(1.0)(big, weights)
    norms = [np.linalg.norm(u) for u in big]
    np.testing.assert_allclose(
        bounded,
        np.average([u / n for u, n in zip(big, norms, strict=True)], axis=0, weights=weights),
    )


def test_bad_aggregation_options_are_typed_errors():
    with pytest.raises(StudyConfigurationError):
        TrimmedMean(0.5)
    with pytest.raises(StudyConfigurationError, match="leaves no update"):
        TrimmedMean(0.4)(honest_updates(2, 3), [1, 1])
    with pytest.raises(StudyConfigurationError):
        Mean()([], [])
    with pytest.raises(StudyConfigurationError):
        Mean()(honest_updates(2, 3), [1, -1])


@given(
    x=hnp.arrays(np.float64, st.integers(1, 200), elements=st.floats(-1e6, 1e6)),
    bits=st.integers(1, 16),
)
@settings(max_examples=80, deadline=None)
@example(x=np.array([5e-324]), bits=3)  # a subnormal scale: 2 M / L underflowed to 0
def test_quantised_values_stay_on_the_grid_next_to_their_value(x, bits):
    q = quantize(x, bits, np.random.default_rng(0))
    decoded = dequantize(Quantized.from_wire(q.to_wire()))
    scale = np.max(np.abs(x))
    step = 2 * scale / ((1 << bits) - 1)
    assert decoded.shape == x.shape
    assert np.all(np.abs(decoded - x) <= step * (1 + 1e-9) + 1e-9 * scale)
    assert q.nbytes == math.ceil(x.size * bits / 8) + 8


def test_quantisation_is_unbiased():
    rng = np.random.default_rng(1)
    x = rng.normal(size=64)
    draws = np.mean([dequantize(quantize(x, 2, rng)) for _ in range(20_000)], axis=0)
    step = 2 * np.max(np.abs(x)) / 3
    # standard error of each mean <= step / (2 sqrt(20000)); allow 5 of them
    assert np.max(np.abs(draws - x)) < 5 * step / (2 * math.sqrt(20_000))
    # deterministic rounding to the nearest grid point would be biased:
    nearest = np.round((x + np.max(np.abs(x))) / step) * step - np.max(np.abs(x))
    assert np.max(np.abs(nearest - x)) > 10 * step / (2 * math.sqrt(20_000))


def test_dp_fedavg_releases_the_clipped_mean_plus_noise_of_the_stated_scale(tmp_path):
    rng = np.random.default_rng(2)
    updates = [np.full(4000, v) for v in (0.01, 0.02, 3.0, 5.0)]  # norms 0.6, 1.3, 190, 316
    options = DPFedAvg(noise_multiplier=1.5, clip=2.0, expected_sites=4)
    coordinator = Coordinator(tmp_path / "coordinator.ledger")
    released = aggregate(options, coordinator, updates, 2.0, rng)
    entries = coordinator.ledger.entries(coordinator.scope)
    assert len(entries) == 1 and entries[0].parameters["clip"] == 2.0
    clipped = [u * min(1.0, 2.0 / np.linalg.norm(u)) for u in updates]
    noise = released.update - np.sum(clipped, axis=0) / 4
    assert abs(noise.mean()) < 4 * (1.5 * 2.0 / 4) / math.sqrt(4000)
    assert noise.std() == pytest.approx(1.5 * 2.0 / 4, rel=0.05)
    assert released.event == dp_accounting.GaussianDpEvent(1.5)


def test_a_dp_fedavg_round_over_budget_draws_no_noise_and_releases_nothing(tmp_path):
    """The charge comes first: refused, no noise is drawn (the generator is untouched)."""
    options = DPFedAvg(noise_multiplier=0.5, clip=1.0, expected_sites=4)
    coordinator = Coordinator(tmp_path / "coordinator.ledger", epsilon=0.1)
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    with pytest.raises(accounting.BudgetExceeded):
        aggregate(options, coordinator, honest_updates(4, 10), 1.0, rng)
    assert rng.bit_generator.state == state
    assert coordinator.ledger.entries(coordinator.scope) == []


def test_adaptive_clipping_splits_the_privacy_of_one_gaussian_exactly():
    options = DPFedAvg(noise_multiplier=1.2, clip=1.0, expected_sites=20, adaptive=True)
    z_u, s_b = options.update_noise_multiplier(), options.count_std()
    both = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(z_u), dp_accounting.GaussianDpEvent(2 * s_b)]
    )
    for delta in (1e-5, 1e-8):
        one = dp_accounting.rdp.RdpAccountant().compose(options.round_event()).get_epsilon(delta)
        two = dp_accounting.rdp.RdpAccountant().compose(both).get_epsilon(delta)
        assert two == pytest.approx(one, abs=1e-9)
    with pytest.raises(StudyConfigurationError, match="count noise"):
        DPFedAvg(noise_multiplier=1.2, clip=1.0, expected_sites=4, adaptive=True, count_noise=0.5)


def test_adaptive_clip_moves_to_the_target_quantile_of_update_norms(tmp_path):
    rng = np.random.default_rng(3)
    coordinator = Coordinator(tmp_path / "coordinator.ledger")
    norms = np.linspace(1, 10, 200)
    updates = [np.array([n]) for n in norms]
    options = DPFedAvg(
        noise_multiplier=0.5, clip=0.1, expected_sites=200, adaptive=True, target_quantile=0.7
    )
    clip = 0.1
    for _ in range(300):
        clip = aggregate(options, coordinator, updates, clip, rng).next_clip
    assert clip == pytest.approx(np.quantile(norms, 0.7), rel=0.08)


def test_dp_fedavg_calibration_meets_the_budget_under_the_ledger(tmp_path):
    options = DPFedAvg.for_budget(5.0, 1e-5, rounds=30, clip=1.0, sites=20, sample_rate=0.5)
    assert options.expected_sites == 10
    ledger = accounting.Ledger(tmp_path / "coordinator.ledger")
    scope = accounting.Scope(unit="site", owner="coordinator", study="s")
    ledger.set_budget(scope, epsilon=5.0, delta=1e-5)
    for _ in range(30):
        ledger.charge(scope, options.round_event(), note="round")
    assert ledger.spent(scope).epsilon <= 5.0 + 1e-9
    with pytest.raises(accounting.BudgetExceeded):
        ledger.charge(scope, options.round_event(), note="one more")
