"""The record-level privacy plan of a federated DP-SGD fit, its calibration and preview.

Every site makes the same releases: its three counts once (one Gaussian
release of noise multiplier :data:`COUNTS_NOISE_MULTIPLIER`, for the FedAvg
weights) and, in every round it takes part in, ``K`` DP-SGD steps with
sampling rate ``q`` and noise multiplier ``sigma``. The whole fit is the event

``ComposedDpEvent([GaussianDpEvent(sigma_counts),
SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), R K)])``

and for a target ``(epsilon, delta)`` the smallest ``sigma`` meeting it under
the RDP accountant is found by ``dp_accounting``'s ``calibrate_dp_mechanism``
(RDP composition is additive, so ``R`` rounds of ``K`` steps cost what
``R K`` steps cost: Mironov 2017, Prop. 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting
from dp_accounting.mechanism_calibration import ExplicitBracketInterval, calibrate_dp_mechanism
from dp_accounting.rdp import RdpAccountant

import accounting
from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan, dp_sgd_event
from fedstats.errors import StudyConfigurationError

COUNTS_NOISE_MULTIPLIER = 10.0
"""Noise multiplier of each site's counts (sensitivity sqrt(2)): a standard deviation of
about 14 patients, costing RDP ``alpha / 200`` — a small share of a DP-SGD budget."""


@dataclass(frozen=True)
class DpSgdSchedule:
    """Sampling rate, noise, clipping norm and steps of a private fit (the same at every site)."""

    sample_rate: float
    noise_multiplier: float
    max_grad_norm: float
    local_steps: int
    rounds: int
    delta: float
    engine: str = "auto"

    def round_plan(self) -> DpSgdPlan:
        return DpSgdPlan(
            self.sample_rate, self.noise_multiplier, self.max_grad_norm, self.local_steps,
            self.engine,
        )  # fmt: skip

    def planned_event(self, rounds: int | None = None) -> dp_accounting.DpEvent:
        """Counts and ``rounds`` (default: all) rounds of DP-SGD at one site."""
        steps = self.local_steps * (self.rounds if rounds is None else rounds)
        events: list[dp_accounting.DpEvent] = [
            dp_accounting.GaussianDpEvent(COUNTS_NOISE_MULTIPLIER)
        ]
        if steps:
            events.append(dp_sgd_event(self.sample_rate, self.noise_multiplier, steps))
        return dp_accounting.ComposedDpEvent(events)


def calibrate_noise(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Smallest DP-SGD noise multiplier whose fit (counts included) meets ``(epsilon, delta)``."""

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.ComposedDpEvent(
            [
                dp_accounting.GaussianDpEvent(COUNTS_NOISE_MULTIPLIER),
                dp_sgd_event(sample_rate, sigma, steps),
            ]
        )

    def epsilon_of(sigma: float) -> float:
        return RdpAccountant().compose(make_event(sigma)).get_epsilon(delta)

    floor = accounting.rdp_epsilon(dp_accounting.GaussianDpEvent(COUNTS_NOISE_MULTIPLIER), delta)
    if epsilon <= floor * 1.01:
        raise StudyConfigurationError(
            f"epsilon {epsilon} at delta {delta} leaves nothing for training once the counts "
            f"are released (they cost {floor:.3f}); raise epsilon"
        )
    low, high = 0.3, 1.0
    while epsilon_of(high) > epsilon:
        low, high = high, high * 2
        if high > 1e4:
            raise StudyConfigurationError(
                f"no noise multiplier up to 1e4 meets epsilon {epsilon} at delta {delta} "
                f"with {steps} steps at sampling rate {sample_rate:.4g}; train fewer steps"
            )
    while epsilon_of(low) <= epsilon:
        low /= 2
    return float(
        calibrate_dp_mechanism(
            RdpAccountant, make_event, epsilon, delta, ExplicitBracketInterval(low, high)
        )
    )


def default_sample_rate(batch_size: int, n_obs: dict[str, float]) -> float:
    """``batch_size / median n_k`` (at most 1): the median site expects ``batch_size`` rows."""
    sizes = sorted(max(v, 1.0) for v in n_obs.values())
    middle = len(sizes) // 2
    median = sizes[middle] if len(sizes) % 2 else (sizes[middle - 1] + sizes[middle]) / 2
    return min(1.0, batch_size / median)


def steps_for_epochs(epochs: int, sample_rate: float) -> int:
    """DP-SGD steps for ``epochs`` expected passes: ``ceil(epochs / q)``."""
    return max(1, math.ceil(epochs / sample_rate - 1e-9))
