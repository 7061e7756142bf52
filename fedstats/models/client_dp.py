"""Client-level DP-FedAvg at the coordinator, with fixed or adaptive clipping.

Each round, site ``k``'s model update ``u_k`` is clipped to L2 norm ``C``,
the clipped updates are summed, Gaussian noise ``N(0, (z_u C)^2 I)`` is added
and the sum is divided by the *expected* number of participating sites
``m = q n`` (a fixed denominator, so one site's presence changes the release
by at most ``C / m``): DP-FedAvg (McMahan, Ramage, Talwar & Zhang, "Learning
differentially private recurrent language models", ICLR 2018). The
neighbouring relation is one site added or removed (unit ``site``).

Adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, "Differentially
private learning with adaptive clipping", NeurIPS 2021, Alg. 1): the sites
also report whether ``||u_k|| <= C``; the noisy fraction
``b~ = (sum_k 1[||u_k|| <= C] + N(0, s_b^2)) / m`` moves the bound
geometrically towards the ``gamma`` quantile of update norms,
``C <- C exp(-eta (b~ - gamma))``. Releasing the count costs privacy too:
with update noise ``z_u = (z^-2 - (2 s_b)^-2)^(-1/2)`` the two releases
together are exactly as private as one Gaussian mechanism of multiplier
``z`` (their Theorem 1: Gaussian RDP adds as ``1 / (2 z^2)``; the count has
sensitivity 1/2 after centring). Each round is charged to the coordinator's
ledger as ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (or the Gaussian
alone when every site takes part) *before* the aggregate is used.

With few sites this guarantee is weak: hiding one hospital among four
needs noise of the order of the updates themselves.

At the coordinator (:func:`preview_training`, :meth:`DPFedAvg.aggregate` through
:mod:`fedstats.models.client_release`, :func:`fedstats.models.privacy.coordinator_spending`):
the whole planned training,
``SelfComposedDpEvent(round_event, rounds)``, is previewed against the
coordinator's client-level budget (unit ``site``) before anything is sent;
every round is charged to that ledger before its aggregate is used; a fit
reports the coordinator's :class:`~fedstats.models.privacy.ScopeSpending`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dp_accounting
import numpy as np

import accounting
from fedstats.errors import StudyConfigurationError
from fedstats.models.client_release import GaussianSum, clipped_sum, l2_norms, release
from fedstats.models.privacy import preview_coordinator_budget

if TYPE_CHECKING:
    from fedstats.models.federation import Federation


@dataclass(frozen=True)
class ClientRound:
    """One round's release: the noisy mean update, the next clip bound and what was charged."""

    update: np.ndarray
    clip: float
    next_clip: float
    clipped_fraction: float | None  # noisy fraction of sites within the bound (adaptive only)
    event: dp_accounting.DpEvent
    update_noise_multiplier: float


@dataclass(frozen=True)
class DPFedAvg:
    """Client-level DP-FedAvg options.

    Parameters
    ----------
    noise_multiplier:
        ``z``, the multiplier of each round's single-Gaussian equivalent.
    clip:
        The (initial) clip bound ``C`` on one site's update norm.
    expected_sites:
        ``m = q n``, the fixed denominator.
    sample_rate:
        ``q``, each site's probability of taking part in a round (Poisson).
    adaptive:
        Adapt ``C`` towards the ``target_quantile`` of update norms.
    count_noise:
        ``s_b``, the noise on the count of unclipped sites (default
        ``m / 20``, as Andrew et al. recommend).
    """

    noise_multiplier: float
    clip: float
    expected_sites: float
    sample_rate: float = 1.0
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_noise: float | None = None

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and self.clip > 0 and self.expected_sites > 0):
            raise StudyConfigurationError(
                "DP-FedAvg needs a positive noise multiplier, clip bound and expected sites"
            )
        if not 0 < self.sample_rate <= 1 or not 0 < self.target_quantile < 1:
            raise StudyConfigurationError(
                "sample_rate must be in (0, 1], target_quantile in (0, 1)"
            )
        if self.adaptive and 2 * self.count_std() <= self.noise_multiplier:
            raise StudyConfigurationError(
                f"adaptive clipping needs count noise above z/2 = {self.noise_multiplier / 2:.3g} "
                f"(got {self.count_std():.3g}); raise count_noise"
            )

    @classmethod
    def for_budget(
        cls,
        epsilon: float,
        delta: float,
        rounds: int,
        *,
        clip: float,
        sites: int,
        sample_rate: float = 1.0,
        **options,
    ) -> DPFedAvg:
        """The smallest ``z`` for which ``rounds`` rounds fit ``(epsilon, delta)`` under RDP."""
        z = accounting.calibrate_gaussian(
            epsilon,
            delta,
            compositions=rounds,
            sampling_rate=None if sample_rate >= 1 else sample_rate,
        )
        return cls(z, clip, sample_rate * sites, sample_rate=sample_rate, **options)

    def count_std(self) -> float:
        return self.count_noise if self.count_noise is not None else self.expected_sites / 20

    def update_noise_multiplier(self) -> float:
        """``z_u``: all of ``z`` without adaptation; less when the count is released too."""
        z = self.noise_multiplier
        if not self.adaptive:
            return z
        return (z**-2 - (2 * self.count_std()) ** -2) ** -0.5

    def round_event(self) -> dp_accounting.DpEvent:
        event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(self.sample_rate, event)
        return event

    def aggregate(
        self,
        federation: Federation,
        updates: Sequence[np.ndarray],
        clip: float,
        rng: np.random.Generator,
        *,
        dimension: int | None = None,
        analysis: str,
        task: str,
        round_no: int,
    ) -> ClientRound:
        """Clip, sum, charge, noise and average one round's updates
        (:func:`fedstats.models.client_release.release`).

        The round's event is charged to the coordinator's ledger before any
        noise is drawn. A round in which no site took part still releases the
        noise alone (``dimension`` entries): skipping it would tell that no
        site was sampled, which the Poisson-subsampled event does not account for.
        """
        vectors = [np.asarray(u, dtype=np.float64).ravel() for u in updates]
        if not vectors and dimension is None:
            raise StudyConfigurationError("a round without updates needs their dimension")
        norms = l2_norms(vectors)
        total = clipped_sum(vectors, clip, norms) if vectors else np.zeros(dimension)
        z_u = self.update_noise_multiplier()
        sums = [GaussianSum(total, z_u * clip)]
        if self.adaptive:
            unclipped = float(np.sum(norms <= clip)) - 0.5 * len(norms)  # centred: sensitivity 1/2
            sums.append(GaussianSum(np.asarray(unclipped), self.count_std()))
        released = release(
            federation,
            sums,
            self.round_event(),
            rng,
            note=f"client-level DP-FedAvg round {round_no}",
            analysis=analysis,
            task=task,
            parameters={
                "noise_multiplier": self.noise_multiplier,
                "update_noise_multiplier": z_u,
                "clip": clip,
                "expected_sites": self.expected_sites,
                "sample_rate": self.sample_rate,
                "adaptive": self.adaptive,
            },
        )
        next_clip, fraction = clip, None
        if self.adaptive:
            fraction = float(released[1]) / self.expected_sites + 0.5
            next_clip = clip * math.exp(
                -self.clip_learning_rate * (fraction - self.target_quantile)
            )
        return ClientRound(
            update=released[0] / self.expected_sites,
            clip=clip,
            next_clip=next_clip,
            clipped_fraction=fraction,
            event=self.round_event(),
            update_noise_multiplier=z_u,
        )


def planned_training(options: DPFedAvg, rounds: int) -> dp_accounting.DpEvent:
    """Every round of a training, composed: ``SelfComposedDpEvent(round_event, rounds)``."""
    return dp_accounting.SelfComposedDpEvent(options.round_event(), rounds)


def preview_training(federation: Federation, options: DPFedAvg, rounds: int) -> None:
    """Refuse, before anything is sent or charged, a training the coordinator cannot pay for.

    Raises :class:`~fedstats.errors.PlannedBudgetError` naming the
    coordinator's client-level budget, what is spent and what the planned
    ``rounds`` would bring it to (RDP composition).
    """
    preview_coordinator_budget(
        federation,
        planned_training(options, rounds),
        f"training ({rounds} rounds of client-level DP-FedAvg, noise multiplier "
        f"{options.noise_multiplier:.4g})",
        "Train fewer rounds or raise the noise multiplier.",
    )
